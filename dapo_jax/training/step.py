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
import numpy as np

from dapo_jax.objectives.adaptive_entropy import EntropyControl
from dapo_jax.parallel.host import to_global, to_host
from dapo_jax.training.overlap import Prefetcher
from dapo_jax.training.rollout import Groups
from dapo_jax.training.state.run_state import RunState
from dapo_jax.training.update.compile_ahead import compile_jobs
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
    control = run.entropy_control  # Skywork-OR1's adaptive entropy coefficient (objective.entropy_target), or None
    alpha = {} if control is None else {"entropy_coef": control.alpha}  # α_k, an input of the update
    state, critic, metrics = learner.update(state, run.critic, batch, critic_batch, **alpha)
    run = dataclasses.replace(run, critic=critic)
    if control is not None:  # the next step's α from this step's entropy (objectives/adaptive_entropy.py)
        after = learner.entropy_control(control, metrics["entropy"])
        after = EntropyControl(float(after.coef), bool(after.gate))
        run = dataclasses.replace(run, entropy_control=after)
        metrics = {**metrics, "entropy_coef": float(control.alpha), "entropy_coef_next": float(after.alpha)}
    return state, run, StepResult(groups, batch.advantages, stats, metrics, t1 - t0, time.perf_counter() - t1)


@dataclasses.dataclass(frozen=True)
class Learner:
    """The update half of the step: the run's jitted `prepare` and `train_step` (training/update/programs.py) on the
    kept groups, laid out over the mesh."""

    programs: Any  # training.update.programs.RunPrograms: prepare, train_step, the critic, and prepare's inputs
    policy: Any  # training.update.lora.PolicyWeights
    reference: Any  # π_ref's weights (objective.needs_reference), or None
    rows: Any  # the batch's sharding: prompts (whole groups) over ("data", "fsdp")
    teacher: Any = None  # on-policy distillation's frozen teacher (training/update/distill.py), or None
    # objective.entropy_target: `(EntropyControl, entropy) -> EntropyControl` (objectives/adaptive_entropy.py), or None
    entropy_control: Callable | None = None
    epochs: int = 1  # optim.epochs: passes of the policy update over the step's batch

    def advantages(self, params, groups: Groups, critic_state=None):
        """`(Batch, critic batch)` of `groups` on the mesh. GFPO's dropped responses (`groups.selected`) leave
        the loss, its denominator and the advantages' statistics; padding groups (valid=False) carry none."""
        args, kwargs = self._prepare_inputs(params, groups, critic_state)
        return self.programs.prepare(*args, **kwargs)

    def _prepare_inputs(self, params, groups: Groups, critic_state) -> tuple[tuple, dict]:
        return self.programs.prepare_inputs(
            groups, trainer_params=self.policy.trainer(params), reference=self.reference, put=self._put,
            critic_params=None if critic_state is None else critic_state.params,
            teacher_params=None if self.teacher is None else self.teacher.params)

    def _put(self, tree):
        return to_global(tree, self.rows)

    def precompile(self, state: TrainState, critic_state=None) -> list:
        """Compiles `advantages` and `update` for the update's batch (`programs.blank()`, the shapes every step's
        batch has; training/update/compile_ahead.py), as `programs.step_programs` declares them: `prepare` (and
        the packed update's small stages) here, for their outputs; returns every program as a `(name, compile)`
        job, to compile in parallel."""
        return compile_jobs(self.programs.step_programs(
            state, critic_state, policy=self.policy, reference=self.reference, put=self._put,
            teacher_params=None if self.teacher is None else self.teacher.params))

    def _step_kwargs(self, entropy_coef) -> dict:
        """The update's keyword inputs (`programs.step_kwargs`): LoRA's frozen base, and α_k when the entropy
        coefficient adapts."""
        return self.programs.step_kwargs(self.policy, entropy_coef)

    def update(self, state: TrainState, critic_state, batch, critic_batch, entropy_coef=None):
        """`(state, critic_state, metrics on the host)` after the step's updates; `entropy_coef`: α_k. With
        `epochs` > 1 the policy update passes over the batch that many times (π_old stays the sampler's)."""
        passes = []
        for _ in range(self.epochs):
            state, metrics = self.programs.train_step(state, batch, **self._step_kwargs(entropy_coef))
            passes.append(metrics)
        metrics = passes[0] if len(passes) == 1 else epoch_metrics([to_host(m) for m in passes])
        if batch.teacher_logp is not None:  # on-policy distillation: how far the student's samples are
            metrics = {**metrics, "distill/reverse_kl": reverse_kl_mean(batch.old_logp, batch.teacher_logp,
                                                                        batch.response_mask)}
        if self.programs.critic is not None:
            critic_state, critic_metrics = self.programs.critic.update(critic_state, critic_batch)
            metrics = {**metrics, **critic_metrics}
        return state, critic_state, to_host(metrics)


def epoch_metrics(passes: list[dict]) -> dict:
    """One step's metrics from its epochs' (`optim.epochs`): the mean over the passes, the max of `*_max`, the min
    of `*_min`, the sum of the counts (`update_tokens`, `nonfinite_updates`), the last `skipped_total`; and each
    pass's clip fractions as `epoch{K}/clip_frac_high` / `_low` (K from 1), where the later passes bind more."""
    out = {}
    for key in passes[0]:
        values = [float(np.asarray(m[key])) for m in passes]
        out[key] = (max(values) if key.endswith("_max") else min(values) if key.endswith("_min") else
                    sum(values) if key in ("update_tokens", "nonfinite_updates") else
                    values[-1] if key == "skipped_total" else float(np.mean(values)))
    for k, m in enumerate(passes, 1):
        out.update({f"epoch{k}/{key}": float(np.asarray(m[key])) for key in ("clip_frac_high", "clip_frac_low",
                                                                            "clip_grad_share_high") if key in m})
    return out


__all__ = ["Learner", "StepResult", "epoch_metrics", "rl_step"]
