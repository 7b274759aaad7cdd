"""What a run carries from step to step besides the jitted `TrainState`, and how a checkpoint holds it.

    state, run = restore(cfg, ckpt, state, stream, say)      # the newest good checkpoint, or step 0
    ... state, run, out = rl_step(run.step + 1, state, run, ...)
    save(ckpt, state, run, stream, prefetch, group_filter)   # the params, the optimizer and `run`

A resumed run equals the uninterrupted one: the checkpoint holds the loop's key, the prompt stream's
position, the carried groups, a rollout prefetched in flight (`rollout.overlap`: `overlap.pack`), GFPO's
difficulty window, difficulty filtering's visit history (`data.difficulty`), the adaptive entropy
coefficient's controller (`objective.entropy_target`: objectives/adaptive_entropy.py) and the counters (steps
skipped, responses generated for `train.max_samples`, rounds of new data: `data.new_round`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from dapo_jax.objectives.adaptive_entropy import EntropyControl
from dapo_jax.training import sources
from dapo_jax.training.state.checkpoint import Checkpointer
from dapo_jax.training.state.checkpoint_errors import CheckpointUnreadableError
from dapo_jax.training.config.run import RunConfig
from dapo_jax.training.overlap import Prefetched, Prefetcher, pack, unpack
from dapo_jax.training.rollout import Groups
from dapo_jax.training.update.train_step import TrainState


@dataclasses.dataclass(frozen=True)
class RunState:
    """The loop's position, besides the jitted state; `rl_step` returns a new one."""

    step: int  # steps completed
    rng: np.ndarray  # uint32 raw key data: the run's key, every use folds in (step, round)
    carry: Groups | None = None  # kept groups left over for the next step (rollout.carry_surplus)
    steps_skipped: int = 0  # steps with no group to train on (dynamic sampling starved under train_on_kept)
    critic: Any = None  # the critic's TrainState (PPO / VAPO: training/update/critic.py)
    samples: float = 0.0  # responses the steps have generated so far, kept or not (train.max_samples)
    prefetched: Prefetched | None = None  # restored only: the next step's rollout, saved in flight (rollout.overlap)
    group_filter: dict | None = None  # restored only: GFPO's difficulty window (`GroupFilter.state_dict`)
    difficulty: dict | None = None  # restored only: difficulty filtering's visit history (training/difficulty.py)
    data_round: int = 0  # rounds of training on new data so far (data.new_round): 0 = the data the run started on
    entropy_control: EntropyControl | None = None  # the adaptive entropy coefficient's (c, gate) (objective.entropy_target)

    def budget_spent(self, cfg: RunConfig) -> bool:
        """train.max_samples: the steps so far generated that many responses (the last step may pass it)."""
        return cfg.train.max_samples is not None and self.samples >= cfg.train.max_samples


def restore(cfg: RunConfig, ckpt: Checkpointer, state: TrainState, stream, say,
            critic=None, *, new_round: bool = False) -> tuple[TrainState, RunState]:
    """The newest good checkpoint's state and loop position (and `critic`'s state when given), or a
    fresh start at step 0. `new_round`: the data section changed on purpose (`data.new_round`,
    `RunDir.round_changes`): the weights, optimizer, key and counters go on, the data starts afresh
    (the stream at its start, no difficulty history, no carried or prefetched groups of the old data)."""
    o = cfg.objective_config
    control = EntropyControl.start(o.entropy_coef_init) if o.adaptive_entropy else None
    run = RunState(0, np.asarray(jax.random.key_data(jax.random.PRNGKey(cfg.train.seed))), critic=critic,
                   entropy_control=control)
    try:
        restored = ckpt.restore_latest(state, critic=critic)
    except CheckpointUnreadableError:
        if not cfg.train.fresh_start:
            raise
        say(f"[dapo-jax] no readable checkpoint in {ckpt.directory}: starting over from step 0 "
            f"(train.fresh_start=true)", flush=True)
        metrics = Path(cfg.train.run_dir) / "metrics.jsonl"
        if metrics.exists() and jax.process_index() == 0:
            metrics.rename(metrics.with_name(f"metrics.before-fresh-start-{int(time.time())}.jsonl"))
        return state, run
    if restored is None:
        return state, run
    carry, prefetched = unpack(restored.carry, restored.meta.get("prefetched"))
    meta = restored.meta
    data_round = int(meta.get("data_round", 0)) + int(new_round)
    if new_round:
        carry = prefetched = None
        say(f"[dapo-jax] new round {data_round} on new data (data.new_round=true) after step {restored.step}: "
            f"the prompt stream starts afresh", flush=True)
    else:
        sources.resume_stream(stream, meta["stream"], cfg, say)  # refuses changed data (one line, exit 2)
    run = RunState(restored.step, np.asarray(meta["rng"], np.uint32), carry, int(meta.get("steps_skipped", 0)),
                   restored.critic, float(meta.get("generated_samples", 0.0)), prefetched, meta.get("group_filter"),
                   None if new_round else meta.get("difficulty"), data_round)
    if control is not None and "entropy_control" in meta:  # the floats of float32 values: restored exactly
        run = dataclasses.replace(run, entropy_control=EntropyControl(float(meta["entropy_control"][0]),
                                                                      bool(meta["entropy_control"][1])))
    elif control is not None:  # the checkpoint predates entropy_target: the controller starts at c_0
        run = dataclasses.replace(run, entropy_control=control)
    quarantined = f" (unreadable newer checkpoint(s) {restored.quarantined} set aside)" if restored.quarantined else ""
    say(f"[dapo-jax] resumed from step {restored.step} in {ckpt.directory}{quarantined}", flush=True)
    return restored.state, run


def save(ckpt: Checkpointer, state: TrainState, run: RunState, stream, prefetch: Prefetcher | None = None,
         group_filter=None, difficulty=None) -> None:
    """Checkpoints step `run.step`; first waits for the rollout in flight (its prompts are read from the
    stream, and its GFPO window is the one to keep)."""
    ready = prefetch.drain() if prefetch is not None else None
    meta = {"rng": [int(x) for x in np.asarray(run.rng).ravel()], "stream": stream.state_dict(),
            "steps_skipped": run.steps_skipped, "generated_samples": run.samples}
    if group_filter is not None:
        meta["group_filter"] = group_filter.state_dict()
    if difficulty is not None:
        meta["difficulty"] = difficulty.state_dict()
    if run.data_round:
        meta["data_round"] = run.data_round
    if run.entropy_control is not None:
        meta["entropy_control"] = [float(run.entropy_control.coef), bool(run.entropy_control.gate)]
    carry, prefetched = pack(run.carry, ready)
    if prefetched is not None:
        meta["prefetched"] = prefetched
    ckpt.save(run.step, state, meta=meta, carry=carry, critic=run.critic)


__all__ = ["RunState", "restore", "save"]
