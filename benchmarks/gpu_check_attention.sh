#!/usr/bin/env bash
# The two GPU-only attention checks that failed on an H100, in under 150 s (GPU machine, repo root, carry .whl):
#   float32 gpu_flash at 1030 x 128 (blocks from gpu_block_sizes) and the llama3 decoder switch at equal precision.
# Prints each case's errors (the tests print them; -rA shows them for passes too). Wheels installed as gpu_suite.sh.
set -u
cd "$(dirname "$0")/.."
if python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || echo "installing the wheels failed"
fi
LOG=${OUT:-/tmp}/gpu_check_attention.txt
JAX_PLATFORMS=cuda timeout 140 python3 -m pytest -p no:cacheprovider -p no:xdist -v -rA \
  "tests/models/test_pallas_attention.py::test_gpu_flash_compiled_for_the_gpu_equals_the_reference[1030-128-float32-0.03]" \
  "tests/training/test_attention_switch.py::test_gpu_flash_decoder_on_a_gpu_equals_the_reference[llama3]" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
echo "--- errors (rc $rc) ---"
grep -E "relative errors|largest \|got - want\||RESOURCE_EXHAUSTED|Error" "$LOG" | sort -u | head -20
exit "$rc"
