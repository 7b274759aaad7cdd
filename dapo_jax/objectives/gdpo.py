"""GDPO, group DPO (docs/objectives.md#gfpo-gdpo): a DPO loss on the best and the worst response of each group.

For a group (one prompt's G responses) whose rewards have spread, `y⁺` is the highest-reward
response and `y⁻` the lowest (ties: the first index). With `ℓ(y) = Σ_t m_t·log π(o_t)` summed over
the response's valid tokens,

    L_p = −log σ(β·[(ℓ_θ(y⁺) − ℓ_ref(y⁺)) − (ℓ_θ(y⁻) − ℓ_ref(y⁻))])

and the loss is the mean of `L_p` over the groups with spread; groups without spread contribute
nothing (neither to the sum nor to the count).

Two pieces, so that the trainer's data path (rewards -> advantages -> `Batch`) stays as it is:

- `gdpo_pair`, an advantage estimator with the shared signature of `advantages.py`: +1 on `y⁺`,
  −1 on `y⁻`, 0 elsewhere, and 0 on every response of a zero-spread group. It marks the pair.
- `gdpo_terms`, the objective that replaces `loss.objective_terms` when `cfg.kind == "gdpo"`: it
  reads the pair back from the sign of the advantages and returns the additive form
  `(Σ_p used_p·L_p, Σ_p used_p, metrics)`. The denominator counts the groups used and does not
  depend on the parameters, so splitting the prompts into micro-batches (or devices) gives exactly
  the whole batch's mean and gradient.

Like DPO, GDPO has no importance ratio: `old_logp` plays no part and nothing is clipped.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dapo_jax.objectives.advantages import group_mean_std, to_tokens


def _f32(x):
    return jnp.asarray(x, jnp.float32)


def gdpo_pair(rewards, *, mask=None, valid=None, eps=1e-6, unbiased=True, kl_penalty=None):
    """The preference pair of each group as an advantage [P, G]: +1 on y⁺, −1 on y⁻, 0 elsewhere.

    Args:
      rewards: [P, G] scalar rewards.
      mask: optional [P, G, T] response mask: a response without any valid token (e.g. overlong-
        filtered) cannot be y⁺ or y⁻ (its log-likelihood would be empty).
      valid: optional [P, G]: only valid responses compete.
      eps, unbiased: unused (the shared estimator signature).
      kl_penalty: must be None (GDPO has no KL term of its own: its β is the regulariser).

    Groups with fewer than two competing responses or equal rewards among them are all zeros.
    """
    del eps, unbiased
    if kl_penalty is not None:
        raise ValueError("gdpo_pair takes no KL penalty: GDPO's beta (gdpo_beta) is its KL regulariser; set kl_beta=0")
    r = _f32(rewards)
    if r.ndim != 2:
        raise ValueError(f"rewards must be [P, G], got shape {r.shape}")
    v = jnp.ones(r.shape, jnp.float32) if valid is None else _f32(valid)
    if mask is not None:
        v = v * (jnp.sum(_f32(mask), axis=-1) > 0)
    competes = v > 0
    # argmax / argmin return the first index among ties
    best = jnp.argmax(jnp.where(competes, r, -jnp.inf), axis=-1)
    worst = jnp.argmin(jnp.where(competes, r, jnp.inf), axis=-1)
    g = r.shape[-1]
    pair = jax.nn.one_hot(best, g, dtype=jnp.float32) - jax.nn.one_hot(worst, g, dtype=jnp.float32)
    _, _, zero_spread = group_mean_std(r, valid=v)
    return jnp.where(zero_spread, 0.0, pair)


def gdpo_terms(cfg, *, logp, old_logp, advantages, mask, ref_logp=None, **unused):
    """GDPO's loss of one (micro-)batch in the trainer's additive form.

    Args:
      cfg: the `ObjectiveConfig` (reads `gdpo_beta`).
      logp: [P, G, T] log π_θ of the sampled tokens (the differentiated input).
      old_logp: [P, G, T] log π_old: unused (no ratio), accepted for the shared call.
      advantages: [P, G] or [P, G, T] from `gdpo_pair` (+1 marks y⁺, −1 marks y⁻; constant).
      mask: [P, G, T] 1 on response tokens.
      ref_logp: [P, G, T] log π_ref (required; constant).
      unused: the other inputs the trainer passes (entropy, ...); GDPO needs none of them.

    Returns:
      (loss_sum, groups_used, metrics): loss = Σ loss_sum / Σ groups_used over micro-batches. Metrics
      (value, count) pairs: policy_loss, preference_accuracy (share of used groups whose margin is
      > 0, i.e. π_θ already prefers y⁺ more than π_ref does), margin_mean (the mean of
      `β·[...]`, the argument of σ), groups_used (share of the groups that have a pair).
    """
    del old_logp, unused
    m = _f32(mask)
    if m.ndim != 3:
        raise ValueError(f"mask must be [P, G, T], got shape {m.shape}")
    if ref_logp is None:
        raise ValueError("ref_logp is required: GDPO compares π_θ with the reference policy (kind='gdpo')")
    for name, x in (("logp", logp), ("ref_logp", ref_logp)):
        if tuple(jnp.shape(x)) != m.shape:
            raise ValueError(f"{name} has shape {tuple(jnp.shape(x))}, expected the mask's {m.shape}")
    adv = jax.lax.stop_gradient(to_tokens(advantages, m))
    side = jnp.sign(jnp.sum(adv, axis=-1))  # [P, G]: +1 on y⁺, −1 on y⁻ (their masked tokens all carry it)
    used = (jnp.any(side > 0, axis=-1) & jnp.any(side < 0, axis=-1)).astype(jnp.float32)  # [P]
    # where, not a product: a non-finite log-prob on padding must not reach the sum or its gradient
    log_ratio = jnp.where(m > 0, _f32(logp) - jax.lax.stop_gradient(_f32(ref_logp)), 0.0)
    margin = cfg.gdpo_beta * jnp.sum(side * jnp.sum(log_ratio, axis=-1), axis=-1)  # [P]
    per_group = jnp.where(used > 0, jax.nn.softplus(-margin), 0.0)  # −log σ(margin)
    loss_sum, groups_used = jnp.sum(per_group), jnp.sum(used)
    margin_sg = jax.lax.stop_gradient(margin)
    metrics = {
        "policy_loss": (jax.lax.stop_gradient(loss_sum), groups_used),
        "preference_accuracy": (jnp.sum(used * (margin_sg > 0)), groups_used),
        "margin_mean": (jnp.sum(used * margin_sg), groups_used),
        "groups_used": (groups_used, jnp.asarray(m.shape[0], jnp.float32)),
    }
    return loss_sum, groups_used, metrics
