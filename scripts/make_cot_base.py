"""Builds the chain-of-thought base model `dapo_jax/assets/cot_base/` (reproducible: fixed seeds).

    python scripts/make_cot_base.py [--out DIR]

A small Qwen2-architecture decoder over the character tokenizer, warmed up with supervised
cross-entropy (response tokens + EOS) on worked traces of the running-sum task
(`dapo_jax.data.cot`) of MIXED quality: mostly reference traces, some verbose (redundant `Total:`
lines, too long for the RL configs' `max_new_tokens` on long problems), some terse (two terms per
line: shorter, harder) and some with an arithmetic slip. It is STOPPED EARLY once its sampled
held-out accuracy (temperature 1, one sample per problem, the RL configs' token budget) enters the
target band, so that RL has room: a right answer is often the mode but the chain of 1-11 lines,
sampled token by token, often slips or rambles somewhere.

The warm-up is `dapo-jax sft` (scripts/sft_warmup.py: the trainer's own SFT path, its packed update)
stopped by `train.stop_at_accuracy`, with the RL configs' response budget: a trace longer than
MAX_NEW_TOKENS (some verbose ones) is left out by the SFT data stream and counted, not cut. Shares the
data encoding and the command line with `scripts/make_tiny_base.py`; measures lengths and greedy
accuracy with the project's KV-cache sampler. Writes the model (`hf_io.save_pretrained`), the tokenizer
files, README.md and warmup_stats.json. The shipped asset was made by the version of this script before
it ran `dapo-jax sft` (commit c00707e and earlier: its own AdamW loop over length buckets, long traces cut,
evaluations from step 600); rerunning this one makes a model of the same recipe, not the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# shared with the tiny base; run as a script, this folder is on sys.path
from make_tiny_base import encode_rows, make_base  # noqa: E402
from sft_warmup import sft_warm_up  # noqa: E402

from dapo_jax.data import cot  # noqa: E402
from dapo_jax.data.char_tokenizer import build_char_tokenizer  # noqa: E402
from dapo_jax.models.config import ModelConfig  # noqa: E402
from dapo_jax.models.decoder import Decoder  # noqa: E402
from dapo_jax.sampling import SamplingConfig, make_generate  # noqa: E402

# ----------------------------------------------------------------------------- knobs
SEED = 0
TASK = dict(seed=0, heldout_size=400, train_size=20000, min_terms=2, max_terms=15, min_digits=1, max_digits=1)
MIX = {"reference": 0.65, "verbose": 0.15, "terse": 0.08, "slip": 0.12}  # share of warm-up traces
DRILLS = 6000             # extra label-lookup drills (`a9+b3+c5?` -> `c5+a9+b3`), see lookup_drills
MODEL = dict(hidden_size=96, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=24, max_position_embeddings=256, rope_theta=10000.0,
             rms_norm_eps=1e-6, tie_word_embeddings=True)
PROMPT_LEN = 48           # = the configs' data.max_prompt_length (longest prompt: 45 characters)
MAX_NEW_TOKENS = 144      # = the configs' rollout.max_new_tokens (longest reference trace + EOS: 139)
LEARNING_RATE = 1e-3      # 3e-3 delays the label lookup (an induction head) by hundreds of steps
WARMUP_STEPS = 50
WEIGHT_DECAY = 0.01
BATCH = 32
MAX_STEPS = 3000
EVAL_EVERY = 50
EVAL_SIZE = 400           # held-out problems per accuracy estimate (all of them)
TARGET_SAMPLED = 0.2      # stop at the first evaluation with sampled accuracy >= this (it rises ~10 points / 50 steps there)
OUT = Path(__file__).resolve().parents[1] / "dapo_jax" / "assets" / "cot_base"


# ----------------------------------------------------------------------------- data
def warmup_traces(rows, *, seed: int = SEED) -> tuple[list[dict], dict[str, int]]:
    """One trace per train row, its variant drawn with probabilities `MIX` (a fixed seed)."""
    names = list(MIX)
    picks = np.random.default_rng(seed).choice(len(names), size=len(rows), p=list(MIX.values()))
    out = [{"prompt": r["prompt"], "answer": cot.trace(r["prompt"], names[k], seed=i)}
           for i, (r, k) in enumerate(zip(rows, picks))]
    return out, {n: int((picks == k).sum()) for k, n in enumerate(names)}


def lookup_drills(rows, n: int, *, seed: int = SEED) -> list[dict]:
    """`n` drills: the prompt with `?` for `=`, the response its labelled terms in a random order.

    Why: a trace line finds its term by its label (the digits after `c` in the prompt), a two-layer
    circuit (an induction head) that forms late when only one token in ten of the traces needs it;
    in a drill every other token does, so it forms within a few hundred steps. The `?` keeps drills
    apart from the task's prompts (which end in `=`).
    """
    rng = np.random.default_rng(seed + 1)
    out = []
    for i in rng.choice(len(rows), size=n, replace=n > len(rows)):
        parts = rows[i]["prompt"][:-1].split("+")
        out.append({"prompt": rows[i]["prompt"][:-1] + "?", "answer": "+".join(parts[j] for j in rng.permutation(len(parts)))})
    return out


# ----------------------------------------------------------------------------- build
def make_model(tok) -> Decoder:
    cfg = ModelConfig(model_type="qwen2", vocab_size=len(tok), attention_bias=True,
                      eos_token_id=(tok.eos_token_id,), pad_token_id=tok.pad_token_id, **MODEL)
    return Decoder(cfg, rngs=nnx.Rngs(SEED))


def make_evaluator(tok, graphdef, heldout):
    """`(state, key, greedy) -> (accuracy, lengths [N], truncated [N])` over the held-out problems."""
    prompts, pmask, _, _ = encode_rows(tok, [{"prompt": r["prompt"], "answer": ""} for r in heldout], PROMPT_LEN, 1)
    common = dict(max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id)
    gens = {g: make_generate(graphdef, SamplingConfig(temperature=0.0 if g else 1.0, **common), 1)
            for g in (False, True)}

    def evaluate(state, key, greedy: bool):
        out = gens[greedy](state, jnp.asarray(prompts), jnp.asarray(pmask), key)
        ids, mask = np.asarray(out.response_ids[:, 0]), np.asarray(out.response_mask[:, 0])
        texts = [tok.decode([int(i) for i, m in zip(row, ms) if m], skip_special_tokens=True)
                 for row, ms in zip(ids, mask)]
        ok = [cot.is_correct(t, r["answer"]) for t, r in zip(texts, heldout)]
        return float(np.mean(ok)), np.asarray(out.lengths[:, 0]), np.asarray(out.truncated[:, 0])

    return evaluate


def warm_up(*, work: Path, log=print, max_steps: int = MAX_STEPS, eval_every: int = EVAL_EVERY,
            eval_size: int = EVAL_SIZE, train_size: int | None = None, target: float = TARGET_SAMPLED):
    """Supervised warm-up by `dapo-jax sft` in `work`, early stop; returns (model, tokenizer, stats)."""
    tok = build_char_tokenizer()
    train = cot.cot_rows("train", **TASK)[:train_size]
    heldout = cot.cot_rows("heldout", **TASK)[:eval_size]
    rows, counts = warmup_traces(train)
    drills = DRILLS if train_size is None else min(DRILLS, train_size)
    counts["drill"] = drills
    log(f"warm-up traces {counts}")
    options = {k: v for k, v in TASK.items() if k != "seed"}
    model, stats = sft_warm_up(
        make_model(tok), tok, rows + lookup_drills(train, drills), work=work, log=log,
        task={"name": "cot", "split": "heldout", "options": options}, reward="cot",
        prompt_len=PROMPT_LEN, response_len=MAX_NEW_TOKENS, batch=BATCH, lr=LEARNING_RATE,
        warmup_steps=WARMUP_STEPS, weight_decay=WEIGHT_DECAY, max_steps=max_steps, eval_every=eval_every,
        eval_size=eval_size, target=target, seed=TASK["seed"])
    graphdef, state = nnx.split(model)
    evaluate = make_evaluator(tok, graphdef, heldout)
    eval_key = jax.random.key(SEED + 1)
    _, lengths, truncated = evaluate(state, eval_key, False)
    greedy, _, greedy_trunc = evaluate(state, eval_key, True)
    log(f"stopped after {stats['steps']} steps: sampled {stats['sampled_accuracy']:.3f}, greedy {greedy:.3f} "
        f"(truncated {greedy_trunc.mean():.3f})")
    return model, tok, dict(
        stats, greedy_accuracy=greedy, sampled_length_mean=float(lengths.mean()),
        sampled_length_percentiles={p: round(float(np.percentile(lengths, p)), 1) for p in (5, 25, 50, 75, 95)},
        sampled_truncated_fraction=float(truncated.mean()),
        greedy_truncated_fraction=float(greedy_trunc.mean()), trace_counts=counts)


def write_readme(out: Path, cfg: ModelConfig, stats: dict, n_params: int, seconds: float):
    pct = stats.get("sampled_length_percentiles", {})
    (out / "README.md").write_text(f"""# cot_base: the chain-of-thought base model of dapo_jax

