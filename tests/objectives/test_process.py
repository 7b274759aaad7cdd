"""Process supervision's advantage (docs/objectives.md#process-supervision) against hand-computed values and a plain-NumPy
reference: statistics over ALL step rewards of the group, padded / masked steps, zero-spread groups."""

import jax
import numpy as np
import pytest

from dapo_jax.objectives import compute_advantages, load_objective
from dapo_jax.objectives.advantages import grpo, to_tokens
from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.objectives.process import StepRewards, grpo_process, process_advantages


def np_process(rewards, ends, smask, mask, valid=None, eps=1e-6, unbiased=True):
    """Â[p,g,t] = Σ_{j: e ≥ t} r̃ with r̃ normalised over the real steps of every response of group p."""
    P, G, J = rewards.shape
    T = mask.shape[-1]
    valid = np.ones((P, G), bool) if valid is None else valid
    out = np.zeros((P, G, T))
    for p in range(P):
        real = [(g, j) for g in range(G) for j in range(J) if smask[p, g, j] > 0 and valid[p, g]]
        pool = np.array([rewards[p, g, j] for g, j in real], np.float64)
        if len(pool) < 2 or pool.max() == pool.min():
            continue
        std = pool.std(ddof=1 if unbiased else 0)
        for g, j in real:
            normed = (rewards[p, g, j] - pool.mean()) / (std + eps)
            for t in range(T):
                if ends[p, g, j] >= t and mask[p, g, t] > 0:
                    out[p, g, t] += normed
    return out


def test_hand_computed_group():
    # response 0: steps +1 (ends at token 1) and -1 (token 3), 5 tokens; response 1: one step +1 (token 2), 4 tokens
    rewards = np.array([[[1.0, -1.0], [1.0, 0.0]]], np.float32)
    ends = np.array([[[1, 3], [2, 0]]], np.int32)
    smask = np.array([[[1, 1], [1, 0]]], np.float32)
    mask = np.array([[[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]], np.float32)
    # the group's step rewards are {1, -1, 1}: mean 1/3, unbiased std sqrt(4/3)
    hi, lo = (1 - 1 / 3) / np.sqrt(4 / 3), (-1 - 1 / 3) / np.sqrt(4 / 3)  # 0.57735, -1.1547
    want = [[hi + lo, hi + lo, lo, lo, 0.0], [hi, hi, hi, 0.0, 0.0]]
    got = np.asarray(process_advantages(rewards, ends, smask, mask, eps=0.0))
    np.testing.assert_allclose(got[0], want, rtol=1e-6, atol=1e-7)
    # per-response statistics would differ: response 1 alone has no spread, response 0 alone has mean 0
    assert abs(got[0, 1, 0]) > 0.5
    # biased std: sqrt(8/9)
    got = np.asarray(process_advantages(rewards, ends, smask, mask, eps=0.0, unbiased=False))
    np.testing.assert_allclose(got[0, 1, 0], (2 / 3) / np.sqrt(8 / 9), rtol=1e-6)


def random_steps(seed, P=4, G=3, J=5, T=7):
    rng = np.random.default_rng(seed)
    rewards = rng.choice([-1.0, 1.0, 0.5], size=(P, G, J)).astype(np.float32)
    ends = rng.integers(-1, T + 2, size=(P, G, J)).astype(np.int32)  # some before 0, some past T - 1
    smask = (rng.random((P, G, J)) < 0.7).astype(np.float32)
    rewards[smask == 0] = 99.0  # padding slots hold garbage that must not count
    rewards[1] = 0.5  # a zero-spread group
    smask[2] = 0
    smask[2, 0, 0] = 1  # a group with a single real step: no spread
    lengths = rng.integers(0, T + 1, size=(P, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    return rewards, ends, smask, mask


@pytest.mark.parametrize("unbiased", [True, False])
def test_matches_numpy_with_padding_masked_steps_and_flat_groups(unbiased):
    rewards, ends, smask, mask = random_steps(0)
    valid = np.ones(rewards.shape[:2], bool)
    valid[3, 1] = False
    fn = jax.jit(lambda *a: process_advantages(*a, valid=valid, eps=1e-6, unbiased=unbiased))
    got = np.asarray(fn(rewards, ends, smask, mask))
    want = np_process(rewards, ends, smask, mask, valid=valid, unbiased=unbiased)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.all(got[1] == 0) and np.all(got[2] == 0)  # exactly zero, whatever eps
    assert np.all(got[3, 1] == 0) and np.all(got[mask == 0] == 0)
    assert np.any(got[0] != 0)


def test_outcome_rewards_are_one_step_at_the_end_which_is_grpo():
    rng = np.random.default_rng(1)
    rewards = rng.choice([0.0, 1.0], size=(4, 5)).astype(np.float32)
    rewards[0] = 1.0
    mask = (np.arange(6) < rng.integers(0, 7, size=(4, 5))[..., None]).astype(np.float32)
    got = np.asarray(grpo_process(rewards, mask=mask))
    np.testing.assert_allclose(got, np.asarray(to_tokens(grpo(rewards), mask)), rtol=1e-6, atol=1e-7)


def test_compute_advantages_routes_step_rewards_and_the_config_guards():
    rewards, ends, smask, mask = random_steps(2)
    cfg = load_objective("grpo_process")
    assert cfg.needs_step_rewards and cfg.needs_reference and not load_objective("grpo").needs_step_rewards
    steps = StepRewards(rewards, ends, smask)
    got = np.asarray(jax.jit(lambda s, m: compute_advantages(cfg, s, m))(steps, mask))
    np.testing.assert_allclose(got, np_process(rewards, ends, smask, mask), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="grpo_process"):
        compute_advantages(load_objective("grpo"), steps, mask)
    with pytest.raises(ValueError, match="overlong_buffer"):
        load_objective("grpo_process", overlong_buffer=4)
    with pytest.raises(ValueError, match="kl_in='loss'"):
        ObjectiveConfig(advantage="grpo_process", kl_beta=0.1, kl_in="reward")
    with pytest.raises(ValueError, match="mask"):
        grpo_process(steps)
