"""Advantage estimators of the GRPO family (docs/objectives.md#advantages).

Every estimator has the same keyword signature so the registry can call any of them:

    fn(rewards [P, G], *, mask [P, G, T] | None = None, valid [P, G] | None = None,
       eps=1e-6, unbiased=True, kl_penalty [P, G, T] | None = None) -> [P, G] or [P, G, T]

- `mask` (float/bool, 1 on response tokens) is needed by the token-level estimators and whenever a
  `kl_penalty` is given.
- `valid` marks the responses that count: an invalid response gets advantage 0 and is left out of
  every mean and std. None = all valid.
- `kl_penalty` = beta * kl_t per token (KL "in the reward"): the token reward is `-kl_penalty`, so a
  sequence estimator sees `r - sum_t m * kl_penalty` and `reinforce_pp` adds it token by token.

A group whose (valid) rewards are all equal gets exactly 0.0, whatever `eps`: the spread is tested
with max == min, not with a small std, so rounding in the mean can never leak through.
All math runs in float32 whatever the input dtype.
"""

from __future__ import annotations

import jax.numpy as jnp

Array = jnp.ndarray


def _f32(x):
    return None if x is None else jnp.asarray(x, jnp.float32)


def _valid(rewards: Array, valid: Array | None) -> Array:
    return jnp.ones(rewards.shape, jnp.float32) if valid is None else _f32(valid)


def _effective_rewards(rewards, mask, kl_penalty):
    r = _f32(rewards)
    if kl_penalty is not None:
        if mask is None:
            raise ValueError("kl_penalty given without mask: the [P, G, T] response mask is needed to sum it")
        r = r - jnp.sum(_f32(kl_penalty) * _f32(mask), axis=-1)
    return r


def group_mean_std(rewards: Array, *, valid: Array | None = None, unbiased: bool = True):
    """Per-group mean, std and zero-spread flag of `rewards` [P, G] over the valid responses.

    Returns (mean [P, 1], std [P, 1], zero_spread [P, 1] bool). std is sqrt(Σ (r - mean)^2 / (n - 1))
    (unbiased) or / n; a group with fewer than 2 valid responses, or all-equal ones, is zero-spread.
    """
    r = _f32(rewards)
    v = _valid(r, valid)
    n = jnp.sum(v, axis=-1, keepdims=True)
    mean = jnp.sum(r * v, axis=-1, keepdims=True) / jnp.maximum(n, 1.0)
    dof = n - 1.0 if unbiased else n
    var = jnp.sum(jnp.square(r - mean) * v, axis=-1, keepdims=True) / jnp.maximum(dof, 1.0)
    hi = jnp.max(jnp.where(v > 0, r, -jnp.inf), axis=-1, keepdims=True)
    lo = jnp.min(jnp.where(v > 0, r, jnp.inf), axis=-1, keepdims=True)
    zero_spread = (n < 2) | (hi <= lo)
    return mean, jnp.sqrt(var), zero_spread


def _finish(adv: Array, zero_spread: Array, v: Array) -> Array:
    return jnp.where(zero_spread | (v <= 0), 0.0, adv)


def grpo(rewards, *, mask=None, valid=None, eps=1e-6, unbiased=True, kl_penalty=None) -> Array:
    """GRPO: `A = (r - mean_g r) / (std_g r + eps)`, [P, G]."""
    r = _effective_rewards(rewards, mask, kl_penalty)
    v = _valid(r, valid)
    mean, std, zero = group_mean_std(r, valid=v, unbiased=unbiased)
    return _finish((r - mean) / (std + eps), zero, v)


def dr_grpo(rewards, *, mask=None, valid=None, eps=1e-6, unbiased=True, kl_penalty=None) -> Array:
    """Dr. GRPO: `A = r - mean_g r` (no std division), [P, G]. eps/unbiased unused."""
    del eps, unbiased
    r = _effective_rewards(rewards, mask, kl_penalty)
    v = _valid(r, valid)
    mean, _, zero = group_mean_std(r, valid=v)
    return _finish(r - mean, zero, v)


def rloo(rewards, *, mask=None, valid=None, eps=1e-6, unbiased=True, kl_penalty=None) -> Array:
    """RLOO: `A = r - (Σ_{j≠g} r_j) / (n - 1)` = `n / (n - 1) · (r - mean_g r)`, [P, G]."""
    del eps, unbiased
    r = _effective_rewards(rewards, mask, kl_penalty)
    v = _valid(r, valid)
    mean, _, zero = group_mean_std(r, valid=v)
    n = jnp.sum(v, axis=-1, keepdims=True)
    return _finish(n / jnp.maximum(n - 1.0, 1.0) * (r - mean), zero, v)


def batch_norm(rewards, *, mask=None, valid=None, eps=1e-6, unbiased=True, kl_penalty=None) -> Array:
    """TRL `scale_rewards="batch"`: `A = (r - mean_g r) / (std of r over the whole batch + eps)`, [P, G]."""
    r = _effective_rewards(rewards, mask, kl_penalty)
    v = _valid(r, valid)
    mean, _, zero = group_mean_std(r, valid=v)
    _, batch_std, _ = group_mean_std(r.reshape(1, -1), valid=v.reshape(1, -1), unbiased=unbiased)
    return _finish((r - mean) / (batch_std[0, 0] + eps), zero, v)


