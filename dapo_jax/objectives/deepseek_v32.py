"""DeepSeek-V3.2's off-policy sequence masking and unbiased KL estimate (arXiv 2512.02556, §3.1,
Eqs. 7 and 9; docs/objectives_recent.md#deepseek-v32).

Off-policy sequence mask (OPSM): a response with a negative advantage whose policy has drifted too far
from the one that sampled it is dropped from the policy term:

    M_i = 0  iff  A_i < 0  and  (1/L_i)·Σ_t m·(μ_t − sg(logp_t)) > δ,   else 1,

with μ the sampler's log-probs (the paper: the probabilities the inference engine returned, so the
statistic covers both engine mismatch and staleness) and logp the current policy, so the mask is
re-taken every micro-step (it carries no gradient). M multiplies the policy term only: the response
stays in the denominator and keeps its KL term (the paper's 1/G Σ_i 1/|o_i| Σ_t [(…)·M_i − β·D]).

Unbiased KL (Eq. 7): k3 reweighted by the ratio to π_old, gradient through both factors,

    D_t = r_t·k3_t = exp(logp − old)·(exp(ref − logp) − (ref − logp) − 1),
    ∂D_t/∂logp_t = r_t·(logp_t − ref_t),

which stays bounded where π_θ ≪ π_ref (plain k3's gradient 1 − π_ref/π_θ does not).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dapo_jax.objectives import diagnostics as diag
from dapo_jax.objectives.policy_loss import LOG_RATIO_CLAMP


def _f32(x):
    return jnp.asarray(x, jnp.float32)


def off_policy_sequence_mask(logp, sampler_logp, advantages, mask, *, delta: float):
    """OPSM's keep mask `M` broadcast to [P, G, T] (float 0/1) and its metric.

    logp: [P, G, T] the current policy (detached here); sampler_logp: [P, G, T] μ; advantages:
    [P, G, T] (the response's mean over its tokens is its A_i); mask: [P, G, T].
    Returns (keep, metrics): opsm_masked_frac = dropped / non-empty responses.
    """
    m = _f32(mask)
    valid = m > 0
    length = jnp.maximum(jnp.sum(m, axis=-1), 1.0)
    drift = jnp.clip(_f32(sampler_logp) - jax.lax.stop_gradient(_f32(logp)), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    stat = jnp.sum(jnp.where(valid, drift, 0.0), axis=-1) / length  # [P, G]
    adv = jnp.sum(jnp.where(valid, _f32(advantages), 0.0), axis=-1) / length
    drop = (adv < 0) & (stat > delta)
    nonempty = (jnp.sum(m, axis=-1) > 0).astype(jnp.float32)
    keep = jnp.broadcast_to((~drop).astype(jnp.float32)[..., None], m.shape)
    return keep, {"opsm_masked_frac": diag.masked_sum_count(drop, nonempty)}


def unbiased_kl(kl, logp, old_logp):
    """`exp(clip(logp − old, ±20))·kl`: an estimate of KL(π_θ‖π_ref) under π_θ from tokens drawn by π_old."""
    return jnp.exp(jnp.clip(_f32(logp) - _f32(old_logp), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)) * _f32(kl)