Made by `python scripts/make_cot_base.py` (fixed seeds; about {seconds:.0f} s on a 2-core CPU).

- Architecture: Qwen2 (`model_type: qwen2`), hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers,
  {cfg.num_attention_heads} heads / {cfg.num_key_value_heads} KV heads, intermediate {cfg.intermediate_size},
  tied embeddings, {n_params:,} parameters, float32, {cfg.max_position_embeddings} positions.
- Tokenizer: character level (`dapo_jax.data.char_tokenizer`), vocabulary {cfg.vocab_size}, EOS `<|endoftext|>`.
- Task: `dapo_jax.data.cot` with {TASK}: prompts such as `a5+b7+c4+d3=`, the response a running sum, one
  line per term (`a5+b7=12`, `12+c4=16`, `16+d3=19`), ending `Answer: 19` (see docs/cot_task.md).
- Warm-up: `dapo-jax sft` (supervised cross-entropy on the response tokens and EOS), traces mixed {MIX}
  plus {DRILLS} label-lookup drills ({stats.get('trace_counts')}), AdamW lr {LEARNING_RATE} (linear warm-up
  {WARMUP_STEPS}), batch {BATCH}, responses over {MAX_NEW_TOKENS} tokens left out, stopped after
  {stats.get('steps')} steps at the first evaluation (every {EVAL_EVERY} steps) with sampled accuracy >=
  {TARGET_SAMPLED:.0%}.
- Held-out accuracy ({EVAL_SIZE} problems, one response each, at most {MAX_NEW_TOKENS} new tokens): sampled at
  temperature 1 **{stats.get('sampled_accuracy', float('nan')):.1%}**, greedy **{stats.get('greedy_accuracy', float('nan')):.1%}**.
- Sampled response length (EOS included): mean {stats.get('sampled_length_mean', float('nan')):.1f} tokens,
  percentiles 5/25/50/75/95: {'/'.join(f"{v:.0f}" for v in pct.values())}; truncated at {MAX_NEW_TOKENS} tokens:
  {stats.get('sampled_truncated_fraction', float('nan')):.1%} sampled, {stats.get('greedy_truncated_fraction', float('nan')):.1%} greedy.
""")


def main(argv=None):
    make_base(argv, doc=__doc__, out=OUT, warm_up=warm_up, write_readme=write_readme, eval_size=EVAL_SIZE)


if __name__ == "__main__":
    main()
