"""The run-level guards: K consecutive non-finite steps stop the run; SIGTERM and SIGINT become a flag."""

import os
import signal

import pytest

from dapo_jax.training.state.guards import NonFiniteError, NonFiniteMonitor, Preempted, Preemption, StepBoundary
from dapo_jax.parallel.stopped import RunStopped


def test_monitor_stops_on_the_kth_consecutive_bad_step_only():
    monitor = NonFiniteMonitor(3, last_good_checkpoint=lambda: 7)
    with pytest.warns(RuntimeWarning, match="step 1: 2 update"):
        monitor.update(1, 2.0)
    monitor.update(2, 0.0)  # a good step resets the count
    with pytest.warns(RuntimeWarning):
        monitor.update(3, 1.0)
        monitor.update(4, 1.0)
    with pytest.warns(RuntimeWarning), pytest.raises(NonFiniteError, match=r"step 5: 3 consecutive.*checkpoint: 7"):
        monitor.update(5, 1.0)


def test_exit_codes_are_distinct_and_non_zero():
    assert NonFiniteError.exit_code == 4 and Preempted.exit_code == 143
    assert issubclass(NonFiniteError, RunStopped) and issubclass(Preempted, RunStopped)


def test_sigterm_sets_the_flag_and_the_old_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with Preemption() as pre:
        assert not pre.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert pre.requested
    assert signal.getsignal(signal.SIGTERM) is before


class FakeCheckpointer:
    directory = "/runs/x/checkpoints"

    def __init__(self, error=None):
        self.error = error

    def check(self):
        if self.error is not None:
            raise self.error


def test_the_step_boundary_stops_for_a_sigterm_or_a_failed_save_and_arms_the_preemption():
    from dapo_jax.training.state.checkpoint import CheckpointSaveError

    pre = Preemption(exit_until_armed=True)
    boundary = StepBoundary(pre, FakeCheckpointer())
    assert not pre.armed and not boundary.should_stop(1) and pre.armed  # a step is done: something to save
    pre.requested = True
    assert boundary.should_stop(2) and boundary.signalled == [0]
    assert "SIGTERM at step 2: checkpoint saved in /runs" in str(boundary.preempted(2, "/runs/x/checkpoints"))
    failed = CheckpointSaveError("could not save step 2 in /runs/x/checkpoints: read-only")
    with pytest.raises(CheckpointSaveError, match="read-only"):  # a failed save wins over the SIGTERM
        StepBoundary(pre, FakeCheckpointer(failed)).should_stop(3)
    assert failed.exit_code == 6 and failed.abandon_saves


def test_sigterm_before_arming_ends_the_process_at_once_even_inside_a_long_c_call():
    """The watcher thread, woken through the signal's wakeup fd, ends the process while the main thread
    is still busy (here in a long sleep, which the flag alone would not end; in a run, an XLA compile,
    during which the main thread runs no Python signal handler at all)."""
    code, err = signal_before_arming(signal.SIGTERM)
    assert code == 143 and "SIGTERM before the first step completed: nothing to save" in err


def signal_before_arming(sig) -> tuple[int, str]:
    """`sig` to a process sleeping 120 s in an unarmed Preemption: (exit code, stderr)."""
    import subprocess
    import sys

    code = ("import os, signal, time; from dapo_jax.training.state.guards import Preemption\n"
            "with Preemption(exit_until_armed=True):\n"
            "    print('ready', flush=True); time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)  # a bound against a hang: the sleep alone is 120 s
    return proc.returncode, err


def test_sigint_is_a_preemption_that_exits_130_and_a_second_one_stops_at_once():
    """Ctrl-C takes SIGTERM's path (a flag, a save at the step boundary) with the shell's exit code 130; a
    second Ctrl-C raises KeyboardInterrupt instead of waiting for the step; the old handlers come back."""
    from dapo_jax.training.state.guards import Interrupted

    assert Interrupted.exit_code == 130 and issubclass(Interrupted, Preempted)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with Preemption() as pre:
        os.kill(os.getpid(), signal.SIGINT)
        assert pre.requested and pre.signum == signal.SIGINT
        boundary = StepBoundary(pre, FakeCheckpointer())
        assert boundary.should_stop(4)
        stop = boundary.preempted(4, "/runs/x/checkpoints")
        assert type(stop) is Interrupted and stop.exit_code == 130
        assert str(stop).startswith("Ctrl-C (SIGINT) at step 4: checkpoint saved in /runs/x/checkpoints")
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_the_first_signal_names_the_stop():
    with Preemption() as pre:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # one Ctrl-C after a SIGTERM: still the first signal's exit
        stop = StepBoundary(pre, FakeCheckpointer()).preempted(1, "/x")
    assert type(stop) is Preempted and stop.exit_code == 143


def test_sigint_before_arming_ends_the_process_at_once_with_130():
    code, err = signal_before_arming(signal.SIGINT)
    assert code == 130, err
    assert err.strip().splitlines() == ["dapo-jax: Interrupted: Ctrl-C (SIGINT) before the first step completed: "
                                        "nothing to save, exiting now (exit 130); rerun the same command to start or "
                                        "resume"]


def test_sighup_is_caught_unless_the_caller_ignores_it():
    """SIGHUP (a closed terminal) saves and stops like SIGTERM; under `nohup`, which ignores it, the run
    keeps ignoring it and outlives its terminal."""
    before = signal.getsignal(signal.SIGHUP)
    try:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        with Preemption() as pre:
            signal.raise_signal(signal.SIGHUP)
            assert pre.requested and pre.signum == signal.SIGHUP
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with Preemption() as pre:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            signal.raise_signal(signal.SIGHUP)
            assert not pre.requested
    finally:
        signal.signal(signal.SIGHUP, before)
