"""Clip-Cov and KL-Cov: act on the few tokens whose log-prob and advantage covary most
(Cui et al., "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617;
docs/objectives_recent.md#clip-cov-kl-cov).

Over the valid tokens of the whole update batch (N of them), with the current policy's detached logp:

    Cov_t = (A_t − Ā)·(logp_t − l̄),   Ā, l̄ = the means over the N valid tokens.

Clip-Cov: the candidates are the valid tokens with ω_low < Cov_t < ω_high that PPO's clip does not
already bind; n = max(⌊r·N⌋, 1) of them, drawn uniformly at random, lose their loss and gradient
(ℓ_t = 0, still counted in the denominator); the others keep PPO's clipped surrogate
max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high)) (no dual clip).

KL-Cov: the k = max(⌊r·N⌋, 1) tokens of largest Cov_t get a KL penalty, and no token is clipped:

    ℓ_t = −A_t·ρ_t + β·|logp_t − old_t|·[t selected].

WHY the statistics are batch-level: every peer takes Ā, l̄ and the selection per micro-batch, so
its update depends on how the batch is split. Here `*_statistics` take them over the whole update
batch (the trainer runs them on a no-gradient pass, as for the high-entropy mask) and pass the
scalars back to each micro-batch; called without them, the losses take them over the arrays given.
The random draw is a per-token priority u ~ U[0, 1) (the trainer draws it for the whole batch from
the step number): the selected candidates are those with the n largest u. KL-Cov's ties: every token
tied with the k-th largest Cov is selected (all or none of a tie, whatever the split).
⌊r·N⌋ is computed as ⌊r·N + 1e-4⌋ so that float32 rounding does not floor an exact integer down.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dapo_jax.objectives import diagnostics as diag
from dapo_jax.objectives.policy_loss import LOG_RATIO_CLAMP


class CovarianceStats(NamedTuple):
    """Batch-level scalars: the valid tokens' mean advantage Ā and mean log-prob l̄, and the selection
    threshold (Clip-Cov: the n-th largest priority among the candidates; KL-Cov: the k-th largest Cov)."""

    adv_mean: jax.Array
    logp_mean: jax.Array
    threshold: jax.Array


def _f32(x):
    return jnp.asarray(x, jnp.float32)


def covariance_means(logp, advantages, mask):
    """(Ā, l̄): the means of A and of sg(logp) over the valid tokens (0 when there are none)."""
    m = _f32(mask)
    n = jnp.maximum(jnp.sum(m), 1.0)
    valid = m > 0
    return (jnp.sum(jnp.where(valid, _f32(advantages), 0.0)) / n,
            jnp.sum(jnp.where(valid, jax.lax.stop_gradient(_f32(logp)), 0.0)) / n)


def token_covariance(logp, advantages, *, adv_mean, logp_mean):
    """`Cov_t = (A_t − Ā)·(sg(logp_t) − l̄)` [P, G, T] (not masked)."""
    return (_f32(advantages) - adv_mean) * (jax.lax.stop_gradient(_f32(logp)) - logp_mean)


def selection_count(n_valid, ratio: float):
    """`max(⌊r·N⌋, 1)` as int32 (see the module docstring for the 1e-4)."""
    return jnp.maximum(jnp.floor(_f32(n_valid) * ratio + 1e-4), 1.0).astype(jnp.int32)


def kth_largest(values, where, k):
    """The k-th largest (k ≥ 1, traced) of `values` at the positions `where`; −inf when fewer exist."""
    flat = jnp.where(where, _f32(values), -jnp.inf).reshape(-1)
    ordered = -jnp.sort(-flat)
    return ordered[jnp.clip(k - 1, 0, flat.shape[0] - 1)] if flat.shape[0] else jnp.float32(-jnp.inf)


def _ratio(logp, old_logp):
    return jnp.exp(jnp.clip(_f32(logp) - _f32(old_logp), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _ppo(ratio, a, eps_low, eps_high):
    """PPO's two branches: (−A·ρ, −A·clip(ρ)); the clip binds where the second is larger."""
    return -a * ratio, -a * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)


def default_priority(shape):
    """The draw used when the trainer passes none: u ~ U[0, 1) from a fixed key."""
    return jax.random.uniform(jax.random.PRNGKey(0), shape, jnp.float32)


def clip_cov_candidates(logp, old_logp, advantages, mask, *, eps_low, eps_high, lb, ub, adv_mean, logp_mean):
    """Bool [P, G, T]: valid, `ω_low < Cov < ω_high`, and PPO's clip does not bind."""
    a = _f32(advantages)
    cov = token_covariance(logp, a, adv_mean=adv_mean, logp_mean=logp_mean)
    unclipped, clipped = _ppo(_ratio(jax.lax.stop_gradient(_f32(logp)), old_logp), a, eps_low, eps_high)
    return (_f32(mask) > 0) & (cov > lb) & (cov < ub) & ~(clipped > unclipped)


