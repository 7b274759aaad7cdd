"""The run directory: one run at a time, and a resume only with the config it started with.

    with RunDir(cfg) as rd:          # fails at once if another process holds RUN_DIR/.lock
        rd.check_same_config()      # a rerun must keep everything that changes the trajectory
        ...
        rd.save_config()            # written only once the run really starts

The lock is an OS file lock (`filelock`), released by the kernel when the holder dies, even by
SIGKILL, so a crashed run never leaves a stale lock; the holder's pid and host sit beside it so
that the second run's error can name them. In a multi-process run process 0 holds it and writes
for all, and tells the others whether it got it (`parallel/agree.py`): a run dir in use stops every
process with the same line, exit 2, before the model loads.
"""

from __future__ import annotations

import json
import os
import socket
import time
import typing
from pathlib import Path

import filelock
import jax
import pydantic_core
import yaml

from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.parallel.agree import agree
from dapo_jax.parallel.mesh import START_TIMEOUT_S
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import RunConfig, save_config
from dapo_jax.training.state.failed_save import cause_of

# Keys that may change between a run and its resume (they do not change the trajectory). The mesh
# (`mesh.*`: its shape and the processes) is one of them: a checkpoint restores onto the new mesh's
# shardings and the math is the same up to float reduction order.
RESUMABLE_KEYS = {"train.steps", "train.max_samples", "train.progress", "train.tensorboard", "train.eval_every",
                  "train.checkpoint_every", "train.keep_checkpoints", "train.run_dir", "train.fresh_start",
                  "train.max_nonfinite_steps", "train.rollouts_every", "train.rollouts_sample", "train.loggers",
                  "data.accept_changed", "data.new_round", "model.accept_changed"}
# What a new round of training (`data.new_round=true`) may change on resume: the data and its reward
ROUND_KEYS = ("data.", "reward.")


