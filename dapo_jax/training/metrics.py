"""Per-step metrics: one JSON object per line in RUN_DIR/metrics.jsonl, the same to TensorBoard / W&B.

    writer = MetricsWriter(run_dir, loggers=make_loggers(cfg, run_dir))   # or tensorboard=True
    writer.write(step, {"reward_mean": 0.1, ...})      # appended and flushed at once
    compile_count()                                    # XLA compilations in this process so far

A line is flushed as soon as it is written, so a killed run loses nothing already logged. After a
resume the same step may appear twice (logged, then redone from the checkpoint); readers keep the
last line of each step (`read_metrics`).

A process killed in the middle of a write (power loss, SIGKILL) can leave a torn last line; the next
row appended to it would be glued onto the fragment and lost with it. The writer repairs the file
before its first row: a last line that is a whole JSON row only lacks its newline and gets it; any
other fragment is moved to `metrics.jsonl.torn-<time>` and cut from the file, with a warning. A
resumed run (`resumed_from` > 0) whose metrics.jsonl is gone says so: the rows up to that step are lost.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import threading
import time
import warnings
from pathlib import Path

import jax
import numpy as np

from dapo_jax.training.loggers import TensorBoardLogger, scalars
from dapo_jax.training.state.failed_save import RunDirWriteError, cause_of

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_compiles = 0
_lock = threading.Lock()
_registered = False


def _on_event(event: str, duration: float, **_) -> None:
    global _compiles
    if event == _COMPILE_EVENT:
        with _lock:
            _compiles += 1


def compile_count() -> int:
    """Backend compilations since the first call (installs a `jax.monitoring` listener once)."""
    global _registered
    if not _registered:
        jax.monitoring.register_event_duration_secs_listener(_on_event)
        _registered = True
    return _compiles


def _plain(value):
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    try:
        f = float(np.asarray(value))
    except (TypeError, ValueError):
        return str(value)
    return f if math.isfinite(f) else None if math.isnan(f) else (math.inf if f > 0 else -math.inf)


class MetricsWriter:
    """Appends `{"step": s, **metrics}` lines to metrics.jsonl and the finite scalars to the loggers."""

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True, enabled: bool = True,
                 loggers: list | None = None, resumed_from: int = 0):
        """`enabled=False` (every process but 0 of a multi-process run) writes nothing at all.
        `loggers` (`dapo_jax.training.loggers`): None = TensorBoard if `tensorboard`. `resumed_from`:
        the step the run resumed from (0: a new run), to warn when its metrics.jsonl is missing."""
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self._file = None
        self._loggers = []
        self._failed = False  # a write failed: close() drops what the file still holds
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resumed_from > 0 and not self.path.exists():
            warnings.warn(f"{self.path} is missing although the run resumes from step {resumed_from}: the metrics of "
                          f"steps up to {resumed_from} are lost; it starts again with step {resumed_from + 1}",
                          RuntimeWarning, stacklevel=2)
        repair_torn_line(self.path)
        self._file = open(self.path, "a", buffering=1)
        if loggers is None:
            loggers = [TensorBoardLogger(run_dir)] if tensorboard else []
        self._loggers = list(loggers)

    def write(self, step: int, metrics: dict) -> dict:
        """Appends the row; a full disk (or any OS error) stops the run: `RunDirWriteError`, one line."""
        row = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        if not self.enabled:
            return row
        where = self.path
        try:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
            if self._loggers:
                for logger in self._loggers:
                    where = f"{type(logger).__name__}'s files in {self.path.parent}"
                    logger.log(int(step), scalars(row))
        except OSError as e:
            self._failed = True
            raise RunDirWriteError(f"cannot write {where} at step {step}: {cause_of(e)}; the run stopped (rows up to "
                                   f"the last complete line are kept); free the space and rerun the same command to "
                                   f"resume from the last checkpoint") from None
        return row

    def close(self) -> None:
        """Closes the file and the loggers; after a failed write, what they still hold is dropped."""
        for closer in ([self._file.close] if self._file is not None else []) + [lg.close for lg in self._loggers]:
            try:
                closer()
            except OSError:
                if not self._failed:
                    raise


def repair_torn_line(path: Path) -> Path | None:
    """Makes `path` end with a newline before rows are appended (module docstring). Returns where a torn
    fragment was moved (None: nothing to repair, or a whole row that only lacked its newline)."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(size - 1, 0))
        if f.read(1) == b"\n":
            return None
        start = size  # the last line starts after the last newline: search back in blocks
        while start > 0:
            block = min(start, 1 << 16)
            f.seek(start - block)
            cut = f.read(block).rfind(b"\n")
            if cut >= 0:
                start = start - block + cut + 1
                break
            start -= block
        f.seek(start)
        fragment = f.read()
        try:
            whole = isinstance(json.loads(fragment), dict)
        except ValueError:
            whole = False
        if whole:  # killed between the row and its newline: nothing lost
            f.seek(size)
            f.write(b"\n")
            return None
        aside = path.with_name(f"{path.name}.torn-{time.strftime('%Y%m%dT%H%M%S')}")
        aside.write_bytes(fragment)
        f.truncate(start)
    warnings.warn(f"{path} ended in a torn line ({len(fragment)} bytes: the process writing it was killed mid-write); "
                  f"moved it to {aside} and cut it from the file, so the next rows start on a line of their own",
                  RuntimeWarning, stacklevel=3)
    return aside


def read_metrics(run_dir_or_file: str | Path) -> list[dict]:
    """The rows of metrics.jsonl in step order, the last line of each step winning (resumes redo steps).

    Rows with the same step but different kinds (train / eval) are merged, later keys winning. A chain of
    stages' combined file (training/stages.py) counts `step` over the chain, so a stage's last step and the
    next stage's step-0 evaluation share a step: rows are kept apart by `stage_index` there.
    A torn last line (the process was killed mid-write) is ignored. A folder whose metrics were archived
    as `metrics.jsonl.gz` (scripts/archive_runs.py) is read from that.
    """
    path = Path(run_dir_or_file)
    if path.is_dir():
        path = path / "metrics.jsonl"
        if not path.exists() and path.with_suffix(".jsonl.gz").exists():
            path = path.with_suffix(".jsonl.gz")
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    by_step: dict[tuple[int, int], dict] = {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "step" in row:
            by_step.setdefault((int(row.get("stage_index", 0)), int(row["step"])), {}).update(row)
    return [by_step[s] for s in sorted(by_step)]
