"""DAPO's per-group keep mask and counts (docs/objectives.md#dynamic-sampling)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.objectives.dynamic_sampling import keep_groups


def test_correct_counts_match_numpy():
    rng = np.random.default_rng(0)
    correct = rng.random((40, 4)) < 0.5
    correct[0] = True
    correct[1] = False
    keep, counts = jax.jit(keep_groups, static_argnames="kind")(jnp.asarray(correct), kind="correct")
    c = correct.sum(1)
    np.testing.assert_array_equal(np.asarray(keep), (c > 0) & (c < 4))
    assert int(counts["kept"]) == int(((c > 0) & (c < 4)).sum())
    assert int(counts["all_correct"]) == int((c == 4).sum())
    assert int(counts["all_wrong"]) == int((c == 0).sum())
    assert int(counts["kept"]) + int(counts["all_correct"]) + int(counts["all_wrong"]) == 40
    assert int(counts["groups"]) == 40


def test_reward_spread_and_valid():
    r = jnp.array([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0], [1.0, -1.0, 1.0], [0.5, 0.5, 0.7]])
    keep, counts = keep_groups(r, kind="reward")
    np.testing.assert_array_equal(np.asarray(keep), [False, False, True, True])
    assert int(counts["all_correct"]) == 1 and int(counts["all_wrong"]) == 1 and int(counts["zero_spread"]) == 2
    # the odd response out is invalid: the group has no spread left
    keep_v, _ = keep_groups(r, kind="reward", valid=jnp.array([[1, 1, 1], [1, 1, 1], [1, 0, 1], [1, 1, 0]]))
    np.testing.assert_array_equal(np.asarray(keep_v), [False, False, False, False])


def test_g2_and_bad_input():
    keep, _ = keep_groups(jnp.array([[1, 0], [1, 1]]), kind="correct")
    np.testing.assert_array_equal(np.asarray(keep), [True, False])
    with pytest.raises(ValueError, match="dynamic_sampling_metric"):
        keep_groups(jnp.zeros((2, 2)), kind="bogus")
    with pytest.raises(ValueError, match=r"\[P, G\]"):
        keep_groups(jnp.zeros((2, 2, 2)))
