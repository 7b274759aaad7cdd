"""Builds the Countdown base model `dapo_jax/assets/countdown_base/` (reproducible: fixed seeds).

    python scripts/make_countdown_base.py [--out DIR]

A small Qwen2-architecture decoder over the character tokenizer (the cot base's shape), warmed up
with supervised cross-entropy (response tokens + EOS) on Countdown rows (`dapo_jax.data.countdown`)
whose responses are of MIXED quality: the expression the target was drawn from (right) or another
random expression over the same numbers (well-formed, almost always wrong). It is STOPPED EARLY once
its sampled held-out accuracy (temperature 1, one sample per problem) enters the target band, so that
RL has room: the model writes well-formed expressions over the given numbers, but few reach the target.
Accuracy is judged by the `countdown` reward, in the sandbox. The warm-up is `dapo-jax sft`
(scripts/sft_warmup.py: the trainer's own SFT path) stopped by `train.stop_at_accuracy`; the command line
is `make_tiny_base.make_base`'s. The shipped asset was made by the version of this script before it ran
`dapo-jax sft` (commit c00707e and earlier: its own AdamW loop); rerunning this one makes a model of the
same recipe, not the same bytes.
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

from dapo_jax.data import countdown  # noqa: E402
from dapo_jax.data.char_tokenizer import build_char_tokenizer  # noqa: E402
from dapo_jax.models.config import ModelConfig  # noqa: E402
from dapo_jax.models.decoder import Decoder  # noqa: E402
from dapo_jax.rewards import make_reward  # noqa: E402
from dapo_jax.sampling import SamplingConfig, make_generate  # noqa: E402

# ----------------------------------------------------------------------------- knobs
SEED = 0
TASK = dict(seed=0, heldout_size=200, train_size=5000, count=3, max_number=9, max_target=50)
RIGHT_SHARE = 0.5         # share of warm-up responses that are the drawn (right) expression
MODEL = dict(hidden_size=96, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=24, max_position_embeddings=64, rope_theta=10000.0,
             rms_norm_eps=1e-6, tie_word_embeddings=True)
PROMPT_LEN = 16           # = the recipe's data.max_prompt_length (longest prompt "9,9,9 to 50:": 12)
MAX_NEW_TOKENS = 16       # = the recipe's rollout.max_new_tokens (longest drawn expression + EOS: 8)
LEARNING_RATE = 1e-3
WARMUP_STEPS = 50
WEIGHT_DECAY = 0.01
BATCH = 64
MAX_STEPS = 3000
EVAL_EVERY = 50
EVAL_SIZE = 200           # held-out problems per accuracy estimate (all of them)
TARGET_SAMPLED = 0.12     # stop at the first evaluation with sampled accuracy >= this
OUT = Path(__file__).resolve().parents[1] / "dapo_jax" / "assets" / "countdown_base"


def warmup_rows(rows, *, seed: int = SEED) -> tuple[list[dict], dict[str, int]]:
    """One response per train row: its solution with probability RIGHT_SHARE, else a random expression."""
    rng = np.random.default_rng(seed)
    right = rng.random(len(rows)) < RIGHT_SHARE
    out = []
    for row, ok in zip(rows, right):
        _, numbers = countdown.parse_answer(row["answer"])
        text = row["solution"] if ok else countdown.random_expression(numbers, lambda n: int(rng.integers(n)))
        out.append({"prompt": row["prompt"], "answer": text})
    return out, {"right": int(right.sum()), "random": int((~right).sum())}


def make_model(tok) -> Decoder:
    cfg = ModelConfig(model_type="qwen2", vocab_size=len(tok), attention_bias=True,
                      eos_token_id=(tok.eos_token_id,), pad_token_id=tok.pad_token_id, **MODEL)
    return Decoder(cfg, rngs=nnx.Rngs(SEED))


def make_evaluator(tok, graphdef, heldout):
    """`(state, key, greedy) -> (accuracy, lengths [N])` over the held-out problems (sandboxed reward)."""
    reward = make_reward("countdown", right=1.0, wrong=0.0)
    prompts, pmask, _, _ = encode_rows(tok, [{"prompt": r["prompt"], "answer": ""} for r in heldout], PROMPT_LEN, 1)
    common = dict(max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id)
    gens = {g: make_generate(graphdef, SamplingConfig(temperature=0.0 if g else 1.0, **common), 1) for g in (False, True)}

    def evaluate(state, key, greedy: bool):
        out = gens[greedy](state, jnp.asarray(prompts), jnp.asarray(pmask), key)
        ids, mask = np.asarray(out.response_ids[:, 0]), np.asarray(out.response_mask[:, 0])
        texts = [tok.decode([int(i) for i, m in zip(row, ms) if m], skip_special_tokens=True)
                 for row, ms in zip(ids, mask)]
        _, ok, _ = reward.score_many(texts, [r["answer"] for r in heldout])
        return float(np.mean(ok)), np.asarray(out.lengths[:, 0]), texts

    return evaluate


def warm_up(*, work: Path, log=print, max_steps: int = MAX_STEPS, eval_every: int = EVAL_EVERY,
            eval_size: int = EVAL_SIZE, train_size: int | None = None, target: float = TARGET_SAMPLED):
    """Supervised warm-up by `dapo-jax sft` in `work`, early stop; returns (model, tokenizer, stats)."""
    tok = build_char_tokenizer()
    train = countdown.countdown_rows("train", **TASK)[:train_size]
    heldout = countdown.countdown_rows("heldout", **TASK)[:eval_size]
    rows, counts = warmup_rows(train)
    log(f"warm-up responses {counts}")
    options = {k: v for k, v in TASK.items() if k != "seed"}
    model, stats = sft_warm_up(
        make_model(tok), tok, rows, work=work, log=log,
        task={"name": "countdown", "split": "heldout", "options": options}, reward="countdown",
        prompt_len=PROMPT_LEN, response_len=MAX_NEW_TOKENS, batch=BATCH, lr=LEARNING_RATE,
        warmup_steps=WARMUP_STEPS, weight_decay=WEIGHT_DECAY, max_steps=max_steps, eval_every=eval_every,
        eval_size=eval_size, target=target, seed=TASK["seed"])
    graphdef, state = nnx.split(model)
    evaluate = make_evaluator(tok, graphdef, heldout)
    eval_key = jax.random.key(SEED + 1)
    _, lengths, texts = evaluate(state, eval_key, False)
    greedy, _, _ = evaluate(state, eval_key, True)
    log(f"stopped after {stats['steps']} steps: sampled {stats['sampled_accuracy']:.3f}, greedy {greedy:.3f}, "
        f"e.g. {texts[:4]}")
    return model, tok, dict(stats, greedy_accuracy=greedy, sampled_length_mean=float(lengths.mean()),
                            response_counts=counts)


def write_readme(out: Path, cfg: ModelConfig, stats: dict, n_params: int, seconds: float):
    (out / "README.md").write_text(f"""# countdown_base: the Countdown base model of dapo_jax

