"""Critic-based advantages (PPO with GAE, VAPO) and the clipped value loss (docs/objectives.md#critic-ppo-vapo).

For one response of length `L` (tokens `o_0 … o_{L-1}`), `V_t` is the critic's value of the state
before token `t` (its head read at the position that predicts `o_t`), and `V_L = 0`:

    r_t = -β·kl_t + R·[t = L-1]                 (token rewards; the KL term only when it is in the reward)
    δ_t = r_t + γ·V_{t+1} - V_t
    Â_t = Σ_{l=0}^{L-1-t} (γλ)^l δ_{t+l}       (computed backwards; nothing leaks past L)
    G_t = Â_t(λ_critic) + V_t                   (value targets; λ = 1 gives Monte-Carlo returns)

VAPO's length-adaptive policy λ is `1 - 1/(α·L)` per response, clamped to [0, 1]. PPO whitens the
policy advantages over every valid token of the batch. The value loss is verl's clipped one,
`½·max((V - G)², (clip(V, V_old - ε_v, V_old + ε_v) - G)²)`, returned as a token-mean
(sum, denominator) pair so it stays exact under micro-batching.

Shapes: `[P, G, T]` per token, `[P, G]` per response; `mask` is 1 on the policy's actions: the response
tokens (a contiguous prefix of each row), or an agent episode's model ids, with holes at its tool and
template ids that the recursion skips (`gae`; docs/agents.md). Math in float32 whatever the input dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dapo_jax.objectives import diagnostics as diag
from dapo_jax.objectives.advantages import whiten

Array = jnp.ndarray


def _f32(x):
    return jnp.asarray(x, jnp.float32)


def last_token(mask: Array) -> Array:
    """1 at the last valid token of each response `[..., T]` (0 everywhere for an empty one)."""
    m = _f32(mask)
    from_right = jnp.cumsum(m[..., ::-1], axis=-1)[..., ::-1]
    return m * (from_right == 1.0)


def token_rewards(rewards: Array, mask: Array, kl_penalty: Array | None = None) -> Array:
    """`r_t = -kl_penalty_t + R·[t = L-1]` on valid tokens, 0 elsewhere. rewards [P, G] -> [P, G, T].

    `kl_penalty` = β·kl_t per token (KL in the reward), or None."""
    m = _f32(mask)
    r = _f32(rewards)[..., None] * last_token(m)
    if kl_penalty is not None:
        r = r - _f32(kl_penalty) * m
    return r * m


def adaptive_lambda(lengths: Array, alpha: float) -> Array:
    """VAPO's length-adaptive λ_policy = `1 - 1/(α·L)` per response, clamped to [0, 1] (0 when L = 0)."""
    n = _f32(lengths)
    return jnp.clip(1.0 - 1.0 / jnp.maximum(alpha * n, 1e-12), 0.0, 1.0)


def gae(rewards: Array, values: Array, mask: Array, *, gamma: float, lam) -> Array:
    """Generalised advantage estimates `Â [P, G, T]` (0 where the mask is 0).

    Args:
      rewards: `[P, G, T]` token rewards (`token_rewards`).
      values: `[P, G, T]` `V_t` (values where the mask is 0 are ignored: `V_L = 0`).
      mask: `[P, G, T]`: the actions. The recursion runs backwards over the masked positions only and
        skips the others, so a mask with holes (an episode's tool and template ids between model turns)
        gives GAE over the sequence with the holes removed: `V_{t+1}` is the value at the NEXT masked
        position, and a hole's ids cost no discount. A contiguous prefix is the single-turn case.
      gamma: discount γ; lam: λ, a scalar or one per response `[P, G]`.
    """
    m, r, v = _f32(mask), _f32(rewards), _f32(values)
    lam = jnp.broadcast_to(_f32(lam), m.shape[:-1])

    def back(carry, x):
        next_a, next_v = carry  # Â and V at the next masked position (0 past the last)
        m_t, r_t, v_t = x
        a = r_t + gamma * next_v - v_t + gamma * lam * next_a
        on = m_t > 0
        return (jnp.where(on, a, next_a), jnp.where(on, v_t, next_v)), jnp.where(on, a, 0.0)

    xs = tuple(jnp.moveaxis(x, -1, 0)[::-1] for x in (m, r, v))
    zeros = jnp.zeros(m.shape[:-1], jnp.float32)
    _, adv = jax.lax.scan(back, (zeros, zeros), xs)
    return jnp.moveaxis(adv[::-1], 0, -1)


