#!/usr/bin/env bash
# Every GPU figure of issue 48 in one run of under 8 minutes, written to "$OUT" (at most 5 files).
#
#   bash benchmarks/gpu_suite.sh          # on the GPU machine, from the repository root (carry: .whl)
#   bash benchmarks/gpu_suite.sh --tiny   # the same entry points at tiny shapes on a CPU (minutes)
#
# The GPU machine's image lacks pydantic; the wheels in .whl/ (downloaded here with the device README's
# `pip download` for Python 3.12, manylinux x86-64) are installed into /tmp/site first. Expected, exactly:
#   annotated_types-0.7.0  pydantic-2.13.4  pydantic_core-2.46.4  typing_extensions-4.16.0  typing_inspection-0.4.2
# (typing_extensions: pydantic_core needs >= 4.14.1, newer than the image may have). Nothing else that
# these steps import is missing there (jax, flax, optax, orbax, numpy, pyyaml, pytest, hypothesis are in it).
#
# The steps, most important first, each in processes of its own under `timeout` (a failed or killed step is
# logged and the next one runs). A step starts only if the time left in the budget (GPU_SUITE_BUDGET, 450 s)
# covers its minimum; otherwise it is logged as skipped, so the run ends in time whatever happens:
#   peaks (bf16 matmul, copy bandwidth) -> decode 16 x 512 -> decode 1024 x 512 -> the 0.5B update (MFU)
#   -> the two GPU-only kernel tests -> decode 64 and 256 x 512 -> a whole DAPO step of the 0.5B recipe
#   (96 prompts x 8 sampled, 32 x 8 trained) -> decode 16 and 64 x 4096 -> the 1.5B update -> decode 256 x 4096.
# 1,024 x 4,096 is left out: its KV cache alone is about 52 GB (near the 59 GiB JAX takes of an H100) and its
# 4,096 steps would take about a minute and a half at the bandwidth floor, more than the budget leaves.
# Files in $OUT: log.txt (every step's output), device.jsonl (benchmarks.device's results, failures included),
# gpu_tests.txt (pytest), env.txt (device, versions), summary.md (benchmarks.gpu_summary: the tables and goals).
set -u
cd "$(dirname "$0")/.."
TINY=0
[ "${1:-}" = "--tiny" ] && TINY=1
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
LOG=$OUT/log.txt
RESULTS=$OUT/device.jsonl
START=$(date +%s)
BUDGET=${GPU_SUITE_BUDGET:-450}
[ $TINY = 1 ] && BUDGET=${GPU_SUITE_BUDGET:-6000}  # a loaded 2-core CPU compiles slowly
export PYTHONUNBUFFERED=1
: >"$LOG"
say() { echo "[gpu_suite $(date -u +%T)] $*" | tee -a "$LOG"; }

WHEELS="annotated_types-0.7.0 pydantic-2.13.4 pydantic_core-2.46.4 typing_extensions-4.16.0 typing_inspection-0.4.2"
for w in $WHEELS; do
  ls .whl/"$w"-*.whl >/dev/null 2>&1 || say "missing wheel .whl/$w-*.whl (carry .whl)"
done
if ! python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
  say "the wheels are for Python 3.12, this is $(python3 -V 2>&1): not installed (what is installed is used)"
