"""DPPO against float64 NumPy (docs/objectives_recent.md#dppo): the binary TV and KL regions, the loss and its
gradient −A·min(ρ, C)·keep, masked tokens, and the masked-fraction diagnostic."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.objectives.diagnostics import finalize_metrics
from dapo_jax.objectives.dppo import binary_kl, dppo_kl, dppo_tv


def batch(seed, P=2, G=3, T=6):
    rng = np.random.default_rng(seed)
    old = np.log(rng.uniform(0.02, 0.98, size=(P, G, T)))
    logp = np.log(np.clip(np.exp(old) + rng.normal(size=old.shape) * 0.25, 0.01, 0.99))
    a = np.repeat(rng.normal(size=(P, G, 1)), T, axis=2)
    lengths = rng.integers(1, T + 1, size=(P, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float64)
    return logp, old, a, mask


def np_keep(logp, old, a, kind, dl, dh):
    keep = np.zeros(logp.shape)
    for idx in np.ndindex(logp.shape):
        p, q, A = np.exp(logp[idx]), np.exp(old[idx]), a[idx]
        if kind == "tv":
            keep[idx] = (p - q <= dh) if A > 0 else (p - q >= -dl)
        else:
            d = q * np.log(q / p) + (1 - q) * np.log((1 - q) / (1 - p))
            keep[idx] = (d <= dh or p <= q) if A > 0 else (d <= dl or p >= q)
    return keep


@pytest.mark.parametrize("kind,fn,deltas", [("tv", dppo_tv, (0.15, 0.1)), ("kl", dppo_kl, (0.05, 0.03))])
@pytest.mark.parametrize("cap", [None, 1.5])
def test_loss_gradient_and_mask_match_numpy(kind, fn, deltas, cap):
    for seed in range(3):
        logp, old, a, mask = batch(seed)
        keep = np_keep(logp, old, a, kind, *deltas)
        assert 0 < keep.sum() < keep.size
        rho = np.exp(logp - old)
        w = rho if cap is None else np.minimum(rho, cap)
        kw = dict(delta_low=deltas[0], delta_high=deltas[1], is_cap=cap)
        loss, ratio, metrics = fn(logp, old, a, mask, **kw)
        np.testing.assert_allclose(np.asarray(loss), -a * w * logp * keep, rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(ratio), rho, rtol=2e-5)
        g = jax.grad(lambda l: jnp.sum(fn(l, old, a, mask, **kw)[0] * mask))(jnp.asarray(logp, jnp.float32))
        np.testing.assert_allclose(np.asarray(g), -a * w * keep * mask, rtol=2e-5, atol=1e-7)
        np.testing.assert_allclose(float(finalize_metrics(metrics)["dppo_masked_frac"]),
                                   1 - keep[mask > 0].mean(), rtol=1e-6)


def test_binary_kl_matches_numpy_and_is_zero_on_policy():
    logp, old, _, _ = batch(3)
    q, p = np.exp(old), np.exp(logp)
    want = q * np.log(q / p) + (1 - q) * np.log((1 - q) / (1 - p))
    np.testing.assert_allclose(np.asarray(binary_kl(logp, old)), want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(binary_kl(old, old)), 0.0, atol=1e-6)


def test_hand_cases_tv():
    # q = 0.5: p = 0.7 with A > 0 moved +0.2 > 0.15: masked; p = 0.6 kept; p = 0.3 with A < 0 moved -0.2: masked;
    # p = 0.7 with A < 0 moved against the advantage: kept
    logp = jnp.log(jnp.array([0.7, 0.6, 0.3, 0.7]))
    old = jnp.log(jnp.full(4, 0.5))
    a = jnp.array([1.0, 1.0, -1.0, -1.0])
    loss, _, _ = dppo_tv(logp, old, a, jnp.ones(4), delta_low=0.15, delta_high=0.15)
    keep = np.asarray(loss) != 0
    assert keep.tolist() == [False, True, False, True]


def test_probability_one_stays_finite():
    logp = jnp.array([0.0, -1e-9, -30.0])
    old = jnp.log(jnp.array([0.5, 0.999, 0.5]))
    for fn in (dppo_tv, dppo_kl):
        loss, _, _ = fn(logp, old, jnp.array([1.0, -1.0, 1.0]), jnp.ones(3))
        assert np.all(np.isfinite(np.asarray(loss)))


def test_bad_delta_is_refused():
    with pytest.raises(ValueError, match="delta_low=0"):
        dppo_tv(jnp.zeros(2), jnp.zeros(2), jnp.ones(2), jnp.ones(2), delta_low=0)


def test_bfloat16_inputs_compute_in_float32():
    logp, old, a, mask = batch(11)
    for fn in (dppo_tv, dppo_kl):
        want, _, _ = fn(logp.astype(np.float32), old.astype(np.float32), a, mask)
        got, _, _ = fn(jnp.asarray(logp, jnp.bfloat16), jnp.asarray(old, jnp.bfloat16), a, mask)
        assert got.dtype == jnp.float32
        # a token near the region's edge may flip: compare where both keep it
        both = (np.asarray(got) != 0) & (np.asarray(want) != 0)
        np.testing.assert_allclose(np.asarray(got)[both], np.asarray(want)[both], rtol=0.05, atol=0.05)
