"""Builds the chain-of-thought outcome reward model `dapo_jax/assets/cot_rm/` (reproducible: fixed seeds).

    python scripts/make_cot_rm.py [--out DIR] [--problems 2500]

A `Qwen2ForSequenceClassification` (one label) for the running-sum task (`dapo_jax.data.cot`), trained
the way a learned outcome RM usually is: on the policy's OWN samples, labelled by a checker. Here the
policy is `dapo_jax/assets/cot_base` (sampled at temperature 1, the RL recipes' 144-token budget) and
the checker the `cot` rule reward, so the labels are exact but the samples are what the base writes:
about a quarter right, the rest slips, rambles and truncations. The RM starts from the base's own
trunk (it reads the task's language from the first step) with a zero-initialised `score` head and is
fitted with a logistic loss on its logit at the last token (the EOS its chat template appends), in
the reward pipeline's own rendering (`rewards.reward_model.tokenize_rows`).

It is imperfect in known ways, measured on probes written by `cot.trace` for held-out problems and
recorded in README.md / rm_stats.json: how often it scores above 0 (P(right) > 1/2) a reference chain
(right), a chain with one slip carried to a wrong answer (well-formed, wrong), a right chain whose
`Answer:` line alone is off by one (well-formed, wrong), a chain cut before its answer, and a bare
`Answer: N` line with the right N and no chain. Stored in bfloat16 (about 430 KB).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_base import encode_rows  # noqa: E402  (left-padded prompts, as the base was evaluated)

from dapo_jax.data import cot  # noqa: E402
from dapo_jax.data.char_tokenizer import save_char_tokenizer  # noqa: E402
from dapo_jax.models.classifier import Classifier, sequence_logits  # noqa: E402
from dapo_jax.models.decoder import positions_from_mask  # noqa: E402
from dapo_jax.models.hf_classifier_io import save_classifier  # noqa: E402
from dapo_jax.models.hf_io import load_pretrained, load_tokenizer  # noqa: E402
from dapo_jax.rewards.reward_model import tokenize_rows  # noqa: E402
from dapo_jax.sampling import SamplingConfig, make_generate  # noqa: E402

# ----------------------------------------------------------------------------- knobs
SEED = 0
ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "dapo_jax" / "assets" / "cot_base"
OUT = ROOT / "dapo_jax" / "assets" / "cot_rm"
TASK = dict(seed=0, heldout_size=400, train_size=20000, min_terms=2, max_terms=15, min_digits=1, max_digits=1)
PROBLEMS = 2500           # train problems sampled (the RL recipes train on the same split, as an RM's data would be)
SAMPLES = 8               # responses per problem (the recipes' G)
HELDOUT_PROBLEMS = 200    # held-out problems for the RM's own accuracy (the RL recipes evaluate on these too)
PROMPT_LEN, MAX_NEW_TOKENS = 48, 144   # = the cot recipes' data.max_prompt_length and rollout.max_new_tokens
GEN_BATCH = 16            # prompts per generation call (x SAMPLES rows)
# the RM's chat template: the prompt, a newline, the response, and EOS (the token its score is read at)
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['content'] }}{% if message['role'] == 'user' %}{{ '\\n' }}"
                 "{% endif %}{% endfor %}<|endoftext|>")
BUCKETS = (64, 128, 208)  # row lengths of the fixed-shape training batches (longest row: 45 + 1 + 144 + 1)
LEARNING_RATE = 3e-4
WEIGHT_DECAY = 0.01
BATCH = 64
EPOCHS = 3


# ----------------------------------------------------------------------------- data
def sample_responses(base, tok, rows, key, *, log=print) -> list[str]:
    """`SAMPLES` responses of the base per row (temperature 1), decoded, in row order."""
    graphdef, state = nnx.split(base)
    generate = make_generate(graphdef, SamplingConfig(max_new_tokens=MAX_NEW_TOKENS, temperature=1.0,
                                                      eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id,
                                                      compaction=True), SAMPLES)
    out, start = [], time.time()
    for b in range(0, len(rows), GEN_BATCH):
        chunk = rows[b:b + GEN_BATCH]
        chunk = chunk + [chunk[-1]] * (GEN_BATCH - len(chunk))
        prompts, pmask, _, _ = encode_rows(tok, [{"prompt": r["prompt"], "answer": ""} for r in chunk], PROMPT_LEN, 1)
        roll = generate(state, jnp.asarray(prompts), jnp.asarray(pmask), jax.random.fold_in(key, b))
        ids, mask = np.asarray(roll.response_ids), np.asarray(roll.response_mask)
        texts = tok.batch_decode([row[m > 0].tolist() for row, m in zip(ids.reshape(-1, ids.shape[-1]),
                                                                        mask.reshape(-1, mask.shape[-1]))],
                                 skip_special_tokens=True)
        out.extend(texts[:min(GEN_BATCH, len(rows) - b) * SAMPLES])
        if (b // GEN_BATCH) % 25 == 0:
            log(f"  sampled {len(out)} responses ({time.time() - start:.0f} s)")
    return out


def encode(tok, prompts, responses):
    """Right-padded rows of the RM's rendering, grouped by `BUCKETS`: [(ids, mask, index)]."""
    rows = tokenize_rows(tok, prompts, responses, template="chat")
    lengths = np.array([len(r) for r in rows])
    assert lengths.max() <= BUCKETS[-1], lengths.max()
    which = np.searchsorted(BUCKETS, lengths)
    out = []
    for b, size in enumerate(BUCKETS):
        idx = np.flatnonzero(which == b)
        ids = np.full((len(idx), size), tok.pad_token_id, np.int32)
        mask = np.zeros((len(idx), size), np.int32)
        for k, i in enumerate(idx):
            ids[k, :lengths[i]], mask[k, :lengths[i]] = rows[i], 1
        out.append((ids, mask, idx))
    return out


