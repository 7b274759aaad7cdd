"""Held-out evaluation: k samples per problem -> accuracy (= avg@k), pass@k, maj@k.

    results = evaluate(generate_eval, params, eval_stream, tokenizer=..., scorer=..., key=..., batch_size=..., k=...)

Problems are generated in fixed-size batches (the last one padded with repeats whose results are
dropped), so evaluation compiles once however many problems there are.
"""

from __future__ import annotations

import jax
import numpy as np

from dapo_jax.evaluation.metrics import avg_at_k, maj_at_k, pass_at_k
from dapo_jax.parallel.host import to_host
from dapo_jax.training.sources import decode_responses


def evaluate(generate, params, stream, *, tokenizer, scorer, key, batch_size: int, k: int,
             limit: int | None = None) -> dict[str, float]:
    """Samples `k` responses for each of the stream's problems (in source order, the first `limit`)."""
    examples = list(stream.examples[:limit] if limit else stream.examples)
    n = len(examples)
    correct = np.zeros((n, k), bool)
    answers: list[list] = [[] for _ in range(n)]
    for start in range(0, n, batch_size):
        chunk = examples[start:start + batch_size]
        batch = stream.pad(chunk + [chunk[-1]] * (batch_size - len(chunk)))
        out = generate(params, batch.input_ids, batch.attention_mask, jax.random.fold_in(key, start))
        resp_ids, resp_mask = to_host((out.response_ids, out.response_mask))
        b, g, t = resp_ids.shape
        texts = decode_responses(tokenizer, resp_ids.reshape(b * g, t), resp_mask.reshape(b * g, t))
        _, ok, keys = scorer(texts, [a for a in batch.answers for _ in range(g)])
        ok = ok.reshape(b, g)
        for i in range(len(chunk)):
            correct[start + i] = ok[i]
            answers[start + i] = keys[i * g:(i + 1) * g]
    return {
        "eval/accuracy": avg_at_k(correct),
        f"eval/avg@{k}": avg_at_k(correct),
        f"eval/pass@{k}": pass_at_k(correct, k),
        f"eval/maj@{k}": maj_at_k(answers, correct, k),
        "eval/problems": float(n),
    }
