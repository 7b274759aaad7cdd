"""What a step's rollout says per data source, and Dr. GRPO's length-inflation signal.

    row.update(length_by_outcome(lengths, correct))     # every run: response_length_right/wrong_mean
    sample, keep, seen = watch_rounds(sample_round, keep_fn)   # collect_groups(sample, keep, ...)
    row.update(source_stats(seen, names))                # a mixture: source/NAME/accuracy, ...

Length inflation (Liu et al., 2025, "Understanding R1-Zero-Like Training", Dr. GRPO): GRPO's
per-response `1/|o_i|` normalisation makes a long wrong response cost less per token than a short
one, so the mean length of WRONG responses grows while that of right ones does not. The two means,
`response_length_right_mean` and `response_length_wrong_mean` (over every response generated in the
step), show it: a wrong mean pulling away from the right one is the bias at work. A step with no right
(or no wrong) response has no such mean: NaN, written `null` in metrics.jsonl.

Per source (a data mixture, data/mixture.py), over the groups generated in the step (kept or not), as
the rollout's totals are: `source/NAME/reward_mean` (the shaped reward), `accuracy`,
`response_length_right_mean`, `response_length_wrong_mean`, `kept_fraction` (the groups dynamic
sampling kept, surplus included, as `kept_fraction`), `generated_groups`. A source no prompt of the step
came from has no row entries.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


def length_by_outcome(lengths: np.ndarray, correct: np.ndarray) -> dict[str, float]:
    """Mean length of the right and of the wrong responses; NaN for an empty set.

    lengths: `[..., G]` response lengths in tokens; correct: the same shape, bool."""
    lengths = np.asarray(lengths, np.float64)
    correct = np.asarray(correct, bool)

    def mean(sel):
        return float(lengths[sel].mean()) if sel.any() else float("nan")

    return {"response_length_right_mean": mean(correct), "response_length_wrong_mean": mean(~correct)}


def watch_rounds(sample_round: Callable, keep_fn: Callable | None) -> tuple[Callable, Callable | None, list]:
    """`(sample_round, keep_fn, seen)` for `rollout.collect_groups`: the same functions, also putting each
    generated round and its keep mask in `seen` as `[groups, keep [N] bool]` (all True without `keep_fn`)."""
    seen: list = []

    def sample(i):
        groups = sample_round(i)
        if groups is not None:
            seen.append([groups, np.ones(len(groups), bool)])
        return groups

    def keep(groups):
        mask = keep_fn(groups)
        seen[-1][1] = np.asarray(mask, bool)
        return mask

    return sample, (keep if keep_fn is not None else None), seen


def source_stats(seen: Sequence, names: Sequence[str]) -> dict[str, float]:
    """The per-source metrics (module docstring) of the rounds `watch_rounds` saw."""
    if not seen:
        return {}
    source = np.concatenate([g.source for g, _ in seen])
    kept = np.concatenate([k for _, k in seen])
    correct = np.concatenate([g.correct for g, _ in seen])
    rewards = np.concatenate([g.rewards for g, _ in seen])
    lengths = np.concatenate([g.lengths for g, _ in seen])
    out = {}
    for s, name in enumerate(names):
        rows = source == s
        if not rows.any():
            continue
        key = f"source/{name}"
        out[f"{key}/generated_groups"] = float(rows.sum())
        out[f"{key}/reward_mean"] = float(rewards[rows].mean(dtype=np.float64))
        out[f"{key}/accuracy"] = float(correct[rows].mean())
        out[f"{key}/kept_fraction"] = float(kept[rows].mean())
        out.update({f"{key}/{k}": v for k, v in length_by_outcome(lengths[rows], correct[rows]).items()})
    return out


__all__ = ["length_by_outcome", "source_stats", "watch_rounds"]
