"""What the CLI sets up before it imports anything heavy (JAX, the data and reward stack: seconds).

    from dapo_jax import startup
    startup.prepare()          # first thing in dapo_jax/cli/__init__.py

- A SIGTERM or SIGHUP before the run's own handlers are in place (imports, reading the config, loading the
  data) ends the process with one line and exit 143, as one during loading or compiling does
  (`training/state/guards.py`), instead of a silent death by the signal. Ctrl-C there is Python's
  KeyboardInterrupt, which the CLI already turns into one line.
- A terminal that closes (SIGHUP: the window closed, an ssh session dropped) fails every later write to it;
  `sys.stdout` / `sys.stderr` on a terminal then write to /dev/null instead of raising, so that the run
  goes on to save (the log and metrics are in the run dir).
- libtpu (installed by the `[tpu]` extra, and by `[test]`) is loaded by JAX on any machine and, where no
  TPU is visible, prints five lines of start-up errors that look like a crash: on such a host JAX's
  backends are the CPU's (`quiet_libtpu`). A TPU host, a GPU plugin, or a `JAX_PLATFORMS` the user set
  is left alone.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import signal
import sys

PREEMPTED_EXIT_CODE = 143  # as training/state/guards.py: what schedulers expect from a process that obeyed SIGTERM
_EARLY_SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP (the terminal closed)"}
GPU_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin")


def _stop_before_the_run(signum, frame) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.write(f"dapo-jax: Preempted: {_EARLY_SIGNALS[signum]} while starting (imports, config, data): "
                         f"nothing to save, exiting now (exit {PREEMPTED_EXIT_CODE}); rerun the same command to start "
                         f"or resume\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # the terminal that would show it is gone (SIGHUP)
        pass
    os._exit(PREEMPTED_EXIT_CODE)


def stop_on_early_signals() -> None:
    """One line and exit 143 on SIGTERM / SIGHUP until the run installs its own handlers (only where the
    signal still has its default action: an embedding program's own handler is left alone)."""
    for signum in _EARLY_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, _stop_before_the_run)


def tpu_visible() -> bool:
    """Whether this host has a TPU: the device files TPU VMs have, or `TPU_ACCELERATOR_TYPE` set."""
    return (any(os.path.exists(p) for p in ("/dev/accel0", "/dev/vfio/0"))
            or bool(os.environ.get("TPU_ACCELERATOR_TYPE")))


def quiet_libtpu() -> None:
    """On a host without a TPU where libtpu is installed, JAX's backends are the CPU's, so that libtpu is
    never started (it prints its failures to find a TPU before any log level applies). Left alone: a TPU
    host, a `JAX_PLATFORMS` the user set, a GPU plugin installed (JAX then picks the GPU). A plan for a TPU
    slice still compiles through libtpu's own topology API (`training/plan/slices.py`)."""
    if os.environ.get("JAX_PLATFORMS") or tpu_visible() or importlib.util.find_spec("libtpu") is None:
        return
    if any(importlib.util.find_spec(m) for m in GPU_PLUGINS):
        return
    os.environ["JAX_PLATFORMS"] = "cpu"
    if "jax" in sys.modules:  # JAX read the variable when it was imported
        import jax

        jax.config.update("jax_platforms", "cpu")


class _TerminalStream:
    """`sys.stdout` / `sys.stderr` on a terminal. When the terminal closes, every write to it fails with EIO,
    possibly before the SIGHUP handler has run: the first such write points the descriptor at /dev/null and
    is dropped, so that a print or the progress bar cannot end the run before it saves."""

    def __init__(self, stream):
        self._stream = stream

    def _gone(self) -> None:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._stream.fileno())
        os.close(null)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            if e.errno != errno.EIO:
                raise
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            if e.errno != errno.EIO:
                raise
            self._gone()
            self._stream.flush()  # what was buffered goes to /dev/null

    def __getattr__(self, name):
        return getattr(self._stream, name)


def survive_a_closed_terminal() -> None:
    """`sys.stdout` and `sys.stderr` that are a terminal wrapped in `_TerminalStream`."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            tty = stream is not None and not isinstance(stream, _TerminalStream) and os.isatty(stream.fileno())
        except (OSError, ValueError, AttributeError):  # no descriptor (a captured stream)
            tty = False
        if tty:
            setattr(sys, name, _TerminalStream(stream))


def prepare() -> None:
    stop_on_early_signals()
    survive_a_closed_terminal()
    quiet_libtpu()


__all__ = ["prepare", "quiet_libtpu", "stop_on_early_signals", "survive_a_closed_terminal", "tpu_visible"]