def value_targets(rewards: Array, values: Array, mask: Array, *, gamma: float, lam) -> Array:
    """`G_t = Â_t(λ) + V_t` on valid tokens, 0 on padding; λ = 1 gives the Monte-Carlo returns."""
    return (gae(rewards, values, mask, gamma=gamma, lam=lam) + _f32(values)) * _f32(mask)


def gae_advantages(rewards, *, mask=None, valid=None, eps=1e-6, unbiased=True, kl_penalty=None, values=None,
                   gamma=1.0, lam=0.95, lam_alpha=None, whiten_advantages=True) -> Array:
    """The policy's advantages `[P, G, T]`, with the registry's estimator signature plus the critic's
    `values [P, G, T]` and the GAE knobs (`lam_alpha` set = VAPO's length-adaptive λ, overriding `lam`).

    Invalid responses (`valid` = 0) get 0 and are left out of the whitening statistics."""
    if values is None or mask is None:
        raise ValueError("advantage='gae' needs the critic's values [P, G, T] and the response mask: "
                         "dapo_jax.training.update.critic computes them (a run config whose objective uses a critic)")
    m = _f32(mask)
    if valid is not None:
        m = m * _f32(valid)[..., None]
    if lam_alpha is not None:
        lam = adaptive_lambda(jnp.sum(m, axis=-1), lam_alpha)
    adv = gae(token_rewards(rewards, m, kl_penalty), values, m, gamma=gamma, lam=lam)
    return whiten(adv, m, eps=eps, unbiased=unbiased) if whiten_advantages else adv


def value_loss(values: Array, old_values: Array, returns: Array, mask: Array, *, clip_eps: float | None = 0.5):
    """verl's clipped value loss as a token-mean pair, plus additive metrics.

    ℓ_t = ½·max((V_t - G_t)², (clip(V_t, V_old - ε_v, V_old + ε_v) - G_t)²) (ε_v None: ½·(V_t - G_t)²).

    Returns `(Σ ℓ·m, Σ m, metrics)`; metrics (`diagnostics` pairs): value_loss, value_mean, return_mean,
    value_clip_frac (tokens where the clipped term is the larger), value_abs_error.
    """
    m = _f32(mask)
    v, g = _f32(values), jax.lax.stop_gradient(_f32(returns))
    old = jax.lax.stop_gradient(_f32(old_values))
    unclipped = jnp.square(v - g)
    if clip_eps is None:
        loss, clipped_more = 0.5 * unclipped, jnp.zeros_like(m, bool)
    else:
        clipped = jnp.square(jnp.clip(v, old - clip_eps, old + clip_eps) - g)
        loss, clipped_more = 0.5 * jnp.maximum(unclipped, clipped), clipped > unclipped
    loss_sum = jnp.sum(jnp.where(m > 0, loss * m, 0.0))
    metrics = {
        "value_loss": diag.masked_sum_count(jax.lax.stop_gradient(loss), m),
        "value_mean": diag.masked_sum_count(jax.lax.stop_gradient(v), m),
        "return_mean": diag.masked_sum_count(g, m),
        "value_clip_frac": diag.masked_sum_count(clipped_more, m),
        "value_abs_error": diag.masked_sum_count(jnp.abs(jax.lax.stop_gradient(v) - g), m),
    }
    return loss_sum, jnp.sum(m), metrics


def advantages_and_targets(cfg, rewards, mask, values, kl=None, *, valid=None):
    """`(policy advantages [P, G, T], value targets [P, G, T])` from an `ObjectiveConfig` with
    `advantage='gae'`: the policy's λ is `gae_lambda` (or VAPO's adaptive one when `lambda_alpha` is
    set), the critic's `critic_lambda` (decoupled GAE); `kl` [P, G, T] enters the rewards as
    `-kl_beta·kl` when `kl_in='reward'`. Invalid responses get 0 in both."""
    m = _f32(mask)
    if valid is not None:
        m = m * _f32(valid)[..., None]
    kl_penalty = None
    if cfg.kl_beta > 0 and cfg.kl_in == "reward":
        if kl is None:
            raise ValueError(f"kl is required: kl_beta={cfg.kl_beta} with kl_in='reward'")
        kl_penalty = cfg.kl_beta * _f32(kl)
    adv = gae_advantages(rewards, mask=m, eps=cfg.std_eps, unbiased=cfg.std_unbiased, kl_penalty=kl_penalty,
                         values=values, gamma=cfg.gamma, lam=cfg.gae_lambda, lam_alpha=cfg.lambda_alpha,
                         whiten_advantages=cfg.whiten_advantages)
    targets = value_targets(token_rewards(rewards, m, kl_penalty), values, m, gamma=cfg.gamma, lam=cfg.critic_lambda)
    return adv, targets
