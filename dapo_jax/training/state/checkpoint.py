"""Orbax checkpoints of a run: everything needed to resume bit-exactly, verified on every read.

    ckpt = Checkpointer(run_dir / "checkpoints", keep=3)
    ckpt.save(step, train_state, meta={"rng": ..., "stream": ...}, carry=groups_or_None)   # async
    restored = ckpt.restore_latest(abstract_train_state)   # None when there is nothing to resume

Each checkpoint holds three items: `state` (params, optimizer state, counters: restored onto the
target's shardings, so a run may resume on a different mesh shape), `meta` (JSON: step, RNG key,
prompt-stream position, ...) and, when present, `carry` (kept groups carried to the next step) and
`critic` (the value model's state of PPO / VAPO: `save(..., critic=...)`, `restore(..., critic=target)`).

A checkpoint never fails silently:

- **Verified on read.** `save` records in `meta` the CRC-32 of every array of `state` and `carry`
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

`restore_params` (eval, export) reads without moving anything: it skips a corrupt newest checkpoint
with a warning, raises `CheckpointUnreadableError` when none is good, and `CheckpointCorruptError`
when the `step` asked for is corrupt.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
import zlib
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from dapo_jax.training.state.failed_save import (CheckpointSaveError, errno_of, quiet_orbax_errors, release_orbax_threads,
                                                 save_failure)

log = logging.getLogger(__name__)

FRESH_START_KEY = "train.fresh_start"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or used as asked."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint's files cannot be read or do not match the checksums recorded at save time."""


class CheckpointUnreadableError(CheckpointError):
    """Checkpoints exist but none of them is readable."""


class CheckpointRotatedError(CheckpointError):
    """The checkpoint was deleted before or while it was read: the training run writing into the folder
    keeps only its newest `train.keep_checkpoints` (Orbax deletes the older ones). Not a corrupt one."""


ROTATION_RETRIES = 5  # the newest deleted under a reader this many times in a row is no longer a race
ROTATION_GRACE_S = 2.0  # a failed read waits this long for a folder rotation is deleting file by file to vanish


class NonFiniteStateError(CheckpointError):
    """`save` refused a state holding NaN or inf; nothing was written."""


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


def _crc32(data) -> str:
    return f"{zlib.crc32(data):08x}"


def _json_crc32(obj) -> str:
    return _crc32(json.dumps(obj, sort_keys=True).encode())


def _host(x) -> np.ndarray | None:
    """The whole array on this host; None for an array sharded over several hosts."""
    if isinstance(x, jax.Array):
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        if not x.is_fully_addressable:
            return None
        return np.asarray(jax.device_get(x))
    return np.asarray(x)


def _fingerprints(tree, *, refuse_non_finite: str | None = None) -> dict[str, dict]:
    """Tree path -> {crc32, shape, dtype} of every leaf; crc32 None for a multi-host array.

    With `refuse_non_finite` (the checkpoint's name), a float leaf holding NaN or inf raises
    NonFiniteStateError."""
    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = jax.tree_util.keystr(path)
        host = _host(x)
        dtype = x.dtype if host is None else host.dtype
        if refuse_non_finite and jnp.issubdtype(dtype, jnp.inexact):
            finite = bool(jnp.isfinite(x).all()) if host is None else bool(np.isfinite(host).all())
            if not finite:
                detail = "" if host is None else f" ({np.isnan(host).sum()} NaN, {np.isinf(host).sum()} inf)"
                raise NonFiniteStateError(f"refusing to save {refuse_non_finite}: state leaf {name} is not "
                                          f"finite{detail}; nothing was written")
        crc = None if host is None else _crc32(np.ascontiguousarray(host).reshape(-1).view(np.uint8))
        out[name] = {"crc32": crc, "shape": list(np.shape(x)), "dtype": str(dtype)}
    return out


