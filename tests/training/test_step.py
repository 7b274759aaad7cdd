"""`rl_step`: sample until the batch is full, advantages, update; a step that kept nothing trains on nothing;
with overlap the next step's rollout is submitted with this step's params before the update."""

import dataclasses

import numpy as np
import pytest

from dapo_jax.training.state.run_state import RunState
from dapo_jax.training.step import StepResult, rl_step
from tests.training.test_rollout import make_groups


class Rollouts:
    """A Prefetcher's interface: `take` hands out the groups it was given and records what it was asked."""

    def __init__(self, groups, stats):
        self.groups, self.stats, self.calls = groups, stats, []

    def take(self, step, params, carry):
        self.calls.append(("take", step, params, carry))
        return self.groups, dict(self.stats), "surplus"

    def submit(self, step, params, carry):
        self.calls.append(("submit", step, params, carry))


class Learner:
    def __init__(self):
        self.calls = []

    def advantages(self, params, groups, critic_state):
        self.calls.append(("advantages", params, len(groups), critic_state))
        return Batch(advantages=np.ones(groups.response_mask.shape) * groups.valid[:, None, None]), "critic batch"

    def update(self, state, critic_state, batch, critic_batch):
        self.calls.append(("update", state, critic_batch))
        return State(state.params + 1), "critic'", {"entropy": 0.5}


@dataclasses.dataclass
class Batch:
    advantages: np.ndarray


@dataclasses.dataclass
class State:
    params: int


def run_state(**kw):
    return RunState(step=4, rng=np.zeros(2, np.uint32), carry="carried", critic="critic", samples=10.0, **kw)


def test_a_step_samples_then_computes_advantages_then_updates():
    correct = np.array([[True, False, True, False], [True, True, False, False]])
    rollouts, learner = Rollouts(make_groups(correct), {"generated_groups": 3.0}), Learner()
    state, run, out = rl_step(5, State(0), run_state(), rollouts=rollouts, learner=learner, group_size=4,
                              prefetch_next=False)
    assert rollouts.calls == [("take", 5, 0, "carried")]  # the previous step's surplus comes in
    assert learner.calls == [("advantages", 0, 2, "critic"), ("update", State(0), "critic batch")]
    assert state == State(1) and isinstance(out, StepResult) and not out.skipped
    assert (run.step, run.carry, run.critic, run.samples, run.steps_skipped) == (5, "surplus", "critic'", 22.0, 0)
    assert out.metrics == {"entropy": 0.5} and out.advantages.shape == (2, 4, 5)
    assert out.rollout_s >= 0 and out.update_s >= 0


def test_nothing_kept_skips_the_update_and_counts_the_step():
    groups = make_groups(np.zeros((2, 4), bool))
    groups.valid[:] = False  # padding only: dynamic sampling kept no group (on_starvation: train_on_kept)
    rollouts, learner = Rollouts(groups, {"generated_groups": 6.0}), Learner()
    state, run, out = rl_step(5, State(0), run_state(steps_skipped=2), rollouts=rollouts, learner=learner,
                              group_size=4, prefetch_next=False)
    assert learner.calls == [] and state == State(0)
    assert out.skipped and out.advantages is None and out.metrics == {}
    assert (run.step, run.steps_skipped, run.samples, run.critic) == (5, 3, 34.0, "critic")


def test_overlap_submits_the_next_rollout_with_these_params_before_the_update():
    correct = np.array([[True, False, True, False]])
    rollouts, learner = Rollouts(make_groups(correct), {}), Learner()
    rl_step(5, State(7), run_state(), rollouts=rollouts, learner=learner, group_size=4, prefetch_next=True)
    assert rollouts.calls == [("take", 5, 7, "carried"), ("submit", 6, 7, "surplus")]
    assert [c[0] for c in learner.calls] == ["advantages", "update"]


def test_the_run_state_is_not_mutated():
    before = run_state()
    rl_step(5, State(0), before, rollouts=Rollouts(make_groups(np.array([[True, False, False, False]])), {}),
            learner=Learner(), group_size=4, prefetch_next=False)
    assert dataclasses.astuple(before)[2:] == dataclasses.astuple(run_state())[2:] and before.step == 4


def test_epochs_pass_over_the_same_batch_and_combine_their_metrics():
    import types

    from dapo_jax.training.step import Learner as RealLearner
    from dapo_jax.training.step import epoch_metrics

    seen = []

    def train_step(state, batch):  # each pass starts from the state the last one left
        seen.append((state, batch))
        k = len(seen)
        return state + 1, {"loss": np.float32(k), "ratio_max": np.float32(k), "ratio_min": np.float32(-k),
                           "update_tokens": np.float32(10), "skipped_total": np.float32(k), "clip_frac_high": 0.1 * k}

    programs = types.SimpleNamespace(train_step=train_step, step_kwargs=lambda policy, coef: {}, critic=None)
    batch = types.SimpleNamespace(teacher_logp=None)
    learner = RealLearner(programs, policy=None, reference=None, rows=None, epochs=3)
    state, critic, metrics = learner.update(0, "critic", batch, None)
    assert state == 3 and critic == "critic" and [s for s, _ in seen] == [0, 1, 2]
    assert all(b is batch for _, b in seen)  # π_old and the advantages stay the sampler's
    assert metrics["loss"] == 2.0 and metrics["ratio_max"] == 3.0 and metrics["ratio_min"] == -3.0
    assert metrics["update_tokens"] == 30.0 and metrics["skipped_total"] == 3.0
    assert [metrics[f"epoch{k}/clip_frac_high"] for k in (1, 2, 3)] == pytest.approx([0.1, 0.2, 0.3])
    seen.clear()
    one = RealLearner(programs, policy=None, reference=None, rows=None).update(0, None, batch, None)[2]
    assert len(seen) == 1 and "epoch1/clip_frac_high" not in one
    assert epoch_metrics([{"a": 1.0}, {"a": 3.0}]) == {"a": 2.0}
