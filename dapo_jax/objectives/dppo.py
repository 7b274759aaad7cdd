"""DPPO: a trust region on a divergence between the policies, not on the ratio
(Qi et al., "Rethinking the Trust Region in LLM RL", arXiv 2602.04879; docs/objectives_recent.md#dppo).

With p = π_θ(o_t) = exp(sg(logp)) and q = μ(o_t) = exp(old) the probabilities of the sampled token
(the "binary" approximation: this token against everything else), a token is kept when the move
it asks for stays inside the region, or goes against its advantage:

    binary TV:  A > 0: p − q ≤ δ_high;            A ≤ 0: p − q ≥ −δ_low
    binary KL:  D = q·log(q/p) + (1−q)·log((1−q)/(1−p))
                A > 0: D ≤ δ_high or p ≤ q;       A ≤ 0: D ≤ δ_low or p ≥ q

and the loss is the importance-weighted policy gradient on the kept tokens:

    ρ_t = exp(clip(logp − old, ±20)),   ℓ_t = −A_t·sg(min(ρ_t, C))·logp_t·keep_t

(∂ℓ/∂logp = −A·min(ρ, C)·keep; C = None: no truncation, the authors' setting). Masked tokens keep
their place in the denominator, as PPO's clipped tokens do. The anchor is `old_logp`: the sampler's
log-probs when π_old is not recomputed (`rollout.recompute_old_logp=false`, the authors' default, in
which case DPPO is the whole off-policy treatment), the trainer's π_old otherwise. The mask is taken
from the current policy each micro-step; it carries no gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dapo_jax.objectives import diagnostics as diag
from dapo_jax.objectives.policy_loss import LOG_RATIO_CLAMP

_TINY = 1e-12  # keeps log(1 − p) finite when p rounds to 1


def _f32(x):
    return jnp.asarray(x, jnp.float32)


def binary_tv_keep(logp, old_logp, advantages, *, delta_low: float, delta_high: float):
    """Binary-TV keep mask [P, G, T] (bool) from the detached current and anchor log-probs."""
    diff = jnp.exp(_f32(logp)) - jnp.exp(_f32(old_logp))
    return jnp.where(_f32(advantages) > 0, diff <= delta_high, diff >= -delta_low)


def binary_kl(logp, old_logp):
    """`D = q·log(q/p) + (1−q)·log((1−q)/(1−p))`, the KL between the Bernoullis (q, 1−q) and (p, 1−p) [P, G, T]."""
    lp = jnp.clip(_f32(logp), -LOG_RATIO_CLAMP * 5, 0.0)
    lq = jnp.clip(_f32(old_logp), -LOG_RATIO_CLAMP * 5, 0.0)
    q = jnp.exp(lq)
    log1m_p = jnp.log(jnp.maximum(-jnp.expm1(lp), _TINY))
    log1m_q = jnp.log(jnp.maximum(-jnp.expm1(lq), _TINY))
    return q * (lq - lp) + (1.0 - q) * (log1m_q - log1m_p)


def binary_kl_keep(logp, old_logp, advantages, *, delta_low: float, delta_high: float):
    """Binary-KL keep mask [P, G, T] (bool)."""
    d = binary_kl(logp, old_logp)
    lp, lq = _f32(logp), _f32(old_logp)
    return jnp.where(_f32(advantages) > 0, (d <= delta_high) | (lp <= lq), (d <= delta_low) | (lp >= lq))


def _dppo(keep_fn, logp, old_logp, advantages, mask, *, delta_low, delta_high, is_cap):
    if not (delta_low > 0 and delta_high > 0):
        raise ValueError(f"DPPO thresholds must be > 0, got delta_low={delta_low}, delta_high={delta_high}")
    lp = _f32(logp)
    a = _f32(advantages)
    lp_sg = jax.lax.stop_gradient(lp)
    keep = keep_fn(lp_sg, old_logp, a, delta_low=delta_low, delta_high=delta_high).astype(jnp.float32)
    ratio = jnp.exp(jnp.clip(lp_sg - _f32(old_logp), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    weight = ratio if is_cap is None else jnp.minimum(ratio, is_cap)
    m = _f32(mask)
    metrics = {"dppo_masked_frac": diag.masked_sum_count(1.0 - keep, m)}
    return -a * weight * lp * keep, ratio, metrics


def dppo_tv(logp, old_logp, advantages, mask, *, eps_low=0.2, eps_high=0.28, dual_clip_c=None,
            delta_low: float = 0.15, delta_high: float = 0.15, is_cap: float | None = None):
    """DPPO with the binary total-variation region. Shapes [P, G, T]; eps_* / dual_clip_c unused.

    Returns (loss, ratio ρ, metrics): dppo_masked_frac, the fraction of valid tokens outside the region.
    """
    del eps_low, eps_high, dual_clip_c
    return _dppo(binary_tv_keep, logp, old_logp, advantages, mask, delta_low=delta_low, delta_high=delta_high,
                 is_cap=is_cap)


def dppo_kl(logp, old_logp, advantages, mask, *, eps_low=0.2, eps_high=0.28, dual_clip_c=None,
            delta_low: float = 0.05, delta_high: float = 0.05, is_cap: float | None = None):
    """DPPO with the binary KL region. Shapes [P, G, T]; eps_* / dual_clip_c unused."""
    del eps_low, eps_high, dual_clip_c
    return _dppo(binary_kl_keep, logp, old_logp, advantages, mask, delta_low=delta_low, delta_high=delta_high,
                 is_cap=is_cap)