class RunDir:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.path = Path(cfg.train.run_dir)
        if self.path.exists() and not self.path.is_dir():
            raise ConfigError(f"train.run_dir: {self.path} exists and is a file, not a directory")
        self._lock: filelock.BaseFileLock | None = None
        self.round_changes: dict[str, tuple] | None = None  # a new round's changed keys: (before, after)

    def __enter__(self) -> "RunDir":
        self.path.mkdir(parents=True, exist_ok=True)
        refused = self._take_lock() if jax.process_index() == 0 else None  # process 0 holds it for all
        distributed = self.cfg.mesh.distributed
        found = agree("the run dir's lock", None if refused is None else str(refused),  # parallel/agree.py
                      timeout_s=distributed.start_timeout_s if distributed is not None else START_TIMEOUT_S)
        if refused is not None:
            raise refused
        if found:  # what process 0 found, said by every process: all of them exit 2 together
            self.__exit__()
            who, line = min(found.items())
            raise ConfigError(f"{line} (process {who} found it: it takes the lock for all the run's processes)")
        return self

    def _take_lock(self) -> ConfigError | None:
        """Takes RUN_DIR/.lock (one lock per run, for shared file systems); the error when it cannot."""
        holder = self.path / ".lock.holder"
        self._lock = filelock.FileLock(str(self.path / ".lock"), timeout=0)
        try:
            self._lock.acquire()
            holder.write_text(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        except filelock.Timeout:
            self._lock = None
            who = holder.read_text().strip() if holder.exists() else "another process"
            return ConfigError(f"train.run_dir: {self.path} is in use by {who}; wait for it or choose another "
                               f"train.run_dir")
        except OSError as e:  # a full disk, a read-only folder: before anything else is written
            self.__exit__()
            return ConfigError(f"train.run_dir: cannot write {self.path}'s lock ({os.path.basename(e.filename or '.lock')}): "
                               f"{cause_of(e)}")
        return None

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            (self.path / ".lock.holder").unlink(missing_ok=True)
            self._lock.release()
            self._lock = None

    def check_same_config(self) -> None:
        """Raises when RUN_DIR/config.yaml exists and differs in a key that changes the trajectory."""
        saved_file = self.path / "config.yaml"
        if not saved_file.exists():
            return
        old, new = _flat(yaml.safe_load(saved_file.read_text())), _flat(yaml.safe_load(self.cfg.to_yaml()))
        # a key the saved config lacks is a field added since the run started: the same run when the
        # new value is that field's default (the behaviour the run had)
        diff = sorted(k for k in old.keys() | new.keys() if old.get(k, _default(k)) != new.get(k) and not _resumable(k))
        # recompute_old_logp: false (the old default) and unset (now: follow the precision) are the same
        # run when they resolve to the same choice
        if "rollout.recompute_old_logp" in diff and old.get("rollout.recompute_old_logp") is False \
                and new.get("rollout.recompute_old_logp") is None and not self.cfg.recompute_old_logp:
            diff.remove("rollout.recompute_old_logp")
        if diff and self.cfg.data.new_round and all(k.startswith(ROUND_KEYS) for k in diff):
            self.round_changes = {k: (old.get(k), new.get(k)) for k in diff}  # the loop starts a new round
            return
        if diff and self.cfg.data.new_round:  # only the keys a new round may not change
            others = [k for k in diff if not k.startswith(ROUND_KEYS)]
            details = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in others[:6])
            raise ConfigError(f"{saved_file}: data.new_round=true starts a new round on new data and reward "
                              f"(data.*, reward.*), but other keys changed too ({details}): restore them, or use a "
                              f"new train.run_dir")
        if diff:
            details = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:6])
            rounds = (" or, to go on training this checkpoint on the new data and reward (a new round), set "
                      "data.new_round=true" if all(k.startswith(ROUND_KEYS) for k in diff) else "")
            raise ConfigError(f"{saved_file}: resuming this run with a different config ({details}); these keys "
                              f"change the trajectory (only the mesh, train.steps, evaluation, checkpoint and "
                              f"logging keys may change on resume): use a new train.run_dir{rounds}")

    def record_round(self, step: int, data_round: int) -> Path:
        """Appends the new round's line to RUN_DIR/rounds.jsonl: the round, the step it starts after, when,
        and each changed key's value before and after; keeps the config of the round that ended as
        RUN_DIR/config.round-(N-1).yaml."""
        path = self.path / "rounds.jsonl"
        if jax.process_index() != 0:
            return path
        saved = self.path / "config.yaml"
        if saved.exists():
            (self.path / f"config.round-{data_round - 1}.yaml").write_text(saved.read_text())
        row = {"round": data_round, "after_step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "changed": {k: list(v) for k, v in (self.round_changes or {}).items()}}
        with open(path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        return path

    def save_config(self) -> Path:
        path = self.path / "config.yaml"
        return save_config(self.cfg, self.path) if jax.process_index() == 0 else path


_NO_DEFAULT = object()


def _default(key: str):
    """The default of the config field at a flat `section.field` key (objective fields: ObjectiveConfig's),
    or a sentinel equal to nothing when there is none."""
    parts = key.split(".")
    model = RunConfig
    if parts[0] == "objective" and len(parts) == 2:
        model, parts = ObjectiveConfig, parts[1:]
    for i, name in enumerate(parts):
        field = getattr(model, "model_fields", {}).get(name)
        if field is None:
            return _NO_DEFAULT
        if i == len(parts) - 1:
            return _NO_DEFAULT if field.default is pydantic_core.PydanticUndefined else field.default
        # a section that may be absent (`critic: CriticSection | None`): its fields' defaults are the model's
        model = next((a for a in (field.annotation, *typing.get_args(field.annotation))
                      if hasattr(a, "model_fields")), None)
    return _NO_DEFAULT


def _resumable(key: str) -> bool:
    return (key in RESUMABLE_KEYS or key.startswith(("data.eval.", "train.eval_", "train.wandb", "mesh."))
            or key in ("data.eval", "data.eval_size"))


def _flat(d, prefix=""):
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        out.update(_flat(v, key + ".") if isinstance(v, dict) else {key: v})
    return out
