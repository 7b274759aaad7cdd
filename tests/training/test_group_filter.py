"""GFPO's host side: per-round selection with adaptive k from streaming quartiles, its resumable state,
the gfpo/* metrics, the `Groups.selected` field and the k <= G config check."""

import json

import numpy as np
import pytest

from dapo_jax.objectives import ObjectiveConfig
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import load_config
from dapo_jax.training.group_filter import GroupFilter, selection_stats
from dapo_jax.training.rollout import Groups

G = 8
KS = (8, 6, 4, 2)


def ref_select(rewards, lengths, k):
    """Shortest k per row, ties to the lower index."""
    out = np.zeros(rewards.shape, bool)
    for p in range(rewards.shape[0]):
        out[p, sorted(range(G), key=lambda g: (lengths[p, g], g))[: k[p]]] = True
    return out


def rounds(seed, n=4, N=6):
    rng = np.random.default_rng(seed)
    return [(rng.choice([-1.0, 1.0], size=(N, G)).astype(np.float32), rng.integers(1, 9, size=(N, G)))
            for _ in range(n)]


def test_adaptive_selection_follows_a_numpy_window_and_resumes_exactly():
    cfg = ObjectiveConfig(gfpo_adaptive=KS, gfpo_window=10)
    f = GroupFilter(cfg, group_size=G)
    window = []
    data = rounds(0)
    for i, (r, n) in enumerate(data):
        if i == 2:  # resume half way from a JSON round trip of the state
            state = json.loads(json.dumps(f.state_dict()))
            assert len(state["recent"]) == 10
            f = GroupFilter(cfg, group_size=G)
            f.load_state_dict(state)
        window = (window + list(r.mean(axis=1)))[-10:]  # this round's prompts first enter the window
        q = np.quantile(np.asarray(window, np.float64), [0.25, 0.5, 0.75]).astype(np.float32)
        k = np.array([KS[int(np.sum(m > q))] for m in r.mean(axis=1).astype(np.float32)])
        np.testing.assert_array_equal(f.select(r, n), ref_select(r, n, k))
        np.testing.assert_array_equal(f.thresholds(), q)
    assert len(f.state_dict()["recent"]) == 10


def test_fixed_k_keeps_no_state_and_rejects_bad_shapes():
    f = GroupFilter(ObjectiveConfig(gfpo_keep=3), group_size=G)
    r, n = rounds(1, n=1)[0]
    np.testing.assert_array_equal(f.select(r, n), ref_select(r, n, [3] * len(r)))
    assert f.state_dict() == {"recent": []}
    with pytest.raises(ValueError, match="G=8"):
        f.select(r[:, :4], n[:, :4])
    with pytest.raises(ValueError, match="rollout.G"):
        GroupFilter(ObjectiveConfig(gfpo_adaptive=(10, 6, 4, 4)), group_size=G)
    with pytest.raises(ValueError, match="gfpo_keep or gfpo_adaptive"):
        GroupFilter(ObjectiveConfig(), group_size=G)


def test_run_config_checks_k_against_G():
    with pytest.raises(ConfigError, match="gfpo_keep"):
        load_config(None, ["objective.name=gfpo", "objective.overlong_buffer=2", "rollout.G=4",
                           "objective.gfpo_keep=6"])
    cfg = load_config(None, ["objective.name=gfpo", "objective.overlong_buffer=2", "rollout.G=8"])
    assert cfg.objective_config.gfpo_keep == 4


def groups(selected=None, valid=(True, True, False)):
    N, T = len(valid), 5
    lengths = np.array([[1, 2, 3, 4], [5, 5, 1, 1], [0, 0, 0, 0]])[:N]
    zeros = np.zeros((N, 4, T), np.float32)
    return Groups(np.zeros((N, 2), np.int32), np.ones((N, 2), np.int32), zeros.astype(np.int32), zeros, zeros,
                  np.array([[1, -1, 1, -1], [1, 1, -1, -1], [0, 0, 0, 0]], np.float32)[:N],
                  np.array([[1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], bool)[:N], lengths,
                  np.zeros((N, 4), bool), np.array(valid), np.zeros(N, np.int32), selected=selected)


def test_selection_stats_and_groups_field():
    sel = np.array([[1, 1, 0, 0], [0, 0, 1, 1], [1, 1, 1, 1]], bool)
    stats = selection_stats(groups(sel))
    assert stats["gfpo/kept_length_mean"] == pytest.approx(np.mean([1, 2, 1, 1]))
    assert stats["gfpo/generated_length_mean"] == pytest.approx(np.mean([1, 2, 3, 4, 5, 5, 1, 1]))
    assert stats["gfpo/kept_accuracy"] == 0.25 and stats["gfpo/generated_accuracy"] == 0.5
    assert stats["gfpo/kept_reward_mean"] == -0.5 and stats["gfpo/kept_per_group"] == 2.0
    assert selection_stats(groups(sel, valid=(False, False, False))) == {}
    f = GroupFilter(ObjectiveConfig(gfpo_adaptive=(4, 4, 2, 2)), group_size=4)
    f.observe(np.array([-1.0, 0.0, 1.0]))
    assert [selection_stats(groups(sel), f)[f"gfpo/difficulty_q{i}"] for i in (1, 2, 3)] == [-0.5, 0.0, 0.5]
    # without GFPO every response is selected, also in a carry saved before the field existed
    g = groups()
    assert g.selected.all() and g.selected.shape == (3, 4)
    state = g.state_dict()
    del state["selected"]
    assert Groups.from_state_dict(state).selected.all()
    assert not g.padding(2).selected.any()
    np.testing.assert_array_equal(Groups.concat([groups(sel), g]).take([0, 3]).selected, [sel[0], [1, 1, 1, 1]])
