"""Builds the embedded tiny base model `dapo_jax/assets/tiny_base/` (reproducible: fixed seeds).

    python scripts/make_tiny_base.py [--out DIR] [--work DIR] [--max-steps N --eval-every N --eval-size N --train-size N --target A]

A ~0.1M-parameter Qwen2-architecture decoder over a character-level tokenizer, warmed up with supervised
cross-entropy (answer tokens + EOS only) on the synthetic task's train split (`dapo_jax.data.synthetic`)
by `dapo-jax sft` (scripts/sft_warmup.py: the trainer's own SFT path, no loop of its own), and STOPPED
EARLY as soon as its sampled accuracy (temperature 1, one sample per held-out problem) reaches the target
band (`train.stop_at_accuracy`): an under-trained model that is right on some samples and a near miss on
others, which is what the default DAPO job then improves with RL. Prints the greedy and sampled held-out
accuracy, and writes the model (`hf_io.save_pretrained`), the tokenizer files and a README.md into the
output folder. The shipped asset was made by the version of this script before it ran `dapo-jax sft`
(commit c00707e and earlier: its own AdamW loop over random batches); rerunning this one makes a model of
the same recipe, not the same bytes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# run as a script, this folder is on sys.path
from sft_warmup import sft_warm_up  # noqa: E402

from dapo_jax.data import synthetic
from dapo_jax.data.char_tokenizer import build_char_tokenizer, save_char_tokenizer
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder, positions_from_mask

# ----------------------------------------------------------------------------- knobs
SEED = 0
TASK = dict(seed=0, max_operand=99, max_second=9, ops="+-", heldout_size=400)
MODEL = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rope_theta=10000.0,
             rms_norm_eps=1e-6, tie_word_embeddings=True)
LEARNING_RATE = 3e-3
WEIGHT_DECAY = 0.01
BATCH = 128
MAX_STEPS = 3000
EVAL_EVERY = 10
EVAL_SIZE = 400           # held-out problems per accuracy estimate (all of them)
TARGET_SAMPLED = 0.30     # stop at the first evaluation with sampled accuracy >= this
OUT = Path(__file__).resolve().parents[1] / "dapo_jax" / "assets" / "tiny_base"


# ----------------------------------------------------------------------------- data
def encode_rows(tok, rows, prompt_len: int, response_len: int):
    """Left-padded prompts `[N, prompt_len]` and right-padded answer+EOS `[N, response_len]`, with masks."""
    n = len(rows)
    prompts = np.full((n, prompt_len), tok.pad_token_id, np.int32)
    responses = np.full((n, response_len), tok.pad_token_id, np.int32)
    pmask = np.zeros((n, prompt_len), np.int32)
    rmask = np.zeros((n, response_len), np.int32)
    for i, row in enumerate(rows):
        p = tok.encode(row["prompt"], add_special_tokens=False)
        r = tok.encode(row["answer"], add_special_tokens=False) + [tok.eos_token_id]
        prompts[i, prompt_len - len(p):], pmask[i, prompt_len - len(p):] = p, 1
        responses[i, :len(r)], rmask[i, :len(r)] = r, 1
    return prompts, pmask, responses, rmask


# ----------------------------------------------------------------------------- model functions
def sample(model, prompts, pmask, key, *, response_len: int, eos_id: int, pad_id: int,
           temperature: float = 1.0, greedy: bool = False):
    """Responses `[B, R]` and their mask; one full forward per new token (sequences are ~10 tokens)."""
    b = prompts.shape[0]
    responses = jnp.full((b, response_len), pad_id, jnp.int32)
    rmask = jnp.zeros((b, response_len), jnp.int32)
    alive = jnp.ones((b,), bool)
    for t in range(response_len):
        ids = jnp.concatenate([prompts, responses], axis=1)
        mask = jnp.concatenate([pmask, rmask], axis=1)
        hidden, _ = model(ids, positions_from_mask(mask), mask)
        logits = model.logits(hidden[:, prompts.shape[1] + t - 1])
        key, sub = jax.random.split(key)
        tok = jnp.argmax(logits, -1) if greedy else jax.random.categorical(sub, logits / temperature)
        tok = jnp.where(alive, tok, pad_id).astype(jnp.int32)
        responses = responses.at[:, t].set(tok)
        rmask = rmask.at[:, t].set(alive.astype(jnp.int32))
        alive = alive & (tok != eos_id)
    return responses, rmask


def decode_responses(tok, responses, rmask):
    """Response texts, cut at the first EOS (the EOS itself excluded)."""
    out = []
    for ids, m in zip(np.asarray(responses), np.asarray(rmask)):
        ids = [int(i) for i, keep in zip(ids, m) if keep]
        if tok.eos_token_id in ids:
            ids = ids[: ids.index(tok.eos_token_id)]
        out.append(tok.decode(ids))
    return out


def accuracy(tok, rows, responses, rmask) -> float:
    texts = decode_responses(tok, responses, rmask)
    return float(np.mean([synthetic.is_correct(t, r["answer"]) for t, r in zip(texts, rows)]))


# ----------------------------------------------------------------------------- build
def make_model(tok) -> Decoder:
    cfg = ModelConfig(model_type="qwen2", vocab_size=len(tok), attention_bias=True,
                      eos_token_id=(tok.eos_token_id,), pad_token_id=tok.pad_token_id, **MODEL)
    return Decoder(cfg, rngs=nnx.Rngs(SEED))


def warm_up(*, work: Path, log=print, max_steps: int = MAX_STEPS, eval_every: int = EVAL_EVERY,
            eval_size: int = EVAL_SIZE, train_size: int | None = None, target: float = TARGET_SAMPLED):
    """Supervised warm-up by `dapo-jax sft` in `work`, early stop; returns (model, tokenizer, stats)."""
    tok = build_char_tokenizer()
    train = synthetic.synthetic_rows("train", **TASK)[:train_size]
    heldout = synthetic.synthetic_rows("heldout", **TASK)[:eval_size]
    prompt_len = max(len(r["prompt"]) for r in train + heldout)
    response_len = max(len(r["answer"]) for r in train + heldout) + 1
    options = {k: v for k, v in TASK.items() if k != "seed"}
    model, stats = sft_warm_up(
        make_model(tok), tok, train, work=work, log=log,
        task={"name": "synthetic", "split": "heldout", "options": options}, reward="synthetic",
        prompt_len=prompt_len, response_len=response_len, batch=BATCH, lr=LEARNING_RATE, warmup_steps=0,
        weight_decay=WEIGHT_DECAY, max_steps=max_steps, eval_every=eval_every, eval_size=eval_size,
        target=target, seed=TASK["seed"])
    ho_prompts, ho_pmask, _, _ = (jnp.asarray(a) for a in encode_rows(tok, heldout, prompt_len, response_len))
    graphdef, state = nnx.split(model)
    greedy = jax.jit(lambda state: sample(nnx.merge(graphdef, state), ho_prompts, ho_pmask, jax.random.key(SEED + 1),
                                          response_len=response_len, eos_id=tok.eos_token_id,
                                          pad_id=tok.pad_token_id, greedy=True))
    stats["greedy_accuracy"] = accuracy(tok, heldout, *greedy(state))
    log(f"stopped after {stats['steps']} steps: held-out acc sampled(T=1) {stats['sampled_accuracy']:.3f}  "
        f"greedy {stats['greedy_accuracy']:.3f}")
    return model, tok, stats


def write_readme(out: Path, cfg: ModelConfig, stats: dict, n_params: int, seconds: float):
    (out / "README.md").write_text(f"""# tiny_base: the embedded default model of dapo_jax

