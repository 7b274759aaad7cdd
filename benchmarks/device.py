"""A Qwen2.5-0.5B-shaped model on whatever device JAX sees: train-step MFU, decode tokens/s, peak memory.

    python -m benchmarks.device                           # on a GPU or TPU
    python -m benchmarks.device --quick                   # a tiny shape, seconds on a CPU (the test runs it)
    python -m benchmarks.device --phases decode_512 --decode-prompts 8 --json out.jsonl
    python -m benchmarks.device --phases peaks,train --model 1.5b   # the measured ceilings; Qwen2.5-1.5B's shape

The model is Qwen2.5-0.5B's config.json (`step_memory.QWEN25_05B`; `--model 1.5b`: Qwen2.5-1.5B's) with random weights: bf16
compute, float32 master weights, `remat: dots_saveable`, as the recipe `qwen2.5-0.5b-gsm8k-dapo`.
Each phase runs in a process of its own, so its peak memory is its own:
- `train`: one DAPO update (`PackedUpdate`, built by `training/update/programs.py`'s `make_update` as the loop builds it, in `--micro-batches` micro-batches
  as the recipe's 4) on `--prompts` prompts of `--prompt-len` tokens x G = `--group` responses of ragged
  lengths (uniform in 1..`--train-new-tokens`),
  the median of `--steps` timed steps after one untimed. MFU = model FLOPs / step time / the device's
  dense bf16 peak (`training/plan/chips.py`, by `device_kind`; none on a CPU). Model FLOPs = 6 x matmul
  parameters (the LM head included) x the tokens the packed rows lay out + causal attention
  6 x layers x attention width x sum of squared sequence lengths. The same FLOPs are also set against a
  matmul peak measured in the process (bf16 on an accelerator, f32 on a CPU).
- `decode_512`, `decode_4096`: `make_generate` on `--decode-prompts` prompts x G = `--group` samples, no EOS
  (every sequence runs the full length); tokens/s = sequences x new tokens / the median of `--decode-calls`
  calls of the program compiled ahead (`compile_s`). Beside it, the time of one decode step against what
  `dapo-jax plan`'s estimate (`training/plan/estimate.py`) gives for it on this device, and the bytes and FLOPs
  of that estimate (`step_bytes`, `step_flops`) to set against the ceilings measured by `peaks`.
- `peaks`: the ceilings measured here, a square matmul (`matmul_peak`) and a copy (`copy_bandwidth`).
- `dapo_step`: a whole DAPO step of the 0.5B recipe (`benchmarks/dapo_step.py`).
Peak memory: `memory_stats()["peak_bytes_in_use"]` of the device; on a CPU, which reports none, the
process's maximum resident set size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from benchmarks.harness import emit, median, peak_rss_bytes, run_child
from benchmarks.peers import matmul_peak as square_matmul_peak, update_flops
from benchmarks.step_memory import QWEN25_05B

QWEN25_15B = {**QWEN25_05B, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
              "num_attention_heads": 12, "num_key_value_heads": 2}  # Qwen2.5-1.5B's config.json (its shapes)
MODELS = {"0.5b": QWEN25_05B, "1.5b": QWEN25_15B}

QUICK_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=512)


def nominal_peak(device_kind: str) -> float | None:
    """The device's dense bf16 FLOP/s from `training/plan/chips.py`'s table (data sheets), None on a CPU."""
    from dapo_jax.training.plan.chips import chip_for

    chip = chip_for(device_kind)
    return None if chip is None else chip.device_flops


def decode_floor(cfg, *, rows: int, prompt_len: int, new_tokens: int) -> tuple[float, float]:
    """`(bytes, FLOPs)` of one decode step by the plan's count (`estimate.decode_step`): the weights and about
    S + 5T/8 cached slots read in the compute dtype; to set against a measured bandwidth and matmul peak."""
    import jax.numpy as jnp

    from dapo_jax.training.plan.estimate import decode_step

    _, step_bytes, step_flops = decode_step(cfg, rows=rows, context=prompt_len + 5 * new_tokens / 8,
                                            itemsize=jnp.dtype(cfg.dtype).itemsize, peak_flops=1.0, bandwidth=1.0)
    return step_bytes, step_flops


def decode_estimate_ms(cfg, device_kind: str, *, rows: int, prompt_len: int, new_tokens: int) -> float | None:
    """What `dapo-jax plan`'s estimate gives for one decode step of this phase (`estimate.decode_step`: weights
    and KV cache in the compute dtype over the HBM bandwidth, or FLOPs over the peak; about S + 5T/8 cached slots)."""
    import jax.numpy as jnp

    from dapo_jax.training.plan.chips import chip_for
    from dapo_jax.training.plan.estimate import decode_step

    chip = chip_for(device_kind)
    if chip is None:
        return None
    seconds, _, _ = decode_step(cfg, rows=rows, context=prompt_len + 5 * new_tokens / 8,
                                itemsize=jnp.dtype(cfg.dtype).itemsize,
                                peak_flops=chip.device_flops, bandwidth=chip.device_bandwidth)
    return 1e3 * seconds


def model_config(quick: bool, model: str = "0.5b"):
    from dapo_jax.models.config import ModelConfig

    hf = {**MODELS[model], **(QUICK_SHAPE if quick else {})}
    return ModelConfig.from_hf_dict(hf, param_dtype="float32", dtype="bfloat16", remat="dots_saveable")


def train_flops(cfg, n_params: int, laid_out_tokens: int, seq_lengths) -> float:
    """Forward + backward FLOPs of one update (the docstring's formula, `peers.update_flops`)."""
    matmul = n_params - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)  # the lookup is no matmul
    info = {"matmul_params": matmul, "layers": cfg.num_hidden_layers,
            "attn_dim": cfg.num_attention_heads * cfg.head_dim}
    return update_flops(info, [int(x) for x in seq_lengths], tokens=laid_out_tokens)


