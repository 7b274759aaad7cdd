"""Read-only restores for eval and export: `restore_params`, the newest good checkpoint (or a given step),
moving nothing aside, while a training run may still be writing and rotating the folder (rotation.py).
"""

from __future__ import annotations

import warnings
from pathlib import Path

from dapo_jax.training.state.checkpoint import Checkpointer, Restored
from dapo_jax.training.state.checkpoint_errors import (CheckpointCorruptError, CheckpointRotatedError,
                                                       CheckpointUnreadableError)
from dapo_jax.training.state.rotation import ROTATION_RETRIES


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