Made by `python scripts/make_tiny_base.py` (fixed seeds; about {seconds:.0f} s on a 2-core CPU).

- Architecture: Qwen2 (`model_type: qwen2`), hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers,
  {cfg.num_attention_heads} heads / {cfg.num_key_value_heads} KV heads, intermediate {cfg.intermediate_size},
  tied embeddings, {n_params:,} parameters, float32.
- Tokenizer: character level (`dapo_jax.data.char_tokenizer`): printable ASCII + newline, `<pad>` = 0,
  `<|endoftext|>` (EOS) = 1, `<unk>` = 2; vocabulary {cfg.vocab_size}.
- Data: the synthetic task `dapo_jax.data.synthetic` with {TASK}: prompts such as `12+7=`, the response is
  the answer's digits then EOS.
- Warm-up: `dapo-jax sft` (supervised cross-entropy on the answer tokens and EOS only), AdamW lr
  {LEARNING_RATE}, batch {BATCH}, stopped early after {stats.get('steps')} steps once the sampled accuracy
  reached {TARGET_SAMPLED:.0%} (deliberately under-trained, so RL has something to improve).
- Held-out accuracy ({EVAL_SIZE} problems, one response each): sampled at temperature 1
  **{stats.get('sampled_accuracy', float('nan')):.1%}**, greedy **{stats.get('greedy_accuracy', float('nan')):.1%}**.
""")


def ship(model, out: Path, stats: dict, start: float, *, write_readme, eval_size: int) -> None:
    """Writes the warmed-up model, its tokenizer, README.md and warmup_stats.json into `out`."""
    from dapo_jax.models.hf_io import save_pretrained  # written alongside; imported late on purpose

    out.mkdir(parents=True, exist_ok=True)
    save_pretrained(model, out)
    save_char_tokenizer(out)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    seconds = time.time() - start
    write_readme(out, model.config, stats, n_params, seconds)
    (out / "warmup_stats.json").write_text(json.dumps({**stats, "seconds": round(seconds, 1)}, indent=2) + "\n")
    for f in out.iterdir():
        f.chmod(0o644)  # the safetensors writer may leave 0600; ship readable package data
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"base accuracy (held-out, {eval_size}): greedy {stats['greedy_accuracy']:.3f}, "
          f"sampled T=1 {stats['sampled_accuracy']:.3f}; {n_params:,} params; {size / 1e6:.2f} MB at {out}; "
          f"{seconds:.0f} s")


def make_base(argv, *, doc: str, out: Path, warm_up, write_readme, eval_size: int) -> None:
    """The makers' command line: `--out DIR` (default `out`), `--work DIR` (the `dapo-jax sft` run's
    folder; default a temporary one), smaller runs for a check (`--max-steps`, `--eval-every`,
    `--eval-size`, `--train-size`, `--target`), then the warm-up, then `ship`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--eval-every", type=int, default=None)
    parser.add_argument("--eval-size", type=int, default=None)
    parser.add_argument("--train-size", type=int, default=None)
    parser.add_argument("--target", type=float, default=None)
    args = parser.parse_args(argv)
    start = time.time()
    knobs = {k: v for k, v in (("max_steps", args.max_steps), ("eval_every", args.eval_every),
                               ("eval_size", args.eval_size), ("train_size", args.train_size),
                               ("target", args.target)) if v is not None}
    with tempfile.TemporaryDirectory() as tmp:
        model, _, stats = warm_up(work=args.work or Path(tmp), **knobs)
    ship(model, args.out, stats, start, write_readme=write_readme, eval_size=knobs.get("eval_size", eval_size))


def main(argv=None):
    make_base(argv, doc=__doc__, out=OUT, warm_up=warm_up, write_readme=write_readme, eval_size=EVAL_SIZE)


if __name__ == "__main__":
    main()