def matmul_peak(on_cpu: bool) -> float:
    """A square matmul's best FLOP/s here: f32 1024^3 on a CPU (as benchmarks.peers), bf16 8192^3 elsewhere."""
    return square_matmul_peak(1024, dtype="float32") if on_cpu else square_matmul_peak(8192, dtype="bfloat16")


def copy_bandwidth(on_cpu: bool, repeats: int = 5) -> float:
    """Best bytes/s of `x * 2` over a float32 array here (each element read once and written once):
    64 MiB on a CPU, 4 GiB elsewhere (far above any cache)."""
    import jax
    import jax.numpy as jnp

    n = 2**24 if on_cpu else 2**30
    x = jax.random.uniform(jax.random.key(0), (n,), jnp.float32)
    double = jax.jit(lambda a: a * 2)
    jax.block_until_ready(double(x))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(double(x))
        best = min(best, time.perf_counter() - t0)
    return 2 * 4 * n / best


def peak_memory() -> dict:
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return {"peak_memory_bytes": int(stats["peak_bytes_in_use"]), "peak_memory_of": "device"}
    rss = peak_rss_bytes()
    return {"peak_memory_bytes": rss, "peak_memory_of": "host RSS"}


def build(cfg, mesh):
    """Random weights on the mesh: `(graphdef, params, parameter count)`."""
    import jax
    from flax import nnx

    from dapo_jax.models.decoder import Decoder

    with jax.set_mesh(mesh):
        model = Decoder(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    return graphdef, params, int(sum(x.size for x in jax.tree.leaves(params)))


def phase_train(args, cfg, mesh) -> dict:
    import jax
    import jax.numpy as jnp

    from dapo_jax.objectives.registry import load_objective
    from dapo_jax.parallel.host import to_global
    from dapo_jax.parallel.mesh import batch_sharding
    from dapo_jax.training.config.sections import OptimSection
    from dapo_jax.training.update.programs import make_update
    from dapo_jax.training.update.train_step import Batch, init_train_state, make_logprob_fn, make_optimizer

    graphdef, params, n_params = build(cfg, mesh)
    p, g, s, t = args.prompts, args.group, args.prompt_len, args.train_new_tokens
    rng = np.random.default_rng(0)
    prompt_len = rng.integers(s // 2, s + 1, size=p)
    pmask = (np.arange(s)[None] >= s - prompt_len[:, None]).astype(np.int32)  # left-padded
    pids = rng.integers(1, cfg.vocab_size, size=(p, s)).astype(np.int32) * pmask
    lengths = rng.integers(1, t + 1, size=(p, g))
    rmask = (np.arange(t)[None, None] < lengths[..., None]).astype(np.int32)
    rids = rng.integers(1, cfg.vocab_size, size=(p, g, t)).astype(np.int32) * rmask
    adv = rng.choice([-1.0, 1.0], size=(p, g, 1)).astype(np.float32) * rmask
    put = lambda x: to_global(x, batch_sharding(mesh))  # noqa: E731
    objective = load_objective("dapo", dynamic_sampling=False, overlong_buffer=None, max_response_length=t)
    optim = OptimSection(lr=1e-6, weight_decay=0.1, grad_clip=1.0, packing=True, micro_batches=args.micro_batches)
    tx, schedule = make_optimizer(optim)
    with jax.set_mesh(mesh):
        state = init_train_state(params, tx)
        pids_j, pmask_j, rids_j, rmask_j, adv_j = put((pids, pmask, rids, rmask, adv))
        old_logp, _ = make_logprob_fn(graphdef, temperature=1.0)(params, pids_j, pmask_j, rids_j, rmask_j)
        batch = Batch(pids_j, pmask_j, rids_j, rmask_j.astype(jnp.float32), old_logp, adv_j, jnp.zeros_like(old_logp))
        # the packed update as the trainer builds it (training/update/programs.py): a group's prompt shared only where
        # the attention can branch
        step, _ = make_update(graphdef, tx, schedule, objective=objective, optim=optim, temperature=1.0, mesh=mesh,
                              attention=cfg.attention, seq_len=s + t)
        times = []
        for i in range(args.steps + 1):
            t0 = time.perf_counter()
            state, metrics = step(state, batch)
            jax.block_until_ready((state, metrics))
            times.append(time.perf_counter() - t0)
        laid_out = step.packing_stats(batch)["packed_tokens"]
    seqs = (prompt_len[:, None] + lengths).ravel()
    flops = train_flops(cfg, n_params, laid_out, seqs)
    step_s = median(times[1:])
    return dict(params=n_params, step_s=step_s, first_step_s=times[0], flops=flops, flops_per_s=flops / step_s,
                sequences=p * g, real_tokens=int(seqs.sum()), laid_out_tokens=int(laid_out),
                mean_response_length=float(lengths.mean()), grad_norm=float(metrics["grad_norm"]))


def phase_decode(args, cfg, mesh, new_tokens: int) -> dict:
    import jax

    from dapo_jax.parallel.host import to_global
    from dapo_jax.parallel.mesh import batch_sharding
    from dapo_jax.sampling import SamplingConfig, make_generate

    graphdef, params, n_params = build(cfg, mesh)
    p, s = args.decode_prompts, args.prompt_len
    rng = np.random.default_rng(1)
    ids = rng.integers(1, cfg.vocab_size, size=(p, s)).astype(np.int32)
    mask = np.ones_like(ids)
    config = SamplingConfig(max_new_tokens=new_tokens, temperature=1.0, eos_token_ids=(), pad_token_id=0)
    generate = make_generate(graphdef, config, args.group)
    times = []
    with jax.set_mesh(mesh):
        ids_j, mask_j = to_global((ids, mask), batch_sharding(mesh))
        t0 = time.perf_counter()
        compiled = generate.lower(params, ids_j, mask_j, jax.random.key(0)).compile()
        compile_s = time.perf_counter() - t0
        for i in range(args.decode_calls):
            t0 = time.perf_counter()
            out = jax.block_until_ready(compiled(params, ids_j, mask_j, jax.random.key(i)))
            times.append(time.perf_counter() - t0)
    if int(np.asarray(out.lengths).min()) != new_tokens:
        raise RuntimeError(f"a sequence stopped before {new_tokens} tokens: the figure would not be tokens/s")
    tokens = p * args.group * new_tokens
    step_bytes, step_flops = decode_floor(cfg, rows=p * args.group, prompt_len=s, new_tokens=new_tokens)
    return dict(params=n_params, new_tokens=new_tokens, sequences=p * args.group, decode_s=median(times),
                compile_s=compile_s, tokens_per_s=tokens / median(times), step_bytes=step_bytes, step_flops=step_flops)


def run_phase(args) -> dict:
    import jax

    from dapo_jax.parallel.mesh import make_mesh

    cfg = model_config(args.quick, args.model)
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    dev = jax.devices()[0]
    on_cpu = dev.platform == "cpu"
    if args.phase == "train":
        res = phase_train(args, cfg, mesh)
        res["matmul_peak_flops_per_s"] = peak = matmul_peak(on_cpu)
        res["fraction_of_measured_peak"] = res["flops_per_s"] / peak
        nominal = nominal_peak(dev.device_kind)
        res["nominal_peak_flops_per_s"] = nominal
        res["mfu"] = None if nominal is None else res["flops_per_s"] / nominal
        res["estimate_s"] = None if nominal is None else res["flops"] / nominal  # the plan's: the FLOPs at the peak
    elif args.phase == "peaks":
        res = dict(matmul_peak_flops_per_s=matmul_peak(on_cpu), copy_bytes_per_s=copy_bandwidth(on_cpu),
                   nominal_peak_flops_per_s=nominal_peak(dev.device_kind))
    elif args.phase == "dapo_step":
        from benchmarks.dapo_step import phase_dapo_step  # JAX and the trainer: in the child only, as above

        res = phase_dapo_step(args, cfg, mesh, *build(cfg, mesh))
    else:
        res = phase_decode(args, cfg, mesh, int(args.phase.split("_")[1]))
        res["step_ms"] = 1e3 * res["decode_s"] / res["new_tokens"]
        res["estimate_step_ms"] = decode_estimate_ms(cfg, dev.device_kind, rows=res["sequences"],
                                                     prompt_len=args.prompt_len, new_tokens=res["new_tokens"])
    return dict(phase=args.phase, device=dev.device_kind, platform=dev.platform, jax=jax.__version__,
                quick=args.quick, model=args.model, **res, **peak_memory())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="a tiny shape and short lengths (the test; a CPU smoke run)")
    parser.add_argument("--phases", default=None, help="comma-separated: train,decode_512,decode_4096 (the default)")
    parser.add_argument("--phase", help=argparse.SUPPRESS)  # a child process: run one phase, print its result
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8, help="train: prompts per update")
    parser.add_argument("--group", type=int, default=16, help="G, for the update and for decoding")
    parser.add_argument("--prompt-len", dest="prompt_len", type=int, default=128)
    parser.add_argument("--train-new-tokens", dest="train_new_tokens", type=int, default=512)
    parser.add_argument("--gen-prompts", dest="gen_prompts", type=int, default=96,
                        help="dapo_step: prompts sampled per step (the 0.5B recipe's gen_batch)")
    parser.add_argument("--minibatches", type=int, default=1, help="dapo_step: updates per step")
    parser.add_argument("--micro-batches", dest="micro_batches", type=int, default=4,
                        help="train: micro-batches of the update (the 0.5B recipe's 4; chunks of half of one)")
    parser.add_argument("--decode-prompts", dest="decode_prompts", type=int, default=1)
    parser.add_argument("--decode-calls", dest="decode_calls", type=int, default=1,
                        help="decode: timed calls of the compiled rollout (their median)")
    parser.add_argument("--model", choices=sorted(MODELS), default="0.5b", help="the Qwen2.5 shape")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds a phase's process may run before it is killed (and reported failed)")
    parser.add_argument("--json", help="append each phase's result as a JSON line to this file")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.group, args.prompt_len, args.train_new_tokens, args.steps = 2, 4, 16, 32, 2
        args.micro_batches, args.gen_prompts = 2, 3
    if args.phase:
        emit(run_phase(args))
        return 0
    phases = (args.phases or ("train,decode_16,decode_64" if args.quick else "train,decode_512,decode_4096")).split(",")
    failed = 0
    for phase in phases:
        # the child sees this run's own arguments, and the one phase to run
        res = run_child("benchmarks.device", [*argv, "--phase", phase], timeout=args.timeout)
        if "error" in res:
            failed += 1
            print(f"[benchmarks.device] {phase} failed: {res['error'][-2000:]}", flush=True)
            res = {"phase": phase, "model": args.model, "sequences": args.decode_prompts * args.group, **res}
        else:
            print(format_result(res), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(res) + "\n")
    return 1 if failed else 0


