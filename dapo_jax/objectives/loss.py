"""The entry points the trainer calls; everything is driven by `ObjectiveConfig` fields.

Per optimizer step, for a rollout batch:
    rewards, mask = shape_rewards(cfg, rewards, lengths, truncated, mask)       # overlong shaping
    keep, counts  = dynamic_sampling_keep(cfg, correct=..., rewards=rewards)   # if cfg.dynamic_sampling
    adv           = compute_advantages(cfg, rewards, mask, kl=token_kl(...))   # kl only if kl_in="reward"
and per micro-batch, inside the differentiated function:
    loss_sum, den, metrics = objective_terms(cfg, logp=..., old_logp=..., advantages=adv, mask=mask)
The step's loss is Σ loss_sum / Σ den over the micro-batches (and devices): exact by construction.
All functions are jit-able with `cfg` static (it is hashable) and work on sharded arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dapo_jax.objectives import diagnostics as diag
from dapo_jax.objectives.advantages import combine_rewards, to_tokens
from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.objectives.deepseek_v32 import off_policy_sequence_mask, unbiased_kl
from dapo_jax.objectives.dynamic_sampling import keep_groups
from dapo_jax.objectives.entropy_advantage import entropy_driven_advantages
from dapo_jax.objectives.nll import nll_terms
from dapo_jax.objectives.policy_loss import LOG_RATIO_CLAMP, entropy_bonus, high_entropy_mask
from dapo_jax.objectives.process import StepRewards
from dapo_jax.objectives.registry import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    OBJECTIVE_KINDS,
    OFF_POLICY_CORRECTIONS,
    OFF_POLICY_OPTIONS,
    POLICY_LOSS_OPTIONS,
    POLICY_LOSS_STATISTICS,
    POLICY_LOSSES,
    options,
)
from dapo_jax.objectives.rollout_mismatch import batch_normalize, weight_sum
from dapo_jax.objectives.shaping import overlong_filter, overlong_penalty

STATISTICS_KEY = 0  # the PRNG key the trainer folds the step number into for Clip-Cov's draw


def _check_shape(name: str, x, shape) -> None:
    if x is None:
        return
    if tuple(jnp.shape(x)) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(jnp.shape(x))}, expected {tuple(shape)} (the mask's [P, G, T])")


def token_kl(cfg: ObjectiveConfig, logp, ref_logp):
    """Per-token KL estimate [P, G, T] with the config's estimator and clamp (not masked)."""
    return KL_ESTIMATORS[cfg.kl_estimator](logp, ref_logp, clamp=cfg.kl_clamp)


def needs_batch_statistics(cfg: ObjectiveConfig) -> bool:
    """True when the objective takes statistics over the whole update batch (`batch_statistics`)."""
    return cfg.policy_loss in POLICY_LOSS_STATISTICS or cfg.off_policy_batch_normalize


def needs_policy_pass(cfg: ObjectiveConfig) -> bool:
    """True when those statistics read the current policy's log-probs (Clip-Cov, KL-Cov): the trainer
    then runs a no-gradient pass over the update batch and hands each micro-batch the pass's log-probs
    and the per-token draw `priority`."""
    return cfg.policy_loss in POLICY_LOSS_STATISTICS


def batch_statistics(cfg: ObjectiveConfig, *, logp, old_logp, advantages, mask, behaviour_logp=None,
                     priority=None) -> dict:
    """The objective's statistics over a whole update batch, as keyword arguments of `objective_terms`.

    Any leading shape (the trainer passes [micro_batches, P/m, G, T]); advantages broadcast to tokens.
    policy_stats: Clip-Cov / KL-Cov's `covariance.CovarianceStats` (needs logp and, for Clip-Cov, the
    draw `priority` u ~ U[0, 1) per token); weight_total: (Σ w·m, Σ m) of the correction's weights for
    `off_policy_batch_normalize`. Passing them makes the loss independent of micro-batching and the mesh.
    """
    out = {}
    m = jnp.asarray(mask, jnp.float32)
    if cfg.policy_loss in POLICY_LOSS_STATISTICS:
        out["policy_stats"] = POLICY_LOSS_STATISTICS[cfg.policy_loss](
            jax.lax.stop_gradient(logp), old_logp, advantages, m, priority=priority, eps_low=cfg.eps_low,
            eps_high=cfg.eps_high, **options(cfg, POLICY_LOSS_OPTIONS, cfg.policy_loss))
    if cfg.off_policy_batch_normalize:
        corr = OFF_POLICY_CORRECTIONS[cfg.off_policy_correction](
            old_logp, behaviour_logp, m, **options(cfg, OFF_POLICY_OPTIONS, cfg.off_policy_correction))
        out["weight_total"] = weight_sum(corr.weight, m)
    return out