def whiten(values: Array, mask: Array, *, eps: float = 1e-6, unbiased: bool = True) -> Array:
    """`(x - mean) / (std + eps)` over the tokens where mask = 1 (the whole batch), times mask."""
    x, m = _f32(values), _f32(mask)
    n = jnp.sum(m)
    mean = jnp.sum(x * m) / jnp.maximum(n, 1.0)
    dof = n - 1.0 if unbiased else n
    var = jnp.sum(jnp.square(x - mean) * m) / jnp.maximum(dof, 1.0)
    return (x - mean) / (jnp.sqrt(var) + eps) * m


def _token_mask(rewards, mask, valid):
    if mask is None:
        raise ValueError("this advantage estimator is token-level: pass mask [P, G, T]")
    m = _f32(mask)
    if m.shape[:2] != rewards.shape:
        raise ValueError(f"mask has shape {m.shape}, expected rewards' {rewards.shape} + (T,)")
    return m * _valid(rewards, valid)[..., None]


def reinforce_pp(rewards, *, mask=None, valid=None, eps=1e-6, unbiased=True, kl_penalty=None) -> Array:
    """REINFORCE++: token rewards `s_t = -kl_penalty_t + r·[t is the last valid token]`,
    returns `R_t = Σ_{t' ≥ t} s_t' m_t'`, whitened over all valid tokens of the batch. [P, G, T]."""
    r = _f32(rewards)
    m = _token_mask(r, mask, valid)
    # The last valid token is where the count of valid tokens from the right equals 1.
    from_right = jnp.cumsum(m[..., ::-1], axis=-1)[..., ::-1]
    last = m * (from_right == 1.0)
    s = r[..., None] * last
    if kl_penalty is not None:
        s = s - _f32(kl_penalty) * m
    returns = jnp.cumsum(s[..., ::-1], axis=-1)[..., ::-1] * m
    return whiten(returns, m, eps=eps, unbiased=unbiased)


def reinforce_pp_baseline(rewards, *, mask=None, valid=None, eps=1e-6, unbiased=True, kl_penalty=None) -> Array:
    """REINFORCE++-baseline (verl): `A = r - mean_g r` on every token, whitened over all valid tokens
    of the batch, [P, G, T]. Unlike verl, responses of a zero-spread group stay exactly 0 after the
    whitening's mean shift (they carry no signal). `kl_penalty` lowers r by its sum."""
    r = _effective_rewards(rewards, mask, kl_penalty)
    m = _token_mask(r, mask, valid)
    v = _valid(r, valid)
    mean, _, zero = group_mean_std(r, valid=v)
    centred = _finish(r - mean, zero, v)
    white = whiten(jnp.broadcast_to(centred[..., None], m.shape), m, eps=eps, unbiased=unbiased)
    return jnp.where((zero | (v <= 0))[..., None], 0.0, white)


def combine_rewards(
    rewards: Array,
    *,
    weights=None,
    mode: str = "sum",
    valid: Array | None = None,
    eps: float = 1e-6,
    unbiased: bool = True,
) -> Array:
    """Several reward functions `rewards` [P, G, K] (weights [K], None = ones) -> [P, G].

    mode "sum": `Σ_k w_k r_k` (a reward; an advantage estimator runs on it next).
    mode "normalize_then_sum" (GDPO / MO-GRPO, TRL): each reward is GRPO-normalised in its group,
    `s = Σ_k w_k grpo(r_k)`, then `s` is normalised over the batch: `(s - mean) / (std + eps)`.
    The result is already an advantage. Zero-spread groups of `s` stay exactly 0.
    """
    r = _f32(rewards)
    if r.ndim != 3:
        raise ValueError(f"rewards must be [P, G, K] to combine, got shape {r.shape}")
    k = r.shape[-1]
    w = jnp.ones((k,), jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32)
    if w.shape != (k,):
        raise ValueError(f"reward_weights has {w.shape[0] if w.ndim else 0} entries, rewards have K={k}")
    if mode == "sum":
        return jnp.sum(r * w, axis=-1)
    if mode != "normalize_then_sum":
        raise ValueError(f"multi_reward mode {mode!r} is not one of 'sum', 'normalize_then_sum'")
    per = jnp.stack([grpo(r[..., i], valid=valid, eps=eps, unbiased=unbiased) for i in range(k)], axis=-1)
    s = jnp.sum(per * w, axis=-1)
    v = _valid(s, valid)
    _, _, zero = group_mean_std(s, valid=v)
    batch_mean, batch_std, _ = group_mean_std(s.reshape(1, -1), valid=v.reshape(1, -1), unbiased=unbiased)
    return _finish((s - batch_mean[0, 0]) / (batch_std[0, 0] + eps), zero, v)


def to_tokens(advantages: Array, mask: Array) -> Array:
    """Broadcast sequence advantages [P, G] (or pass token ones [P, G, T]) to [P, G, T], times mask."""
    a, m = _f32(advantages), _f32(mask)
    if a.ndim == m.ndim - 1:
        a = a[..., None]
    return jnp.broadcast_to(a, m.shape) * m
