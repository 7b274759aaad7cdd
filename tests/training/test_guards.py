"""The run-level guards: K consecutive non-finite steps stop the run; SIGTERM becomes a flag."""

import os
import signal

import pytest

from dapo_jax.training.guards import NonFiniteError, NonFiniteMonitor, Preempted, Preemption, RunStopped


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