Made by `python scripts/make_countdown_base.py` (fixed seeds; {seconds:.0f} s on a shared 2-core CPU).

- Architecture: Qwen2 (`model_type: qwen2`), hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers,
  {cfg.num_attention_heads} heads / {cfg.num_key_value_heads} KV heads, intermediate {cfg.intermediate_size},
  tied embeddings, {n_params:,} parameters, float32, {cfg.max_position_embeddings} positions.
- Tokenizer: character level (`dapo_jax.data.char_tokenizer`), vocabulary {cfg.vocab_size}, EOS `<|endoftext|>`.
- Task: `dapo_jax.data.countdown` with {TASK}: prompts such as `3,5,7 to 22:`, the response an
  expression using each number once (`3*5+7`), judged by the `countdown` reward in the sandbox
  (see docs/countdown.md).
- Warm-up: `dapo-jax sft` (supervised cross-entropy on the response tokens and EOS), responses
  {stats.get('response_counts')} (the drawn expression, or a random one over the same numbers), AdamW lr
  {LEARNING_RATE} (linear warm-up {WARMUP_STEPS}), batch {BATCH}, stopped after {stats.get('steps')} steps at
  the first evaluation (every {EVAL_EVERY} steps) with sampled accuracy >= {TARGET_SAMPLED:.0%}.
- Held-out accuracy ({EVAL_SIZE} problems, one response each, at most {MAX_NEW_TOKENS} new tokens): sampled at
  temperature 1 **{stats.get('sampled_accuracy', float('nan')):.1%}**, greedy **{stats.get('greedy_accuracy', float('nan')):.1%}**.
""")


def main(argv=None):
    make_base(argv, doc=__doc__, out=OUT, warm_up=warm_up, write_readme=write_readme, eval_size=EVAL_SIZE)


if __name__ == "__main__":
    main()
