"""Per-token policy losses against NumPy loops, with gradients and edge cases (docs/objectives.md#policy-losses)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.objectives import policy_loss as pl


def batch(seed, P=2, G=3, T=5, scale=0.3):
    rng = np.random.default_rng(seed)
    old = (rng.normal(size=(P, G, T)) - 1.5).astype(np.float32)
    logp = (old + rng.normal(size=old.shape) * scale).astype(np.float32)
    a = rng.normal(size=(P, G)).astype(np.float32)
    lengths = rng.integers(1, T + 1, size=(P, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    return logp, old, np.broadcast_to(a[..., None], mask.shape).copy(), mask


def np_surrogate(logp, old, a, el, eh, c=None):
    out = np.zeros(logp.shape)
    for idx in np.ndindex(logp.shape):
        rho = np.exp(np.clip(float(logp[idx]) - float(old[idx]), -20, 20))
        A = float(a[idx])
        v = -min(rho * A, min(max(rho, 1 - el), 1 + eh) * A)
        if c is not None and A < 0:
            v = min(v, -c * A)
        out[idx] = v
    return out


@pytest.mark.parametrize("eps", [(0.2, 0.2), (0.2, 0.28)])
@pytest.mark.parametrize("c", [None, 3.0])
def test_clipped_surrogate_matches_numpy(eps, c):
    for seed in range(3):
        logp, old, a, mask = batch(seed, scale=1.0)
        got, ratio = pl.clipped_surrogate(logp, old, a, mask, eps_low=eps[0], eps_high=eps[1], dual_clip_c=c)
        np.testing.assert_allclose(np.asarray(got), np_surrogate(logp, old, a, *eps, c), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(ratio), np.exp(logp.astype(np.float64) - old), rtol=1e-5)


def test_clipped_surrogate_hand_case():
    # ratio 1.5 with A = +1: clipped at 1.28 -> loss -1.28; ratio 0.5 with A = -1: clipped at 0.8 -> 0.8
    logp = jnp.log(jnp.array([1.5, 0.5, 1.1, 5.0]))
    a = jnp.array([1.0, -1.0, 1.0, -1.0])
    got, _ = pl.clipped_surrogate(logp, jnp.zeros(4), a, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0)
    np.testing.assert_allclose(np.asarray(got), [-1.28, 0.8, -1.1, 3.0], rtol=1e-6)


def test_clipped_tokens_have_zero_gradient_unclipped_do_not():
    logp, old, a, mask = batch(4, scale=1.0)
    el, eh = 0.2, 0.28
    g = np.asarray(jax.grad(lambda l: jnp.sum(pl.clipped_surrogate(l, old, a, eps_low=el, eps_high=eh)[0]))(jnp.asarray(logp)))
    rho = np.exp(logp.astype(np.float64) - old)
    clipped = ((a > 0) & (rho > 1 + eh)) | ((a < 0) & (rho < 1 - el))
    assert clipped.any() and (~clipped).any()
    assert np.all(g[clipped] == 0.0)
    # analytic gradient of -rho*A wrt logp is -rho*A
    np.testing.assert_allclose(g[~clipped], (-rho * a)[~clipped], rtol=1e-5, atol=1e-6)
    assert np.all(g[~clipped] != 0.0)


def test_dual_clip_bounds_negative_advantage_loss():
    logp = jnp.log(jnp.array([2.0, 4.0, 50.0, 1e6]))
    a = jnp.full(4, -2.0)
    val, _ = pl.clipped_surrogate(logp, jnp.zeros(4), a, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0)
    np.testing.assert_allclose(np.asarray(val), [4.0, 6.0, 6.0, 6.0], rtol=1e-6)
    g = jax.grad(lambda l: jnp.sum(pl.clipped_surrogate(l, jnp.zeros(4), a, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0)[0]))(logp)
    np.testing.assert_allclose(np.asarray(g), [4.0, 0.0, 0.0, 0.0], rtol=1e-6)


def test_ratio_one_clip_cannot_bind():
    logp, _, a, _ = batch(5)
    g = jax.grad(lambda l: jnp.sum(pl.clipped_surrogate(l, jnp.asarray(logp), a, eps_low=1e-3, eps_high=1e-3)[0]))(jnp.asarray(logp))
    np.testing.assert_allclose(np.asarray(g), -a, rtol=1e-6)
    val, ratio = pl.clipped_surrogate(logp, logp, a)
    np.testing.assert_array_equal(np.asarray(ratio), 1.0)
    np.testing.assert_allclose(np.asarray(val), -a, rtol=1e-6)


@pytest.mark.parametrize("name", ["clipped_surrogate", "gspo", "gspo_token", "cispo"])
def test_extreme_log_ratios_finite(name):
    logp = jnp.array([[[1e3, -1e3, 0.0, 5.0]], [[-1e3, -1e3, -1e3, -1e3]]])
    old = jnp.zeros_like(logp)
    a = jnp.broadcast_to(jnp.array([[[1.0]], [[-1.0]]]), logp.shape)
    mask = jnp.ones_like(logp)
    fn = getattr(pl, name)
    for c in (None, 3.0):
        val, _ = fn(logp, old, a, mask, eps_low=0.2, eps_high=0.28, dual_clip_c=c)
        g = jax.grad(lambda l: jnp.sum(fn(l, old, a, mask, eps_low=0.2, eps_high=0.28, dual_clip_c=c)[0]))(logp)
        assert np.all(np.isfinite(np.asarray(val))) and np.all(np.isfinite(np.asarray(g)))


def np_gspo(logp, old, a_seq, mask, el, eh):
    P, G, T = logp.shape
    out = np.zeros((P, G, T))
    for p in range(P):
        for g in range(G):
            L = mask[p, g].sum()
            s = np.exp(np.sum((logp[p, g].astype(np.float64) - old[p, g]) * mask[p, g]) / max(L, 1))
            A = a_seq[p, g]
            out[p, g, :] = -min(s * A, min(max(s, 1 - el), 1 + eh) * A)
    return out


def test_gspo_matches_numpy_and_gspo_token_has_same_value_and_gradient():
    logp, old, a, mask = batch(6, scale=0.02)
    el, eh = 3e-4, 4e-4
    got, s = pl.gspo(logp, old, a, mask, eps_low=el, eps_high=eh)
    np.testing.assert_allclose(np.asarray(got), np_gspo(logp, old, a[..., 0], mask, el, eh), rtol=1e-5, atol=1e-6)
    tok, s_t = pl.gspo_token(logp, old, a, mask, eps_low=el, eps_high=eh)
    np.testing.assert_allclose(np.asarray(tok), np.asarray(got), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(s_t), np.asarray(s), rtol=1e-6)

    def seq_mean(fn, l, el, eh):  # mean over responses of the per-response token mean
        v = fn(l, old, a, mask, eps_low=el, eps_high=eh)[0]
        return jnp.sum(jnp.sum(v * mask, -1) / mask.sum(-1))

    for el_, eh_ in ((el, eh), (10.0, 10.0)):  # clipped regime, and a wide clip (every response active)
        g_seq = jax.grad(lambda l: seq_mean(pl.gspo, l, el_, eh_))(jnp.asarray(logp))
        g_tok = jax.grad(lambda l: seq_mean(pl.gspo_token, l, el_, eh_))(jnp.asarray(logp))
        np.testing.assert_allclose(np.asarray(g_tok), np.asarray(g_seq), rtol=1e-5, atol=1e-7)
    # wide clip: d/dlogp_t of -s*A = -s*A*m_t/L
    L = mask.sum(-1, keepdims=True)
    s_np = np.exp(((logp.astype(np.float64) - old) * mask).sum(-1, keepdims=True) / L)
    np.testing.assert_allclose(np.asarray(g_seq), -s_np * a * mask / L, rtol=1e-5, atol=1e-7)


def test_gspo_fully_masked_response_is_finite():
    logp, old, a, mask = batch(7)
    mask[0, 0] = 0.0
    val, s = pl.gspo(logp, old, a, mask)
    assert np.all(np.isfinite(np.asarray(val))) and float(np.asarray(s)[0, 0, 0]) == 1.0


def test_cispo_value_and_gradient():
    logp, old, a, mask = batch(8, scale=1.0)
    el, eh = 1.0, 0.28
    val, _ = pl.cispo(logp, old, a, mask, eps_low=el, eps_high=eh)
    w = np.clip(np.exp(logp.astype(np.float64) - old), 1 - el, 1 + eh)
    np.testing.assert_allclose(np.asarray(val), -w * a * logp, rtol=1e-5, atol=1e-6)
    g = jax.grad(lambda l: jnp.sum(pl.cispo(l, old, a, mask, eps_low=el, eps_high=eh)[0]))(jnp.asarray(logp))
    # the weight is detached: every token keeps the gradient -w*A, truncated ones included
    np.testing.assert_allclose(np.asarray(g), -w * a, rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(g) != 0.0)


def test_entropy_bonus_and_high_entropy_mask():
    rng = np.random.default_rng(9)
    H = rng.random((3, 4, 6)).astype(np.float32)
    mask = (rng.random((3, 4, 6)) < 0.7).astype(np.float32)
    np.testing.assert_allclose(np.asarray(pl.entropy_bonus(jnp.ones(3), jnp.array([1.0, 2.0, 0.0]), coef=0.1)),
                               [0.9, 0.8, 1.0], rtol=1e-6)
    for q in (0.2, 0.5, 1.0):
        got = np.asarray(pl.high_entropy_mask(H, mask, quantile=q))
        thr = np.quantile(H[mask > 0], 1 - q)
        np.testing.assert_array_equal(got, mask * (H >= thr))
        assert got.sum() >= np.floor(q * mask.sum())
    assert float(jnp.sum(pl.high_entropy_mask(H, np.zeros_like(mask), quantile=0.2))) == 0.0


def test_bf16_inputs():
    logp, old, a, mask = batch(10, scale=0.5)
    lb, ob = jnp.asarray(logp, jnp.bfloat16), jnp.asarray(old, jnp.bfloat16)
    got, _ = pl.clipped_surrogate(lb, ob, a)
    assert got.dtype == jnp.float32
    # exact w.r.t. the bf16-rounded inputs; within 5e-2 of the fp32 inputs' loss (bf16 has 8 bits)
    want_rounded = np_surrogate(np.asarray(lb, np.float32), np.asarray(ob, np.float32), a, 0.2, 0.28)
    np.testing.assert_allclose(np.asarray(got), want_rounded, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got), np_surrogate(logp, old, a, 0.2, 0.28), atol=5e-2)
