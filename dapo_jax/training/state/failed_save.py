"""A checkpoint save that failed: one line that says why, and nothing left waiting for it.

    raise save_failure(directory, step, error, last_good)   # CheckpointSaveError: folder, cause, last good step
    quiet_orbax_errors()                                     # once: Orbax's tracebacks of a failed save go to DEBUG
    release_orbax_threads()                                  # after a failure: the process can exit

An async Orbax save that fails (disk full, read-only or unwritable folder) raises at the next
`wait_until_finished`, as whatever Orbax or Tensorstore raised (an OSError, or a ValueError whose
message carries `os_error_code`), after logging one traceback per commit thread (a full disk gave
148); and its remaining commit threads, non-daemon, wait for signals of the failed step, so the
interpreter never exits. `checkpoint.Checkpointer` reports the failure once, as `CheckpointSaveError`
(exit 6), and releases those threads.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
import threading
import traceback
from pathlib import Path

from dapo_jax.parallel.stopped import RunStopped

log = logging.getLogger(__name__)


class CheckpointSaveError(RunStopped):
    """A checkpoint could not be written (disk full, read-only or unwritable folder, ...): the run stops."""

    exit_code = 6
    abandon_saves = True
    peer_may_be_the_cause = True  # Orbax's save runs collectives: a killed peer fails it here (PeerLost then)


# what a user can do about each errno: the cause as one phrase
_SAVE_CAUSES = {
    errno.ENOSPC: "no space left on the device (or no free inodes: `df -i`)",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EIO: "input/output error (a failing disk or a lost network mount)",
}


class RunDirWriteError(RunStopped):
    """A file of the run dir (`metrics.jsonl`, a logger's file) could not be written mid-run: the run stops
    at once (its metrics would be lost), with the same exit code as a failed checkpoint save."""

    exit_code = 6


def cause_of(e: OSError) -> str:
    """One phrase for an OS error: what the user can do about it, else its own words."""
    return _SAVE_CAUSES.get(e.errno, e.strerror or str(e))


def errno_of(e: BaseException) -> int | None:
    """The OS error number behind a save failure: an OSError's, or the `os_error_code` Tensorstore
    (Orbax's array writer) puts in its message, searched along the exception's causes."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno:
            return e.errno
        found = re.search(r"os_error_code='?(\d+)", str(e))
        if found:
            return int(found.group(1))
        e = e.__cause__ or e.__context__
    return None


def save_failure(directory: Path, step: int | None, e: BaseException, last_good: int | None) -> CheckpointSaveError:
    """The one-line error for a failed save of `step` into `directory`."""
    code = errno_of(e)
    if code in _SAVE_CAUSES:
        cause = f"{_SAVE_CAUSES[code]} [{errno.errorcode.get(code, code)}]"
    else:
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        cause = f"{type(e).__name__}: {first}"
    what = f"step {step}" if step is not None else "a checkpoint"
    good = f"the last good checkpoint is {directory}/{last_good}, intact" if last_good is not None else \
        "no checkpoint was completed"
    return CheckpointSaveError(f"could not save {what} in {directory}: {cause}; the run stopped ({good}). "
                               f"Fix the folder and rerun the same command to resume")


class _DemoteOrbaxErrors(logging.Filter):
    """Orbax logs a failed background save at ERROR with a traceback from each of its threads (a full
    disk gave 148 tracebacks); the run reports it once, as `CheckpointSaveError` (and a failed read as
    `CheckpointCorruptError`). Its ERROR records go to DEBUG (shown when absl's logger is at DEBUG)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and f"{os.sep}orbax{os.sep}" in record.pathname:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def quiet_orbax_errors() -> None:
    logger = logging.getLogger("absl")
    if not any(isinstance(f, _DemoteOrbaxErrors) for f in logger.filters):
        logger.addFilter(_DemoteOrbaxErrors())
    if not getattr(sys.excepthook, "_dapo_jax", False):
        sys.excepthook = _skipping_closed_loop_callbacks(sys.excepthook)
    if not getattr(sys.unraisablehook, "_dapo_jax", False):
        hook = sys.unraisablehook

        def unraisable(u):
            if not _is_closed_loop_echo(u.exc_type, u.exc_value, u.exc_traceback):
                hook(u)

        unraisable._dapo_jax = True
        sys.unraisablehook = unraisable


def _is_closed_loop_echo(kind, value, tb) -> bool:
    """Tensorstore completes the writes still in flight after a failed save's event loop has closed,
    and reports the RuntimeError of each callback it could not deliver (through `sys.unraisablehook`
    or `sys.excepthook`): echoes of the failed save, which `check` reports once."""
    frames = traceback.extract_tb(tb) if tb is not None else []
    return kind is RuntimeError and str(value) == "Event loop is closed" and bool(frames) and \
        all(f"{os.sep}asyncio{os.sep}" in frame.filename for frame in frames)


def _skipping_closed_loop_callbacks(hook):
    """`sys.excepthook` less the echoes of a failed save (`_is_closed_loop_echo`)."""

    def skip(kind, value, tb):
        if not _is_closed_loop_echo(kind, value, tb):
            hook(kind, value, tb)

    skip._dapo_jax = True
    return skip


def release_orbax_threads() -> None:
    """Cancels every live Orbax signalling thread and sends the signals it waits for, so it returns.

    After a failed save, Orbax's remaining commit threads wait (non-daemon, up to its 300 s
    coordination timeout, then again for the next operation) for "done" signals of the step that
    failed: the interpreter would never exit. Cancelled threads return without doing their work."""
    try:
        from orbax.checkpoint._src.futures import future as orbax_future
    except ImportError:  # another Orbax layout: nothing we know how to release
        return
    for t in threading.enumerate():
        if isinstance(t, orbax_future._SignalingThread) and t.is_alive():
            try:
                t.cancel()
                orbax_future.set_signals(t._receive_signals, operation_id=t._operation_id)
            except Exception as e:  # noqa: BLE001 - best effort: the CLI still exits (cli/__init__.py)
                log.debug("could not release Orbax thread %s: %s", t.name, e)
