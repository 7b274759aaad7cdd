"""Per-step metrics: one JSON object per line in RUN_DIR/metrics.jsonl, the same to TensorBoard / W&B.

    writer = MetricsWriter(run_dir, loggers=make_loggers(cfg, run_dir))   # or tensorboard=True
    writer.write(step, {"reward_mean": 0.1, ...})      # appended and flushed at once
    compile_count()                                    # XLA compilations in this process so far

A line is flushed as soon as it is written, so a killed run loses nothing already logged. After a
resume the same step may appear twice (logged, then redone from the checkpoint); readers keep the
last line of each step (`read_metrics`).
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import jax
import numpy as np

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
                 loggers: list | None = None):
        """`enabled=False` (every process but 0 of a multi-process run) writes nothing at all.
        `loggers` (`dapo_jax.training.loggers`): None = TensorBoard if `tensorboard`."""
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self._file = None
        self._loggers = []
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1)
        if loggers is None:
            from dapo_jax.training.loggers import TensorBoardLogger

            loggers = [TensorBoardLogger(run_dir)] if tensorboard else []
        self._loggers = list(loggers)

    def write(self, step: int, metrics: dict) -> dict:
        row = {"step": int(step), **{k: _plain(v) for k, v in metrics.items()}}
        if not self.enabled:
            return row
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._loggers:
            from dapo_jax.training.loggers import scalars

            for logger in self._loggers:
                logger.log(int(step), scalars(row))
        return row

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        for logger in self._loggers:
            logger.close()


def read_metrics(run_dir_or_file: str | Path) -> list[dict]:
    """The rows of metrics.jsonl in step order, the last line of each step winning (resumes redo steps).

    Rows with the same step but different kinds (train / eval) are merged, later keys winning.
    A torn last line (the process was killed mid-write) is ignored.
    """
    path = Path(run_dir_or_file)
    if path.is_dir():
        path = path / "metrics.jsonl"
    by_step: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "step" in row:
            by_step.setdefault(int(row["step"]), {}).update(row)
    return [by_step[s] for s in sorted(by_step)]
