"""Process supervision's discount γ (`process_advantages(discount=...)`, docs/objectives.md#process-supervision):
the discounted return of the normalised step rewards against a hand-built case and a float64 NumPy reference
(masked and padded steps, steps ending at the same token, invalid responses), γ = 1 bit for bit the plain sum,
and the gradient through it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.objectives import compute_advantages, load_objective
from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.objectives.process import StepRewards, process_advantages


def np_discounted(rewards, ends, smask, mask, gamma, valid=None, eps=1e-6, unbiased=True):
    """Â[p,g,t] = Σ_{k: e_k ≥ t} γ^(idx_k − j(t)) r̃_k in float64, where a step's index idx_k is the number of
    distinct token positions at which real steps of the response end before e_k, and j(t) the number before t
    (ends clipped to T − 1; masked, padded and negative-end steps are not steps)."""
    P, G, J = rewards.shape
    T = mask.shape[-1]
    valid = np.ones((P, G), bool) if valid is None else valid
    out = np.zeros((P, G, T))
    for p in range(P):
        real = [(g, j) for g in range(G) for j in range(J) if smask[p, g, j] > 0 and valid[p, g]]
        pool = np.array([rewards[p, g, j] for g, j in real], np.float64)
        if len(pool) < 2 or pool.max() == pool.min():
            continue
        mean, std = pool.mean(), pool.std(ddof=1 if unbiased else 0)
        for g in range(G):
            steps = [(min(int(ends[p, g, j]), T - 1), (rewards[p, g, j] - mean) / (std + eps))
                     for gg, j in real if gg == g and ends[p, g, j] >= 0]
            positions = sorted({e for e, _ in steps})
            for t in range(T):
                if mask[p, g, t] <= 0:
                    continue
                j_t = sum(1 for e in positions if e < t)
                for e, normed in steps:
                    if e >= t:
                        out[p, g, t] += gamma ** (sum(1 for u in positions if u < e) - j_t) * normed
    return out


def random_steps(seed, P=4, G=3, J=4, T=9):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(P, G, J)).astype(np.float32)
    rewards[1] = 0.5  # a flat group: 0 everywhere
    ends = rng.integers(-1, T + 2, size=(P, G, J)).astype(np.int32)  # negative and past-the-end ends too
    ends[0, 0, :2] = 4  # two steps ending at the same token
    smask = (rng.random((P, G, J)) < 0.75).astype(np.float32)
    smask[0, 0, :2] = 1
    lengths = rng.integers(1, T + 1, size=(P, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    return rewards, ends, smask, mask


def test_hand_built_turns_with_a_tie_and_a_padded_step():
    # response 0: three turns ending at tokens 1, 3, 4 (rewards 1, 0, 2); response 1: two steps ending at token 2
    # (rewards 0, 1: one turn) and a padding slot. Pool {1, 0, 2, 0, 1}: mean 0.8, unbiased std sqrt(0.7).
    rewards = np.array([[[1.0, 0.0, 2.0], [0.0, 1.0, 9.0]]], np.float32)
    ends = np.array([[[1, 3, 4], [2, 2, 0]]], np.int32)
    smask = np.array([[[1, 1, 1], [1, 1, 0]]], np.float32)
    mask = np.array([[[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]], np.float32)
    gamma, std = 0.5, np.sqrt(0.7) + 1e-6
    n = (rewards - 0.8) / std
    want0 = [n[0, 0, 0] + gamma * n[0, 0, 1] + gamma ** 2 * n[0, 0, 2]] * 2 + \
            [n[0, 0, 1] + gamma * n[0, 0, 2]] * 2 + [n[0, 0, 2], 0.0]
    want1 = [n[0, 1, 0] + n[0, 1, 1]] * 3 + [0.0] * 3  # a tie is one step: no γ between them
    got = np.asarray(process_advantages(rewards, ends, smask, mask, discount=gamma))
    np.testing.assert_allclose(got[0], [want0, want1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, np_discounted(rewards, ends, smask, mask, gamma), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("gamma, unbiased", [(0.9, True), (0.3, False), (1.0, True)])
def test_matches_numpy_with_masked_padded_tied_and_invalid_steps(gamma, unbiased):
    rewards, ends, smask, mask = random_steps(0)
    valid = np.ones(rewards.shape[:2], bool)
    valid[3, 1] = False
    fn = jax.jit(lambda *a: process_advantages(*a, valid=valid, unbiased=unbiased, discount=gamma))
    got = np.asarray(fn(rewards, ends, smask, mask))
    want = np_discounted(rewards, ends, smask, mask, gamma, valid=valid, unbiased=unbiased)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.all(got[1] == 0) and np.all(got[3, 1] == 0) and np.all(got[mask == 0] == 0)
    assert np.any(got[0] != 0)


def test_gamma_one_is_the_plain_sum_bit_for_bit_and_gamma_below_changes_it():
    rewards, ends, smask, mask = random_steps(1)
    plain = np.asarray(process_advantages(rewards, ends, smask, mask))
    np.testing.assert_array_equal(np.asarray(process_advantages(rewards, ends, smask, mask, discount=1.0)), plain)
    assert not np.allclose(np.asarray(process_advantages(rewards, ends, smask, mask, discount=0.5)), plain)
    with pytest.raises(ValueError, match="discount"):
        process_advantages(rewards, ends, smask, mask, discount=0.0)


def test_the_objective_config_carries_the_discount_to_compute_advantages():
    rewards, ends, smask, mask = random_steps(2)
    steps = StepRewards(rewards, ends, smask)
    cfg = load_objective("grpo_process", process_discount=0.7)
    got = np.asarray(jax.jit(lambda s, m: compute_advantages(cfg, s, m))(steps, mask))
    np.testing.assert_allclose(got, np_discounted(rewards, ends, smask, mask, 0.7), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(compute_advantages(load_objective("grpo_process"), steps, mask)),
                                  np.asarray(process_advantages(rewards, ends, smask, mask)))
    with pytest.raises(ValueError, match="process_discount=0.7.*grpo_process"):
        ObjectiveConfig(advantage="grpo", process_discount=0.7)
    with pytest.raises(ValueError):
        ObjectiveConfig(advantage="grpo_process", process_discount=1.5)


def test_gradient_through_the_discounted_advantage_keeps_its_structure():
    # Â is linear in r̃: d Σ_t w_t Â_t / d r̃_k = Σ_{t ≤ e_k} w_t γ^(idx_k − j(t)). Checked against the float64
    # reference's central differences; masked steps get exactly 0, as with γ = 1. (A flat group's std is 0, where
    # the gradient of the std is not finite, for any γ: the loss takes advantages as constants.)
    rewards, ends, smask, mask = (x[[0, 2]] for x in random_steps(3, P=3, G=3, J=3, T=7))
    w = np.random.default_rng(4).normal(size=mask.shape)
    for gamma in (1.0, 0.6):
        grad = np.asarray(jax.grad(lambda r: jnp.sum(process_advantages(r, ends, smask, mask, discount=gamma) * w))(
            jnp.asarray(rewards)))
        assert grad.shape == rewards.shape and np.all(np.isfinite(grad)) and np.all(grad[smask == 0] == 0)
        h, num = 1e-4, np.zeros(rewards.shape)
        for idx in np.ndindex(*rewards.shape):
            up, down = rewards.astype(np.float64), rewards.astype(np.float64)
            up[idx] += h
            down[idx] -= h
            num[idx] = np.sum((np_discounted(up, ends, smask, mask, gamma)
                               - np_discounted(down, ends, smask, mask, gamma)) * w) / (2 * h)
        np.testing.assert_allclose(grad, num, rtol=2e-3, atol=2e-3)
