"""One training step, as DAPO's Algorithm 1 (Yu et al., 2025) writes it:

    for step = 1..M:
        sample a batch of prompts; sample G responses for each with π_θ_old (the params as they are now)
        reward them; keep the groups whose rewards differ (dynamic sampling), until the buffer holds N
        compute the advantage Â_i,t of every token of every kept response
        for each of the μ mini-batches: update π_θ on the objective (clip-higher, token-level loss)

`rl_step` is that step for every objective of the registry (GRPO, Dr. GRPO, DAPO, GSPO, PPO and VAPO with
their critic, ...): the objective decides what "rewards differ" means and how advantages and the loss are
computed (docs/objectives.md), never the step. `Actor.collect` samples (training/actor.py), `Learner`
below turns the kept groups into advantages and an update; `train()` (training/loop.py) drives the steps:
resume, metrics, checkpoints, evaluation, preemption.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax

from dapo_jax.objectives.process import StepRewards
from dapo_jax.parallel.host import to_global, to_host
from dapo_jax.training.overlap import Prefetcher
from dapo_jax.training.rollout import Groups
from dapo_jax.training.state.run_state import RunState
from dapo_jax.training.update.compile_ahead import compiled_outputs
from dapo_jax.training.update.distill import reverse_kl_mean
from dapo_jax.training.update.train_step import TrainState


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What a step did, for the driver to report."""

    groups: Groups  # the batch the step trained on: train_batch groups, padding (valid=False) included
    advantages: jax.Array | None  # [P, G, T] the update's per-token advantages; None: nothing kept, no update
    stats: dict  # the rollout's statistics (rollout.collect_groups, GFPO's gfpo/*, rollout_busy_s)
    metrics: dict  # the update's, on the host ({} without an update)
    rollout_s: float  # wall time to get the groups (waiting for a prefetched rollout, with rollout.overlap)
    update_s: float  # wall time of the advantages and the update

    @property
    def skipped(self) -> bool:
        return self.advantages is None


def rl_step(step: int, state: TrainState, run: RunState, *, rollouts: Prefetcher, learner: "Learner",
            group_size: int, prefetch_next: bool) -> tuple[TrainState, RunState, StepResult]:
    """Step `step` (1-based) of the run: `(state, run)` after it, and what it did.

    rollouts: `Actor.collect` behind a `Prefetcher`; prefetch_next: start sampling step `step + 1`'s groups
    with the params of this step's rollout, to run during this step's update (`rollout.overlap`)."""
    t0 = time.perf_counter()
    # Sample G responses for each prompt with the current params, reward them and keep the groups whose
    # rewards differ, round after round, until the batch is full: `Actor.collect` (training/actor.py), here
    # or, with rollout.overlap, during the previous step's update
    groups, stats, carry = rollouts.take(step, state.params, run.carry)
    t1 = time.perf_counter()
    if prefetch_next:  # the next step's groups are sampled from these params while this update runs
        rollouts.submit(step + 1, state.params, carry)
    run = dataclasses.replace(run, step=step, carry=carry,
                              samples=run.samples + stats.get("generated_groups", 0.0) * group_size)
    if not groups.valid.any():  # nothing kept: an update on padding would only move Adam's moments and counters
        run = dataclasses.replace(run, steps_skipped=run.steps_skipped + 1)
        return state, run, StepResult(groups, None, stats, {}, t1 - t0, time.perf_counter() - t1)
    # The advantage of every token of every kept response (and π_old, π_ref recomputed where the objective asks)
    batch, critic_batch = learner.advantages(state.params, groups, run.critic)
    # num_minibatches gradient updates of the policy on the objective (and of the critic, with one)
    state, critic, metrics = learner.update(state, run.critic, batch, critic_batch)
    run = dataclasses.replace(run, critic=critic)
    return state, run, StepResult(groups, batch.advantages, stats, metrics, t1 - t0, time.perf_counter() - t1)