def _verify(tree, record: dict[str, dict], where: str, item: str) -> None:
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = jax.tree_util.keystr(path)
        rec = record.get(name)
        if rec is None:
            raise CheckpointCorruptError(f"checkpoint {where} is corrupt: {item} leaf {name} has no checksum record")
        host = _host(x)
        if rec["crc32"] is None or host is None or str(host.dtype) != rec["dtype"]:
            continue  # multi-host array or a deliberate cast: nothing to compare
        if _crc32(np.ascontiguousarray(host).reshape(-1).view(np.uint8)) != rec["crc32"]:
            raise CheckpointCorruptError(f"checkpoint {where} is corrupt: {item} leaf {name} does not match "
                                         f"the checksum recorded when it was saved")


def _check_fits(target, record: dict[str, dict], where: str) -> None:
    """An intact record that does not fit the target is a changed config, not a corrupt file."""
    leaves = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(target)[0]}
    missing, extra = sorted(record.keys() - leaves.keys()), sorted(leaves.keys() - record.keys())
    if missing or extra:
        raise CheckpointError(f"checkpoint {where} does not fit the restore target: saved leaves not in the "
                              f"target {missing[:3]}, target leaves not saved {extra[:3]} (model or optimizer "
                              f"changed?)")
    for name, x in leaves.items():
        if list(np.shape(x)) != record[name]["shape"]:
            raise CheckpointError(f"checkpoint {where} does not fit the restore target: {name} was saved with "
                                  f"shape {tuple(record[name]['shape'])}, the target has {tuple(np.shape(x))}")


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
        sums = {"state": _fingerprints(state, refuse_non_finite=f"checkpoint {self.directory}/{step}")}
        items = {"state": ocp.args.StandardSave(state)}
        if critic is not None:
            sums["critic"] = _fingerprints(critic, refuse_non_finite=f"checkpoint {self.directory}/{step}")
            items["critic"] = ocp.args.StandardSave(critic)
        if carry is not None:
            carry = {k: np.asarray(v) for k, v in carry.items()}
            sums["carry"] = _fingerprints(carry)
            items["carry"] = ocp.args.StandardSave(carry)
        record = json.loads(json.dumps({**meta, "step": step, "has_carry": carry is not None, "checksums": sums}))
        record["meta_crc32"] = _json_crc32(record)
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
        self._check_not_rotated(step, None)
        try:
            meta = dict(self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])
        except Exception as e:  # noqa: BLE001 - any failure to read the JSON is a corrupt checkpoint
            if _is_out_of_memory(e):
                raise
            self._check_not_rotated(step, e)
            raise CheckpointCorruptError(f"checkpoint {where} is unreadable: its meta JSON cannot be read "
                                         f"({type(e).__name__}: {str(e)[:300]})") from e
        sums = meta.pop("checksums", None)
        crc = meta.pop("meta_crc32", None)
        if crc is None and sums is None:
            log.warning("checkpoint %s predates checksums: restored unverified", where)
        elif crc != _json_crc32({**meta, "checksums": sums}):
            raise CheckpointCorruptError(f"checkpoint {where} is corrupt: its meta JSON does not match its checksum")
        else:
            _check_fits(target, sums["state"], where)
            if critic is not None:
                if "critic" not in sums:
                    raise CheckpointError(f"checkpoint {where} holds no critic state, and this run has a critic "
                                          f"(objective changed?)")
                _check_fits(critic, sums["critic"], where)
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
            self._check_not_rotated(step, e)
            raise CheckpointCorruptError(f"checkpoint {where} is unreadable ({type(e).__name__}: "
                                         f"{str(e)[:300]})") from e
        carry = None
        if meta.get("has_carry"):
            carry = {k: np.asarray(v) for k, v in out["carry"].items()}
        if sums is not None:
            _verify(out["state"], sums["state"], where, "state")
            if carry is not None:
                _verify(carry, sums.get("carry", {}), where, "carry")
            if critic is not None:
                _verify(out["critic"], sums["critic"], where, "critic")
        return Restored(step, out["state"], meta, carry, [], out["critic"] if critic is not None else None)

    def _check_not_rotated(self, step: int, error: BaseException | None) -> None:
        """Raises CheckpointRotatedError when checkpoint `step`'s folder is gone (listed by Orbax a moment
        ago, then deleted by the training run's rotation): a read that failed because of it is no corruption.

        Rotation deletes a folder file by file, so a read can fail on a missing file while the folder is still
        there: after a failed read, while files keep disappearing from it (up to ROTATION_GRACE_S), this waits
        for the folder to go before calling the failure corruption."""
        folder = self.directory / str(step)
        if error is not None:
            _wait_while_deleted(folder, ROTATION_GRACE_S)
        if not folder.is_dir():
            raise CheckpointRotatedError(
                f"checkpoint {self.directory}/{step} was deleted while it was read: the training run writing "
                f"there keeps only its newest train.keep_checkpoints; name a newer one, or the run dir for its "
                f"newest") from error

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


