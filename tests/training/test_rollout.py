"""Dynamic sampling: fills the batch exactly, never keeps a zero-spread group, starves clearly, carries surplus."""

import numpy as np
import pytest

from dapo_jax.objectives.loss import dynamic_sampling_keep
from dapo_jax.objectives.registry import load_objective
from dapo_jax.training.rollout import Groups, StarvationError, collect_groups

G, S, T = 4, 3, 5


def make_groups(correct: np.ndarray, start: int = 0) -> Groups:
    """`correct [N, G]`; prompt_ids[:, 0] numbers the groups so tests can track them."""
    n = correct.shape[0]
    ids = np.zeros((n, S), np.int32)
    ids[:, 0] = np.arange(start, start + n)
    rewards = np.where(correct, 1.0, -1.0).astype(np.float32)
    return Groups(
        prompt_ids=ids, prompt_mask=np.ones((n, S), np.int32),
        response_ids=np.ones((n, G, T), np.int32), response_mask=np.ones((n, G, T), np.float32),
        old_logp=np.full((n, G, T), -1.0, np.float32), rewards=rewards, correct=correct.astype(bool),
        lengths=np.full((n, G), T, np.int32), truncated=np.zeros((n, G), bool),
        valid=np.ones(n, bool), age=np.zeros(n, np.int32),
    )


class Sampler:
    """Round i yields `per_round` groups; group j is mixed iff `mixed(j)` (else all-right / all-wrong alternately)."""

    def __init__(self, per_round, mixed):
        self.per_round, self.mixed, self.calls = per_round, mixed, 0

    def __call__(self, round_idx):
        start = self.calls * self.per_round
        self.calls += 1
        correct = np.zeros((self.per_round, G), bool)
        for i in range(self.per_round):
            j = start + i
            if self.mixed(j):
                correct[i, : 1 + j % (G - 1)] = True
            elif j % 2:
                correct[i] = True
        return make_groups(correct, start)


DAPO = load_objective("dapo")  # dynamic_sampling_metric: correct


def keep(groups):
    """The loop's keep function: the objective's DAPO filter 0 < #correct < G."""
    k, _ = dynamic_sampling_keep(DAPO, correct=groups.correct, rewards=groups.rewards)
    return np.asarray(k, bool)


def test_fills_exactly_and_never_keeps_zero_spread():
    sampler = Sampler(per_round=6, mixed=lambda j: j % 3 == 0)  # 2 of 6 mixed per round
    batch, stats, carry = collect_groups(sampler, keep, train_batch=5, max_gen_batches=10)
    assert len(batch) == 5 and batch.valid.all()
    assert sampler.calls == 3  # 2 + 2 + 2 kept >= 5
    spread = batch.correct.any(1) & ~batch.correct.all(1)
    assert spread.all(), "a zero-spread group was trained on"
    assert list(batch.prompt_ids[:, 0]) == [0, 3, 6, 9, 12]  # kept in generation order
    assert stats["gen_rounds"] == 3 and stats["kept_fraction"] == pytest.approx(6 / 18)
    assert stats["all_correct_fraction"] + stats["all_wrong_fraction"] == pytest.approx(12 / 18)
    assert stats["surplus"] == 1 and carry is None  # verl behaviour: the surplus is discarded


def test_starvation_fails_with_a_clear_message():
    always_right = Sampler(per_round=4, mixed=lambda j: False)
    always_right.mixed = lambda j: False
    with pytest.raises(StarvationError, match=r"kept 0 of the 4 .*max_gen_batches=3"):
        collect_groups(always_right, keep, train_batch=4, max_gen_batches=3)
    assert always_right.calls == 3


def test_train_on_kept_pads_with_mask_zero_groups():
    sampler = Sampler(per_round=4, mixed=lambda j: j == 1)
    batch, stats, _ = collect_groups(sampler, keep, train_batch=4, max_gen_batches=2, on_starvation="train_on_kept")
    assert len(batch) == 4 and list(batch.valid) == [True, False, False, False]
    assert np.all(batch.response_mask[1:] == 0) and np.all(batch.rewards[1:] == 0)
    assert np.all(batch.prompt_mask[1:, -1] == 1)  # the log-prob forward needs one real prompt token
    assert stats["trained_groups"] == 1