# ----------------------------------------------------------------------------- model
def logits_of(model, ids, mask):
    logits = model(ids, positions_from_mask(mask), mask)
    return sequence_logits(logits, ids, mask, pad_token_id=model.config.pad_token_id)[:, 0]


def scores(model, tok, prompts, responses) -> np.ndarray:
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda s, i, m: logits_of(nnx.merge(graphdef, s), i, m))
    out = np.zeros(len(prompts), np.float32)
    for ids, mask, idx in encode(tok, prompts, responses):
        for b in range(0, len(idx), 256):
            n = len(idx[b:b + 256])
            pad = lambda x: np.concatenate([x, np.repeat(x[-1:], 256 - n, 0)]) if n < 256 else x  # noqa: E731
            out[idx[b:b + 256]] = np.asarray(fn(state, pad(ids[b:b + 256]), pad(mask[b:b + 256])))[:n]
    return out


def auc(score, label) -> float:
    """Probability that a random right response outscores a random wrong one (ties count half)."""
    pos, neg = score[label], score[~label]
    if not len(pos) or not len(neg):
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="stable")
    ranks = np.empty(len(order))
    ranks[order] = np.arange(1, len(order) + 1)
    allv = np.concatenate([pos, neg])
    for v in np.unique(allv):  # average ranks of ties
        at = allv == v
        ranks[at] = ranks[at].mean()
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def train(model, tok, prompts, responses, labels, *, log=print):
    batches = encode(tok, prompts, responses)
    optimizer = nnx.Optimizer(model, optax.adamw(LEARNING_RATE, weight_decay=WEIGHT_DECAY), wrt=nnx.Param)
    pos_frac = float(labels.mean())

    @nnx.jit
    def step(model, optimizer, ids, mask, y):
        def loss_fn(model):
            z = logits_of(model, ids, mask)
            return optax.sigmoid_binary_cross_entropy(z, y).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    rng = np.random.default_rng(SEED)
    plan = [(b, k) for b, (_, _, idx) in enumerate(batches) for k in range(0, len(idx) - BATCH + 1, BATCH)]
    start, losses = time.time(), []
    for epoch in range(EPOCHS):
        perms = [rng.permutation(len(idx)) for _, _, idx in batches]
        for n, j in enumerate(rng.permutation(len(plan))):
            b, k = plan[j]
            ids, mask, idx = batches[b]
            sel = perms[b][k:k + BATCH]
            losses.append(float(step(model, optimizer, ids[sel], mask[sel], labels[idx[sel]].astype(np.float32))))
            if n % 100 == 0:
                log(f"  epoch {epoch} batch {n}/{len(plan)} loss {np.mean(losses[-100:]):.4f} "
                    f"(constant predictor {-(pos_frac * np.log(pos_frac) + (1 - pos_frac) * np.log(1 - pos_frac)):.4f}; "
                    f"{time.time() - start:.0f} s)")
    return float(np.mean(losses[-100:]))


