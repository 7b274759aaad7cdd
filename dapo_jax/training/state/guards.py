"""What stops a run loudly instead of letting it end in a NaN model or a hang: non-finite updates,
preemption (SIGTERM, and SIGHUP: a closed terminal), Ctrl-C (SIGINT) and failed checkpoint saves, agreed between the processes of a
multi-process run.

    monitor = NonFiniteMonitor(max_consecutive=3)
    monitor.update(step, metrics["nonfinite_updates"])    # raises NonFiniteError on the K-th bad step in a row
    with Preemption(exit_until_armed=True) as pre:         # SIGTERM / SIGINT set pre.requested
        boundary = StepBoundary(pre, checkpointer)
        ...; if boundary.should_stop(step): save, then raise boundary.preempted(step, where)

Preemption notices reach the hosts of a pod at different moments. A process that saved and stopped on
its own while the others went on to the next step would leave both waiting forever in collectives
that no longer match, so every step boundary exchanges each process's flags (one tiny all-gather,
`parallel.host.process_flags`): a SIGTERM on any process makes all of them save the same step and
exit 143, a failed save on any of them stops all. Ctrl-C takes the same path, exiting 130 (128 +
SIGINT, what a shell reports for an interrupted command); a second Ctrl-C stops at once, without
waiting for the step (KeyboardInterrupt). Before the first step has completed there is nothing to
save: either signal then ends the process at once (a watcher thread woken by the signal, so that a
long compile does not delay it past the scheduler's grace period, or keep a user waiting).

The train step itself never applies a non-finite update (`training/update/train_step.py`); this module decides when
the run as a whole has gone wrong.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import warnings

import jax

from dapo_jax.parallel.host import process_flags
from dapo_jax.parallel.stopped import RunStopped
from dapo_jax.training.state.failed_save import CheckpointSaveError

PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM: what schedulers expect from a process that obeyed SIGTERM
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C
# SIGHUP (the terminal closed, an ssh session dropped) is a preemption too: save, then stop like SIGTERM
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class NonFiniteError(RunStopped):
    exit_code = 4


class Preempted(RunStopped):
    exit_code = PREEMPTED_EXIT_CODE


class Interrupted(Preempted):
    """Ctrl-C: saved like a preemption, exit 130."""

    exit_code = INTERRUPTED_EXIT_CODE


def _words(signum: int) -> str:
    return {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGHUP: "SIGHUP (the terminal closed)"}.get(signum, "SIGTERM")


def detach_from_a_closed_terminal() -> None:
    """After SIGHUP, stdout and stderr that were the closed terminal fail every write (EIO): pointed at
    /dev/null, the progress bar and the log lines of the step still running cannot stop it before the save."""
    for fd in (1, 2):
        try:
            if os.isatty(fd):
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, fd)
                os.close(null)
        except OSError:
            pass


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
    """Turns SIGTERM, SIGHUP and SIGINT into a flag the loop checks between steps (only in the main thread);
    `signum` is the first one received. A second SIGINT raises KeyboardInterrupt: stop now.

    With `exit_until_armed`, a signal that comes before `arm()` (the first step of this process's run
    completed: something to save) ends the process at once with exit 143 (SIGTERM) or 130 (SIGINT) and
    one line. Python runs signal handlers only between bytecodes of the main thread, which a compile
    holds for minutes, so a daemon thread woken through `signal.set_wakeup_fd` does it."""

    def __init__(self, *, exit_until_armed: bool = False):
        self.requested = False
        self.signum: int | None = None
        self.armed = not exit_until_armed
        self._interrupts = 0  # SIGINTs received once armed
        self._previous: dict[int, object] = {}
        self._previous_fd = None
        self._pipe: tuple[socket.socket, socket.socket] | None = None

    def _handler(self, signum, frame) -> None:
        if signum == signal.SIGHUP:
            detach_from_a_closed_terminal()
        if signum == signal.SIGINT and self.armed:
            self._interrupts += 1
            if self._interrupts > 1:
                raise KeyboardInterrupt  # Ctrl-C twice: do not wait for the step to end
        self._request(signum)

    def _request(self, signum: int) -> None:
        self.requested = True
        if self.signum is None:
            self.signum = signum

    def arm(self) -> None:
        """A step is done: from now on a signal is honoured at the next step boundary, with a save."""
        self.armed = True

    def _watch(self, reader: socket.socket) -> None:
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in (s for s in _SIGNALS if s in data):
                if signum == signal.SIGHUP:
                    detach_from_a_closed_terminal()
                if not self.armed:  # once armed, the main thread's handler alone counts the signals
                    self._request(signum)
                    code = INTERRUPTED_EXIT_CODE if signum == signal.SIGINT else PREEMPTED_EXIT_CODE
                    kind = "Interrupted" if signum == signal.SIGINT else "Preempted"
                    sys.stdout.flush()
                    sys.stderr.write(f"dapo-jax: {kind}: {_words(signum)} before the first step completed: nothing to "
                                     f"save, exiting now (exit {code}); rerun the same command to start or resume\n")
                    sys.stderr.flush()
                    os._exit(code)

    def __enter__(self) -> "Preemption":
        if threading.current_thread() is threading.main_thread():
            # a SIGHUP ignored by the caller (`nohup dapo-jax train`) stays ignored: the run outlives its terminal
            caught = [s for s in _SIGNALS if not (s == signal.SIGHUP and signal.getsignal(s) is signal.SIG_IGN)]
            self._previous = {s: signal.signal(s, self._handler) for s in caught}
            if not self.armed:
                reader, writer = socket.socketpair()
                writer.setblocking(False)
                self._pipe = (reader, writer)
                self._previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
                threading.Thread(target=self._watch, args=(reader,), name="dapo-jax-signals", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self._pipe is not None:
            signal.set_wakeup_fd(self._previous_fd)
            for end in self._pipe:  # the watcher's recv returns and it ends
                end.close()
            self._pipe = None
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous = {}


class StepBoundary:
    """What every process of the run must learn between two steps, and act on together.

    `should_stop(step)` arms the preemption (a step is done), checks the last async checkpoint save
    (`Checkpointer.check`) and exchanges both flags with the other processes: it raises the failed
    save's error when any process's save failed (every process stops at this boundary), and returns
    True when any process got SIGTERM or SIGINT (every process saves this step, then raises `preempted`)."""

    def __init__(self, preemption: Preemption, checkpointer):
        self.preemption = preemption
        self.checkpointer = checkpointer
        self.signalled: list[int] = []

    def should_stop(self, step: int) -> bool:
        self.preemption.arm()
        failure = None
        try:
            self.checkpointer.check()
        except RunStopped as e:
            failure = e
        flags = process_flags([self.preemption.requested, failure is not None])  # [processes, 2]
        if failure is not None:
            raise failure
        if flags[:, 1].any():
            raise CheckpointSaveError(
                f"process(es) {_listed(flags[:, 1])} could not save a checkpoint in {self.checkpointer.directory} "
                f"(their log says why); every process stopped at step {step}. Fix the folder and rerun the same "
                f"command to resume")
        self.signalled = _listed(flags[:, 0])
        return bool(self.signalled)

    def preempted(self, step: int, where) -> Preempted:
        """`Interrupted` (exit 130) when this process got Ctrl-C, else `Preempted` (exit 143: its own SIGTERM,
        or another process's signal)."""
        n = jax.process_count()
        who = f" (it reached process(es) {self.signalled} of {n}; all {n} saved and stopped)" if n > 1 else ""
        signum = self.preemption.signum if self.preemption.signum is not None else signal.SIGTERM
        kind = Interrupted if signum == signal.SIGINT else Preempted
        return kind(f"{_words(signum)} at step {step}{who}: checkpoint saved in {where}; rerun the same command to "
                    f"resume")


def _listed(flags) -> list[int]:
    return [int(p) for p in flags.nonzero()[0]]
