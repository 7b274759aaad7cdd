"""KL estimators against NumPy formulas and hand values (docs/objectives.md#kl)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.objectives import kl


def np_kl(name, logp, ref, clamp=None):
    x = np.clip(logp.astype(np.float64) - ref, -20, 20)
    v = {"k1": x, "k2": 0.5 * x**2, "k3": np.exp(-x) + x - 1}[name]
    return v if clamp is None else np.clip(v, -clamp, clamp)


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
@pytest.mark.parametrize("clamp", [None, 10.0])
def test_matches_numpy(name, clamp):
    rng = np.random.default_rng(0)
    logp = rng.normal(size=(2, 3, 7)).astype(np.float32) - 2
    ref = logp + rng.normal(size=logp.shape).astype(np.float32) * 2
    got = getattr(kl, name)(jnp.asarray(logp), jnp.asarray(ref), clamp=clamp)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np_kl(name, logp, ref, clamp), rtol=1e-5, atol=1e-6)


def test_hand_values():
    lp, ref = jnp.array([np.log(0.5)]), jnp.array([np.log(0.25)])  # x = log 2
    np.testing.assert_allclose(kl.k1(lp, ref), [np.log(2)], rtol=1e-6)
    np.testing.assert_allclose(kl.k2(lp, ref), [0.5 * np.log(2) ** 2], rtol=1e-6)
    np.testing.assert_allclose(kl.k3(lp, ref), [0.5 + np.log(2) - 1], rtol=1e-6)
    # equal policies: every estimator is exactly 0
    z = jnp.zeros(3)
    for f in (kl.k1, kl.k2, kl.k3):
        assert np.all(np.asarray(f(z - 1.0, z - 1.0)) == 0.0)


def test_k3_nonnegative_and_tiny_x_accurate():
    x = np.array([1e-4, -1e-4, 3.0, -3.0], np.float32)
    v = np.asarray(kl.k3(jnp.asarray(x), jnp.zeros(4)))
    assert np.all(v >= 0)
    # exp(-x) + x - 1 in fp32 would be off by ~100% here (ulp of exp near 1 is 6e-8); expm1 keeps ~1e-3
    np.testing.assert_allclose(v[:2], 0.5 * x[:2].astype(np.float64) ** 2, rtol=5e-3)


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_gradient_is_analytic(name):
    rng = np.random.default_rng(1)
    logp = rng.normal(size=(5,)).astype(np.float32)
    ref = logp + rng.normal(size=5).astype(np.float32)
    g = jax.grad(lambda l: jnp.sum(getattr(kl, name)(l, jnp.asarray(ref))))(jnp.asarray(logp))
    x = logp.astype(np.float64) - ref
    want = {"k1": np.ones_like(x), "k2": x, "k3": 1 - np.exp(-x)}[name]
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["k1", "k2", "k3"])
def test_extreme_log_ratios_finite(name):
    lp = jnp.array([1e3, -1e3, 0.0])
    f = lambda l: jnp.sum(getattr(kl, name)(l, jnp.zeros(3), clamp=10.0))
    v, g = getattr(kl, name)(lp, jnp.zeros(3), clamp=10.0), jax.grad(f)(lp)
    assert np.all(np.isfinite(np.asarray(v))) and np.all(np.isfinite(np.asarray(g)))
    assert np.all(np.abs(np.asarray(v)) <= 10.0)


def test_bf16_inputs():
    rng = np.random.default_rng(2)
    logp = jnp.asarray(rng.normal(size=(4, 8)) - 1, jnp.bfloat16)
    ref = jnp.asarray(rng.normal(size=(4, 8)) - 1, jnp.bfloat16)
    got = kl.k3(logp, ref)
    assert got.dtype == jnp.float32
    # exact on the bf16-rounded inputs (math is fp32)
    want = np_kl("k3", np.asarray(logp, np.float32), np.asarray(ref, np.float32))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
