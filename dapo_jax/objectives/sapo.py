"""SAPO: soft adaptive policy optimisation (Gao et al., Qwen, arXiv 2511.20347; docs/objectives_recent.md#sapo).

A smooth gate of the ratio in place of PPO's hard clip, with its own temperature for positive and
negative advantages:

    r_t = exp(clip(logp − old, ±20)),   τ_t = τ_pos if A_t > 0 else τ_neg,
    f(r) = (4/τ)·sigmoid(τ·(r − 1)),    ℓ_t = −f(r_t)·A_t.

∂ℓ_t/∂logp_t = −A_t·w_t·r_t with the gate weight w_t = 4·p·(1 − p), p = sigmoid(τ(r_t − 1)): w = 1 at
r = 1 (on policy it is the plain policy gradient) and decays smoothly as r leaves 1, faster for larger
τ, so τ_neg > τ_pos quiets negative-advantage tokens sooner. No clip, no min, no dual clip; nothing is
stop-gradiented. The value at r = 1 is −2A/τ, not −A: compare gradients, not values, with PPO.
The paper aggregates with `seq_mean_token_mean`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dapo_jax.objectives import diagnostics as diag
from dapo_jax.objectives.policy_loss import LOG_RATIO_CLAMP

# A token counts as "gated" in the diagnostics when the gate has taken away at least half of its
# gradient (w < 1/2, i.e. |r − 1| ≳ 1.76/τ).
GATED_BELOW = 0.5


def _f32(x):
    return jnp.asarray(x, jnp.float32)


def sapo_gate_weight(ratio, advantages, *, tau_pos: float, tau_neg: float):
    """`w = 4·p·(1 − p)`, `p = sigmoid(τ(r − 1))`: the factor SAPO puts on the policy gradient [P, G, T]."""
    tau = jnp.where(_f32(advantages) > 0, tau_pos, tau_neg)
    p = jax.nn.sigmoid(tau * (_f32(ratio) - 1.0))
    return 4.0 * p * (1.0 - p)


def sapo(logp, old_logp, advantages, mask, *, eps_low=0.2, eps_high=0.28, dual_clip_c=None,
         tau_pos: float = 1.0, tau_neg: float = 1.05):
    """SAPO's per-token loss `ℓ = −(4/τ)·sigmoid(τ(r − 1))·A`, τ = τ_pos where A > 0 else τ_neg.

    logp, old_logp, advantages, mask: [P, G, T]. eps_low / eps_high / dual_clip_c: unused (the gate
    replaces the clip; kept for the shared signature).
    Returns (loss [P, G, T], ratio r [P, G, T], metrics): sapo_weight_mean (the mean gate weight w
    over valid tokens) and sapo_gated_frac (the fraction with w < 1/2).
    """
    del eps_low, eps_high, dual_clip_c
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"SAPO temperatures must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    a = _f32(advantages)
    ratio = jnp.exp(jnp.clip(_f32(logp) - _f32(old_logp), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    tau = jnp.where(a > 0, tau_pos, tau_neg)
    loss = -(4.0 / tau) * jax.nn.sigmoid(tau * (ratio - 1.0)) * a
    w = jax.lax.stop_gradient(sapo_gate_weight(ratio, a, tau_pos=tau_pos, tau_neg=tau_neg))
    m = _f32(mask)
    metrics = {"sapo_weight_mean": diag.masked_sum_count(w, m),
               "sapo_gated_frac": diag.masked_sum_count(w < GATED_BELOW, m)}
    return loss, ratio, metrics
