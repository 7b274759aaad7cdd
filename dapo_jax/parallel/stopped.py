"""`RunStopped`: the run stopped before its last step, with the exit code the CLI returns. Below both the
trainer's guards (`training/state/guards.py`: non-finite updates, preemption, failed saves) and a lost peer
process (`parallel/peers.py`), which both raise it."""


class RunStopped(RuntimeError):
    """The run stopped before its last step; `exit_code` is what the CLI returns. `abandon_saves`: the
    checkpoint save in flight cannot complete (it failed, or a peer process is gone): not waited for."""

    exit_code = 1
    abandon_saves = False


__all__ = ["RunStopped"]