@dataclasses.dataclass(frozen=True)
class Learner:
    """The update half of the step: the run's jitted `prepare` and `train_step` (training/update/programs.py) on the
    kept groups, laid out over the mesh."""

    prepare: Callable  # log π_old / π_ref recomputed, advantages (and the critic's batch): jitted
    train_step: Callable  # (TrainState, Batch, **policy.step_kwargs) -> (TrainState, metrics)
    policy: Any  # training.update.lora.PolicyWeights
    reference: Any  # π_ref's weights (objective.needs_reference), or None
    critic: Any  # training.update.critic.Critic (PPO, VAPO), or None
    rows: Any  # the batch's sharding: prompts (whole groups) over ("data", "fsdp")
    reward_parts: bool  # multi_reward normalize_then_sum: each function's reward [P, G, K], combined on the device
    step_rewards: bool  # process supervision: advantages from the step rewards (docs/objectives.md#process-supervision)
    teacher: Any = None  # on-policy distillation's frozen teacher (training/update/distill.py), or None

    def advantages(self, params, groups: Groups, critic_state=None):
        """`(Batch, critic batch)` of `groups` on the mesh. GFPO's dropped responses (`groups.selected`) leave
        the loss, its denominator and the advantages' statistics; padding groups (valid=False) carry none."""
        args, kwargs = self._prepare_inputs(params, groups, critic_state)
        return self.prepare(*args, **kwargs)

    def _prepare_inputs(self, params, groups: Groups, critic_state) -> tuple[tuple, dict]:
        sel = groups.selected
        host = (groups.prompt_ids, groups.prompt_mask, groups.response_ids, groups.response_mask * sel[..., None],
                groups.old_logp, groups.reward_parts if self.reward_parts else groups.rewards,
                groups.valid[:, None] & sel)
        steps = StepRewards(groups.step_rewards, groups.step_ends, groups.step_mask) if self.step_rewards else None
        critic_in = {} if self.critic is None else {
            "critic_params": critic_state.params, "correct": to_global(groups.correct, self.rows)}
        teacher_in = {} if self.teacher is None else {"teacher_params": self.teacher.params}
        return ((self.policy.trainer(params), self.reference, *to_global(host, self.rows)),
                {"steps": to_global(steps, self.rows), **critic_in, **teacher_in})

    def precompile(self, state: TrainState, groups: Groups, critic_state=None) -> list:
        """Compiles `advantages` and `update` for a batch shaped like `groups` (training/update/compile_ahead.py):
        `prepare` here; returns the update's programs as `(name, compile)` jobs, to compile in parallel."""
        args, kwargs = self._prepare_inputs(state.params, groups, critic_state)
        batch, critic_batch = compiled_outputs(self.prepare, *args, **kwargs)
        kw = self.policy.step_kwargs
        if hasattr(self.train_step, "precompile"):  # the packed update: a program per chunk height
            jobs = self.train_step.precompile(state, batch, **kw)
        else:
            jobs = [("update", lambda: self.train_step.lower(state, batch, **kw).compile())]
        if self.critic is not None:
            jobs.append(("critic update", lambda: self.critic.update.lower(critic_state, critic_batch).compile()))
        return jobs

    def update(self, state: TrainState, critic_state, batch, critic_batch):
        """`(state, critic_state, metrics on the host)` after the step's updates."""
        state, metrics = self.train_step(state, batch, **self.policy.step_kwargs)
        if batch.teacher_logp is not None:  # on-policy distillation: how far the student's samples are
            metrics = {**metrics, "distill/reverse_kl": reverse_kl_mean(batch.old_logp, batch.teacher_logp,
                                                                        batch.response_mask)}
        if self.critic is not None:
            critic_state, critic_metrics = self.critic.update(critic_state, critic_batch)
            metrics = {**metrics, **critic_metrics}
        return state, critic_state, to_host(metrics)


__all__ = ["Learner", "StepResult", "rl_step"]
