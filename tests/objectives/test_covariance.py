"""Clip-Cov and KL-Cov against float64 NumPy (docs/objectives_recent.md#clip-cov-kl-cov): the covariance, the
candidate window, the n = ⌊r·N⌋ draw given the priorities, KL-Cov's top-k with ties, losses, gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.objectives import covariance as cv
from dapo_jax.objectives.diagnostics import finalize_metrics


def batch(seed, P=2, G=4, T=8, scale=0.4):
    rng = np.random.default_rng(seed)
    old = rng.normal(size=(P, G, T)) * 1.5 - 2.0
    logp = old + rng.normal(size=old.shape) * scale
    a = np.repeat(rng.normal(size=(P, G, 1)) * 2.0, T, axis=2)
    lengths = rng.integers(1, T + 1, size=(P, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float64)
    return logp, old, a, mask, rng.uniform(size=old.shape)


def np_cov(logp, a, mask):
    v = mask > 0
    return (a - a[v].mean()) * (logp - logp[v].mean())


def np_ppo(logp, old, a, el, eh):
    r = np.exp(logp - old)
    return -a * r, -a * np.clip(r, 1 - el, 1 + eh)


def np_clip_cov(logp, old, a, mask, u, *, r, lb, ub, el, eh):
    """(loss, selected): the n = max(⌊r·N⌋, 1) candidates of largest priority u lose their loss."""
    cov = np_cov(logp, a, mask)
    l1, l2 = np_ppo(logp, old, a, el, eh)
    cand = (mask > 0) & (cov > lb) & (cov < ub) & ~(l2 > l1)
    n = max(int(r * (mask > 0).sum()), 1)
    order = np.argsort(-np.where(cand, u, -np.inf), axis=None)[: min(n, cand.sum())]
    selected = np.zeros(mask.shape, bool)
    selected.flat[order] = True
    return np.where(selected, 0.0, np.maximum(l1, l2)), selected, cand


@pytest.mark.parametrize("ratio", [0.05, 0.2, 1.0])
def test_clip_cov_matches_numpy(ratio):
    for seed in range(3):
        logp, old, a, mask, u = batch(seed)
        kw = dict(r=ratio, lb=0.05, ub=3.0, el=0.2, eh=0.28)
        want, selected, cand = np_clip_cov(logp, old, a, mask, u, **kw)
        assert cand.sum() >= 2
        loss, _, metrics = cv.clip_cov(logp, old, a, mask, eps_low=0.2, eps_high=0.28, ratio=ratio, lb=0.05, ub=3.0,
                                       priority=u)
        np.testing.assert_allclose(np.asarray(loss), want, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(float(finalize_metrics(metrics)["cov_selected_frac"]),
                                   selected.sum() / (mask > 0).sum(), rtol=1e-6)
        g = jax.grad(lambda l: jnp.sum(cv.clip_cov(l, old, a, mask, eps_low=0.2, eps_high=0.28, ratio=ratio, lb=0.05,
                                                   ub=3.0, priority=u)[0] * mask))(jnp.asarray(logp, jnp.float32))
        r_ = np.exp(logp - old)
        l1, l2 = np_ppo(logp, old, a, 0.2, 0.28)
        want_g = np.where(selected | (l2 > l1), 0.0, -a * r_) * mask
        np.testing.assert_allclose(np.asarray(g), want_g, rtol=2e-5, atol=1e-6)


def test_clip_cov_selects_all_candidates_when_fewer_than_n():
    logp, old, a, mask, u = batch(4)
    _, selected, cand = np_clip_cov(logp, old, a, mask, u, r=1.0, lb=0.05, ub=3.0, el=0.2, eh=0.28)
    assert np.array_equal(selected, cand)
    loss, _, _ = cv.clip_cov(logp, old, a, mask, ratio=1.0, lb=0.05, ub=3.0, priority=u)
    assert np.all(np.asarray(loss)[cand] == 0)


def np_kl_cov(logp, old, a, mask, *, r, coef):
    """Top-k by Cov over the valid tokens, every token tied with the k-th included."""
    cov = np_cov(logp, a, mask)
    v = mask > 0
    k = max(int(r * v.sum()), 1)
    kth = np.sort(cov[v])[::-1][k - 1]
    selected = v & (cov >= kth)
    x = logp - old
    return -a * np.exp(x) + np.where(selected, coef * np.abs(x), 0.0), selected


@pytest.mark.parametrize("ratio,coef", [(0.02, 1.0), (0.25, 0.1)])
def test_kl_cov_matches_numpy(ratio, coef):
    for seed in range(3):
        logp, old, a, mask, _ = batch(seed)
        want, selected = np_kl_cov(logp, old, a, mask, r=ratio, coef=coef)
        loss, _, metrics = cv.kl_cov(logp, old, a, mask, ratio=ratio, coef=coef)
        np.testing.assert_allclose(np.asarray(loss), want, rtol=2e-5, atol=1e-6)
        assert float(finalize_metrics(metrics)["cov_selected_frac"]) == pytest.approx(selected.sum() / mask.sum())
        g = jax.grad(lambda l: jnp.sum(cv.kl_cov(l, old, a, mask, ratio=ratio, coef=coef)[0] * mask))(
            jnp.asarray(logp, jnp.float32))
        x = logp - old
        np.testing.assert_allclose(np.asarray(g), (-a * np.exp(x) + selected * coef * np.sign(x)) * mask,
                                   rtol=2e-5, atol=1e-6)


def test_kl_cov_ties_are_all_or_none():
    # Ā = 1, l̄ = −2: Cov = [1, 1, −1, −1, 0, 0]; tokens 0 and 1 tie for first, so k = ⌊0.25·6⌋ = 1 selects both
    logp = jnp.array([[[-1.0, -1.0, -1.0, -1.0, -4.0, -4.0]]])
    a = jnp.array([[[2.0, 2.0, 0.0, 0.0, 1.0, 1.0]]])
    mask = jnp.ones((1, 1, 6))
    loss, _, metrics = cv.kl_cov(logp, logp - 0.5, a, mask, ratio=0.25, coef=1.0)
    assert float(finalize_metrics(metrics)["cov_selected_frac"]) == pytest.approx(2 / 6)
    r = np.exp(0.5)
    np.testing.assert_allclose(np.asarray(loss)[0, 0], [-2 * r + 0.5, -2 * r + 0.5, 0, 0, -r, -r], rtol=1e-6)


def test_selection_count_floors_exact_products():
    counts = cv.selection_count(jnp.array([5000, 10000, 4999, 1, 0]), 2e-4)
    assert np.asarray(counts).tolist() == [1, 2, 1, 1, 1]


def test_statistics_over_a_larger_batch_are_what_the_loss_uses():
    """Given the whole batch's statistics, each half of the batch gives the whole batch's loss terms."""
    logp, old, a, mask, u = batch(6, P=4)
    for name, fn, stat in (("clip", cv.clip_cov, cv.clip_cov_statistics), ("kl", cv.kl_cov, cv.kl_cov_statistics)):
        kw = dict(ratio=0.1, lb=0.05, ub=3.0) if name == "clip" else dict(ratio=0.1)
        stats = stat(logp, old, a, mask, priority=u, **kw)
        whole = np.asarray(fn(logp, old, a, mask, priority=u, **kw)[0])
        halves = [np.asarray(fn(logp[s], old[s], a[s], mask[s], priority=u[s], stats=stats, **kw)[0])
                  for s in (slice(0, 2), slice(2, 4))]
        np.testing.assert_array_equal(np.concatenate(halves), whole)
        alone = np.asarray(fn(logp[:2], old[:2], a[:2], mask[:2], priority=u[:2], **kw)[0])
        assert not np.array_equal(alone, whole[:2]), name  # per-half statistics would select otherwise


def test_no_valid_tokens_selects_nothing():
    logp, old, a, mask, u = batch(7)
    z = np.zeros_like(mask)
    for fn in (cv.clip_cov, cv.kl_cov):
        loss, _, metrics = fn(logp, old, a, z, priority=u)
        assert np.all(np.isfinite(np.asarray(loss)))
        assert float(finalize_metrics(metrics)["cov_selected_frac"]) == 0.0


def test_bfloat16_inputs_compute_in_float32():
    logp, old, a, mask, u = batch(12)
    for fn in (cv.clip_cov, cv.kl_cov):
        got, _, _ = fn(jnp.asarray(logp, jnp.bfloat16), jnp.asarray(old, jnp.bfloat16), a, mask, priority=u)
        assert got.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(got)))
