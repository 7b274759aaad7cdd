"""Per-source rollout metrics and Dr. GRPO's length-inflation signal, against hand-computed values."""

import math

import numpy as np

from dapo_jax.training.rollout import Groups, collect_groups
from dapo_jax.training.source_metrics import length_by_outcome, source_stats, watch_rounds


def scored(source, correct, lengths, rewards):
    correct = np.asarray(correct, bool)
    n, g = correct.shape
    z = np.zeros((n, 1), np.int32)
    return Groups(z, z + 1, np.zeros((n, g, 1), np.int32), np.ones((n, g, 1), np.float32),
                  np.zeros((n, g, 1), np.float32), np.asarray(rewards, np.float32), correct,
                  np.asarray(lengths, np.int32), np.zeros((n, g), bool), np.ones(n, bool), np.zeros(n, np.int32),
                  source=np.asarray(source, np.int32))


def test_length_by_outcome_hand_computed_and_nan_when_empty():
    got = length_by_outcome(np.array([[3, 5], [10, 2]]), np.array([[True, False], [False, True]]))
    assert got == {"response_length_right_mean": 2.5, "response_length_wrong_mean": 7.5}
    none_right = length_by_outcome(np.array([[4, 6]]), np.zeros((1, 2), bool))
    assert math.isnan(none_right["response_length_right_mean"]) and none_right["response_length_wrong_mean"] == 5.0


def test_round_stats_carry_the_length_signal():
    g = scored([0, 0], [[True, False], [False, False]], [[2, 8], [4, 6]], [[1, 0], [0, 0]])
    _, stats, _ = collect_groups(lambda i: g, None, train_batch=2, max_gen_batches=1)
    assert stats["response_length_right_mean"] == 2.0 and stats["response_length_wrong_mean"] == 6.0


def test_source_stats_over_the_rounds_seen_with_their_keep_masks():
    r1 = scored([0, 1, 1], [[True, True], [True, False], [False, False]], [[2, 4], [6, 10], [8, 8]],
                [[1, 1], [1, -1], [-1, -1]])
    r2 = scored([0, 1], [[False, True], [True, True]], [[12, 2], [3, 5]], [[-1, 1], [1, 1]])
    rounds = iter([r1, r2])
    keep = lambda g: g.rewards.max(axis=1) > g.rewards.min(axis=1)  # noqa: E731  (dynamic sampling on reward)
    sample, keep_seen, seen = watch_rounds(lambda i: next(rounds), keep)
    collect_groups(sample, keep_seen, train_batch=2, max_gen_batches=2)
    got = source_stats(seen, ["math", "code"])
    # math: groups r1[0] (right, right; dropped: no spread) and r2[0] (wrong 12, right 2; kept)
    assert got["source/math/generated_groups"] == 2
    assert got["source/math/accuracy"] == 3 / 4
    assert got["source/math/reward_mean"] == (1 + 1 - 1 + 1) / 4
    assert got["source/math/kept_fraction"] == 1 / 2
    assert got["source/math/response_length_right_mean"] == (2 + 4 + 2) / 3
    assert got["source/math/response_length_wrong_mean"] == 12
    # code: r1[1] (right 6, wrong 10; kept), r1[2] (wrong 8, 8; dropped), r2[1] (right 3, 5; dropped)
    assert got["source/code/generated_groups"] == 3
    assert got["source/code/accuracy"] == 3 / 6
    assert got["source/code/kept_fraction"] == 1 / 3
    assert got["source/code/response_length_right_mean"] == (6 + 3 + 5) / 3
    assert got["source/code/response_length_wrong_mean"] == (10 + 8 + 8) / 3
    assert source_stats(seen, ["math", "code", "unused"]).keys() == got.keys()  # no prompt: no entries


def test_without_dynamic_sampling_every_group_counts_as_kept():
    g = scored([0, 1], [[True, False], [False, False]], [[1, 1], [1, 1]], [[1, 0], [0, 0]])
    sample, keep, seen = watch_rounds(lambda i: g, None)
    assert keep is None
    collect_groups(sample, keep, train_batch=2, max_gen_batches=1)
    got = source_stats(seen, ["a", "b"])
    assert got["source/a/kept_fraction"] == got["source/b/kept_fraction"] == 1.0
    assert source_stats([], ["a"]) == {}
