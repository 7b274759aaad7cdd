"""Where a policy update's time goes on this backend: XLA ops by kind, from a profiler trace.

    python -m benchmarks.update_ops                    # 5M bench model, one packed chunk [32, 80]
    python -m benchmarks.update_ops --size 15m --rows 32 --length 80
    python -m benchmarks.update_ops --size cot --rows 32 --length 192   # the main job's model and chunk

Prints, for one forward + backward of `packed_logprobs` on a packed chunk of the `benchmarks.peers`
model (random weights, segments of 10-59 tokens): the median wall time, the matmul FLOP rate (6 x
matmul parameters x positions), and the wall time attributed to each kind of XLA op (time split
equally among the ops running at once; `idle` = no op running between the first and last op).

The chunk runs twice: with the decoder's causal query blocks (`models/attention.causal_blocks`: a block of
queries attends to the keys up to its end only) and with one block over the whole L x L square.
`--size cot` is the main job's model (`dapo_jax/assets/cot_base`) on its update's chunk shape, with
sequences of 50-189 tokens.

Then the MLP alone, `[B, S, d]` activations against the same tokens flattened to `[B*S, d]`: the
weight gradient of a projection over `[B, S, d]` contracts two axes, and XLA's CPU backend first writes
transposed copies of the activations (`copy_bitcast_fusion`); over one axis its dot takes them as they
are. `models/decoder.py` projects `[B*S, d]` for this reason (docs/benchmarks.md, "Tokens on one axis").
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import median_time
from benchmarks.workload import SIZES


def median_s(fn, *args, repeats: int) -> float:
    return median_time(fn, *args, repeats=repeats)[1]


def op_kinds(fn, *args, runs: int = 2) -> tuple[dict, float, float]:
    """({op kind: wall ms per run}, idle ms per run, span ms per run) from a `jax.profiler` trace."""
    import jax

    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(runs):
                jax.block_until_ready(fn(*args))
        data = jax.profiler.ProfileData.from_file(glob.glob(d + "/**/*.xplane.pb", recursive=True)[0])
        bounds = []
        for plane in data.planes:
            for line in plane.lines:
                if not line.name.startswith("tf_XLA"):  # the threads that run XLA's ops (Eigen pool, client)
                    continue
                for ev in line.events:
                    if "::" in ev.name or ev.name.startswith("end:"):  # runtime bookkeeping, not an op
                        continue
                    kind = re.sub(r"\.\d+$", "", ev.name)
                    bounds += [(ev.start_ns, 1, kind), (ev.start_ns + ev.duration_ns, -1, kind)]
    bounds.sort(key=lambda b: (b[0], b[1]))
    running, wall, idle = collections.Counter(), collections.Counter(), 0.0
    last = first = bounds[0][0]
    for t, delta, kind in bounds:
        total = sum(running.values())
        if t > last:
            if total == 0:
                idle += t - last
            for k, c in running.items():
                if c:
                    wall[k] += (t - last) * c / total
        running[kind] += delta
        last = t
    ms = 1e6 * runs
    return {k: v / ms for k, v in wall.most_common()}, idle / ms, (last - first) / ms


def model_config(size: str):
    """The bench model of that size (benchmarks/peers.py), or `cot`: the main job's `cot_base` shape."""
    from dapo_jax.models.config import ModelConfig

    if size == "cot":
        hf = json.loads((Path(__file__).resolve().parents[1] / "dapo_jax/assets/cot_base/config.json").read_text())
        return ModelConfig.from_hf_dict(hf), (50, 190)
    return ModelConfig(model_type="qwen2", vocab_size=99, tie_word_embeddings=False, **SIZES[size]), (10, 60)


