"""Held-out evaluation: k samples per problem -> accuracy, avg@k, pass@k, maj@k.

    results = evaluate(generate_eval, params, rows, tokenizer=..., scorer=..., ...)

Problems are generated in fixed-size batches (the last one padded with copies whose results are
dropped), so evaluation compiles once however many problems there are.
"""

from __future__ import annotations

from collections import Counter
from math import comb

import jax
import numpy as np

from dapo_jax.training.sources import decode_responses, encode_prompts


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: `1 - C(n-c, k) / C(n, k)`."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def majority_correct(answers: list[str | None], correct: list[bool]) -> bool:
    """maj@k: the most frequent (non-empty) answer is correct; ties go to the answer seen first."""
    counts = Counter(a for a in answers if a)
    if not counts:
        return False
    best = max(counts.values())
    winner = next(a for a in answers if a and counts[a] == best)
    return any(ok for a, ok in zip(answers, correct) if a == winner)


def evaluate(generate, params, rows: list[dict], *, tokenizer, scorer, key, batch_size: int,
             max_prompt_length: int, chat_template: bool = False, k: int) -> dict[str, float]:
    """Samples `k` responses for every row; returns eval/accuracy (= avg@k), eval/pass@k, eval/maj@k."""
    n = len(rows)
    correct = np.zeros((n, k), bool)
    answers: list[list[str]] = [[] for _ in range(n)]
    for start in range(0, n, batch_size):
        chunk = rows[start:start + batch_size]
        padded = chunk + [chunk[-1]] * (batch_size - len(chunk))
        ids, mask = encode_prompts(tokenizer, [r["prompt"] for r in padded], max_len=max_prompt_length,
                                   chat_template=chat_template)
        out = generate(params, ids, mask, jax.random.fold_in(key, start))
        resp_ids, resp_mask = jax.device_get((out.response_ids, out.response_mask))
        b, g, t = resp_ids.shape
        texts = decode_responses(tokenizer, resp_ids.reshape(b * g, t), resp_mask.reshape(b * g, t))
        truths = [r["answer"] for r in padded for _ in range(g)]
        _, ok = scorer(texts, truths)
        ok = ok.reshape(b, g)
        for i in range(len(chunk)):
            correct[start + i] = ok[i]
            answers[start + i] = [s.strip() for s in texts[i * g:(i + 1) * g]]
    c = correct.sum(axis=1)
    return {
        "eval/accuracy": float(correct.mean()),
        f"eval/avg@{k}": float(correct.mean()),
        f"eval/pass@{k}": float(np.mean([pass_at_k(k, int(ci), k) for ci in c])),
        f"eval/maj@{k}": float(np.mean([majority_correct(answers[i], list(correct[i])) for i in range(n)])),
        "eval/problems": float(n),
    }
