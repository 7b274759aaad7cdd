"""Generation on ragged response lengths: the sampler with and without active-row compaction, and
continuous batching.

    python -m benchmarks.long_tail                       # both setups below
    python -m benchmarks.long_tail --setups geometric --new-tokens 512 --repeats 5
    python -m benchmarks.long_tail --stream-rounds 0     # without the continuous-batching lines

Setups (each: the same prompts and keys for both samplers; the outputs are checked identical):
- `cot`: the chain-of-thought task's base model (dapo_jax/assets/cot_base) with the cot_dapo recipe's
  rollout settings (16 prompts x G = 8, 144 new tokens, temperature 1).
- `geometric`: a random qwen2 model (benchmarks.sampler's `5m` size) whose near-uniform policy stops at
  each step with probability ~k/V, k = the number of EOS ids: a geometric length distribution with
  mean ~`--mean-frac` x T and a tail to T.

Printed per setup: real (unpadded) tokens per second of each sampler (best of `--repeats`,
interleaved, compile excluded), their ratio, the mean response length, the row-steps each decodes
(rows x forwards, the padded work) and the compile times.

Then, with `--stream-rounds R` (default 3): R x P prompts (the setup's P prompts, R times, other keys)
through `generate` in R calls of P prompts (plain and compacted) against one stream of
`sampling/continuous.py` with P slots refilled `--refill` at a time: real tokens per second of each
(best of `--repeats`, interleaved, compile excluded) and the continuous sampler's ratio to both.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from benchmarks.harness import REPO


def cot_setup(args):
    from dapo_jax.data import cot
    from dapo_jax.models.hf_io import load_pretrained, load_tokenizer
    from dapo_jax.training.config.run import load_config

    cfg = load_config(REPO / "dapo_jax" / "configs" / "cot_dapo.yaml")
    path = REPO / cfg.model.path
    tok = load_tokenizer(path)
    options = cfg.data.train.options
    rows = cot.cot_rows("train", seed=cfg.data.seed, **options)[: args.cot_prompts or cfg.rollout.gen_batch]
    s = cfg.data.max_prompt_length
    enc = [tok.encode(r["prompt"], add_special_tokens=False) for r in rows]
    ids = np.array([[tok.pad_token_id] * (s - len(e)) + e for e in enc], np.int32)
    mask = (np.arange(s)[None] >= np.array([s - len(e) for e in enc])[:, None]).astype(np.int32)
    r = cfg.rollout
    sampling = dict(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                    eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id)
    return load_pretrained(path), ids, mask, r.G, sampling


def geometric_setup(args):
    from benchmarks.sampler import SIZES, build_models, hf_dict, make_prompts

    from dapo_jax.sampling import pad_to_bucket

    hf = hf_dict(*SIZES["5m"])
    model, _ = build_models(hf, "float32", with_torch=False)
    vocab, t = hf["vocab_size"], args.new_tokens
    k = max(1, round(vocab / (args.mean_frac * t)))  # P(stop) ~ k / V per step: mean ~ V / k
    ids, mask = pad_to_bucket(make_prompts(args.prompts, 32, vocab), (32,), pad_id=0)
    eos = tuple(range(vocab - k, vocab))  # never in the prompts' low ids, so the draw decides alone
    sampling = dict(max_new_tokens=t, temperature=1.0, eos_token_ids=eos, pad_token_id=0)
    return model, ids, mask, args.group, sampling


def row_steps(lengths: np.ndarray, stages: list[int]) -> int:
    """Rows x decode forwards: the forward drawing token t runs the current stage's rows; a stage
    ends once at most the next stage's rows still need a token (length > t)."""
    total, stage, t = 0, 0, 1
    while t < lengths.max():
        while stage + 1 < len(stages) and int((lengths > t).sum()) <= stages[stage + 1]:
            stage += 1
        total += stages[stage]
        t += 1
    return total