def chunk(size: str, rows: int, length: int, repeats: int) -> None:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import dapo_jax.models.attention as attention
    from dapo_jax.models.decoder import Decoder
    from dapo_jax.training.update.packed_step import packed_logprobs

    cfg, (short, long) = model_config(size)
    graphdef, params = nnx.split(Decoder(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, cfg.vocab_size, (rows, length)).astype(np.int32)
    segs, pos = np.zeros((rows, length), np.int32), np.zeros((rows, length), np.int32)
    for r in range(rows):  # sequences of short..long-1 tokens end to end, as pack_groups lays them
        offset, seg = 0, 1
        while offset < length - short:
            n = min(int(rng.integers(short, long)), length - offset)
            segs[r, offset:offset + n], pos[r, offset:offset + n] = seg, np.arange(n)
            offset, seg = offset + n, seg + 1

    def loss(p):
        logp, _ = packed_logprobs(nnx.merge(graphdef, p), tokens, segs, pos, tokens, temperature=1.0)
        return jnp.sum(logp * (segs > 0))

    matmul_params = sum(x.size for path, x in jax.tree_util.tree_leaves_with_path(params)
                        if x.ndim == 2 and "embed_tokens" not in jax.tree_util.keystr(path))
    if cfg.tie_word_embeddings:
        matmul_params += cfg.vocab_size * cfg.hidden_size  # the tied embedding is also the output matmul
    flops = 6 * matmul_params * rows * length
    default_block = attention.ATTENTION_BLOCK
    for name, block in (("causal blocks", default_block), ("one block", 10 ** 9)):
        attention.ATTENTION_BLOCK = block  # read when the chunk is traced
        try:
            grad = jax.jit(jax.grad(loss))
            t = median_s(grad, params, repeats=repeats)
            kinds, idle, span = op_kinds(grad, params)
        finally:
            attention.ATTENTION_BLOCK = default_block
        print(f"{size} packed chunk [{rows}, {length}] forward + backward, {name} "
              f"({len(attention.causal_blocks(length)) if block == default_block else 1} query blocks): median "
              f"{t * 1e3:.1f} ms over {repeats}, {flops / t / 1e9:.1f} GFLOP/s (matmuls, every position), "
              f"fill {np.mean(segs > 0):.2f}")
        print(f"  traced span {span:.1f} ms/run, idle {idle:.1f} ms; by op kind (wall ms/run): "
              + ", ".join(f"{k} {v:.1f}" for k, v in list(kinds.items())[:12]))


def mlp(size: str, rows: int, length: int, repeats: int) -> None:
    import jax
    import jax.numpy as jnp

    cfg, _ = model_config(size)
    d, f = cfg.hidden_size, cfg.intermediate_size
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(rows, length, d)), jnp.float32)
    ws = [jnp.asarray(rng.normal(size=s) * 0.05, jnp.float32) for s in ((d, f), (d, f), (f, d))]

    def block(x, wg, wu, wd):
        return (jax.nn.silu(x @ wg) * (x @ wu)) @ wd

    variants = {"[B, S, d]": block, "[B*S, d]": lambda x, *w: block(x.reshape(-1, d), *w).reshape(x.shape)}
    for name, fn in variants.items():
        grad = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a) ** 2), argnums=(0, 1, 2, 3)))
        t = median_s(grad, x, *ws, repeats=repeats)
        kinds, _, _ = op_kinds(grad, x, *ws)
        print(f"  MLP {name:9s} forward + backward {t * 1e3:7.1f} ms; transposed copies (copy_bitcast_fusion) "
              f"{kinds.get('copy_bitcast_fusion', 0.0):.1f} ms")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="5m", choices=[*SIZES, "cot"])
    ap.add_argument("--rows", type=int, default=32, help="packed rows (bench_peers: half of P*G = 64)")
    ap.add_argument("--length", type=int, default=80, help="row length (bench_peers: S + T = 80)")
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args(argv)
    import jax

    print(f"[bench_update_ops] {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, jax {jax.__version__} on "
          f"{jax.devices()[0].platform}")
    chunk(a.size, a.rows, a.length, a.repeats)
    print(f"MLP of the {a.size} model alone on [{a.rows * 2}, {a.length}] tokens (the unpacked bench batch):")
    mlp(a.size, a.rows * 2, a.length, a.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
