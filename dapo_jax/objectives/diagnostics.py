"""Diagnostics of one loss evaluation, in a form that adds up over micro-batches and devices.

Every metric is a pair `(value, count)` of float32 scalars:
  - names ending in `_min` / `_max`: value is the min / max over the counted tokens (±inf when the
    count is 0); pairs combine with min / max of the values and the sum of the counts;
  - every other name: value is a SUM over the counted items; pairs combine by adding both.
`combine_metrics` adds a list of such dicts; `finalize_metrics` turns one into scalars
(sum / count, or min / max; 0.0 where the count is 0, never NaN).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp


def masked_sum_count(x, mask):
    """(Σ x·m, Σ m) over the positions where mask > 0 (x outside the mask never leaks, even NaN)."""
    m = jnp.asarray(mask, jnp.float32)
    return jnp.sum(jnp.where(m > 0, jnp.asarray(x, jnp.float32) * m, 0.0)), jnp.sum(m)


def masked_min_count(x, mask):
    m = jnp.asarray(mask, jnp.float32)
    return jnp.min(jnp.where(m > 0, jnp.asarray(x, jnp.float32), jnp.inf)), jnp.sum(m)


def masked_max_count(x, mask):
    m = jnp.asarray(mask, jnp.float32)
    return jnp.max(jnp.where(m > 0, jnp.asarray(x, jnp.float32), -jnp.inf)), jnp.sum(m)


def zero_advantage_groups(advantages, mask):
    """(#groups whose valid tokens all have A == 0 exactly, #groups with any valid token).

    advantages, mask [P, G, T]: with GRPO-style estimators these are the zero-spread groups."""
    m = jnp.asarray(mask, jnp.float32)
    a = jnp.asarray(advantages, jnp.float32)
    has_tokens = jnp.sum(m, axis=(1, 2)) > 0
    nonzero = jnp.sum(jnp.where(m > 0, a != 0, False), axis=(1, 2)) > 0
    zero = has_tokens & ~nonzero
    return jnp.sum(zero.astype(jnp.float32)), jnp.sum(has_tokens.astype(jnp.float32))


def _kind(name: str) -> str:
    return "min" if name.endswith("_min") else "max" if name.endswith("_max") else "sum"


def combine_metrics(metrics: Sequence[dict]) -> dict:
    """Combine the metric dicts of several micro-batches / devices into one of the same form."""
    out: dict = {}
    for md in metrics:
        for name, (value, count) in md.items():
            if name not in out:
                out[name] = (value, count)
                continue
            v0, c0 = out[name]
            kind = _kind(name)
            v = v0 + value if kind == "sum" else jnp.minimum(v0, value) if kind == "min" else jnp.maximum(v0, value)
            out[name] = (v, c0 + count)
    return out


def combine_stacked(metrics: dict) -> dict:
    """`combine_metrics` for pairs stacked along leading axes (the output of a `lax.scan` over micro-batches)."""
    reduce = {"sum": jnp.sum, "min": jnp.min, "max": jnp.max}
    return {name: (reduce[_kind(name)](value), jnp.sum(count)) for name, (value, count) in metrics.items()}


def finalize_metrics(metrics: dict) -> dict:
    """`{name: (value, count)}` -> `{name: float32 scalar}` (jit-able; `float()` them on the host):
    sum / count, or the min / max, and 0.0 where the count is 0. Adds `advantage_std` from the moments."""
    out = {}
    for name, (value, count) in metrics.items():
        value, count = jnp.asarray(value, jnp.float32), jnp.asarray(count, jnp.float32)
        v = value / jnp.maximum(count, 1e-12) if _kind(name) == "sum" else value
        out[name] = jnp.where(count > 0, v, 0.0)
    if "advantage_mean" in out and "advantage_sq_mean" in out:
        out["advantage_std"] = jnp.sqrt(jnp.maximum(out["advantage_sq_mean"] - jnp.square(out["advantage_mean"]), 0.0))
    return out
