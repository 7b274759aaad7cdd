"""DAPO dynamic sampling, the per-group part (docs/objectives.md#dynamic-sampling): which groups carry a gradient.

A group whose responses are all right or all wrong has advantages exactly 0 and no gradient; DAPO
keeps only groups with `0 < #correct < G`, or (metric "reward") a non-zero spread of a float metric.
The refill loop (sample again until enough groups are kept) belongs to the trainer; this is the jit-able
mask and its counts.
"""

from __future__ import annotations

import jax.numpy as jnp


def keep_groups(metric, *, kind: str = "correct", valid=None):
    """Per-group keep mask and counts.

    Args:
      metric: [P, G]; with kind "correct", correctness (bool or 0/1); with kind "reward", any float
        metric (the reward) whose spread inside the group decides.
      kind: "correct" (keep `0 < #correct < n`) or "reward" (keep `max_g > min_g`).
      valid: optional [P, G] mask of the responses that count (n = their number per group).

    Returns:
      (keep [P] bool, counts) with counts = {"kept", "all_correct", "all_wrong", "zero_spread",
      "groups"} int32 scalars. With kind "reward", all_correct / all_wrong count zero-spread groups
      whose value equals the group's max metric of the batch / its min (so with a +1/-1 reward they
      are the all-right / all-wrong groups).
    """
    x = jnp.asarray(metric, jnp.float32)
    if x.ndim != 2:
        raise ValueError(f"metric must be [P, G], got shape {x.shape}")
    v = jnp.ones(x.shape, bool) if valid is None else jnp.asarray(valid, bool)
    n = jnp.sum(v, axis=-1)
    if kind == "correct":
        c = jnp.sum((x > 0) & v, axis=-1)
        all_correct = (n > 0) & (c == n)
        all_wrong = c == 0
        keep = (c > 0) & (c < n)
    elif kind == "reward":
        hi = jnp.max(jnp.where(v, x, -jnp.inf), axis=-1)
        lo = jnp.min(jnp.where(v, x, jnp.inf), axis=-1)
        keep = (n >= 2) & (hi > lo)
        batch_hi = jnp.max(jnp.where(v, x, -jnp.inf))
        batch_lo = jnp.min(jnp.where(v, x, jnp.inf))
        all_correct = ~keep & (n > 0) & (hi == batch_hi) & (batch_hi > batch_lo)
        all_wrong = ~keep & (n > 0) & (lo == batch_lo) & (batch_hi > batch_lo)
    else:
        raise ValueError(f"dynamic_sampling_metric {kind!r} is not one of 'correct', 'reward'")
    counts = {
        "kept": jnp.sum(keep, dtype=jnp.int32),
        "all_correct": jnp.sum(all_correct, dtype=jnp.int32),
        "all_wrong": jnp.sum(all_wrong, dtype=jnp.int32),
        "zero_spread": jnp.sum(~keep, dtype=jnp.int32),
        "groups": jnp.asarray(x.shape[0], jnp.int32),
    }
    return keep, counts