elif ls .whl/*.whl >/dev/null 2>&1; then
  site=/tmp/gpu_suite_site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
    >>"$LOG" 2>&1 && export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} || say "installing the wheels failed"
fi

{
  date -u +"date %FT%TZ"
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown) (the lead records it when .git does not travel)"
  echo "mode $([ $TINY = 1 ] && echo tiny || echo full), budget ${BUDGET} s"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | head -3
  python3 -c "import sys, jax, flax, optax, pydantic; print('python', sys.version.split()[0], 'jax', jax.__version__,
'flax', flax.__version__, 'optax', optax.__version__, 'pydantic', pydantic.__version__); print(jax.devices())" 2>&1
} >"$OUT/env.txt"
cat "$OUT/env.txt" >>"$LOG"

left() { echo $(( BUDGET - ($(date +%s) - START) )); }

# step NAME MAX MIN CMD...: CMD under `timeout` of MAX seconds (less if less is left); skipped under MIN left
step() {
  local name=$1 max=$2 min=$3 t rc s0
  shift 3
  t=$(left)
  if (( t < min )); then say "$name: skipped (${t} s left of the budget, it needs ${min} s)"; return; fi
  (( t > max )) && t=$max
  s0=$(date +%s)
  say "$name: start (limit ${t} s): $*"
  timeout -k 5 "$t" "$@" >>"$LOG" 2>&1
  rc=$?
  say "$name: exit $rc after $(( $(date +%s) - s0 )) s"
}

# device NAME MAX MIN ARGS...: one `benchmarks.device` phase; its child is killed 15-30 s before the step's limit
# (the parent's own imports take seconds), so the failure is still written to device.jsonl
device() {
  local name=$1 max=$2 min=$3 t
  shift 3
  t=$(left)
  (( t > max )) && t=$max
  step "$name" "$max" "$min" python3 -m benchmarks.device --json "$RESULTS" --timeout $(( t >= 80 ? t - 30 : t - 15 )) \
    "$@" $([ $TINY = 1 ] && echo --quick)
}

GPU_TESTS="tests/models/test_pallas_attention.py::test_gpu_flash_compiled_for_the_gpu_equals_the_reference
tests/training/test_attention_switch.py::test_gpu_flash_decoder_on_a_gpu_equals_the_reference"

if [ $TINY = 1 ]; then  # each entry point once, at the quick shape (decode_16: 16 new tokens)
  device peaks 1200 0 --phases peaks
  device decode 1200 0 --phases decode_16 --decode-prompts 1 --group 4
  device train 1200 0 --phases train
  device train_1.5b 1200 0 --phases train --model 1.5b
  step gpu_tests 1200 0 sh -c "python3 -m pytest -p no:cacheprovider -p no:xdist -q -rA $(echo $GPU_TESTS) >$OUT/gpu_tests.txt 2>&1"
  device dapo_step 1200 0 --phases dapo_step
else
  device peaks 75 20 --phases peaks
  device decode_16x512 90 45 --phases decode_512 --decode-prompts 1 --group 16
  device decode_1024x512 110 60 --phases decode_512 --decode-prompts 64 --group 16
  device train_0.5b 150 70 --phases train
  step gpu_tests 120 40 sh -c "JAX_PLATFORMS=cuda python3 -m pytest -p no:cacheprovider -p no:xdist -q -rA \
    $(echo $GPU_TESTS) >$OUT/gpu_tests.txt 2>&1"
  device decode_64x512 90 45 --phases decode_512 --decode-prompts 4 --group 16
  device decode_256x512 90 50 --phases decode_512 --decode-prompts 16 --group 16
  device dapo_step 170 100 --phases dapo_step --gen-prompts 96 --prompts 32 --group 8 --minibatches 2 \
    --micro-batches 4 --prompt-len 256 --train-new-tokens 512
  device decode_16x4096 100 60 --phases decode_4096 --decode-prompts 1 --group 16
  device decode_64x4096 100 60 --phases decode_4096 --decode-prompts 4 --group 16
  device train_1.5b 170 100 --phases train --model 1.5b
  device decode_256x4096 120 70 --phases decode_4096 --decode-prompts 16 --group 16
fi

if [ -f "$RESULTS" ]; then
  timeout -k 5 30 python3 -m benchmarks.gpu_summary "$RESULTS" >"$OUT/summary.md" 2>>"$LOG"
else
  echo "no results: every phase failed or was skipped (log.txt)" >"$OUT/summary.md"
fi
cat "$OUT/summary.md"
say "done in $(( $(date +%s) - START )) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
