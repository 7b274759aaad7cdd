"""GAE, value targets, VAPO's length-adaptive λ and the clipped value loss against plain NumPy loops
(docs/objectives.md#critic-ppo-vapo)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.objectives import gae
from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.objectives.loss import compute_advantages


def np_gae(R, V, mask, gamma, lam, klp=None):
    """Reference: per response, the valid prefix of length L, V_L = 0, δ and Â by an explicit sum."""
    P, G, T = mask.shape
    lam = np.broadcast_to(np.asarray(lam, np.float64), (P, G))
    adv = np.zeros((P, G, T))
    for p in range(P):
        for g in range(G):
            L = int(mask[p, g].sum())
            r = [(-klp[p, g, t] if klp is not None else 0.0) + (R[p, g] if t == L - 1 else 0.0) for t in range(L)]
            v = [float(V[p, g, t]) for t in range(L)] + [0.0]
            delta = [r[t] + gamma * v[t + 1] - v[t] for t in range(L)]
            for t in range(L):
                adv[p, g, t] = sum((gamma * lam[p, g]) ** k * delta[t + k] for k in range(L - t))
    return adv


def np_whiten(x, m, eps=1e-6):
    vals = x[m > 0]
    return (x - vals.mean()) / (vals.std(ddof=1) + eps) * m


def batch(seed, P=3, G=4, T=7, min_len=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_len, T + 1, size=(P, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    V = rng.normal(size=(P, G, T)).astype(np.float32)
    V = np.where(mask > 0, V, 1e6).astype(np.float32)  # garbage on padding must never leak
    R = rng.choice([-1.0, 1.0], size=(P, G)).astype(np.float32)
    return R, V, mask, lengths


def test_hand_computed_case():
    # L = 3, γ = 1, λ = 0.5, V = (0.5, 0.2, -0.1), R = 1:
    # δ = (0.2 - 0.5, -0.1 - 0.2, 1 + 0.1) = (-0.3, -0.3, 1.1); Â_2 = 1.1, Â_1 = -0.3 + 0.55 = 0.25,
    # Â_0 = -0.3 + 0.125 = -0.175; one padding slot.
    mask = jnp.array([[[1.0, 1.0, 1.0, 0.0]]])
    V = jnp.array([[[0.5, 0.2, -0.1, 9.0]]])
    r = gae.token_rewards(jnp.array([[1.0]]), mask)
    chex.assert_trees_all_close(r, jnp.array([[[0.0, 0.0, 1.0, 0.0]]]))
    adv = gae.gae(r, V, mask, gamma=1.0, lam=0.5)
    chex.assert_trees_all_close(adv, jnp.array([[[-0.175, 0.25, 1.1, 0.0]]]), atol=1e-6)
    targets = gae.value_targets(r, V, mask, gamma=1.0, lam=0.5)
    chex.assert_trees_all_close(targets, jnp.array([[[0.325, 0.45, 1.0, 0.0]]]), atol=1e-6)


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (1.0, 0.0), (0.99, 1.0)])
def test_gae_matches_numpy_with_varying_lengths_and_kl(gamma, lam):
    R, V, mask, _ = batch(1)
    klp = np.random.default_rng(2).normal(size=mask.shape).astype(np.float32) * 0.1
    r = gae.token_rewards(R, mask, kl_penalty=klp)
    got = gae.gae(r, V, mask, gamma=gamma, lam=lam)
    chex.assert_shape(got, mask.shape)
    np.testing.assert_allclose(np.asarray(got), np_gae(R, V, mask, gamma, lam, klp), rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(got)[mask == 0] == 0.0)


def test_lambda_one_targets_are_monte_carlo_returns():
    R, V, mask, _ = batch(3, min_len=1)
    klp = np.random.default_rng(4).normal(size=mask.shape).astype(np.float32) * 0.1
    gamma = 0.9
    r = np.asarray(gae.token_rewards(R, mask, kl_penalty=klp))
    got = np.asarray(gae.value_targets(r, V, mask, gamma=gamma, lam=1.0))
    want = np.zeros_like(got)
    P, G, T = mask.shape
    for p in range(P):
        for g in range(G):
            for t in range(int(mask[p, g].sum())):
                want[p, g, t] = sum(gamma ** (k - t) * r[p, g, k] for k in range(t, int(mask[p, g].sum())))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # γ = 1 and no KL: every token's target is the outcome reward itself, whatever V is
    r1 = gae.token_rewards(R, mask)
    t1 = np.asarray(gae.value_targets(r1, V, mask, gamma=1.0, lam=1.0))
    np.testing.assert_allclose(t1, R[..., None] * mask, atol=1e-5)


def test_adaptive_lambda_matches_numpy_and_clamps():
    lengths = np.array([[0, 1, 10, 20], [40, 100, 1000, 5]])
    got = np.asarray(gae.adaptive_lambda(lengths, 0.05))
    want = np.clip(1 - 1 / (0.05 * np.maximum(lengths, 1e-9)), 0, 1)
    want[lengths == 0] = 0.0
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert got[0, 2] == 0.0 and got[0, 3] == 0.0 and abs(got[1, 0] - 0.5) < 1e-6


def test_length_adaptive_gae_uses_each_responses_lambda():
    R, V, mask, lengths = batch(5, T=30, min_len=15)
    alpha = 0.1
    lam = np.clip(1 - 1 / (alpha * lengths), 0, 1)
    assert len(np.unique(lam)) > 2  # the lengths differ, so do the λs
    got = gae.gae_advantages(R, mask=mask, values=V, gamma=1.0, lam=0.95, lam_alpha=alpha, whiten_advantages=False)
    np.testing.assert_allclose(np.asarray(got), np_gae(R, V, mask, 1.0, lam), rtol=1e-4, atol=1e-4)


def test_whitening_and_invalid_responses():
    R, V, mask, _ = batch(6, min_len=1)
    valid = np.ones(R.shape, np.float32)
    valid[1, 2] = 0
    got = np.asarray(gae.gae_advantages(R, mask=mask, valid=valid, values=V, gamma=1.0, lam=0.9, eps=1e-6))
    m = mask * valid[..., None]
    want = np_whiten(np_gae(R, V, m, 1.0, 0.9), m)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.all(got[1, 2] == 0.0)
    vals = got[m > 0]
    assert abs(vals.mean()) < 1e-5 and abs(vals.std(ddof=1) - 1) < 1e-4


def test_compute_advantages_without_values_says_what_is_missing():
    cfg = ObjectiveConfig(advantage="gae")
    with pytest.raises(ValueError, match="critic"):
        compute_advantages(cfg, jnp.ones((2, 2)), jnp.ones((2, 2, 3)))


def test_advantages_and_targets_decouple_lambdas():
    R, V, mask, lengths = batch(7, min_len=1)
    cfg = ObjectiveConfig(advantage="gae", gamma=1.0, gae_lambda=0.3, critic_lambda=1.0, whiten_advantages=False)
    adv, targets = gae.advantages_and_targets(cfg, R, mask, V)
    np.testing.assert_allclose(np.asarray(adv), np_gae(R, V, mask, 1.0, 0.3), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(targets), R[..., None] * mask, atol=1e-5)
    vapo = cfg.model_copy(update={"lambda_alpha": 0.5})
    adv2, _ = gae.advantages_and_targets(vapo, R, mask, V)
    lam = np.clip(1 - 1 / (0.5 * lengths), 0, 1)
    np.testing.assert_allclose(np.asarray(adv2), np_gae(R, V, mask, 1.0, lam), rtol=1e-5, atol=1e-5)


def np_value_loss(V, old, G, m, eps):
    unclipped = (V - G) ** 2
    clipped = (np.clip(V, old - eps, old + eps) - G) ** 2
    loss = 0.5 * np.maximum(unclipped, clipped)
    # d/dV: the larger branch's derivative; the clipped branch has none outside [old - eps, old + eps]
    inside = (V >= old - eps) & (V <= old + eps)
    grad = np.where(unclipped >= clipped, V - G, (np.clip(V, old - eps, old + eps) - G) * inside)
    return (loss * m).sum(), m.sum(), grad * m


def value_case(seed):
    rng = np.random.default_rng(seed)
    _, _, mask, _ = batch(seed)
    V = rng.normal(size=mask.shape).astype(np.float32)
    old = (V + rng.normal(size=mask.shape) * 0.8).astype(np.float32)  # some beyond ε_v = 0.5
    G = rng.normal(size=mask.shape).astype(np.float32)
    return V, old, G, mask


def test_value_loss_value_and_gradient_match_numpy():
    V, old, G, mask = value_case(8)
    s, d, metrics = gae.value_loss(V, old, G, mask, clip_eps=0.5)
    ws, wd, wgrad = np_value_loss(V, old, G, mask, 0.5)
    np.testing.assert_allclose(float(s), ws, rtol=1e-5)
    assert float(d) == wd
    grad = jax.grad(lambda v: gae.value_loss(v, old, G, mask, clip_eps=0.5)[0])(jnp.asarray(V))
    np.testing.assert_allclose(np.asarray(grad), wgrad, rtol=1e-5, atol=1e-6)
    frac = float(metrics["value_clip_frac"][0] / metrics["value_clip_frac"][1])
    assert 0.0 < frac < 1.0  # both branches are exercised
    # returns and old values are constants
    g_ret = jax.grad(lambda g: gae.value_loss(V, old, g, mask)[0])(jnp.asarray(G))
    assert np.all(np.asarray(g_ret) == 0.0)


def test_value_loss_unclipped_and_padding():
    V, old, G, mask = value_case(9)
    V = np.where(mask > 0, V, np.nan).astype(np.float32)  # NaN on padding never leaks
    s, d, _ = gae.value_loss(V, old, G, mask, clip_eps=None)
    np.testing.assert_allclose(float(s), (0.5 * np.nan_to_num(V - G) ** 2 * mask).sum(), rtol=1e-5)
    assert np.isfinite(float(s))


def test_value_loss_pairs_add_up_over_splits():
    V, old, G, mask = value_case(10)
    s, d, _ = gae.value_loss(V, old, G, mask)
    parts = [gae.value_loss(V[i:i + 1], old[i:i + 1], G[i:i + 1], mask[i:i + 1]) for i in range(V.shape[0])]
    np.testing.assert_allclose(sum(float(p[0]) for p in parts) / sum(float(p[1]) for p in parts), float(s / d),
                               rtol=1e-6)


def np_gae_skipping(R, V, mask, gamma, lam, klp=None):
    """Reference for a mask with holes (an episode): per row, keep only the masked positions (the model's
    ids), run GAE on that compressed sequence in float64 by explicit sums, and scatter back (0 elsewhere)."""
    P, G, T = mask.shape
    adv = np.zeros((P, G, T))
    for p in range(P):
        for g in range(G):
            keep = np.flatnonzero(mask[p, g] > 0)
            L = len(keep)
            r = [(-float(klp[p, g, t]) if klp is not None else 0.0) for t in keep]
            if L:
                r[-1] += float(R[p, g])  # the outcome at the episode's last model token
            v = [float(V[p, g, t]) for t in keep] + [0.0]
            delta = [r[i] + gamma * v[i + 1] - v[i] for i in range(L)]
            for i, t in enumerate(keep):
                adv[p, g, t] = sum((gamma * lam) ** k * delta[i + k] for k in range(L - i))
    return adv


def test_gae_over_an_episode_skips_its_tool_and_template_ids():
    """A hand-built episode: model turn (3 ids), tool/template ids (2), model turn (2 ids), padding. GAE with
    the holes equals GAE over the sequence with them removed; the holes get 0 and their values never leak."""
    mask = np.array([[[1, 1, 1, 0, 0, 1, 1, 0, 0]]], np.float32)
    V = np.array([[[0.5, 0.2, -0.1, 1e6, -1e6, 0.3, 0.4, 1e6, 1e6]]], np.float32)
    R = np.array([[1.0]], np.float32)
    r = gae.token_rewards(R, mask)
    np.testing.assert_array_equal(np.asarray(r), [[[0, 0, 0, 0, 0, 0, 1, 0, 0]]])  # at the last model id
    # hand-computed: compressed V = (0.5, 0.2, -0.1, 0.3, 0.4), γ = 1, λ = 0.5;
    # δ = (-0.3, -0.3, 0.4, 0.1, 0.6); Â_4 = 0.6, Â_3 = 0.4, Â_2 = 0.6, Â_1 = 0.0, Â_0 = -0.3
    adv = np.asarray(gae.gae(r, V, mask, gamma=1.0, lam=0.5))
    np.testing.assert_allclose(adv, [[[-0.3, 0.0, 0.6, 0, 0, 0.4, 0.6, 0, 0]]], atol=1e-6)


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (0.99, 1.0)])
def test_gae_with_holes_matches_gae_over_the_compressed_sequence(gamma, lam):
    rng = np.random.default_rng(7)
    P, G, T = 3, 4, 12
    mask = (rng.random((P, G, T)) < 0.6).astype(np.float32)
    mask[0, 0] = 0  # an empty row
    mask[1, 1, :5] = 1  # a contiguous prefix: the single-turn case
    mask[1, 1, 5:] = 0
    V = np.where(mask > 0, rng.normal(size=(P, G, T)), 1e6).astype(np.float32)
    R = rng.choice([-1.0, 1.0], size=(P, G)).astype(np.float32)
    klp = rng.normal(size=(P, G, T)).astype(np.float32) * 0.1
    r = gae.token_rewards(R, mask, kl_penalty=klp)
    got = np.asarray(gae.gae(r, V, mask, gamma=gamma, lam=lam))
    np.testing.assert_allclose(got, np_gae_skipping(R, V, mask, gamma, lam, klp), rtol=1e-5, atol=1e-5)
    assert np.all(got[mask == 0] == 0.0)
    targets = np.asarray(gae.value_targets(r, V, mask, gamma=gamma, lam=lam))
    np.testing.assert_allclose(targets, (np_gae_skipping(R, V, mask, gamma, lam, klp) + V) * mask, rtol=1e-5,
                               atol=1e-5)
