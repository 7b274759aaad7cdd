"""Evaluation metrics over ``n`` sampled responses per problem (docs/objectives.md#evaluation-metrics). Host-side NumPy.

Shapes: ``correct`` is ``[N, n]`` bool (problem ``i``, sample ``j``); ``answers`` is ``N`` lists of
``n`` canonical answer strings (``None`` = no answer extracted), e.g. from a reward's
``answer_key``.

- ``avg@k``: mean accuracy of k samples per problem (DAPO: avg@32 on AIME 2024). From ``n >= k``
  samples the unbiased estimate is the mean of all ``n`` (every k-subset's mean averages to it).
- ``pass@k``: probability that at least one of k samples is right, unbiased from ``n >= k``
  samples with ``c`` right (Chen et al. 2021): ``1 - C(n-c, k) / C(n, k)``, computed as the
  product ``1 - Π_{i=n-c+1}^{n} (1 - k/i)`` (no huge binomials, no overflow).
- ``maj@k``: the most frequent answer among the first k samples is right. Ties go to the tied
  answer seen first (smallest sample index); ``None`` answers do not vote; a problem with no
  answer at all counts as wrong. Answers are compared as strings, so canonicalise them first
  (``dapo_jax.rewards.answer_key`` maps ``25``, ``025``, ``25.0`` to one key).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["avg_at_k", "pass_at_k", "maj_at_k", "majority_index", "summarize"]


def _as_correct(correct, name: str = "correct") -> np.ndarray:
    arr = np.asarray(correct)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be [N problems, n samples], got shape {arr.shape}")
    if arr.dtype != bool:
        if not np.isin(arr, (0, 1)).all():
            raise ValueError(f"{name} must hold booleans (or 0/1), got dtype {arr.dtype}")
        arr = arr.astype(bool)
    return arr


def _check_k(k: int, n: int, name: str) -> None:
    if not 1 <= k <= n:
        raise ValueError(f"{name}: need 1 <= k <= n samples, got k={k}, n={n}")


def avg_at_k(correct, k: int | None = None, *, per_problem: bool = False):
    """Mean accuracy (avg@k) from ``correct [N, n]``; ``k`` (default n) only checks ``k <= n``.

    Returns the mean over problems (float), or ``[N]`` per-problem accuracies.
    """
    arr = _as_correct(correct)
    _check_k(arr.shape[1] if k is None else k, arr.shape[1], "avg@k")
    per = arr.mean(axis=1, dtype=np.float64)
    return per if per_problem else float(per.mean())


def pass_at_k(correct, k: int, *, per_problem: bool = False):
    """Unbiased pass@k, ``1 - C(n-c, k)/C(n, k)`` per problem, from ``correct [N, n]``.

    Returns the mean over problems (float), or ``[N]`` per-problem values.
    """
    arr = _as_correct(correct)
    n = arr.shape[1]
    _check_k(k, n, "pass@k")
    c = arr.sum(axis=1)  # [N]
    i = np.arange(1, n + 1, dtype=np.float64)  # [n]
    # Π over i in (n-c, n] of (1 - k/i) = C(n-c, k)/C(n, k); it is 0 when n-c < k (a factor is 0).
    in_range = i[None, :] > (n - c)[:, None]  # [N, n]
    factors = np.where(in_range, 1.0 - k / i[None, :], 1.0)
    per = 1.0 - np.prod(factors, axis=1)
    per = np.where(n - c < k, 1.0, per)  # exact 1 (the product has an exact 0 factor anyway)
    return per if per_problem else float(per.mean())


def majority_index(answers: Sequence[str | None]) -> int | None:
    """Index of the first occurrence of the most frequent non-None answer; ties -> seen first."""
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for j, a in enumerate(answers):
        if a is None:
            continue
        counts[a] = counts.get(a, 0) + 1
        first.setdefault(a, j)
    if not counts:
        return None
    best = max(counts, key=lambda a: (counts[a], -first[a]))
    return first[best]


def maj_at_k(
    answers: Sequence[Sequence[str | None]], correct, k: int, *, per_problem: bool = False
):
    """maj@k: whether the majority answer among each problem's first ``k`` samples is right.

    Args:
      answers: ``N`` lists of ``n`` canonical answers (``None`` = none extracted).
      correct: ``[N, n]`` bool, ``correct[i, j]`` = sample ``j`` of problem ``i`` is right. The
        majority answer's correctness is read at its first occurrence (equal keys are assumed to
        be equally right).
      k: samples used per problem (the first k).

    Returns:
      The fraction of problems (float), or ``[N]`` bool per problem.
    """
    arr = _as_correct(correct)
    if len(answers) != arr.shape[0]:
        raise ValueError(
            f"maj@k: {len(answers)} answer rows but correct has {arr.shape[0]} problems"
        )
    _check_k(k, arr.shape[1], "maj@k")
    per = np.zeros(arr.shape[0], dtype=bool)
    for i, row in enumerate(answers):
        if len(row) != arr.shape[1]:
            raise ValueError(
                f"maj@k: answers row {i} has {len(row)} samples, expected {arr.shape[1]}"
            )
        j = majority_index(row[:k])
        per[i] = j is not None and bool(arr[i, j])
    return per if per_problem else float(per.mean())


def summarize(
    correct,
    *,
    ks: Sequence[int] = (1,),
    answers: Sequence[Sequence[str | None]] | None = None,
) -> dict[str, float]:
    """``{"avg@n": …, "pass@k": …, "maj@k": …}`` for each ``k`` in ``ks`` (``k <= n``).

    maj@k entries appear only when ``answers`` is given.
    """
    arr = _as_correct(correct)
    n = arr.shape[1]
    out = {f"avg@{n}": avg_at_k(arr)}
    for k in ks:
        out[f"pass@{k}"] = pass_at_k(arr, k)
        if answers is not None:
            out[f"maj@{k}"] = maj_at_k(answers, arr, k)
    return out
