"""GMPO: geometric-mean policy optimisation (Zhao et al., arXiv 2507.20673; docs/objectives_recent.md#gmpo).

One importance weight per response, the geometric mean of its token ratios, each clipped in log
space on PPO's pessimistic side only:

    x_t = clip(logp_t − old_t, ±20),
    x'_t = min(x_t, ε_high) if A_i > 0,  max(x_t, −ε_low) if A_i < 0,  x_t if A_i = 0,
    s_i = exp(Σ_t m·x'_t / L_i),         ℓ_i = −A_i·s_i.

ℓ_i is broadcast to the response's tokens, so `seq_mean_token_mean` gives the mean over responses
(the paper's 1/G Σ_i). ∂ℓ_i/∂logp_t = −A_i·s_i/L_i for an unclipped token, 0 for a clipped one:
every token of a response shares the factor s_i. The published clip is ε_low = ε_high = 0.4 (ratios
in [e^−0.4, e^0.4] = [0.670, 1.492]). A_i is the response's mean token advantage (its A for
sequence advantages).
"""

from __future__ import annotations

import jax.numpy as jnp

from dapo_jax.objectives import diagnostics as diag
from dapo_jax.objectives.policy_loss import LOG_RATIO_CLAMP


def _f32(x):
    return jnp.asarray(x, jnp.float32)


def gmpo(logp, old_logp, advantages, mask, *, eps_low=0.4, eps_high=0.4, dual_clip_c=None):
    """GMPO's response loss `−A_i·exp(mean_t x'_t)`, broadcast to [P, G, T].

    logp, old_logp, advantages, mask: [P, G, T]; eps_low / eps_high: the log-space clip; dual_clip_c:
    unused. Returns (loss [P, G, T], s_i broadcast [P, G, T], metrics): gmpo_clip_frac, the fraction of
    valid tokens whose log-ratio the sign-aware clip cut.
    """
    del dual_clip_c
    m = _f32(mask)
    x = jnp.where(m > 0, jnp.clip(_f32(logp) - _f32(old_logp), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), 0.0)
    length = jnp.maximum(jnp.sum(m, axis=-1, keepdims=True), 1.0)
    a = jnp.sum(jnp.where(m > 0, _f32(advantages), 0.0), axis=-1, keepdims=True) / length  # [P, G, 1]
    clipped_x = jnp.where(a > 0, jnp.minimum(x, eps_high), jnp.where(a < 0, jnp.maximum(x, -eps_low), x))
    s = jnp.exp(jnp.sum(clipped_x * m, axis=-1, keepdims=True) / length)
    shape = m.shape
    clipped = ((a > 0) & (x > eps_high)) | ((a < 0) & (x < -eps_low))
    metrics = {"gmpo_clip_frac": diag.masked_sum_count(clipped, m)}
    return jnp.broadcast_to(-a * s, shape), jnp.broadcast_to(s, shape), metrics
