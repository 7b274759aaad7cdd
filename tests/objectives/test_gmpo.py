"""GMPO against a float64 NumPy transcription (docs/objectives_recent.md#gmpo): the sign-aware log-space clip,
the geometric mean over valid tokens, gradients (finite differences away from the clip edges), padding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.objectives.aggregation import seq_mean_token_mean
from dapo_jax.objectives.diagnostics import finalize_metrics
from dapo_jax.objectives.gmpo import gmpo


def batch(seed, P=2, G=3, T=5, scale=0.5):
    rng = np.random.default_rng(seed)
    old = rng.normal(size=(P, G, T)) - 1.5
    logp = old + rng.normal(size=old.shape) * scale
    a = np.repeat(rng.normal(size=(P, G, 1)), T, axis=2)
    lengths = rng.integers(1, T + 1, size=(P, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float64)
    return logp, old, a, mask


def np_gmpo_responses(logp, old, a, mask, el, eh):
    """[P, G] response losses −A_i·exp(Σ_t m·x'_t / L_i) (float64 loops)."""
    P, G, T = logp.shape
    out = np.zeros((P, G))
    for p in range(P):
        for g in range(G):
            xs = []
            for t in range(T):
                if mask[p, g, t] == 0:
                    continue
                x = float(np.clip(logp[p, g, t] - old[p, g, t], -20, 20))
                A = a[p, g, 0]
                xs.append(min(x, eh) if A > 0 else max(x, -el) if A < 0 else x)
            out[p, g] = -a[p, g, 0] * np.exp(np.mean(xs)) if xs else 0.0
    return out


@pytest.mark.parametrize("eps", [(0.4, 0.4), (0.2, 0.3)])
def test_values_match_numpy(eps):
    for seed in range(4):
        logp, old, a, mask = batch(seed)
        loss, s, _ = gmpo(logp, old, a, mask, eps_low=eps[0], eps_high=eps[1])
        want = np_gmpo_responses(logp, old, a, mask, *eps)
        np.testing.assert_allclose(np.asarray(loss)[..., 0], want, rtol=2e-5, atol=1e-6)
        assert np.all(np.asarray(loss) == np.asarray(loss)[..., :1])  # broadcast to every token
        total, den = seq_mean_token_mean(loss, mask)
        np.testing.assert_allclose(float(total) / float(den), want.mean(), rtol=2e-5)


def test_gradient_matches_finite_differences_and_clipped_tokens_get_none():
    logp, old, a, mask = batch(8, scale=0.6)
    x = logp - old
    edge = (np.abs(x - 0.4) < 1e-3) | (np.abs(x + 0.4) < 1e-3)
    assert not edge.any()
    f = lambda lp: jnp.sum(gmpo(lp, old, a, mask, eps_low=0.4, eps_high=0.4)[0][..., 0])  # noqa: E731
    g = np.asarray(jax.grad(f)(jnp.asarray(logp, jnp.float32)))
    fd = np.zeros_like(logp)
    for idx in np.ndindex(logp.shape):
        lp_p, lp_m = logp.copy(), logp.copy()
        lp_p[idx] += 1e-6
        lp_m[idx] -= 1e-6
        fd[idx] = (np_gmpo_responses(lp_p, old, a, mask, 0.4, 0.4).sum()
                   - np_gmpo_responses(lp_m, old, a, mask, 0.4, 0.4).sum()) / 2e-6
    np.testing.assert_allclose(g, fd, rtol=1e-4, atol=1e-5)
    clipped = ((a > 0) & (x > 0.4)) | ((a < 0) & (x < -0.4))
    assert (clipped & (mask > 0)).any() and np.all(g[clipped] == 0) and np.all(g[mask == 0] == 0)


def test_padding_garbage_and_metrics():
    logp, old, a, mask = batch(9, scale=0.6)
    dirty = np.where(mask > 0, logp, 1e4)
    loss, _, metrics = gmpo(dirty, old, a, mask, eps_low=0.4, eps_high=0.4)
    np.testing.assert_allclose(np.asarray(loss)[..., 0], np_gmpo_responses(logp, old, a, mask, 0.4, 0.4), rtol=2e-5)
    x = logp - old
    clipped = (((a > 0) & (x > 0.4)) | ((a < 0) & (x < -0.4)))[mask > 0]
    np.testing.assert_allclose(float(finalize_metrics(metrics)["gmpo_clip_frac"]), clipped.mean(), rtol=1e-6)


def test_zero_advantage_and_empty_response():
    logp = jnp.log(jnp.array([[[2.0, 3.0], [1.0, 1.0]]]))
    mask = jnp.array([[[1.0, 1.0], [0.0, 0.0]]])
    loss, s, _ = gmpo(logp, jnp.zeros_like(logp), jnp.zeros_like(logp), mask)
    assert np.all(np.asarray(loss) == 0)
    np.testing.assert_allclose(float(s[0, 0, 0]), np.sqrt(6.0), rtol=1e-6)  # A = 0: no clip, plain geometric mean


def test_bfloat16_inputs_compute_in_float32():
    logp, old, a, mask = batch(10, scale=0.1)
    want, _, _ = gmpo(logp.astype(np.float32), old.astype(np.float32), a, mask)
    got, _, _ = gmpo(jnp.asarray(logp, jnp.bfloat16), jnp.asarray(old, jnp.bfloat16), a, mask)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0.05, atol=0.05)
