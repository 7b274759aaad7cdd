"""Held-out evaluation: k samples per problem -> accuracy (= avg@k), pass@k, maj@k.

    results = evaluate(generate_eval, params, eval_stream, tokenizer=..., scorer=..., key=eval_key(seed),
                       batch_size=..., k=...)

Problems are generated in fixed-size batches (the last one padded with repeats whose results are
dropped), so evaluation compiles once however many problems there are. Batch `b` samples with
`fold_in(key, first problem index)`: the result depends on the key, the batch size, the sampling
settings and the problems, nothing else, so `dapo-jax eval` of a run's checkpoint reproduces the
run's own evaluation at that step exactly when it uses the same ones (`eval_key(train.seed)`).
"""

from __future__ import annotations

import jax
import numpy as np

from dapo_jax.evaluation.metrics import avg_at_k, maj_at_k, pass_at_k
from dapo_jax.parallel.host import to_host
from dapo_jax.training.sources import decode_responses


# Folded into the run's key for every evaluation: a stream of its own, apart from the rollouts'.
EVAL_KEY_SALT = 10_000_019


def eval_key(seed_or_key):
    """The evaluation key of a run: `fold_in(PRNGKey(train.seed), EVAL_KEY_SALT)` (a raw uint32 key)."""
    key = jax.random.PRNGKey(seed_or_key) if isinstance(seed_or_key, int) else seed_or_key
    return jax.random.fold_in(key, EVAL_KEY_SALT)


def evaluate(generate, params, stream, *, tokenizer, scorer, key, batch_size: int, k: int,
             limit: int | None = None, records: list | None = None) -> dict[str, float]:
    """Samples `k` responses for each of the stream's problems (in source order, the first `limit`).

    `records`, when given, receives one dict per problem (prompt, answer, the k responses with their
    reward, correctness, extracted answer, length and truncation) for inspection.
    """
    examples = list(stream.examples[:limit] if limit else stream.examples)
    n = len(examples)
    correct = np.zeros((n, k), bool)
    answers: list[list] = [[] for _ in range(n)]
    names = getattr(scorer, "part_names", ())
    part_sums = np.zeros(len(names), np.float64)  # each reward function's own reward (rewards/pipeline.py)
    for start in range(0, n, batch_size):
        chunk = examples[start:start + batch_size]
        batch = stream.pad(chunk + [chunk[-1]] * (batch_size - len(chunk)))
        out = generate(params, batch.input_ids, batch.attention_mask, jax.random.fold_in(key, start))
        resp_ids, resp_mask = to_host((out.response_ids, out.response_mask))
        b, g, t = resp_ids.shape
        texts = decode_responses(tokenizer, resp_ids.reshape(b * g, t), resp_mask.reshape(b * g, t))
        scored = scorer.score(texts, [a for a in batch.answers for _ in range(g)],
                              prompts=[x for x in batch.texts for _ in range(g)],
                              rows=[x for x in batch.rows for _ in range(g)])
        rewards, ok, keys = scored.rewards, scored.correct, scored.keys
        part_sums += scored.parts[:len(chunk) * g].sum(axis=0)
        ok = ok.reshape(b, g)
        for i in range(len(chunk)):
            correct[start + i] = ok[i]
            answers[start + i] = keys[i * g:(i + 1) * g]
        if records is not None:
            lengths, truncated = to_host((out.lengths, out.truncated))
            records.extend(_record(chunk[i], texts[i * g:(i + 1) * g], rewards[i * g:(i + 1) * g], ok[i],
                                   keys[i * g:(i + 1) * g], lengths[i], truncated[i]) for i in range(len(chunk)))
    return {
        "eval/accuracy": avg_at_k(correct),
        f"eval/avg@{k}": avg_at_k(correct),
        f"eval/pass@{k}": pass_at_k(correct, k),
        f"eval/maj@{k}": maj_at_k(answers, correct, k),
        "eval/problems": float(n),
        **({f"eval/reward/{name}": float(part_sums[i] / (n * k)) for i, name in enumerate(names)}
           if len(names) > 1 else {}),  # several functions (a reward model beside a rule): each one's mean
    }


def _record(example, texts, rewards, correct, keys, lengths, truncated) -> dict:
    return {"index": int(example.index), "prompt": example.text, "answer": example.answer,
            "accuracy": float(np.mean(correct)),
            "responses": [{"text": t, "reward": float(r), "correct": bool(c), "extracted": None if a is None else str(a),
                           "length": int(n), "truncated": bool(tr)}
                          for t, r, c, a, n, tr in zip(texts, rewards, correct, keys, lengths, truncated)]}
