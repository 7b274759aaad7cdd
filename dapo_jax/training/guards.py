"""What stops a run loudly instead of letting it end in a NaN model: non-finite updates and preemption.

    monitor = NonFiniteMonitor(max_consecutive=3)
    monitor.update(step, metrics["nonfinite_updates"])    # raises NonFiniteError on the K-th bad step in a row
    with Preemption() as pre:                              # SIGTERM (TPU / cloud schedulers) sets pre.requested
        ...; if pre.requested: save and raise Preempted(step)

The train step itself never applies a non-finite update (`train_step.py`); this module decides when
the run as a whole has gone wrong.
"""

from __future__ import annotations

import signal
import threading
import warnings

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: what schedulers expect from a process that obeyed SIGTERM


class RunStopped(RuntimeError):
    """The run stopped before its last step; `exit_code` is what the CLI returns."""

    exit_code = 1


class NonFiniteError(RunStopped):
    exit_code = 4


class Preempted(RunStopped):
    exit_code = PREEMPTED_EXIT_CODE


class NonFiniteMonitor:
    """Counts consecutive steps with a skipped (non-finite) update; K in a row stops the run."""

    def __init__(self, max_consecutive: int, last_good_checkpoint=lambda: None):
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self.last_good_checkpoint = last_good_checkpoint

    def update(self, step: int, nonfinite_updates: float) -> None:
        if nonfinite_updates <= 0:
            self.consecutive = 0
            return
        self.consecutive += 1
        warnings.warn(f"step {step}: {int(nonfinite_updates)} update(s) had a non-finite loss, gradient, "
                      f"parameter or optimizer moment and were not applied "
                      f"({self.consecutive} step(s) in a row)", RuntimeWarning, stacklevel=2)
        if self.consecutive >= self.max_consecutive:
            good = self.last_good_checkpoint()
            raise NonFiniteError(
                f"stopped at step {step}: {self.consecutive} consecutive steps produced non-finite updates "
                f"(train.max_nonfinite_steps={self.max_consecutive}); the parameters were never overwritten. "
                f"Last good checkpoint: {good if good is not None else 'none'}. Lower optim.lr, check the "
                f"data and rewards, or resume from it.")


class Preemption:
    """Turns SIGTERM into a flag the loop checks between steps (only in the main thread)."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def _handler(self, signum, frame) -> None:
        self.requested = True

    def __enter__(self) -> "Preemption":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