def clip_cov_statistics(logp, old_logp, advantages, mask, *, priority=None, eps_low=0.2, eps_high=0.28,
                        ratio=2e-4, lb=1.0, ub=5.0, **unused):
    """Clip-Cov's `CovarianceStats` over the arrays given (the trainer: the whole update batch)."""
    del unused
    m = _f32(mask)
    priority = default_priority(m.shape) if priority is None else _f32(priority)
    adv_mean, logp_mean = covariance_means(logp, advantages, m)
    cand = clip_cov_candidates(logp, old_logp, advantages, m, eps_low=eps_low, eps_high=eps_high, lb=lb, ub=ub,
                               adv_mean=adv_mean, logp_mean=logp_mean)
    n = selection_count(jnp.sum(m > 0), ratio)
    return CovarianceStats(adv_mean, logp_mean, kth_largest(priority, cand, n))


def kl_cov_statistics(logp, old_logp, advantages, mask, *, ratio=2e-3, **unused):
    """KL-Cov's `CovarianceStats` over the arrays given (the trainer: the whole update batch)."""
    del old_logp, unused
    m = _f32(mask)
    adv_mean, logp_mean = covariance_means(logp, advantages, m)
    cov = token_covariance(logp, advantages, adv_mean=adv_mean, logp_mean=logp_mean)
    k = selection_count(jnp.sum(m > 0), ratio)
    return CovarianceStats(adv_mean, logp_mean, kth_largest(cov, m > 0, k))


def clip_cov(logp, old_logp, advantages, mask, *, eps_low=0.2, eps_high=0.28, dual_clip_c=None,
             ratio: float = 2e-4, lb: float = 1.0, ub: float = 5.0, stats: CovarianceStats | None = None,
             priority=None):
    """Clip-Cov's per-token loss [P, G, T] (module docstring).

    stats: the batch-level `CovarianceStats` (None = `clip_cov_statistics` of these arrays); priority:
    [P, G, T] the draw u (None = `default_priority`). dual_clip_c: unused.
    Returns (loss, ratio ρ, metrics): cov_selected_frac, the fraction of valid tokens whose loss was cut.
    """
    del dual_clip_c
    m = _f32(mask)
    priority = default_priority(m.shape) if priority is None else _f32(priority)
    if stats is None:
        stats = clip_cov_statistics(logp, old_logp, advantages, m, priority=priority, eps_low=eps_low,
                                    eps_high=eps_high, ratio=ratio, lb=lb, ub=ub)
    a = _f32(advantages)
    cand = clip_cov_candidates(logp, old_logp, a, m, eps_low=eps_low, eps_high=eps_high, lb=lb, ub=ub,
                               adv_mean=stats.adv_mean, logp_mean=stats.logp_mean)
    selected = cand & (priority >= stats.threshold)
    rho = _ratio(logp, old_logp)
    loss = jnp.where(selected, 0.0, jnp.maximum(*_ppo(rho, a, eps_low, eps_high)))
    return loss, jax.lax.stop_gradient(rho), {"cov_selected_frac": diag.masked_sum_count(selected, m)}


def kl_cov(logp, old_logp, advantages, mask, *, eps_low=0.2, eps_high=0.28, dual_clip_c=None,
           ratio: float = 2e-3, coef: float = 1.0, stats: CovarianceStats | None = None, priority=None):
    """KL-Cov's per-token loss [P, G, T]: `−A·ρ + β·|logp − old|` on the selected tokens, `−A·ρ` elsewhere.

    stats: the batch-level `CovarianceStats` (None = `kl_cov_statistics` of these arrays). eps_*,
    dual_clip_c, priority: unused (KL-Cov clips nothing). Returns (loss, ratio ρ, metrics): cov_selected_frac.
    """
    del eps_low, eps_high, dual_clip_c, priority
    m = _f32(mask)
    if stats is None:
        stats = kl_cov_statistics(logp, old_logp, advantages, m, ratio=ratio)
    a = _f32(advantages)
    cov = token_covariance(logp, a, adv_mean=stats.adv_mean, logp_mean=stats.logp_mean)
    selected = (m > 0) & (cov >= stats.threshold)
    x = jnp.clip(_f32(logp) - _f32(old_logp), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho = jnp.exp(x)
    loss = -a * rho + jnp.where(selected, coef * jnp.abs(x), 0.0)
    return loss, jax.lax.stop_gradient(rho), {"cov_selected_frac": diag.masked_sum_count(selected, m)}
