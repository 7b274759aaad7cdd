"""Update time packed vs unpacked on the cot_dapo shapes (P=16 prompts x G=8, S=48, T=144, 2 mini-batches)
with the shipped cot_base model and a synthetic length distribution (prompts 10-45 tokens, responses
uniform in [18, MAX_LEN]): the same batch through `make_train_step` and `PackedUpdate` (the
trainer's default: shared prompts, tails of R/2; and each response after its own prompt,
with half-height tails and with none).

    python -m benchmarks.packing [--max-len 100] [--repeats 3] [--rows 32]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.harness import median
from dapo_jax.models.hf_io import load_pretrained
from dapo_jax.objectives.registry import load_objective
from dapo_jax.training.config.sections import OptimSection
from dapo_jax.training.update.packed_step import PackedUpdate, default_chunk_rows, packing_stats
from dapo_jax.training.update.train_step import Batch, init_train_state, make_optimizer, make_train_step

ROOT = Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-len", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", type=int, default=None,
                    help="optim.packing_rows (default: the trainer's default_chunk_rows, 32 here)")
    a = ap.parse_args()
    P, G, S, T = 16, 8, 48, 144
    model = load_pretrained(ROOT / "dapo_jax/assets/cot_base", param_dtype="float32", dtype="float32")
    graphdef, params = nnx.split(model)
    V = model.config.vocab_size
    rng = np.random.default_rng(0)
    plen = rng.integers(10, 46, P)
    rlen = rng.integers(18, a.max_len + 1, (P, G))
    rmask = (np.arange(T) < rlen[..., None]).astype(np.float32)
    batch = Batch(jnp.asarray(rng.integers(1, V, (P, S)), jnp.int32),
                  jnp.asarray((np.arange(S) >= S - plen[:, None]).astype(np.int32)),
                  jnp.asarray(rng.integers(1, V, (P, G, T)), jnp.int32), jnp.asarray(rmask),
                  jnp.asarray(-2.0 + 0.1 * rng.normal(size=(P, G, T)) * rmask, jnp.float32),
                  jnp.asarray(np.repeat(rng.normal(size=(P, G, 1)), T, 2) * rmask, jnp.float32),
                  jnp.zeros((P, G, T), jnp.float32))
    objective = load_objective("dapo", max_response_length=T, overlong_buffer=16)
    tx, schedule = make_optimizer(OptimSection(lr=1e-5))
    kw = dict(objective=objective, num_minibatches=2, micro_batches=1)
    rows = a.rows or default_chunk_rows(P // 2 * G, G)
    variants = {  # name: (tail step, shared prompts); the first is the trainer's default
        "packed": (None, True),
        "packed, own prompts, half tails": (-(-rows // 2), False),
        "packed, own prompts, no tails": (0, False),
    }
    steps = {"unpacked": make_train_step(graphdef, tx, schedule, **kw)}
    st = packing_stats(batch, 2, 1, a.rows)
    print(f"real tokens {st['real_tokens']}, unpacked positions {st['unpacked_positions']} "
          f"({st['unpacked_chunks']} chunks of {P // 2 * G} x {S + T}), mean response {rlen.mean():.1f} of {T}")
    for name, (tail, share) in variants.items():
        steps[name] = PackedUpdate(graphdef, tx, schedule, chunk_rows=a.rows, tail_rows=tail,
                                   share_prompts=share, **kw)
        st = steps[name].packing_stats(batch)
        print(f"{name}: {st['packed_tokens']} tokens laid out in {st['packed_positions']} positions "
              f"({st['chunks']} chunks, {st['tail_chunks']} of them tails of fewer than {rows} rows x {S + T})")
    for name, step in steps.items():
        state = init_train_state(jax.tree.map(jnp.copy, params), tx)
        t0 = time.perf_counter()
        state, m = step(state, batch)
        jax.block_until_ready(state)
        first = time.perf_counter() - t0
        times = []
        for _ in range(a.repeats):
            state = init_train_state(jax.tree.map(jnp.copy, params), tx)
            t0 = time.perf_counter()
            state, m = step(state, batch)
            jax.block_until_ready(state)
            times.append(time.perf_counter() - t0)
        print(f"{name:32s} first call {first:6.2f} s, then median {median(times):6.2f} s over {a.repeats}; "
              f"loss {float(m['loss']):.6f} grad_norm {float(m['grad_norm']):.6f}")


if __name__ == "__main__":
    main()
