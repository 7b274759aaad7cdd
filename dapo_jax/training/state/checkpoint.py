"""Orbax checkpoints of a run: everything needed to resume bit-exactly, verified on every read.

    ckpt = Checkpointer(run_dir / "checkpoints", keep=3)
    ckpt.save(step, train_state, meta={"rng": ..., "stream": ...}, carry=groups_or_None)   # async
    restored = ckpt.restore_latest(abstract_train_state)   # None when there is nothing to resume

Each checkpoint holds three items: `state` (params, optimizer state, counters: restored onto the
target's shardings, so a run may resume on a different mesh shape), `meta` (JSON: step, RNG key,
prompt-stream position, ...) and, when present, `carry` (kept groups carried to the next step) and
`critic` (the value model's state of PPO / VAPO: `save(..., critic=...)`, `restore(..., critic=target)`).

A checkpoint never fails silently:

- **Verified on read** (`checksums.py`). `save` records in `meta` the CRC-32 of every array of `state` and `carry`
  (of its bytes, gathered on the host), keyed by the leaf's tree path with its shape and dtype, and a
  CRC-32 of the JSON itself. `restore` recomputes them and raises `CheckpointCorruptError`, naming the
  checkpoint and the first bad leaf, on any mismatch or on any file it cannot read. Orbax checks
  none of this (its zarr3 arrays carry a CRC of the chunk index only; flipped data bytes load as
  wrong numbers), hence our own. A leaf restored to another dtype than saved (a deliberate cast) is
  not checked. Only fully addressable arrays are checksummed: an array sharded over several hosts
  is saved and restored unchecked for now. Checkpoints written before the checksums load unchecked,
  with a log line.
- **Finite or nothing.** `save` raises `NonFiniteStateError`, naming the first NaN/inf float leaf,
  and writes nothing: a checkpoint is a state worth resuming from.
- **Atomic.** Orbax writes into a temporary directory and renames it when complete (tested by
  SIGKILL mid-save): a crash leaves the previous checkpoints intact and no visible partial one.
- **A fallback that heals.** `restore_latest` tries the newest first. One that fails verification
  or reading is quarantined: moved to `checkpoints/corrupt/STEP-<time>` (out of Orbax's view; move it
  back by hand to retry it) with a RuntimeWarning naming it and the reason, and the previous one is
  used. The run then redoes that step and saves it afresh, so the newest checkpoint is always good.
  `Restored.quarantined` lists the steps moved aside.
- **Never a silent restart.** When checkpoints exist (or were quarantined earlier) but none is
  readable, `restore_latest` raises `CheckpointUnreadableError`: the run starts from step 0 only when
  asked to (`train.fresh_start=true`: the trainer catches the error; every unreadable checkpoint is
  already out of the way). With no checkpoint at all it returns None.
- A checkpoint whose (intact) record does not fit the restore target, e.g. after a change of model or
  optimizer, raises `CheckpointError` from both `restore` and `restore_latest` and is left in place.

- **A failed save stops the run at once.** An async save that fails (disk full, a read-only or
  unwritable folder) is noticed at the next step boundary (`check`, called every step), not at the
  next save: `CheckpointSaveError` (exit 6) says in one line which folder and why (ENOSPC, EROFS,
  EACCES, ... from the OSError or Tensorstore's `os_error_code`), and names the last good checkpoint,
  which Orbax left intact (a save writes into a temporary folder). Orbax's threads still waiting on
  the failed save are released (`abandon`), so the process exits instead of waiting for them
  (`failed_save.py`).

`restore_params` (eval, export; `checkpoint_reader.py`) reads without moving anything: it skips a corrupt newest checkpoint
with a warning, raises `CheckpointUnreadableError` when none is good, and `CheckpointCorruptError`
when the `step` asked for is corrupt. A checkpoint deleted by the writing run's rotation while it is read
is `CheckpointRotatedError`, not corruption (`rotation.py`). The errors are in `checkpoint_errors.py`.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp

from dapo_jax.training.state.checkpoint_errors import (CheckpointCorruptError, CheckpointError,
                                                       CheckpointUnreadableError)
from dapo_jax.training.state.checksums import check_fits, fingerprints, json_crc32, verify
from dapo_jax.training.state.failed_save import (CheckpointSaveError, errno_of, quiet_orbax_errors, release_orbax_threads,
                                                 save_failure)
from dapo_jax.training.state.rotation import check_not_rotated

log = logging.getLogger(__name__)

FRESH_START_KEY = "train.fresh_start"


class Restored(NamedTuple):
    step: int
    state: Any
    meta: dict
    carry: dict | None
    quarantined: list[int] = []  # steps moved to checkpoints/corrupt/ by this restore, newest first
    critic: Any = None  # the critic's state (PPO / VAPO), restored when a critic target is given


def abstract_like(tree):
    """ShapeDtypeStructs with the leaves' shardings: the restore target (the current mesh's layout).

    A leaf without a sharding (e.g. the optimizer moments of an `eval_shape`d state) takes that of a
    sharded leaf of the same shape (a parameter's: the same memory per device), else replicated on
    their mesh: left unset, Orbax would use the saved layout, which fails on another mesh or process
    count."""
    named = [x.sharding for x in jax.tree.leaves(tree)
             if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding)]
    by_shape = {}
    for x in jax.tree.leaves(tree):
        if isinstance(getattr(x, "sharding", None), jax.sharding.NamedSharding):
            by_shape.setdefault(tuple(np.shape(x)), x.sharding)

    def one(x):
        sharding = getattr(x, "sharding", None)
        if sharding is None and named:
            sharding = by_shape.get(tuple(np.shape(x)),
                                    jax.sharding.NamedSharding(named[0].mesh, jax.sharding.PartitionSpec()))
        return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)
    return jax.tree.map(one, tree)


def _is_out_of_memory(e: BaseException) -> bool:
    """Host or device memory ran out (re-raised as is). Tensorstore reports a full disk as
    `RESOURCE_EXHAUSTED` too (absl's code for ENOSPC), with the OS error number beside it: a save failure."""
    return isinstance(e, MemoryError) or ("RESOURCE_EXHAUSTED" in str(e) and errno_of(e) is None)


class Checkpointer:
    """A thin wrapper over `ocp.CheckpointManager` (async saves, keep the newest `keep`) that verifies reads."""

    def __init__(self, directory: str | Path, *, keep: int = 2, async_save: bool = True):
        self.directory = Path(directory).absolute()
        self.quarantine_dir = self.directory / "corrupt"
        quiet_orbax_errors()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, create=True, enable_async_checkpointing=async_save,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)
        self.failed: CheckpointSaveError | None = None  # a save that failed: every later call re-raises it
        self._saving: int | None = None  # the step of the save in flight (None: none, or it finished)

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Finishes the save in flight (a preemption's included), unless the run stops because a save
        failed or a peer process is gone: then nothing more is waited for."""
        if exc is not None and getattr(exc, "abandon_saves", False):
            self.abandon()
        else:
            self.close()

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def check(self) -> None:
        """Raises CheckpointSaveError when the last (async) save failed; returns at once while it runs.
        Called at every step boundary, so a failure stops the run one step after it happened."""
        if self.failed is not None:
            raise self.failed
        if self._saving is None or self.manager.is_saving_in_progress():
            return
        self.wait()  # finished: collects its error, if any

    def _fail(self, step: int | None, e: BaseException) -> CheckpointSaveError:
        good = [s for s in self.all_steps() if s != step]
        self.failed = save_failure(self.directory, step, e, max(good, default=None))
        self.failed.__cause__ = e
        self.abandon()
        return self.failed

    def save(self, step: int, state, *, meta: dict, carry: dict | None = None, critic=None) -> None:
        """Starts an (async) save; the previous save is finished first. Raises NonFiniteStateError,
        writing nothing, when a float leaf of `state` (or `critic`, a critic's state saved beside it)
        is NaN or inf. `meta` must be JSON; its keys `step`, `has_carry`, `checksums` and
        `meta_crc32` are this module's."""
        step = int(step)
        sums = {"state": fingerprints(state, refuse_non_finite=f"checkpoint {self.directory}/{step}")}
        items = {"state": ocp.args.StandardSave(state)}
        if critic is not None:
            sums["critic"] = fingerprints(critic, refuse_non_finite=f"checkpoint {self.directory}/{step}")
            items["critic"] = ocp.args.StandardSave(critic)
        if carry is not None:
            carry = {k: np.asarray(v) for k, v in carry.items()}
            sums["carry"] = fingerprints(carry)
            items["carry"] = ocp.args.StandardSave(carry)
        record = json.loads(json.dumps({**meta, "step": step, "has_carry": carry is not None, "checksums": sums}))
        record["meta_crc32"] = json_crc32(record)
        items["meta"] = ocp.args.JsonSave(record)
        self.wait()  # the previous save: its failure stops the run here, before another is started
        try:
            self.manager.save(step, args=ocp.args.Composite(**items), force=True)
        except Exception as e:  # noqa: BLE001 - the folder could not even be prepared
            if _is_out_of_memory(e):
                raise
            raise self._fail(step, e) from e
        self._saving = step

    def wait(self) -> None:
        """Blocks until the save in flight is done; CheckpointSaveError when it (or an earlier one) failed."""
        if self.failed is not None:
            raise self.failed
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - Orbax re-raises the background save's error here
            if _is_out_of_memory(e):
                raise
            raise self._fail(self._saving, e) from e
        self._saving = None

    def close(self) -> None:
        if self.failed is None:
            self.wait()
            self.manager.close()

    def abandon(self) -> None:
        """Stops waiting for the save in flight: releases Orbax's threads that wait for signals a failed
        save (or a lost peer process) will never send, so that the process can exit. The folder keeps
        its completed checkpoints; a half-written one stays in Orbax's temporary folder, out of view."""
        release_orbax_threads()

    def restore(self, step: int, target, *, critic=None) -> Restored:
        """Restores `step` onto `target`'s shapes, dtypes and shardings (a pytree of arrays or abstract
        arrays), verified against the checksums recorded at save time; with `critic` (a target like
        `target`), also the critic's state saved beside it (CheckpointError when there is none).

        Raises CheckpointCorruptError when it cannot be read or does not match, CheckpointError when it
        does not fit `target`, FileNotFoundError when there is no such step."""
        step = int(step)
        where = f"{self.directory}/{step}"
        if step not in self.all_steps():
            raise FileNotFoundError(f"no checkpoint {where}; the checkpoints there are steps {self.all_steps()}")
        check_not_rotated(self.directory, step, None)
        try:
            meta = dict(self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])
        except Exception as e:  # noqa: BLE001 - any failure to read the JSON is a corrupt checkpoint
            if _is_out_of_memory(e):
                raise
            check_not_rotated(self.directory, step, e)
            raise CheckpointCorruptError(f"checkpoint {where} is unreadable: its meta JSON cannot be read "
                                         f"({type(e).__name__}: {str(e)[:300]})") from e
        sums = meta.pop("checksums", None)
        crc = meta.pop("meta_crc32", None)
        if crc is None and sums is None:
            log.warning("checkpoint %s predates checksums: restored unverified", where)
        elif crc != json_crc32({**meta, "checksums": sums}):
            raise CheckpointCorruptError(f"checkpoint {where} is corrupt: its meta JSON does not match its checksum")
        else:
            check_fits(target, sums["state"], where)
            if critic is not None:
                if "critic" not in sums:
                    raise CheckpointError(f"checkpoint {where} holds no critic state, and this run has a critic "
                                          f"(objective changed?)")
                check_fits(critic, sums["critic"], where)
        items = {"state": ocp.args.StandardRestore(abstract_like(target))}
        if critic is not None:
            items["critic"] = ocp.args.StandardRestore(abstract_like(critic))
        if meta.get("has_carry"):
            items["carry"] = ocp.args.StandardRestore()
        try:
            out = self.manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:  # noqa: BLE001 - a file missing, truncated or garbled
            if _is_out_of_memory(e):
                raise
            check_not_rotated(self.directory, step, e)
            raise CheckpointCorruptError(f"checkpoint {where} is unreadable ({type(e).__name__}: "
                                         f"{str(e)[:300]})") from e
        carry = None
        if meta.get("has_carry"):
            carry = {k: np.asarray(v) for k, v in out["carry"].items()}
        if sums is not None:
            verify(out["state"], sums["state"], where, "state")
            if carry is not None:
                verify(carry, sums.get("carry", {}), where, "carry")
            if critic is not None:
                verify(out["critic"], sums["critic"], where, "critic")
        return Restored(step, out["state"], meta, carry, [], out["critic"] if critic is not None else None)

    def restore_latest(self, target, *, critic=None) -> Restored | None:
        """The newest good checkpoint, after quarantining every newer corrupt one; None when there is
        no checkpoint at all. Raises CheckpointUnreadableError when none is readable."""
        self.wait()
        tried, quarantined = self.all_steps()[::-1], []
        for step in tried:
            try:
                return self.restore(step, target, critic=critic)._replace(quarantined=quarantined)
            except CheckpointCorruptError as e:
                moved_to = self._quarantine(step)
                quarantined.append(step)
                warnings.warn(f"{e}; moved it to {moved_to} (move it back to retry it) and trying the "
                              f"previous checkpoint", RuntimeWarning, stacklevel=2)
        earlier = sorted(p.name for p in self.quarantine_dir.iterdir()) if self.quarantine_dir.is_dir() else []
        if not tried and not earlier:
            return None
        raise CheckpointUnreadableError(
            f"no readable checkpoint in {self.directory}: "
            + (f"steps {tried} are corrupt or unreadable" if tried else "none left")
            + f"; quarantined in {self.quarantine_dir}: {earlier}. Refusing to restart from step 0 silently: "
              f"set {FRESH_START_KEY}=true to start the run afresh")

    def _quarantine(self, step: int) -> Path:
        """Moves checkpoint `step` out of Orbax's view, into checkpoints/corrupt/STEP-<time>."""
        stamp = time.strftime("%Y%m%dT%H%M%S")
        dest, n = self.quarantine_dir / f"{step}-{stamp}", 1
        while dest.exists():
            dest, n = self.quarantine_dir / f"{step}-{stamp}-{n}", n + 1
        if jax.process_index() == 0:  # one shared directory: one process moves it
            self.quarantine_dir.mkdir(exist_ok=True)
            (self.directory / str(step)).rename(dest)
        if jax.process_count() > 1:
            ocp.multihost.sync_global_processes(f"dapo_jax_quarantine_{step}")
        self.manager.reload()
        return dest
