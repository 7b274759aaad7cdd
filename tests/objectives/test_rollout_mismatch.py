"""The rollout-mismatch corrections against float64 NumPy (docs/objectives.md#off-policy-correction):
separate bounds, the geometric-mean mask, IcePop, K3 rejection, batch-normalised weights, bypass mode."""

import numpy as np
import pytest

from dapo_jax.objectives import off_policy as op
from dapo_jax.objectives import rollout_mismatch as rm
from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.objectives.diagnostics import finalize_metrics
from dapo_jax.objectives.loss import batch_statistics, objective_terms


def batch(seed, P=3, G=4, T=6, spread=0.05):
    rng = np.random.default_rng(seed)
    old = rng.normal(size=(P, G, T)) - 2.0
    beh = old + rng.normal(size=old.shape) * spread
    logp = old + rng.normal(size=old.shape) * 0.2
    a = np.repeat(rng.normal(size=(P, G, 1)), T, axis=2)
    lengths = rng.integers(0, T + 1, size=(P, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float64)
    return logp, old, beh, a, mask


def seq_mean(x, mask):
    return (x * mask).sum(-1) / np.maximum(mask.sum(-1), 1)


def test_geo_seq_mask_matches_numpy():
    for seed in range(3):
        _, old, beh, _, mask = batch(seed)
        g = np.exp(seq_mean(old - beh, mask))
        keep = (g >= 0.99) & (g <= 1.01)
        assert keep.any() and (~keep & (mask.sum(-1) > 0)).any()
        c = rm.geo_seq_mask(old, beh, mask, cap=1.01, cap_low=0.99)
        np.testing.assert_array_equal(np.asarray(c.keep), np.broadcast_to(keep[..., None], mask.shape).astype(float))
        assert np.all(np.asarray(c.weight) == 1)
        nonempty = mask.sum(-1) > 0
        f = finalize_metrics(c.metrics)
        np.testing.assert_allclose(float(f["behaviour_masked_frac"]), 1 - keep[nonempty].mean(), rtol=1e-6)
        np.testing.assert_allclose(float(f["behaviour_ratio_mean"]), g[nonempty].mean(), rtol=1e-5)


def test_icepop_matches_numpy_and_keeps_the_denominator():
    _, old, beh, a, mask = batch(1, spread=0.8)
    k = np.exp(old - beh)
    inside = (k >= 0.5) & (k <= 5.0)
    assert inside.any() and (~inside & (mask > 0)).any()
    c = rm.icepop(old, beh, mask, cap=5.0, cap_low=0.5)
    np.testing.assert_allclose(np.asarray(c.weight) * mask, k * inside * mask, rtol=1e-5)
    assert np.all(np.asarray(c.keep) == 1)
    f = finalize_metrics(c.metrics)
    np.testing.assert_allclose(float(f["behaviour_masked_frac"]), 1 - inside[mask > 0].mean(), rtol=1e-6)


def test_k3_seq_mask_matches_numpy():
    _, old, beh, _, mask = batch(2, spread=0.15)
    k = np.exp(old - beh)
    mean_k3 = seq_mean(k - 1 - np.log(k), mask)
    keep = mean_k3 <= 0.01
    assert keep.any() and (~keep).any()
    c = rm.k3_seq_mask(old, beh, mask, k3_threshold=0.01)
    np.testing.assert_array_equal(np.asarray(c.keep)[..., 0], keep.astype(float))
    np.testing.assert_allclose(float(finalize_metrics(c.metrics)["behaviour_k3_mean"]),
                               (k - 1 - np.log(k))[mask > 0].mean(), rtol=1e-4)


def test_separate_lower_bound_for_masks_and_tis():
    _, old, beh, _, mask = batch(3, spread=0.5)
    k = np.exp(old - beh)
    c = op.token_mask(old, beh, mask, cap=2.0, cap_low=0.8)
    np.testing.assert_array_equal(np.asarray(c.keep) * mask, ((k >= 0.8) & (k <= 2.0)) * mask)
    c = op.token_tis(old, beh, mask, cap=2.0, cap_low=0.8)
    np.testing.assert_allclose(np.asarray(c.weight) * mask, np.clip(k, 0.8, 2.0) * mask, rtol=1e-5)
    s = np.exp((np.log(k) * mask).sum(-1))
    c = op.seq_mask(old, beh, mask, cap=2.0, cap_low=0.9)
    np.testing.assert_array_equal(np.asarray(c.keep)[..., 0], ((s >= 0.9) & (s <= 2.0)).astype(float))
    with pytest.raises(ValueError, match="lower bound"):
        op.token_mask(old, beh, mask, cap=2.0, cap_low=2.5)


def test_batch_normalised_weights():
    logp, old, beh, a, mask = batch(4, spread=0.5)
    cfg = ObjectiveConfig(off_policy_correction="token_tis", off_policy_batch_normalize=True)
    w = np.minimum(np.exp(old - beh), 2.0)
    w_tilde = w / w[mask > 0].mean()
    s, d, _ = objective_terms(cfg, logp=logp, old_logp=old, advantages=a, mask=mask, behaviour_logp=beh)
    r = np.exp(logp - old)
    pg = np.maximum(-a * r, -a * np.clip(r, 0.8, 1.28))
    np.testing.assert_allclose(float(s), (pg * w_tilde * mask).sum(), rtol=2e-5)
    # over halves with the whole batch's total: the same sum
    total = batch_statistics(cfg, logp=None, old_logp=old, advantages=a, mask=mask, behaviour_logp=beh)
    halves = sum(float(objective_terms(cfg, logp=logp[sl], old_logp=old[sl], advantages=a[sl], mask=mask[sl],
                                       behaviour_logp=beh[sl], **total)[0]) for sl in (slice(0, 1), slice(1, 3)))
    np.testing.assert_allclose(halves, float(s), rtol=2e-5)


def test_bypass_compares_the_current_policy_with_the_sampler():
    logp, old, beh, a, mask = batch(5, spread=0.0)
    sampler = old  # bypass: π_old is the sampler's
    cfg = ObjectiveConfig(off_policy_correction="token_mask", off_policy_cap=1.2, off_policy_bypass=True)
    s, d, m = objective_terms(cfg, logp=logp, old_logp=sampler, advantages=a, mask=mask, behaviour_logp=sampler)
    k = np.exp(logp - sampler)
    keep = ((k >= 1 / 1.2) & (k <= 1.2)) * mask
    assert 0 < keep.sum() < mask.sum()
    pg = np.maximum(-a * k, -a * np.clip(k, 0.8, 1.28))
    np.testing.assert_allclose(float(s), (pg * keep).sum(), rtol=2e-5)
    assert float(d) == keep.sum()
    # without bypass the same arrays compare π_old with itself: nothing is masked
    _, d0, _ = objective_terms(cfg.model_copy(update={"off_policy_bypass": False}), logp=logp, old_logp=sampler,
                               advantages=a, mask=mask, behaviour_logp=sampler)
    assert float(d0) == mask.sum()


def test_bypass_sets_the_run_config():
    from dapo_jax.training.config.base import ConfigError
    from dapo_jax.training.config.run import load_config

    cfg = load_config(None, ["objective.name=dapo_bypass_geo_mask"])
    assert cfg.recompute_old_logp is False
    assert load_config(None, ["objective.name=dapo_geo_mask"]).recompute_old_logp is True
    with pytest.raises(ConfigError, match="recompute_old_logp"):
        load_config(None, ["objective.name=dapo_geo_mask", "rollout.recompute_old_logp=false"])
