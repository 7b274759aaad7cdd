"""SAPO against a float64 NumPy transcription of the paper's gate: values, gradients (analytic and
finite differences), the A = 0 tie, dtypes, and the gate-weight diagnostics (docs/objectives_recent.md#sapo)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.objectives.diagnostics import finalize_metrics
from dapo_jax.objectives.sapo import sapo


def batch(seed, P=2, G=3, T=5, scale=0.8):
    rng = np.random.default_rng(seed)
    old = rng.normal(size=(P, G, T)) - 1.5
    logp = old + rng.normal(size=old.shape) * scale
    a = np.repeat(rng.normal(size=(P, G, 1)), T, axis=2)
    lengths = rng.integers(1, T + 1, size=(P, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float64)
    return logp, old, a, mask


def np_sapo(logp, old, a, tau_pos, tau_neg):
    """ℓ = −(4/τ)·σ(τ(r − 1))·A per token, τ = τ_pos for A > 0 else τ_neg (float64)."""
    out = np.zeros(logp.shape)
    for idx in np.ndindex(logp.shape):
        r = np.exp(np.clip(logp[idx] - old[idx], -20, 20))
        tau = tau_pos if a[idx] > 0 else tau_neg
        out[idx] = -(4.0 / tau) / (1.0 + np.exp(-tau * (r - 1.0))) * a[idx]
    return out


def fd_grad(f, x, h=1e-6):
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        g[idx] = (f(xp) - f(xm)) / (2 * h)
    return g


@pytest.mark.parametrize("taus", [(1.0, 1.05), (0.5, 2.0)])
def test_values_match_numpy(taus):
    for seed in range(3):
        logp, old, a, mask = batch(seed)
        got, ratio, _ = sapo(logp, old, a, mask, tau_pos=taus[0], tau_neg=taus[1])
        np.testing.assert_allclose(np.asarray(got), np_sapo(logp, old, a, *taus), rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(ratio), np.exp(logp - old), rtol=2e-5)


def test_hand_cases():
    # r = 1: ℓ = −(4/τ)·½·A = −2A/τ; A = 0 sends the token to τ_neg (its loss is 0 either way)
    got, _, _ = sapo(jnp.zeros(3), jnp.zeros(3), jnp.array([1.0, -1.0, 0.0]), jnp.ones(3), tau_pos=1.0, tau_neg=2.0)
    np.testing.assert_allclose(np.asarray(got), [-2.0, 1.0, 0.0], atol=1e-7)


def test_gradient_is_the_gated_policy_gradient():
    """∂ℓ/∂logp = −A·w·r with w = 4p(1 − p), and equal to finite differences of the float64 reference."""
    logp, old, a, mask = batch(4)
    tp, tn = 1.0, 1.05
    g = np.asarray(jax.grad(lambda l: jnp.sum(sapo(l, old, a, mask, tau_pos=tp, tau_neg=tn)[0] * mask))(
        jnp.asarray(logp, jnp.float32)))
    r = np.exp(logp - old)
    tau = np.where(a > 0, tp, tn)
    p = 1 / (1 + np.exp(-tau * (r - 1)))
    np.testing.assert_allclose(g, (-a * 4 * p * (1 - p) * r) * mask, rtol=1e-4, atol=1e-6)
    fd = fd_grad(lambda x: np.sum(np_sapo(x, old, a, tp, tn) * mask), logp)
    np.testing.assert_allclose(g, fd, rtol=1e-4, atol=1e-5)
    assert np.all(g[mask == 0] == 0)


def test_on_policy_gradient_equals_unclipped_policy_gradient():
    logp, _, a, mask = batch(5)
    g = jax.grad(lambda l: jnp.sum(sapo(l, jax.lax.stop_gradient(l), a, mask)[0]))(jnp.asarray(logp, jnp.float32))
    np.testing.assert_allclose(np.asarray(g), -a, rtol=1e-6)


def test_bfloat16_inputs_compute_in_float32():
    logp, old, a, mask = batch(6, scale=0.2)
    got32, _, _ = sapo(logp.astype(np.float32), old.astype(np.float32), a, mask)
    got16, _, _ = sapo(jnp.asarray(logp, jnp.bfloat16), jnp.asarray(old, jnp.bfloat16), a, mask)
    assert got16.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got16), np.asarray(got32), rtol=0.05, atol=0.05)


def test_metrics_count_valid_tokens_only():
    logp, old, a, mask = batch(7, scale=2.0)
    logp = np.where(mask > 0, logp, 50.0)  # padding far off: must not count
    _, _, metrics = sapo(logp, old, a, mask, tau_pos=1.0, tau_neg=1.05)
    out = finalize_metrics(metrics)
    r = np.exp(np.clip(logp - old, -20, 20))
    tau = np.where(a > 0, 1.0, 1.05)
    p = 1 / (1 + np.exp(-tau * (r - 1)))
    w = 4 * p * (1 - p)
    valid = mask > 0
    np.testing.assert_allclose(float(out["sapo_weight_mean"]), w[valid].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(out["sapo_gated_frac"]), (w[valid] < 0.5).mean(), rtol=1e-6)
    assert 0 < float(out["sapo_gated_frac"]) < 1


def test_bad_temperature_is_refused():
    with pytest.raises(ValueError, match="tau_neg=0"):
        sapo(jnp.zeros(2), jnp.zeros(2), jnp.ones(2), jnp.ones(2), tau_pos=1.0, tau_neg=0)
