"""Per-token policy losses ℓ[P, G, T] to minimise (docs/objectives.md#policy-losses).

All losses share one keyword signature so the registry can call any of them:

    fn(logp, old_logp, advantages, mask, *, eps_low, eps_high, dual_clip_c=None)
       -> (loss [P, G, T], ratio [P, G, T])

`logp` carries the gradient; `old_logp` is treated as a constant. `advantages` are already
broadcast to [P, G, T]. `ratio` is the importance ratio each loss clips (token ρ, or the sequence
ratio s broadcast to the tokens for GSPO), returned for the diagnostics. The returned loss is not
masked: aggregation multiplies by the mask. Math in float32 whatever the input dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

LOG_RATIO_CLAMP = 20.0


def _f32(x):
    return jnp.asarray(x, jnp.float32)


def _surrogate(ratio, adv, eps_low, eps_high, dual_clip_c):
    """`-min(ρ·A, clip(ρ, 1-ε_low, 1+ε_high)·A)`, then dual clip `min(ℓ, -c·A)` where A < 0."""
    loss = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high))
    if dual_clip_c is not None:
        loss = jnp.where(adv < 0, jnp.minimum(loss, -dual_clip_c * adv), loss)
    return loss


def clipped_surrogate(logp, old_logp, advantages, mask=None, *, eps_low=0.2, eps_high=0.28, dual_clip_c=None):
    """PPO / GRPO / DAPO clipped surrogate with clip-higher and optional dual clip.

    x = clip(logp - old, ±20), ρ = exp(x),
    ℓ = -min(ρ·A, clip(ρ, 1 - ε_low, 1 + ε_high)·A);  where A < 0 and c given: ℓ = min(ℓ, -c·A).
    """
    del mask
    ratio = jnp.exp(jnp.clip(_f32(logp) - _f32(old_logp), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return _surrogate(ratio, _f32(advantages), eps_low, eps_high, dual_clip_c), ratio


def _seq_log_ratio(logp, old_logp, mask):
    m = _f32(mask)
    length = jnp.maximum(jnp.sum(m, axis=-1, keepdims=True), 1.0)
    return jnp.sum((_f32(logp) - _f32(old_logp)) * m, axis=-1, keepdims=True) / length


def _seq_advantage(advantages, mask):
    """Token advantages -> their mean over the response (equal to A for broadcast sequence ones)."""
    m = _f32(mask)
    return jnp.sum(_f32(advantages) * m, axis=-1, keepdims=True) / jnp.maximum(jnp.sum(m, -1, keepdims=True), 1.0)


def gspo(logp, old_logp, advantages, mask, *, eps_low=3e-4, eps_high=4e-4, dual_clip_c=None):
    """GSPO with the sequence ratio `s = exp(Σ_t m·(logp - old) / L)` (clamped to exp(±20)).

    ℓ_seq = -min(s·A, clip(s, 1 - ε_low, 1 + ε_high)·A) with A the response's (mean) advantage,
    broadcast to every token so that `seq_mean_token_mean` gives the mean over responses of ℓ_seq.
    """
    log_s = jnp.clip(_seq_log_ratio(logp, old_logp, mask), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    s = jnp.exp(log_s)
    loss = _surrogate(s, _seq_advantage(advantages, mask), eps_low, eps_high, dual_clip_c)
    shape = jnp.shape(logp)
    return jnp.broadcast_to(loss, shape), jnp.broadcast_to(s, shape)


def gspo_token(logp, old_logp, advantages, mask, *, eps_low=3e-4, eps_high=4e-4, dual_clip_c=None):
    """GSPO-token: `s_t = sg(s)·exp(logp_t - sg(logp_t))`, clipped per token with the token's A.

    Its value equals s; its gradient flows through each token (`∂s_t/∂logp_t = s`). With sequence
    advantages and `seq_mean_token_mean` it has GSPO's value and gradient.
    """
    lp = _f32(logp)
    log_s = jax.lax.stop_gradient(_seq_log_ratio(lp, old_logp, mask)) + lp - jax.lax.stop_gradient(lp)
    s_t = jnp.exp(jnp.clip(log_s, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return _surrogate(s_t, _f32(advantages), eps_low, eps_high, dual_clip_c), s_t


def cispo(logp, old_logp, advantages, mask=None, *, eps_low=1.0, eps_high=0.28, dual_clip_c=None):
    """CISPO (MiniMax-M1): `ℓ = -sg(clip(ρ, 1 - ε_low, 1 + ε_high))·A·logp`.

    The importance weight is clipped and detached, so every token keeps the gradient `-w·A·∇logp`.
    ε_low = 1 (lower bound 0) is MiniMax's "no lower bound". Dual clip does not apply (ignored).
    """
    del mask, dual_clip_c
    lp = _f32(logp)
    ratio = jnp.exp(jnp.clip(lp - _f32(old_logp), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    weight = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high))
    return -weight * _f32(advantages) * lp, jax.lax.stop_gradient(ratio)


def entropy_bonus(loss, entropy, *, coef: float):
    """`ℓ - α_H·H_t` (maximising entropy); H_t = logsumexp(z) - Σ softmax(z)·z from the model."""
    return loss - coef * _f32(entropy)


def high_entropy_threshold(entropy, mask, *, quantile: float):
    """The (1 - q) quantile of the valid tokens' entropies (numpy's linear interpolation); NaN when
    nothing is valid. Any shape: the trainer passes a whole update batch, every micro-batch stacked."""
    h = jnp.where(_f32(mask) > 0, _f32(entropy), jnp.nan)
    return jnp.nanquantile(h.reshape(-1), 1.0 - quantile)


def high_entropy_mask(entropy, mask, *, quantile: float, threshold=None):
    """Keep tokens whose entropy is at or above the (1 - q) quantile of the valid tokens' entropies.

    `threshold`: that quantile taken over a larger batch (the whole update batch, so the kept tokens
    do not depend on how it is split into micro-batches or devices); None = over the arrays given.
    Returns a float mask [P, G, T]; all zero when nothing is valid.
    """
    m = _f32(mask)
    if threshold is None:
        threshold = high_entropy_threshold(entropy, m, quantile=quantile)
    h = jnp.where(m > 0, _f32(entropy), -jnp.inf)
    return m * (h >= threshold)