# ----------------------------------------------------------------------------- probes
def probes(rows) -> dict[str, tuple[list[str], list[str], bool]]:
    """name -> (prompts, responses, right?) written from the task's own traces."""
    def off_by_one(text):
        head, _, last = text.rpartition("Answer: ")
        return f"{head}Answer: {int(last) + 1}"

    prompts = [r["prompt"] for r in rows]
    ref = [cot.solution(p) for p in prompts]
    return {
        "reference chain (right)": (prompts, ref, True),
        "one slip carried to the answer (wrong)": (prompts, [cot.trace(p, "slip", seed=i) for i, p in enumerate(prompts)], False),
        "right chain, Answer line off by one (wrong)": (prompts, [off_by_one(t) for t in ref], False),
        "cut before the Answer line (wrong)": (prompts, [t.rpartition("\n")[0] for t in ref], False),
        "bare right Answer line, no chain (right)": (prompts, [f"Answer: {r['answer']}" for r in rows], True),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--problems", type=int, default=PROBLEMS)
    args = parser.parse_args(argv)
    start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    save_char_tokenizer(args.out)
    (args.out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    tok = load_tokenizer(args.out)  # the RM's own tokenizer and template, exactly as the reward pipeline loads them
    base = load_pretrained(BASE)

    train_rows = cot.cot_rows("train", **TASK)[:args.problems]
    held_rows = cot.cot_rows("heldout", **TASK)[:HELDOUT_PROBLEMS]
    print(f"sampling {len(train_rows)} x {SAMPLES} train and {len(held_rows)} x {SAMPLES} held-out responses of {BASE}")
    key = jax.random.key(SEED)
    train_resp = sample_responses(base, tok, train_rows, jax.random.fold_in(key, 0))
    held_resp = sample_responses(base, tok, held_rows, jax.random.fold_in(key, 1))
    rep = lambda rows: [r["prompt"] for r in rows for _ in range(SAMPLES)]  # noqa: E731
    truths = lambda rows: [r["answer"] for r in rows for _ in range(SAMPLES)]  # noqa: E731
    train_p, held_p = rep(train_rows), rep(held_rows)
    y_train = np.array([cot.is_correct(t, a) for t, a in zip(train_resp, truths(train_rows))])
    y_held = np.array([cot.is_correct(t, a) for t, a in zip(held_resp, truths(held_rows))])
    print(f"labels: train {y_train.mean():.3f} right of {len(y_train)}, held-out {y_held.mean():.3f} of {len(y_held)}")

    # the base's trunk (same tokenizer, same task) and a zero score head: logit 0 = P(right) 1/2 to start
    model = Classifier(base, num_labels=1, head="linear", bias=False, rngs=nnx.Rngs(SEED))
    model.score.kernel.set_value(jnp.zeros_like(model.score.kernel[...]))
    final_loss = train(model, tok, train_p, train_resp, y_train)
    save_classifier(model, args.out, task="sequence", dtype="bfloat16")
    from dapo_jax.models.hf_classifier_io import load_classifier

    shipped = load_classifier(args.out)  # what a run reads: the bfloat16-rounded weights, computed in float32
    s_held = scores(shipped, tok, held_p, held_resp)
    stats = {"train_responses": len(y_train), "train_right_fraction": round(float(y_train.mean()), 4),
             "final_train_loss": round(final_loss, 4), "heldout_responses": len(y_held),
             "heldout_right_fraction": round(float(y_held.mean()), 4),
             "heldout_auc": round(auc(s_held, y_held), 4),
             "heldout_accuracy_at_0": round(float(((s_held > 0) == y_held).mean()), 4),
             "heldout_score_mean_right": round(float(s_held[y_held].mean()), 3),
             "heldout_score_mean_wrong": round(float(s_held[~y_held].mean()), 3), "probes": {}}
    for name, (ps, rs, right) in probes(held_rows).items():
        s = scores(shipped, tok, ps, rs)
        stats["probes"][name] = {"scored_right_fraction": round(float((s > 0).mean()), 4),
                                 "score_mean": round(float(s.mean()), 3)}
    stats["seconds"] = round(time.time() - start, 1)
    (args.out / "rm_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    write_readme(args.out, stats)
    for f in args.out.iterdir():
        f.chmod(0o644)
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(json.dumps(stats, indent=2))
    print(f"{size / 1e3:.0f} KB at {args.out}; {stats['seconds']:.0f} s")


def write_readme(out: Path, stats: dict) -> None:
    rows = "\n".join(f"| {name} | {p['scored_right_fraction']:.1%} | {p['score_mean']:+.2f} |"
                     for name, p in stats["probes"].items())
    (out / "README.md").write_text(f"""# cot_rm: an outcome reward model for the chain-of-thought task

Made by `python scripts/make_cot_rm.py` (fixed seeds; {stats['seconds']:.0f} s on a 2-core CPU shared with other jobs).

- `Qwen2ForSequenceClassification`, one label: the trunk of `cot_base` (hidden 96, 2 layers, character
  tokenizer) fine-tuned with a logistic loss, the score read at the EOS its chat template appends
  (prompt, newline, response, EOS). Stored in bfloat16.
- Data: {stats['train_responses']:,} responses of `cot_base` itself (temperature 1, {MAX_NEW_TOKENS} new tokens) to
  {stats['train_responses'] // SAMPLES:,} train problems, labelled by the `cot` rule ({stats['train_right_fraction']:.1%} right);
  AdamW lr {LEARNING_RATE}, batch {BATCH}, {EPOCHS} epochs; final train loss {stats['final_train_loss']}.
- Held-out ({stats['heldout_responses']:,} samples of the base on {HELDOUT_PROBLEMS} held-out problems, {stats['heldout_right_fraction']:.1%} right):
  AUC **{stats['heldout_auc']:.3f}**, accuracy of `score > 0` {stats['heldout_accuracy_at_0']:.1%}, mean score
  {stats['heldout_score_mean_right']:+.2f} on right responses and {stats['heldout_score_mean_wrong']:+.2f} on wrong ones.

Probes (the {HELDOUT_PROBLEMS} held-out problems, traces written by `dapo_jax.data.cot`): how often the RM
scores a response above 0 (P(right) > 1/2), and its mean score:

| probe | scored > 0 | mean score |
|---|---|---|
{rows}

Use: `reward.functions: [{{name: reward_model, path: dapo_jax/assets/cot_rm}}]`
(`dapo_jax/configs/cot_grpo_rm.yaml`, `docs/reward_models.md`).
""")


if __name__ == "__main__":
    main()
