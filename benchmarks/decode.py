"""One decode step (`models.decode.decode_step`) with the fused `[q|k|v]` / `[gate|up]` projections against the
same step with the separate ones (the baseline, in the same process), on whatever JAX sees.

    python -m benchmarks.decode                       # Qwen2.5-0.5B's layer shape, 4 layers, 16 rows, float32
    python -m benchmarks.decode --layers 24 --rows 64 --context 512

Both variants run the same function (`Block.decode` with and without `Block.fused()`; `tests/models/test_decode.py`
checks that they agree): the difference is two matmuls per layer instead of five, the fused kernels built once
outside the step as the rollout builds them. Each is compiled once,
warmed up, then timed as the median of `--repeats` steps; beside each, its kernels per layer (`benchmarks.lowering`)
and `bytes accessed` from XLA's cost analysis. The variants alternate, so a change of load hits both.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks.harness import median
from benchmarks.lowering import analyse
from benchmarks.step_memory import QWEN25_05B
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decode import PromptCache, decode_step, empty_response_cache, fused_layers
from dapo_jax.models.decoder import Decoder


def step_inputs(cfg: ModelConfig, rows: int, context: int):
    """A prompt cache of `context` slots for `rows` single-sample prompts, a one-slot block, a token per row."""
    h_kv, d, dtype = cfg.num_key_value_heads, cfg.head_dim, jnp.dtype(cfg.dtype)
    keys = jax.random.split(jax.random.key(0), 2 * cfg.num_hidden_layers)
    k = tuple(jax.random.normal(keys[2 * i], (rows, h_kv, d, context), dtype) for i in range(cfg.num_hidden_layers))
    v = tuple(jax.random.normal(keys[2 * i + 1], (rows, h_kv, context, d), dtype) for i in range(cfg.num_hidden_layers))
    prompt = PromptCache(k, v, jnp.full((rows,), context, jnp.int32))
    return prompt, empty_response_cache(prompt, 1, 1), jnp.ones((rows,), jnp.int32), jnp.full((rows,), context, jnp.int32)


def step_fn(graphdef):
    """A jitted decode step taking the fused kernels as an input (the rollout builds them once, outside its
    loop); `()` for them runs each block's separate projections."""
    def step(state, fused, prompt, block, tokens, positions):
        model = nnx.merge(graphdef, state)
        fused = fused or (None,) * len(model.layers)
        return decode_step(model, fused, prompt, None, block, tokens, positions, jnp.int32(0))

    return jax.jit(step)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dtype", default="float32", help="float32 on a CPU (its bf16 dots are emulated); bfloat16 elsewhere")
    args = parser.parse_args(argv)
    cfg = ModelConfig.from_hf_dict({**QWEN25_05B, "num_hidden_layers": args.layers}, param_dtype=args.dtype,
                                   dtype=args.dtype)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    cache = step_inputs(cfg, args.rows, args.context)
    inputs = {"fused": (state, fused_layers(model), *cache), "separate (baseline)": (state, (), *cache)}
    step = step_fn(graphdef)
    compiled = {name: step.lower(*x).compile() for name, x in inputs.items()}
    times = {name: [] for name in compiled}
    for name, fn in compiled.items():
        jax.block_until_ready(fn(*inputs[name]))
    for _ in range(args.repeats):
        for name, fn in compiled.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*inputs[name]))
            times[name].append(time.perf_counter() - t0)
    dev = jax.devices()[0]
    print(f"{dev.device_kind} ({dev.platform}, jax {jax.__version__}): Qwen2.5-0.5B's layer shape x {args.layers} "
          f"layers, {args.dtype}, {args.rows} rows over {args.context} cached slots, median of {args.repeats} steps")
    print("| projections | step ms | kernels | kernels per layer (all / dots) | bytes accessed |")
    print("|---|---|---|---|---|")
    for name, fn in compiled.items():
        report = analyse(fn.as_text())
        dots = fn.as_text().count(" dot(") + sum(report["custom_calls"].get(t, 0) for t in report["custom_calls"]
                                                if "gemm" in t or "matmul" in t)
        cost = fn.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        print(f"| {name} | {1e3 * median(times[name]):.2f} | {report['kernels']} | "
              f"{report['kernels'] / args.layers:.1f} / {dots / args.layers:.1f} | {cost['bytes accessed']:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