def objective_terms(cfg: ObjectiveConfig, *, logp, old_logp, advantages, mask, ref_logp=None, entropy=None,
                    entropy_threshold=None, behaviour_logp=None, nll_weight=None, entropy_norm=None,
                    policy_stats=None, priority=None, weight_total=None, entropy_coef=None, grad_norms=None):
    """The loss of one (micro-)batch as an additive pair, plus additive metrics.

    Args:
      cfg: the objective (static under jit).
      logp: [P, G, T] log π_θ of the sampled tokens (the differentiated input).
      old_logp: [P, G, T] log π_old (constant).
      advantages: [P, G] or [P, G, T] (from `compute_advantages`; constant).
      mask: [P, G, T] 1 on response tokens (EOS included), 0 on padding / filtered responses.
      ref_logp: [P, G, T] log π_ref; required only when cfg.kl_beta > 0 and cfg.kl_in == "loss".
      entropy: [P, G, T] per-token entropy; required only when cfg.needs_entropy.
      entropy_threshold: scalar, the high-entropy mask's quantile taken over the whole update batch
        (`policy_loss.high_entropy_threshold`; the trainer passes it so the mask does not depend on
        `micro_batches` or the mesh); None = the quantile of this batch's valid tokens.
      behaviour_logp: [P, G, T] log μ, the sampler's log-probs of the sampled tokens (constant);
        required only when cfg.off_policy_correction is set (`off_policy.py`: TIS weights multiply ℓ,
        masking removes tokens / responses from the loss and the denominator).
      entropy_norm: scalar, EDGE-GRPO's normaliser N (`entropy_advantage.entropy_normaliser`) taken over
        the whole update batch by the trainer; None = over this batch. Used only when
        cfg.entropy_driven_advantage (the advantages become A·N/P̄, P̄ = the response's mean entropy).
      nll_weight: [P, G, T] VAPO's positive-example NLL weights (`nll.nll_weights`, constant); required
        only when cfg.nll_coef > 0: adds Σ -logp·w to loss_sum (metric `nll`).
      policy_stats, priority, weight_total: the whole update batch's statistics (`batch_statistics`;
        priority [P, G, T] is Clip-Cov's draw); None = taken over this batch.
      entropy_coef: scalar α_k, Skywork-OR1's adaptive entropy coefficient of this step
        (`adaptive_entropy.EntropyControl.alpha`, carried by the run); required only when
        cfg.adaptive_entropy, where it replaces cfg.entropy_coef (no gradient flows into it).
      grad_norms: [P, G, T] each token's output-layer gradient norm (`logprobs.output_grad_norms`, constant);
        given (the trainer passes it when cfg.clip_grad_share), adds `clip_grad_share_high` / `_low`.

    Returns:
      (loss_sum, denominator, metrics): float32 scalars with loss = Σ loss_sum / Σ den over micro-batches;
      ℓ = policy_loss + β·kl − α_H·H per token, aggregated by cfg.loss_agg over the (entropy-masked)
      mask. metrics = {name: (value, count)}, combined by `diagnostics.combine_metrics` and turned into
      floats by `diagnostics.finalize_metrics`: policy_loss, kl (if in loss), entropy (if given),
      ratio_mean / _min / _max, approx_kl (k3 of π_old -> π_θ), clip_frac_low / _high / _dual,
      clip_high_p_old_K / clip_low_p_old_K / ratio_pos_K / ratio_neg_K (`diagnostics.clip_histograms`),
      advantage_mean, advantage_sq_mean, zero_adv_group_frac, high_entropy_kept (if on),
      behaviour_ratio_mean / _min / _max, behaviour_masked_frac, behaviour_capped_frac (if corrected).
      With cfg.kind = "gdpo" the whole objective is `gdpo.gdpo_terms` (registry.OBJECTIVE_KINDS).
    """
    if cfg.kind in OBJECTIVE_KINDS:  # an objective of its own, not a per-token policy loss
        return OBJECTIVE_KINDS[cfg.kind](cfg, logp=logp, old_logp=old_logp, advantages=advantages, mask=mask,
                                         ref_logp=ref_logp, entropy=entropy)
    m = jnp.asarray(mask, jnp.float32)
    if m.ndim != 3:
        raise ValueError(f"mask must be [P, G, T], got shape {m.shape}")
    _check_shape("logp", logp, m.shape)
    _check_shape("old_logp", old_logp, m.shape)
    _check_shape("ref_logp", ref_logp, m.shape)
    _check_shape("entropy", entropy, m.shape)
    _check_shape("behaviour_logp", behaviour_logp, m.shape)
    if jnp.ndim(advantages) not in (2, 3) or tuple(jnp.shape(advantages))[:2] != m.shape[:2]:
        raise ValueError(f"advantages has shape {jnp.shape(advantages)}, expected [P, G] or [P, G, T] = {m.shape}")
    old_logp = jax.lax.stop_gradient(old_logp)
    adv = jax.lax.stop_gradient(to_tokens(advantages, m))
    if cfg.entropy_driven_advantage:  # EDGE-GRPO's EDA (objectives/entropy_advantage.py)
        if entropy is None:
            raise ValueError("entropy is required: entropy_driven_advantage=True")
        adv = entropy_driven_advantages(adv, entropy, m, normaliser=entropy_norm)

    extra = options(cfg, POLICY_LOSS_OPTIONS, cfg.policy_loss)
    if cfg.policy_loss in POLICY_LOSS_STATISTICS:
        extra.update(stats=policy_stats, priority=priority)
    pg, ratio, *own = POLICY_LOSSES[cfg.policy_loss](
        logp, old_logp, adv, m, eps_low=cfg.eps_low, eps_high=cfg.eps_high, dual_clip_c=cfg.dual_clip_c, **extra
    )
    metrics = dict(own[0]) if own else {}  # the newer losses' own diagnostics (gated / masked fractions)
    if cfg.opsm_delta is not None:  # DeepSeek-V3.2: the policy term of far-drifted negative responses is dropped
        sampler = old_logp if behaviour_logp is None else jax.lax.stop_gradient(behaviour_logp)
        keep, opsm_metrics = off_policy_sequence_mask(logp, sampler, adv, m, delta=cfg.opsm_delta)
        pg = pg * keep
        metrics.update(opsm_metrics)
    loss = pg
    metrics["policy_loss"] = diag.masked_sum_count(pg, m)

    if cfg.kl_beta > 0 and cfg.kl_in == "loss":
        if ref_logp is None:
            raise ValueError(f"ref_logp is required: kl_beta={cfg.kl_beta} with kl_in='loss'")
        kl = token_kl(cfg, logp, jax.lax.stop_gradient(ref_logp))
        if cfg.kl_unbiased:  # DeepSeek-V3.2's Eq. 7: the estimator times π_θ/π_old, gradient through both
            kl = unbiased_kl(kl, logp, old_logp)
        loss = loss + cfg.kl_beta * kl
        metrics["kl"] = diag.masked_sum_count(kl, m)

    if cfg.needs_entropy and entropy is None:
        raise ValueError(
            f"entropy is required: entropy_coef={cfg.entropy_coef}, high_entropy_quantile={cfg.high_entropy_quantile}"
        )
    train_mask = m
    if entropy is not None:
        metrics["entropy"] = diag.masked_sum_count(jax.lax.stop_gradient(entropy), m)
        if cfg.entropy_coef != 0:
            loss = entropy_bonus(loss, entropy, coef=cfg.entropy_coef)
        if cfg.adaptive_entropy:  # Skywork-OR1: α_k from the run's controller (objectives/adaptive_entropy.py)
            if entropy_coef is None:
                raise ValueError(f"entropy_coef (the step's adaptive coefficient α_k) is required: "
                                 f"entropy_target={cfg.entropy_target}")
            loss = entropy_bonus(loss, entropy, coef=jax.lax.stop_gradient(jnp.asarray(entropy_coef, jnp.float32)))
        if cfg.uses_high_entropy_tokens:
            train_mask = high_entropy_mask(jax.lax.stop_gradient(entropy), m, quantile=cfg.high_entropy_quantile,
                                           threshold=entropy_threshold)
            metrics["high_entropy_kept"] = (jnp.sum(train_mask), jnp.sum(m))

    if cfg.off_policy_correction is not None:
        if behaviour_logp is None:
            raise ValueError(f"behaviour_logp (the sampler's log μ) is required: "
                             f"off_policy_correction={cfg.off_policy_correction!r}")
        # bypass: no recomputed π_old, so the masks compare the current policy with μ (verl's bypass mode)
        base = jax.lax.stop_gradient(jnp.asarray(logp, jnp.float32)) if cfg.off_policy_bypass else old_logp
        corr = OFF_POLICY_CORRECTIONS[cfg.off_policy_correction](
            base, jax.lax.stop_gradient(behaviour_logp), m, **options(cfg, OFF_POLICY_OPTIONS, cfg.off_policy_correction))
        if cfg.off_policy_batch_normalize:
            corr = batch_normalize(corr, m, total=weight_total)
        loss = loss * jax.lax.stop_gradient(corr.weight)
        train_mask = train_mask * corr.keep
        metrics.update(corr.metrics)

    loss_sum, denominator = AGGREGATIONS[cfg.loss_agg](loss, train_mask, max_response_length=cfg.max_response_length)
    if cfg.nll_coef > 0:
        if nll_weight is None:
            raise ValueError(f"nll_weight is required: nll_coef={cfg.nll_coef} (see objectives/nll.py)")
        nll_sum, nll_metrics = nll_terms(logp, jax.lax.stop_gradient(nll_weight))
        loss_sum = loss_sum + nll_sum
        metrics.update(nll_metrics)

    # Diagnostics: no gradient flows through them.
    r = jax.lax.stop_gradient(ratio)
    x = jnp.clip(jax.lax.stop_gradient(jnp.asarray(logp, jnp.float32)) - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    metrics["ratio_mean"] = diag.masked_sum_count(r, m)
    metrics["ratio_min"] = diag.masked_min_count(r, m)
    metrics["ratio_max"] = diag.masked_max_count(r, m)
    metrics["approx_kl"] = diag.masked_sum_count(jnp.expm1(x) - x, m)
    metrics["clip_frac_high"] = diag.masked_sum_count((adv > 0) & (r > 1.0 + cfg.eps_high), m)
    metrics["clip_frac_low"] = diag.masked_sum_count((adv < 0) & (r < 1.0 - cfg.eps_low), m)
    dual = (adv < 0) & (r > cfg.dual_clip_c) if cfg.dual_clip_c is not None else jnp.zeros(m.shape, bool)
    metrics["clip_frac_dual"] = diag.masked_sum_count(dual, m)
    metrics.update(diag.clip_histograms(old_logp, r, adv, m, eps_low=cfg.eps_low, eps_high=cfg.eps_high))
    if grad_norms is not None:
        _check_shape("grad_norms", grad_norms, m.shape)
        metrics.update(diag.clip_grad_shares(r, adv, m, jax.lax.stop_gradient(grad_norms), eps_low=cfg.eps_low,
                                             eps_high=cfg.eps_high))
    metrics["advantage_mean"] = diag.masked_sum_count(adv, m)
    metrics["advantage_sq_mean"] = diag.masked_sum_count(jnp.square(adv), m)
    metrics["zero_adv_group_frac"] = diag.zero_advantage_groups(adv, m)
    return loss_sum, denominator, metrics


def objective_loss(cfg: ObjectiveConfig, **terms):
    """`loss_sum / max(denominator, 1)` for one whole batch (a convenience for tests and tiny runs)."""
    loss_sum, den, metrics = objective_terms(cfg, **terms)
    return loss_sum / jnp.maximum(den, 1e-12) * (den > 0), metrics


def compute_advantages(cfg: ObjectiveConfig, rewards, mask, kl=None, *, valid=None):
    """Advantages [P, G] (sequence estimators) or [P, G, T] (reinforce_pp*) from rewards.

    Args:
      rewards: [P, G], or [P, G, K] for K reward functions combined by cfg.multi_reward with
        cfg.reward_weights ("normalize_then_sum" returns the GDPO advantage itself, [P, G]),
        or `process.StepRewards` ([P, G, J] step rewards) for advantage="grpo_process".
      mask: [P, G, T] response mask (token-level estimators and KL-in-reward need it).
      kl: [P, G, T] per-token KL (e.g. `token_kl(cfg, old_logp, ref_logp)`); required when
        cfg.kl_in == "reward" and cfg.kl_beta > 0, ignored otherwise (beta = 0 needs no reference).
      valid: optional [P, G] responses that count in the statistics (others get 0).
    """
    if isinstance(rewards, StepRewards):  # process supervision (docs/objectives.md#process-supervision)
        if not cfg.needs_step_rewards:
            raise ValueError(f"step rewards given, but advantage={cfg.advantage!r} reads outcome rewards "
                             f"(advantage='grpo_process' reads steps)")
        return ADVANTAGES[cfg.advantage](rewards, mask=mask, valid=valid, eps=cfg.std_eps, unbiased=cfg.std_unbiased,
                                         discount=cfg.process_discount)
    r = jnp.asarray(rewards, jnp.float32)
    if r.ndim == 3:
        if cfg.sums_normalised_rewards:
            if cfg.kl_beta > 0 and cfg.kl_in == "reward":
                raise ValueError("multi_reward='normalize_then_sum' cannot take the KL in the reward: use kl_in='loss'")
            return combine_rewards(r, weights=cfg.reward_weights, mode=cfg.multi_reward, valid=valid,
                                   eps=cfg.std_eps, unbiased=cfg.std_unbiased)
        r = combine_rewards(r, weights=cfg.reward_weights, mode="sum")
    if r.ndim != 2:
        raise ValueError(f"rewards must be [P, G] or [P, G, K], got shape {r.shape}")
    kl_penalty = None
    if cfg.kl_beta > 0 and cfg.kl_in == "reward":
        if kl is None:
            raise ValueError(f"kl is required: kl_beta={cfg.kl_beta} with kl_in='reward'")
        kl_penalty = cfg.kl_beta * jnp.asarray(kl, jnp.float32)
    return ADVANTAGES[cfg.advantage](
        r, mask=mask, valid=valid, eps=cfg.std_eps, unbiased=cfg.std_unbiased, kl_penalty=kl_penalty
    )


def shape_rewards(cfg: ObjectiveConfig, rewards, lengths, truncated, mask):
    """Apply soft overlong punishment (to rewards [P, G]) and overlong filtering (to mask [P, G, T]).

    lengths: [P, G] response lengths in tokens; truncated: [P, G] hit the cap without EOS.
    Returns (rewards float32 [P, G], mask). A no-op for the parts that are off in cfg.
    """
    r = jnp.asarray(rewards, jnp.float32)
    if cfg.overlong_buffer is not None:
        if cfg.max_response_length is None:
            raise ValueError("overlong_buffer is set but max_response_length (L_max) is None in the ObjectiveConfig")
        if r.ndim != 2:
            raise ValueError(f"rewards must be [P, G] for the overlong penalty (combine K rewards first), got {r.shape}")
        r = r + overlong_penalty(lengths, max_length=cfg.max_response_length, buffer=cfg.overlong_buffer,
                                 factor=cfg.overlong_penalty_factor)
    if cfg.overlong_filtering:
        mask = overlong_filter(mask, truncated)
    return r, mask


def dynamic_sampling_keep(cfg: ObjectiveConfig, *, correct=None, rewards=None, valid=None):
    """DAPO's per-group keep mask [P] and counts, on cfg.dynamic_sampling_metric ("correct" reads
    `correct` [P, G], "reward" reads `rewards` [P, G])."""
    metric = correct if cfg.dynamic_sampling_metric == "correct" else rewards
    if metric is None:
        raise ValueError(f"dynamic_sampling_metric={cfg.dynamic_sampling_metric!r} needs the "
                         f"{'correct' if cfg.dynamic_sampling_metric == 'correct' else 'rewards'} [P, G] argument")
    return keep_groups(metric, kind=cfg.dynamic_sampling_metric, valid=valid)