def test_carry_surplus_to_the_next_step():
    sampler = Sampler(per_round=6, mixed=lambda j: True)
    batch, _, carry = collect_groups(sampler, keep, train_batch=4, max_gen_batches=5, carry_surplus=True)
    assert len(carry) == 2 and list(carry.prompt_ids[:, 0]) == [4, 5]
    batch2, stats2, carry2 = collect_groups(sampler, keep, train_batch=4, max_gen_batches=5, carry=carry,
                                            carry_surplus=True)
    assert list(batch2.prompt_ids[:, 0]) == [4, 5, 6, 7]  # carried first, marked one step stale
    assert list(batch2.age) == [1, 1, 0, 0] and stats2["carried_in"] == 2
    assert len(carry2) == 4
    restored = Groups.from_state_dict(carry2.state_dict())
    np.testing.assert_array_equal(restored.prompt_ids, carry2.prompt_ids)


def test_without_dynamic_sampling_one_round_keeps_everything():
    sampler = Sampler(per_round=4, mixed=lambda j: False)
    batch, stats, _ = collect_groups(sampler, None, train_batch=4, max_gen_batches=10)
    assert sampler.calls == 1 and len(batch) == 4 and stats["kept_fraction"] == 1.0


def test_reward_spread_metric():
    g = make_groups(np.zeros((2, G), bool))
    g.rewards[0, 1] = 0.5
    by_reward = load_objective("dapo", dynamic_sampling_metric="reward")
    k, _ = dynamic_sampling_keep(by_reward, correct=g.correct, rewards=g.rewards)
    np.testing.assert_array_equal(np.asarray(k), [True, False])
    np.testing.assert_array_equal(keep(g), [False, False])


def test_round_stats_cover_every_generated_group_kept_or_not():
    """entropy_generated, zero_adv_fraction and the length spread are over all generated groups,
    computed here independently from the arrays."""
    rng = np.random.default_rng(0)
    correct = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0, 1, 1, 0]], bool)
    g = make_groups(correct)
    g.lengths[:] = rng.integers(1, T + 1, size=g.lengths.shape)
    live = np.arange(T) < g.lengths[..., None]
    g.entropy = np.where(live, rng.uniform(0.1, 2.0, size=live.shape), 0.0).astype(np.float32)
    g.rewards[2, 0] = -1.5  # an all-wrong group with reward spread (a soft overlong penalty): not zero-advantage
    batch, stats, _ = collect_groups(lambda i: g, keep, train_batch=2, max_gen_batches=1)
    assert list(batch.prompt_ids[:, 0]) == [0, 3]  # only the mixed groups are trained on ...
    assert stats["entropy_generated"] == pytest.approx(g.entropy[live].mean(), rel=1e-6)  # ... all are measured
    assert stats["zero_adv_fraction"] == pytest.approx(1 / 4)  # group 1 only
    assert stats["all_correct_fraction"] + stats["all_wrong_fraction"] == pytest.approx(2 / 4)
    assert stats["response_length_std"] == pytest.approx(np.std(g.lengths))
    np.testing.assert_array_equal(batch.entropy, g.entropy[[0, 3]])


def test_groups_without_entropy_default_to_zeros_and_old_carries_restore():
    g = make_groups(np.eye(2, G, dtype=bool))
    assert g.entropy.shape == g.old_logp.shape and not g.entropy.any()
    old = {k: v for k, v in g.state_dict().items() if k != "entropy"}  # a carry saved before the field
    restored = Groups.from_state_dict(old)
    assert restored.entropy.shape == (2, G, T) and len(restored.padding(3)) == 3


def test_a_stream_ends_the_rounds_when_it_has_no_more():
    """`max_gen_batches=None` (continuous batching): rounds until the stream returns None."""
    inner = Sampler(per_round=2, mixed=lambda j: j % 3 == 0)

    def stream(i):  # 3 chunks of 2 groups, then nothing (the prompt budget is spent)
        return inner(i) if inner.calls < 3 else None

    batch, stats, _ = collect_groups(stream, keep, train_batch=2, max_gen_batches=None)
    assert inner.calls == 2 and stats["gen_rounds"] == 2  # groups 0 and 3 kept: the stream stops there
    assert list(batch.prompt_ids[:, 0]) == [0, 3] and batch.valid.all()
    inner.calls = 0
    batch, stats, _ = collect_groups(stream, keep, train_batch=3, max_gen_batches=None, on_starvation="train_on_kept")
    assert inner.calls == 3 and stats["gen_rounds"] == 3 and list(batch.valid) == [True, True, False]
    inner.calls = 0
    with pytest.raises(StarvationError, match=r"kept 2 of the 3 .*after 3 generation rounds.*continuous"):
        collect_groups(stream, keep, train_batch=3, max_gen_batches=None)
    # without dynamic sampling a stream's chunks fill the batch (one chunk is smaller than it)
    inner.calls = 0
    batch, stats, _ = collect_groups(stream, None, train_batch=4, max_gen_batches=None)
    assert inner.calls == 2 and list(batch.prompt_ids[:, 0]) == [0, 1, 2, 3] and batch.valid.all()
