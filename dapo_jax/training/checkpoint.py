"""Orbax checkpoints of a run: everything needed to resume bit-exactly.

    ckpt = Checkpointer(run_dir / "checkpoints", keep=3)
    ckpt.save(step, train_state, meta={"rng": ..., "stream": ...}, carry=groups_or_None)   # async
    restored = ckpt.restore_latest(abstract_train_state)   # None when there is nothing to resume

Each checkpoint holds three items: `state` (params, optimizer state, counters: restored onto the
target's shardings, so a run may resume on a different mesh shape), `meta` (JSON: step, RNG key,
prompt-stream position, ...) and, when present, `carry` (kept groups carried to the next step).
Orbax writes into a temporary directory and renames it when complete, so a crash (even SIGKILL)
mid-save leaves the previous checkpoints intact; a newest checkpoint that cannot be read is
skipped with a warning and the one before it is used.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class Restored(NamedTuple):
    step: int
    state: Any
    meta: dict
    carry: dict | None


def abstract_like(tree):
    """ShapeDtypeStructs with the leaves' shardings: the restore target (the current mesh's layout)."""
    def one(x):
        sharding = getattr(x, "sharding", None)
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)
    return jax.tree.map(one, tree)


class Checkpointer:
    """A thin wrapper over `ocp.CheckpointManager` (async saves, keep the newest `keep`)."""

    def __init__(self, directory: str | Path, *, keep: int = 2, async_save: bool = True):
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=async_save,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state, *, meta: dict, carry: dict | None = None) -> None:
        """Starts an (async) save; the previous save is finished first."""
        items = {
            "state": ocp.args.StandardSave(state),
            "meta": ocp.args.JsonSave({**meta, "step": int(step), "has_carry": carry is not None}),
        }
        if carry is not None:
            items["carry"] = ocp.args.StandardSave({k: np.asarray(v) for k, v in carry.items()})
        self.manager.save(int(step), args=ocp.args.Composite(**items), force=True)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

    def restore(self, step: int, target) -> Restored:
        """Restores `step` onto `target`'s shapes, dtypes and shardings (a pytree of arrays or abstract arrays)."""
        meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        items = {"state": ocp.args.StandardRestore(abstract_like(target))}
        if meta.get("has_carry"):
            items["carry"] = ocp.args.StandardRestore()
        out = self.manager.restore(step, args=ocp.args.Composite(**items))
        carry = None
        if meta.get("has_carry"):
            carry = {k: np.asarray(v) for k, v in out["carry"].items()}
        return Restored(int(step), out["state"], dict(meta), carry)

    def restore_latest(self, target) -> Restored | None:
        """The newest readable checkpoint (warning about any newer unreadable one), or None."""
        for step in reversed(self.all_steps()):
            try:
                return self.restore(step, target)
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint falls back to the previous one
                warnings.warn(
                    f"checkpoint {self.directory}/{step} is incomplete or unreadable "
                    f"({type(e).__name__}: {str(e)[:300]}); trying the previous one",
                    RuntimeWarning, stacklevel=2,
                )
        return None


def restore_params(checkpoint_dir: str | Path, target, step: int | None = None):
    """Only the `state` item of a checkpoint (newest when `step` is None): for eval and export."""
    ckpt = Checkpointer(checkpoint_dir, async_save=False)
    try:
        if step is None:
            restored = ckpt.restore_latest(target)
            if restored is None:
                raise FileNotFoundError(f"no readable checkpoint in {checkpoint_dir}")
            return restored
        return ckpt.restore(step, target)
    finally:
        ckpt.close()