def bench(name, setup, args):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dapo_jax.sampling import SamplingConfig, make_generate
    from dapo_jax.sampling.compaction import stage_sizes

    model, ids, mask, g, sampling = setup(args)
    graphdef, state = nnx.split(model)
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)
    b = ids.shape[0] * g
    gens, compile_s = {}, {}
    for on in (False, True):
        config = SamplingConfig(**sampling, compaction=on, compaction_min_rows=args.min_rows)
        gens[on] = make_generate(graphdef, config, g)
        t0 = time.perf_counter()
        jax.block_until_ready(gens[on](state, ids, mask, jax.random.key(0)))
        compile_s[on] = time.perf_counter() - t0
    times = {False: [], True: []}
    tokens, row = 0, np.zeros(2)
    for i in range(args.repeats):
        outs = {}
        for on in (False, True):
            t0 = time.perf_counter()
            outs[on] = jax.block_until_ready(gens[on](state, ids, mask, jax.random.key(i + 1)))
            times[on].append(time.perf_counter() - t0)
        np.testing.assert_array_equal(outs[False].response_ids, outs[True].response_ids)
        lengths = np.asarray(outs[True].lengths).ravel()
        tokens += int(lengths.sum())
        stages = stage_sizes(b, enabled=True, min_rows=args.min_rows)
        row += (row_steps(lengths, [b]), row_steps(lengths, stages))
    per_call = tokens / args.repeats
    best = {on: min(v) for on, v in times.items()}
    mean_len = per_call / b
    print(f"{name:>10} rows {b:4d} T {sampling['max_new_tokens']:4d} mean len {mean_len:6.1f} "
          f"| plain {per_call / best[False]:8.0f} tok/s | compacted {per_call / best[True]:8.0f} tok/s "
          f"| ratio {best[False] / best[True]:5.2f}x | row-steps {row[1] / row[0]:.2f} of plain "
          f"| compile s {compile_s[False]:.1f} / {compile_s[True]:.1f}", flush=True)
    print(f"{'':>10} plain s {[round(x, 3) for x in times[False]]}  compacted s {[round(x, 3) for x in times[True]]}")
    if args.stream_rounds:
        bench_stream(name, gens, graphdef, state, ids, mask, g, sampling, args)


def bench_stream(name, gens, graphdef, state, ids, mask, g, sampling, args):
    """R rounds of `generate` (plain, compacted) against one continuous stream of the same R x P prompts."""
    import jax

    from dapo_jax.sampling import SamplingConfig
    from dapo_jax.sampling.continuous import ContinuousSampler

    p, s = ids.shape
    rounds = args.stream_rounds
    refill = args.refill or max(1, p // 4)
    sampler = ContinuousSampler(graphdef, SamplingConfig(**sampling), num_samples=g, slots=p, refill=refill,
                                prompt_width=s)
    host_ids, host_mask = np.asarray(ids), np.asarray(mask)

    def stream(key) -> int:
        served = [0]

        def next_prompts(n):
            rows = [(served[0] + j) % p for j in range(n)]
            served[0] += n
            return host_ids[rows], host_mask[rows], rows

        return sum(int(np.asarray(c.rollout.lengths).sum())
                   for c in sampler.stream(state, next_prompts, key, max_prompts=rounds * p))

    t0 = time.perf_counter()
    stream(jax.random.key(0))
    compile_s = time.perf_counter() - t0
    calls = sampler.decode_calls  # decode loops (host round trips) of one stream
    times = {"plain": [], "compacted": [], "continuous": []}
    tokens = {k: 0 for k in times}
    for i in range(args.repeats):
        for on, label in ((False, "plain"), (True, "compacted")):
            t0 = time.perf_counter()
            for r in range(rounds):
                out = jax.block_until_ready(gens[on](state, ids, mask, jax.random.key(1000 * (i + 1) + r)))
                tokens[label] += int(np.asarray(out.lengths).sum())
            times[label].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        tokens["continuous"] += stream(jax.random.key(i + 1))
        times["continuous"].append(time.perf_counter() - t0)
    rate = {k: tokens[k] / args.repeats / min(v) for k, v in times.items()}
    print(f"{name:>10} {rounds} x {p} prompts, {p} slots refilled {refill} at a time | plain {rate['plain']:8.0f} tok/s "
          f"| compacted {rate['compacted']:8.0f} tok/s | continuous {rate['continuous']:8.0f} tok/s "
          f"| continuous / plain {rate['continuous'] / rate['plain']:5.2f}x, / compacted "
          f"{rate['continuous'] / rate['compacted']:5.2f}x | first stream (compiles) {compile_s:.1f} s, "
          f"{calls} decode calls", flush=True)
    print(f"{'':>10} " + "  ".join(f"{k} s {[round(x, 3) for x in v]}" for k, v in times.items()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setups", nargs="+", default=["cot", "geometric"], choices=["cot", "geometric"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-rows", type=int, default=8, help="rollout.compaction_min_rows")
    parser.add_argument("--prompts", type=int, default=8, help="geometric: prompts")
    parser.add_argument("--cot-prompts", type=int, default=0, help="cot: prompts (0: the config's gen_batch, 16)")
    parser.add_argument("--group", type=int, default=8, help="geometric: G")
    parser.add_argument("--new-tokens", type=int, default=256, help="geometric: T")
    parser.add_argument("--stream-rounds", type=int, default=3, help="continuous batching: rounds of P prompts (0: skip)")
    parser.add_argument("--refill", type=int, default=0, help="continuous batching: prompts per refill (0: P // 4)")
    parser.add_argument("--mean-frac", type=float, default=0.25, help="geometric: mean length / T before truncation")
    args = parser.parse_args(argv)

    import jax

    print(f"jax {jax.__version__} on {jax.devices()[0].platform} x{jax.device_count()}, {os.cpu_count()} CPU cores")
    for name in args.setups:
        bench(name, {"cot": cot_setup, "geometric": geometric_setup}[name], args)


if __name__ == "__main__":
    main()