def _wait_while_deleted(folder: Path, limit_s: float, still_s: float = 0.2) -> None:
    """Returns once `folder` is gone, its file count has held still `still_s`, or `limit_s` has passed."""
    deadline = time.monotonic() + limit_s
    count, moved = _file_count(folder), time.monotonic()
    while count is not None and (now := time.monotonic()) < deadline and now - moved < still_s:
        time.sleep(0.02)
        if (latest := _file_count(folder)) != count:
            count, moved = latest, time.monotonic()


def _file_count(folder: Path) -> int | None:
    """How many files `folder` holds now (None once it is gone)."""
    try:
        return sum(len(files) for _, _, files in os.walk(folder)) if folder.is_dir() else None
    except OSError:
        return None


def _reader(directory) -> Checkpointer:
    """A Checkpointer to read from. Orbax lists the step folders, then reads each one's time: a step that a
    training run's rotation deleted in between fails the listing (FileNotFoundError), which is listed again."""
    for attempt in range(ROTATION_RETRIES + 1):
        try:
            return Checkpointer(directory, async_save=False)
        except FileNotFoundError:
            if attempt == ROTATION_RETRIES:
                raise
    raise AssertionError("unreachable")


def restore_params(checkpoint_dir: str | Path, target, step: int | None = None) -> Restored:
    """A checkpoint (newest good one when `step` is None) for eval and export: read-only, verified.

    Skips a corrupt newest checkpoint with a RuntimeWarning; when a training run's rotation deletes the
    newest before or while it is read, reads the newest one then on disk (a RuntimeWarning says so).
    Raises CheckpointUnreadableError when none is good, CheckpointCorruptError when `step` is given and
    corrupt, CheckpointRotatedError when `step` is given and was deleted, FileNotFoundError when there is
    no checkpoint."""
    ckpt = _reader(checkpoint_dir)
    try:
        if step is not None:
            return ckpt.restore(step, target)
        for _ in range(ROTATION_RETRIES + 1):
            steps = ckpt.all_steps()[::-1]
            if not steps:
                raise FileNotFoundError(f"no checkpoint in {checkpoint_dir}")
            try:
                for s in steps:
                    try:
                        return ckpt.restore(s, target)
                    except CheckpointCorruptError as e:
                        warnings.warn(f"{e}; using the previous checkpoint", RuntimeWarning, stacklevel=2)
            except CheckpointRotatedError as e:
                warnings.warn(f"{e}: reading the newest one now", RuntimeWarning, stacklevel=2)
                ckpt.close()
                ckpt = _reader(checkpoint_dir)  # the steps on disk now
                continue
            raise CheckpointUnreadableError(f"no readable checkpoint in {checkpoint_dir}: steps {steps} are all "
                                            f"corrupt or unreadable")
        raise CheckpointUnreadableError(f"no readable checkpoint in {checkpoint_dir}: the newest was deleted while "
                                        f"it was read {ROTATION_RETRIES + 1} times in a row (a training run saving "
                                        f"faster than it can be read?)")
    finally:
        ckpt.close()
