"""Time and peak memory of the chunked log-prob/entropy kernel against the full-logits version.

    python -m benchmarks.logprobs                 # B=8, T=2048, V=151,936, d=896 (Qwen2.5-0.5B head)
    python -m benchmarks.logprobs --quick         # B=2, T=256, V=32,000, d=256: seconds
    python -m benchmarks.logprobs --batch 1 --variants naive,chunked

Every (variant, mode) runs in its own subprocess so that its peak RSS is honest. Each reports:
the compiled executable's temporary buffers (`memory_analysis().temp_size_in_bytes`, what XLA
allocates beyond inputs and outputs), the process's peak RSS and its RSS before compiling (inputs
included), compile time, and the run time (median of `--repeats` runs of the compiled function).
A variant whose compiled temporaries exceed `--max-run-gb` is compiled but not run: its memory
figure is then what it would need, which is the point of the kernel.
"""

from __future__ import annotations

import argparse
import time

from benchmarks.harness import emit, median, peak_rss_bytes, run_child

VARIANTS = ("naive", "chunked", "chunked_vocab")
MODES = ("fwd", "fwd_bwd")


def worker(args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dapo_jax.models.logprobs import naive_token_logprobs, token_logprobs

    b, t, v, d = args.batch, args.seq, args.vocab, args.hidden
    dtype = jnp.dtype(args.dtype)
    # float32 straight from NumPy, one array at a time: building the inputs must not set the peak RSS.
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.standard_normal((b, t, d), dtype=np.float32), dtype)
    w_np = rng.standard_normal((d, v), dtype=np.float32)
    w_np *= 0.05
    w = jnp.asarray(w_np, dtype)
    del w_np
    y = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
    jax.block_until_ready((h, w, y))

    if args.variant == "naive":
        kernel = lambda h, w: naive_token_logprobs(h, w, y, temperature=args.temperature)  # noqa: E731
    else:
        vocab_chunk = args.vocab_chunk if args.variant == "chunked_vocab" else None
        kernel = lambda h, w: token_logprobs(  # noqa: E731
            h, w, y, temperature=args.temperature, chunk_size=args.chunk_size, vocab_chunk=vocab_chunk
        )

    if args.mode == "fwd":
        fn = kernel
    else:
        def loss(h, w):
            logp, entropy = kernel(h, w)
            return jnp.sum(logp) + 0.01 * jnp.sum(entropy)  # an entropy bonus: both cotangents live

        fn = jax.value_and_grad(loss, argnums=(0, 1))

    rss_before = peak_rss_bytes()
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(h, w).compile()
    compile_s = time.perf_counter() - start
    stats = compiled.memory_analysis()
    temp = None if stats is None else int(stats.temp_size_in_bytes)
    out = dict(temp_bytes=temp, compile_s=compile_s, rss_before=rss_before)
    if temp is not None and temp > args.max_run_gb * 2**30:
        out["skipped"] = f"compiled temporaries {temp / 2**30:.1f} GiB > --max-run-gb {args.max_run_gb}"
        return out
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(h, w))
        times.append(time.perf_counter() - start)
    out.update(run_s=median(times), peak_rss=peak_rss_bytes())
    return out


def run_variant(args, variant, mode) -> dict:
    child = ["--worker", "--variant", variant, "--mode", mode]
    for key in ("batch", "seq", "vocab", "hidden", "chunk_size", "vocab_chunk", "temperature", "dtype",
                "repeats", "max_run_gb"):
        child += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    return run_child("benchmarks.logprobs", child)


def gib(x):
    return "-" if x is None else f"{x / 2**30:.2f}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="B=2, T=256, V=32000, d=256")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--chunk-size", type=int, default=128)
    p.add_argument("--vocab-chunk", type=int, default=16384)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--max-run-gb", type=float, default=12.0,
                   help="compile but do not run a variant whose temporaries exceed this (the machine is shared)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.seq, args.vocab, args.hidden = 2, 256, 32000, 256
        args.chunk_size, args.vocab_chunk, args.repeats = 64, 4096, 3
    if args.worker:
        emit(worker(args))
        return

    b, t, v, d = args.batch, args.seq, args.vocab, args.hidden
    print(f"B={b} T={t} V={v} d={d} dtype={args.dtype} chunk_size={args.chunk_size} "
          f"vocab_chunk={args.vocab_chunk} (chunked_vocab only); full fp32 logits = "
          f"B*T*V*4 = {gib(b * t * v * 4)} GiB")
    header = ("variant", "mode", "temp GiB", "peak RSS GiB", "RSS before GiB", "compile s", "run s")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    results = {}
    for mode in args.modes.split(","):
        for variant in args.variants.split(","):
            r = results[variant, mode] = run_variant(args, variant, mode)
            if "error" in r:
                print(f"| {variant} | {mode} | {r['error']} |", flush=True)
                continue
            run = r.get("skipped", f"{r.get('run_s', 0):.2f}")
            print(f"| {variant} | {mode} | {gib(r['temp_bytes'])} | {gib(r.get('peak_rss'))} | "
                  f"{gib(r['rss_before'])} | {r['compile_s']:.1f} | {run} |", flush=True)
    for mode in args.modes.split(","):
        naive = results.get(("naive", mode), {})
        for variant in ("chunked", "chunked_vocab"):
            ours = results.get((variant, mode), {})
            if not naive.get("temp_bytes") or not ours.get("temp_bytes"):
                continue
            line = f"{mode}: naive/{variant} temporaries = {naive['temp_bytes'] / ours['temp_bytes']:.1f}x"
            if "run_s" in naive and "run_s" in ours:
                line += f", time naive/{variant} = {naive['run_s'] / ours['run_s']:.2f}x"
                line += f", peak RSS naive/{variant} = {naive['peak_rss'] / ours['peak_rss']:.2f}x"
            print(line)


if __name__ == "__main__":
    main()
