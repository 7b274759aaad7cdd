"""Process supervision's step fields of `Groups`: empty by default, kept through take / concat / padding,
and left out of the carried state when empty (a checkpoint cannot hold a zero-size array)."""

import numpy as np

from dapo_jax.training.rollout import Groups

N, G, S, T = 3, 2, 4, 5


def groups(**steps) -> Groups:
    return Groups(np.zeros((N, S), np.int32), np.ones((N, S), np.int32), np.zeros((N, G, T), np.int32),
                  np.ones((N, G, T), np.float32), np.zeros((N, G, T), np.float32), np.ones((N, G), np.float32),
                  np.ones((N, G), bool), np.full((N, G), T, np.int32), np.zeros((N, G), bool), np.ones(N, bool),
                  np.zeros(N, np.int32), **steps)


def test_no_steps_are_empty_and_stay_out_of_the_state():
    g = groups()
    assert g.step_rewards.shape == g.step_ends.shape == g.step_mask.shape == (N, G, 0)
    assert g.step_ends.dtype == np.int32
    state = g.state_dict()
    assert not any(k.startswith("step_") for k in state) and "rewards" in state
    back = Groups.from_state_dict(state)
    assert back.step_mask.shape == (N, G, 0)
    assert Groups.concat([g, g.padding(2)]).take(np.arange(4)).step_rewards.shape == (4, G, 0)


def test_steps_travel_with_their_groups():
    rng = np.random.default_rng(0)
    steps = {"step_rewards": rng.normal(size=(N, G, T)).astype(np.float32),
             "step_ends": rng.integers(0, T, (N, G, T)).astype(np.int32),
             "step_mask": (rng.random((N, G, T)) < 0.5).astype(np.float32)}
    g = groups(**steps)
    picked = Groups.concat([g, g.padding(1)]).take(np.array([2, 0, 3]))
    for name, value in steps.items():
        np.testing.assert_array_equal(getattr(picked, name)[:2], value[[2, 0]])
        assert not getattr(picked, name)[2].any()  # padding groups have no steps
        np.testing.assert_array_equal(getattr(Groups.from_state_dict(g.state_dict()), name), value)
