"""top-p / top-k without a vocabulary sort: the new `truncation_mask` vs the sorted reference.

    python -m benchmarks.topp                          # V 99, 32000, 151936; B 8, 64
    python -m benchmarks.topp --vocab 151936 --batch 8 --repeats 9

For each vocabulary size V, batch B, truncation setting and logit shape it times, jitted and after a
warm-up call, the filter alone (`truncation_mask` on `[B, V]` float32 log-probs) and a whole draw
(`draw_tokens` on float32 logits, temperature 0.7), both with the new filter and with the previous
one that sorts (`processors._truncation_mask_sorted`), interleaved, `--repeats` times; it prints the
medians in milliseconds and sorted / new. `same` says whether both kept the same tokens and drew
the same tokens with the same log-probs. `top_p = 1` gives the plain draw's time for comparison.

Logit shapes: `peaked` is a language model's next-token distribution (a tail of N(0, 2) logits
and 8 tokens about 16 nats above it, so the nucleus holds a few tokens); `flat` is N(0, 1) logits
(at top_p 0.7 about half the vocabulary is kept: the new filter's slowest case, the bisection
over the whole vocabulary).
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from unittest import mock

import numpy as np

from benchmarks.harness import median, median_time

SETTINGS = [  # (top_k, top_p, logit shapes)
    (0, 0.7, ("peaked", "flat")),
    (20, 1.0, ("peaked",)),
    (50, 1.0, ("peaked",)),
    (50, 0.7, ("peaked",)),
]


def make_logits(shape: str, batch: int, vocab: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if shape == "flat":
        return rng.normal(size=(batch, vocab)).astype(np.float32)
    logits = rng.normal(size=(batch, vocab)) * 2.0
    for row in logits:
        head = rng.choice(vocab, size=min(8, vocab), replace=False)
        row[head] = 16.0 + 2.0 * rng.normal(size=head.size)
    return logits.astype(np.float32)


def compiled_pair(top_k: int, top_p: float):
    """Jitted (filter, draw) for the new filter and for the sorted reference."""
    import jax

    from dapo_jax.sampling import SamplingConfig, processors

    config = SamplingConfig(max_new_tokens=1, temperature=0.7, top_k=top_k, top_p=top_p)
    out = {}
    for name, fn in (("new", processors.truncation_mask), ("sorted", processors._truncation_mask_sorted)):
        mask = jax.jit(lambda logp, fn=fn: fn(logp, top_k=top_k, top_p=top_p))

        def draw(u, logits, fn=fn):
            # draw_tokens looks the filter up when it is traced: trace it under the patch
            with mock.patch.object(processors, "truncation_mask", fn):
                return processors.draw_tokens(u, logits, config=config)

        out[name] = (mask, jax.jit(draw))
    return out


def bench_one(vocab: int, batch: int, top_k: int, top_p: float, shape: str, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp

    logits = jnp.asarray(make_logits(shape, batch, vocab))
    logp = jax.nn.log_softmax(logits / 0.7, axis=-1)
    uniform = jax.random.uniform(jax.random.key(1), (batch,))
    fns = compiled_pair(top_k, top_p)
    results = {}
    for name, (mask, draw) in fns.items():  # warm-up: compile and run once
        results[name] = (jax.block_until_ready(mask(logp)), jax.block_until_ready(draw(uniform, logits)))
    same = bool(np.array_equal(results["new"][0], results["sorted"][0])) and all(
        np.array_equal(a, b) for a, b in zip(results["new"][1], results["sorted"][1])
    )
    times = {(name, what): [] for name in fns for what in ("mask", "draw")}
    for _ in range(repeats):
        for name, (mask, draw) in fns.items():
            for what, call in (("mask", lambda: mask(logp)), ("draw", lambda: draw(uniform, logits))):
                start = time.perf_counter()
                jax.block_until_ready(call())
                times[name, what].append(time.perf_counter() - start)
    ms = {key: 1e3 * median(v) for key, v in times.items()}
    return dict(vocab=vocab, batch=batch, top_k=top_k, top_p=top_p, shape=shape, same=same, ms=ms,
                kept=float(np.asarray(results["new"][0]).sum(-1).mean()))


def plain_draw_ms(vocab: int, batch: int, repeats: int) -> float:
    import jax
    import jax.numpy as jnp

    from dapo_jax.sampling import SamplingConfig
    from dapo_jax.sampling.processors import draw_tokens

    config = SamplingConfig(max_new_tokens=1, temperature=0.7)
    logits = jnp.asarray(make_logits("peaked", batch, vocab))
    uniform = jax.random.uniform(jax.random.key(1), (batch,))
    draw = jax.jit(lambda u, x: draw_tokens(u, x, config=config))
    return 1e3 * median_time(draw, uniform, logits, repeats=repeats)[1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, nargs="+", default=[99, 32000, 151936])
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)

    import jax

    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPU cores, "
          f"{datetime.date.today()}, load average {os.getloadavg()[0]:.1f}; medians of {args.repeats}, ms")
    print(f"{'V':>7} {'B':>3} {'top_k':>5} {'top_p':>5} {'logits':>6} {'kept':>8} | "
          f"{'filter sorted':>13} {'new':>7} {'ratio':>6} | {'draw sorted':>11} {'new':>7} {'ratio':>6} "
          f"{'top_p=1':>7} | same")
    for vocab in args.vocab:
        for batch in args.batch:
            plain = plain_draw_ms(vocab, batch, args.repeats)
            for top_k, top_p, shapes in SETTINGS:
                for shape in shapes:
                    r = bench_one(vocab, batch, top_k, top_p, shape, args.repeats)
                    ms = r["ms"]
                    print(f"{vocab:>7} {batch:>3} {top_k:>5} {top_p:>5} {shape:>6} {r['kept']:>8.1f} | "
                          f"{ms['sorted', 'mask']:>13.2f} {ms['new', 'mask']:>7.2f} "
                          f"{ms['sorted', 'mask'] / ms['new', 'mask']:>5.1f}x | "
                          f"{ms['sorted', 'draw']:>11.2f} {ms['new', 'draw']:>7.2f} "
                          f"{ms['sorted', 'draw'] / ms['new', 'draw']:>5.1f}x {plain:>7.2f} | {r['same']}", flush=True)


if __name__ == "__main__":
    main()