def format_result(r: dict) -> str:
    mem = f"peak memory {r['peak_memory_bytes'] / 2**30:.2f} GiB ({r['peak_memory_of']})"
    head = f"[benchmarks.device] {r['device']} ({r['platform']}, jax {r['jax']}) {r['model']} {r['phase']}:"
    if r["phase"] == "peaks":
        return (f"{head} matmul {r['matmul_peak_flops_per_s'] / 1e12:.2f} TFLOP/s, "
                f"copy {r['copy_bytes_per_s'] / 1e9:.1f} GB/s (read + written)")
    if r["phase"] == "dapo_step":
        return (f"{head} step {r['step_s']:.2f} s = rollout {r['rollout_s']:.2f} s ({r['gen_sequences']} sequences x "
                f"{r['new_tokens']} tokens, {r['rollout_tokens_per_s']:.0f} tokens/s) + log pi_old "
                f"{r['old_logp_s']:.2f} s + updates {r['update_s']:.2f} s ({r['train_sequences']} sequences); "
                f"first step {r['first_step_s']:.1f} s; {mem}")
    if r["phase"] == "train":
        mfu = ("n/a (no nominal peak for this device)" if r["mfu"] is None
               else f"{100 * r['mfu']:.1f}% (the plan's estimate at the peak: {r['estimate_s']:.3f} s)")
        return (f"{head} step {r['step_s']:.3f} s ({r['sequences']} sequences, {r['real_tokens']} tokens, "
                f"{r['laid_out_tokens']} laid out), {r['flops_per_s'] / 1e12:.2f} TFLOP/s, MFU {mfu}, "
                f"{100 * r['fraction_of_measured_peak']:.1f}% of the measured matmul peak "
                f"({r['matmul_peak_flops_per_s'] / 1e12:.2f} TFLOP/s); {mem}")
    est = "" if r["estimate_step_ms"] is None else (
        f" against the plan's estimate of {r['estimate_step_ms']:.3f} ms ({r['step_ms'] / r['estimate_step_ms']:.1f}x)")
    return (f"{head} {r['sequences']} sequences x {r['new_tokens']} new tokens in {r['decode_s']:.2f} s: "
            f"{r['tokens_per_s']:.0f} tokens/s, {r['step_ms']:.3f} ms a decode step{est} "
            f"(compiled in {r['compile_s']:.1f} s); {mem}")


if __name__ == "__main__":
    sys.exit(main())
