"""Off-policy correction: the tokens were drawn by a behaviour policy μ other than π_old
(docs/objectives.md#off-policy-correction).

The sampler that drew a response is not always the policy the trainer calls π_old: it may compute
in another precision (a bfloat16 sampler, a float32 trainer), run stale weights (groups carried to
the next step), or be another engine altogether. The trainer then recomputes `old = log π_old` of
the sampled tokens, and `behaviour = log μ` is what the sampler reported. With `δ = old − behaviour`
(clamped to ±20 per token, like every log-ratio here) and a cap `C > 1`:

    token_tis   w_t = sg(min(exp(δ_t), C))                 multiplies each token's loss ℓ_t
    seq_tis     w   = sg(min(exp(Σ_t m·δ_t), C))           one weight per response, on all its tokens
    token_mask  keep_t = [1/C ≤ exp(δ_t) ≤ C]              (verl rollout_corr / IcePop token masking)
    seq_mask    keep   = [1/C ≤ exp(Σ_t m·δ_t) ≤ C]        whole responses

A separate lower bound `cap_low` replaces 1/C (masks) or adds a lower truncation (TIS: clip(·, C_low, C)).
`rollout_mismatch.py` adds the geometric-mean sequence mask, IcePop and K3 rejection.

Truncated importance sampling (TIS) keeps every token and caps the weight; masking drops the tokens
(or responses) whose ratio leaves `[1/C, C]` from the loss AND from the aggregation's denominator
(the trainer multiplies its training mask by `keep`). Weights and masks are constants: no gradient
flows through them. When π_old is not recomputed, `old == behaviour`, every weight is 1 and nothing
is masked: the correction is a no-op (the run config refuses that combination).

Shared signature: fn(old_logp, behaviour_logp, mask, *, cap) -> Correction(weight, keep, metrics)
with weight and keep [P, G, T] float32 and metrics additive `(value, count)` pairs
(`diagnostics.py`): behaviour_ratio_mean / _min / _max (the ratio π_old / μ, per token for the token
modes, per response for the sequence modes, counted over valid tokens or non-empty responses),
behaviour_masked_frac (the fraction the correction drops: 0 for TIS) and behaviour_capped_frac (the
fraction whose ratio exceeds C: capped by TIS, dropped by masking).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dapo_jax.objectives import diagnostics as diag
from dapo_jax.objectives.policy_loss import LOG_RATIO_CLAMP


class Correction(NamedTuple):
    weight: jax.Array  # [P, G, T] float32 multiplying ℓ (1 where masking is used instead)
    keep: jax.Array  # [P, G, T] float32 in {0, 1} multiplying the training mask (1 for TIS)
    metrics: dict  # {name: (value, count)}


def _f32(x):
    return jnp.asarray(x, jnp.float32)


def token_log_ratio(old_logp, behaviour_logp, mask):
    """`δ = clip(old − behaviour, ±20)` on valid tokens, 0 on padding (whatever padding holds). [P, G, T]"""
    m = _f32(mask)
    d = jnp.clip(_f32(old_logp) - _f32(behaviour_logp), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return jnp.where(m > 0, d, 0.0)


def _check_cap(cap) -> float:
    if not cap > 1:
        raise ValueError(f"the off-policy cap C must be > 1, got {cap}")
    return math.log(cap)


def _log_low(cap_low, log_cap, default):
    """log C_low: `default` when cap_low is None, else log(cap_low), which must lie below C."""
    if cap_low is None:
        return default
    if not 0 < cap_low < math.exp(log_cap):
        raise ValueError(f"the off-policy lower bound must lie in (0, C), got cap_low={cap_low}, C={math.exp(log_cap)}")
    return math.log(cap_low)


def _metrics(log_ratio, units, keep_units, capped_units):
    """Pairs over `units` (a [P, G, T] token mask or a [P, G] response mask): the ratio's mean, min,
    max (its log clamped to ±20 so exp stays finite), the dropped and the above-cap fractions."""
    r = jnp.exp(jnp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return {
        "behaviour_ratio_mean": diag.masked_sum_count(r, units),
        "behaviour_ratio_min": diag.masked_min_count(r, units),
        "behaviour_ratio_max": diag.masked_max_count(r, units),
        "behaviour_masked_frac": diag.masked_sum_count(1.0 - keep_units, units),
        "behaviour_capped_frac": diag.masked_sum_count(capped_units, units),
    }


def _sequence(old_logp, behaviour_logp, mask):
    m = _f32(mask)
    s = jnp.sum(token_log_ratio(old_logp, behaviour_logp, m), axis=-1)  # [P, G]
    nonempty = (jnp.sum(m, axis=-1) > 0).astype(jnp.float32)
    return m, s, nonempty


def token_tis(old_logp, behaviour_logp, mask, *, cap=2.0, cap_low=None):
    """Token-level truncated importance sampling: `w_t = sg(min(exp(δ_t), C))`; with `cap_low` the
    truncation is two-sided, `clip(exp(δ_t), C_low, C)` (TRL's token_truncate)."""
    log_cap = _check_cap(cap)
    log_low = _log_low(cap_low, log_cap, -jnp.inf)
    m = _f32(mask)
    d = jax.lax.stop_gradient(token_log_ratio(old_logp, behaviour_logp, m))
    weight = jnp.exp(jnp.clip(d, log_low, log_cap))  # = clip(exp(δ), C_low, C) without overflow
    ones = jnp.ones_like(m)
    return Correction(weight, ones, _metrics(d, m, ones, (d > log_cap).astype(jnp.float32)))


def seq_tis(old_logp, behaviour_logp, mask, *, cap=2.0, cap_low=None):
    """Sequence-level TIS: `w = sg(min(exp(Σ_t m·δ_t), C))`, one weight for every token of a response
    (`clip(·, C_low, C)` with `cap_low`)."""
    log_cap = _check_cap(cap)
    log_low = _log_low(cap_low, log_cap, -jnp.inf)
    m, s, nonempty = _sequence(old_logp, behaviour_logp, mask)
    s = jax.lax.stop_gradient(s)
    weight = jnp.broadcast_to(jnp.exp(jnp.clip(s, log_low, log_cap))[..., None], m.shape)
    return Correction(weight, jnp.ones_like(m),
                      _metrics(s, nonempty, jnp.ones_like(s), (s > log_cap).astype(jnp.float32)))


def token_mask(old_logp, behaviour_logp, mask, *, cap=2.0, cap_low=None):
    """Token masking: keep the tokens with `C_low ≤ exp(δ_t) ≤ C` (C_low = 1/C unless `cap_low`); the
    others leave loss and denominator."""
    log_cap = _check_cap(cap)
    log_low = _log_low(cap_low, log_cap, -log_cap)
    m = _f32(mask)
    d = jax.lax.stop_gradient(token_log_ratio(old_logp, behaviour_logp, m))
    keep = ((d >= log_low) & (d <= log_cap)).astype(jnp.float32)
    return Correction(jnp.ones_like(m), keep, _metrics(d, m, keep, (d > log_cap).astype(jnp.float32)))


def seq_mask(old_logp, behaviour_logp, mask, *, cap=2.0, cap_low=None):
    """Sequence masking: keep the responses with `C_low ≤ exp(Σ_t m·δ_t) ≤ C`, drop the others whole."""
    log_cap = _check_cap(cap)
    log_low = _log_low(cap_low, log_cap, -log_cap)
    m, s, nonempty = _sequence(old_logp, behaviour_logp, mask)
    s = jax.lax.stop_gradient(s)
    keep = ((s >= log_low) & (s <= log_cap)).astype(jnp.float32)
    return Correction(jnp.ones_like(m), jnp.broadcast_to(keep[..., None], m.shape),
                      _metrics(s, nonempty, keep, (s > log_cap).astype(jnp.float32)))


def recompute_old_logp(explicit: bool | None, *, sampler_dtype: str, trainer_dtype: str,
                       correction: str | None) -> bool:
    """Whether the trainer recomputes `log π_old` instead of taking the sampler's log-probs.

    The rule (docs/objectives.md#updates-per-rollout, #off-policy-correction): an explicit True / False
    wins. Otherwise (None) recompute when
    the sampler and the trainer compute in different dtypes (their log-probs differ by more than
    rounding, so the sampler's are μ, not π_old), or when an off-policy correction is on (it compares
    the two; without the recomputation every weight would be 1).
    """
    if explicit is not None:
        return bool(explicit)
    return sampler_dtype != trainer_dtype or correction is not None
