"""The rollout-mismatch corrections beyond `off_policy.py`'s four (docs/objectives.md#off-policy-correction).

Same inputs and output as `off_policy.py`: `δ_t = clip(old − behaviour, ±20)` on valid tokens,
`k_t = exp(δ_t)` = π_old/μ, the band [C_low, C] (C_low = 1/C unless `cap_low` is given), and a
`Correction(weight, keep, metrics)` whose weight multiplies ℓ and whose keep multiplies the mask.

    geo_seq_mask  keep the response iff C_low ≤ exp(Σ_t m·δ_t / L) ≤ C    (geometric mean: SkyRL's
                  first recommendation at [0.99, 1.01]; length does not push it out of the band)
    icepop        w_t = k_t·[C_low ≤ k_t ≤ C], keep = 1                  (Ring-1T's IcePop, [0.5, 5]: the
                  zeroed tokens stay in the denominator, as in verl)
    k3_seq_mask   keep the response iff Σ_t m·(k_t − 1 − δ_t) / L ≤ threshold   (verl seq_mean_k3, 0.01:
                  the mean K3 estimate of KL(μ‖π_old); an upper bound only)

`batch_normalize` divides the weights by their mean over the valid tokens of the whole update batch
(verl's rollout_is_batch_normalize), so their scale is 1 and only their shape corrects.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from dapo_jax.objectives import diagnostics as diag
from dapo_jax.objectives.off_policy import Correction, token_log_ratio


def _f32(x):
    return jnp.asarray(x, jnp.float32)


def band(cap: float, cap_low: float | None) -> tuple[float, float]:
    """(log C_low, log C), C_low = 1/C when not given; refuses an empty band."""
    if not cap > 0 or (cap_low is not None and not 0 < cap_low < cap):
        raise ValueError(f"the off-policy band needs 0 < cap_low < cap, got cap_low={cap_low}, cap={cap}")
    return (-math.log(cap) if cap_low is None else math.log(cap_low)), math.log(cap)


def _seq_metrics(stat_units, keep_units, nonempty, ratio_units):
    return {
        "behaviour_ratio_mean": diag.masked_sum_count(ratio_units, nonempty),
        "behaviour_ratio_min": diag.masked_min_count(ratio_units, nonempty),
        "behaviour_ratio_max": diag.masked_max_count(ratio_units, nonempty),
        "behaviour_masked_frac": diag.masked_sum_count(1.0 - keep_units, nonempty),
        "behaviour_capped_frac": diag.masked_sum_count(stat_units, nonempty),
    }


def geo_seq_mask(old_logp, behaviour_logp, mask, *, cap=1.01, cap_low=None):
    """Keep the responses whose geometric-mean ratio `exp(mean_t δ_t)` lies in [C_low, C]."""
    lo, hi = band(cap, cap_low)
    m = _f32(mask)
    length = jnp.sum(m, axis=-1)
    g = jax.lax.stop_gradient(jnp.sum(token_log_ratio(old_logp, behaviour_logp, m), axis=-1) / jnp.maximum(length, 1.0))
    keep = ((g >= lo) & (g <= hi)).astype(jnp.float32)
    nonempty = (length > 0).astype(jnp.float32)
    metrics = _seq_metrics((g > hi).astype(jnp.float32), keep, nonempty, jnp.exp(g))
    return Correction(jnp.ones_like(m), jnp.broadcast_to(keep[..., None], m.shape), metrics)


def icepop(old_logp, behaviour_logp, mask, *, cap=5.0, cap_low=0.5):
    """IcePop: `w_t = k_t·[C_low ≤ k_t ≤ C]`; tokens outside the band get weight 0 and stay counted."""
    lo, hi = band(cap, cap_low)
    m = _f32(mask)
    d = jax.lax.stop_gradient(token_log_ratio(old_logp, behaviour_logp, m))
    inside = ((d >= lo) & (d <= hi)).astype(jnp.float32)
    weight = jnp.exp(jnp.minimum(d, hi)) * inside
    r = jnp.exp(d)
    metrics = {
        "behaviour_ratio_mean": diag.masked_sum_count(r, m),
        "behaviour_ratio_min": diag.masked_min_count(r, m),
        "behaviour_ratio_max": diag.masked_max_count(r, m),
        "behaviour_masked_frac": diag.masked_sum_count(1.0 - inside, m),
        "behaviour_capped_frac": diag.masked_sum_count(d > hi, m),
    }
    return Correction(weight, jnp.ones_like(m), metrics)


def k3_seq_mask(old_logp, behaviour_logp, mask, *, k3_threshold=0.01):
    """Keep the responses whose mean `k3_t = k_t − 1 − log k_t` is at most the threshold."""
    if not k3_threshold > 0:
        raise ValueError(f"the K3 rejection threshold must be > 0, got {k3_threshold}")
    m = _f32(mask)
    d = jax.lax.stop_gradient(token_log_ratio(old_logp, behaviour_logp, m))
    k3 = jnp.where(m > 0, jnp.expm1(d) - d, 0.0)
    length = jnp.sum(m, axis=-1)
    mean_k3 = jnp.sum(k3, axis=-1) / jnp.maximum(length, 1.0)
    keep = (mean_k3 <= k3_threshold).astype(jnp.float32)
    nonempty = (length > 0).astype(jnp.float32)
    g = jnp.exp(jnp.sum(d, axis=-1) / jnp.maximum(length, 1.0))
    metrics = _seq_metrics(1.0 - keep, keep, nonempty, g)
    metrics["behaviour_k3_mean"] = diag.masked_sum_count(k3, m)
    return Correction(jnp.ones_like(m), jnp.broadcast_to(keep[..., None], m.shape), metrics)


def weight_sum(weight, mask):
    """(Σ w·m, Σ m) over the valid tokens: the batch-level pair `batch_normalize` divides by."""
    return diag.masked_sum_count(weight, mask)


def batch_normalize(correction: Correction, mask, *, total=None) -> Correction:
    """`w̃ = w / mean_valid(w)`; total = (Σ w·m, Σ m) over the whole update batch (None = these arrays).
    The mean counts every valid token, masked-out ones included (verl). A zero mean leaves w as is."""
    s, n = weight_sum(correction.weight, mask) if total is None else total
    mean = s / jnp.maximum(n, 1.0)
    scale = jnp.where(mean > 0, 1.0 / jnp.where(mean > 0, mean, 1.0), 1.0)
    return correction._replace(weight=correction.weight * jax.lax.stop_gradient(scale))
