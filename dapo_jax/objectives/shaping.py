"""Reward shaping on response length (docs/objectives.md#rewards-and-shaping): DAPO's soft overlong punishment and
overlong filtering. Lengths are counted in TOKENS (Tunix counts characters, which is wrong).
"""

from __future__ import annotations

import jax.numpy as jnp


def overlong_penalty(lengths, *, max_length: int, buffer: int, factor: float = 1.0):
    """Soft overlong punishment `R_len` [P, G] (float32) for response lengths `lengths` [P, G] (tokens).

        R_len = 0                                  if L <= L_max - L_cache
                (L_max - L_cache - L) / L_cache    if L_max - L_cache < L <= L_max
                -1                                 if L > L_max
    times `factor`; it is added to the correctness reward. `max_length` = L_max, `buffer` = L_cache.
    """
    if not 0 < buffer <= max_length:
        raise ValueError(f"overlong buffer L_cache={buffer} must be in (0, L_max={max_length}]")
    length = jnp.asarray(lengths, jnp.float32)
    start = float(max_length - buffer)
    in_band = (start - length) / float(buffer)
    penalty = jnp.where(length <= start, 0.0, jnp.where(length <= max_length, in_band, -1.0))
    return factor * penalty


def overlong_filter(mask, truncated):
    """Overlong filtering: responses with `truncated` [P, G] = 1 get mask 0 on every token.

    mask [P, G, T] -> mask of the same dtype: a filtered response leaves the loss and its denominator.
    """
    keep = jnp.logical_not(jnp.asarray(truncated, bool))[..., None]
    return jnp.where(keep, mask, jnp.zeros((), jnp.asarray(mask).dtype))
