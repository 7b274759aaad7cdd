"""KL estimators to the reference policy (docs/objectives.md#kl), per token.

With `x = clip(logp - ref, -20, 20)` (the clamp keeps exp finite):

    k1 = x                      unbiased, high variance, can be negative
    k2 = x² / 2                 low variance, biased
    k3 = exp(-x) + x - 1        unbiased, never negative (GRPO's choice)

`clamp` (optional) then clips the estimator's value to [-clamp, clamp] (verl clamps k3 to ±10).
Shapes: logp, ref_logp [...] (usually [P, G, T]) -> [...] float32. Masking is the caller's job.
"""

from __future__ import annotations

import jax.numpy as jnp

LOG_RATIO_CLAMP = 20.0


def _log_ratio(logp, ref_logp):
    x = jnp.asarray(logp, jnp.float32) - jnp.asarray(ref_logp, jnp.float32)
    return jnp.clip(x, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _clamp(k, clamp):
    return k if clamp is None else jnp.clip(k, -clamp, clamp)


def k1(logp, ref_logp, *, clamp: float | None = None):
    """`k1 = logp - ref`."""
    return _clamp(_log_ratio(logp, ref_logp), clamp)


def k2(logp, ref_logp, *, clamp: float | None = None):
    """`k2 = (logp - ref)² / 2`."""
    return _clamp(0.5 * jnp.square(_log_ratio(logp, ref_logp)), clamp)


def k3(logp, ref_logp, *, clamp: float | None = None):
    """`k3 = exp(ref - logp) - (ref - logp) - 1 = π_ref/π_θ - log(π_ref/π_θ) - 1`."""
    x = _log_ratio(logp, ref_logp)
    # expm1 keeps the value exact near x = 0, where k3 ~ x²/2 and exp(-x) + x - 1 loses its digits.
    return _clamp(jnp.expm1(-x) + x, clamp)
