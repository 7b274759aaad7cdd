"""Reading a checkpoint folder that a training run is rotating (it keeps only its newest
`train.keep_checkpoints`: Orbax deletes the older ones, file by file).

A read that fails because its checkpoint was deleted under it is `CheckpointRotatedError`, never corruption:
`check_not_rotated` tells the two apart after a failed read, waiting (up to ROTATION_GRACE_S) while files keep
disappearing from the folder. Readers retry the newest checkpoint up to ROTATION_RETRIES times in a row.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from dapo_jax.training.state.checkpoint_errors import CheckpointRotatedError

ROTATION_RETRIES = 5  # the newest deleted under a reader this many times in a row is no longer a race
ROTATION_GRACE_S = 2.0  # a failed read waits this long for a folder rotation is deleting file by file to vanish


def check_not_rotated(directory: Path, step: int, error: BaseException | None) -> None:
    """Raises CheckpointRotatedError when checkpoint `step`'s folder is gone (listed by Orbax a moment
    ago, then deleted by the training run's rotation): a read that failed because of it is no corruption.

    Rotation deletes a folder file by file, so a read can fail on a missing file while the folder is still
    there: after a failed read, while files keep disappearing from it (up to ROTATION_GRACE_S), this waits
    for the folder to go before calling the failure corruption."""
    folder = directory / str(step)
    if error is not None:
        wait_while_deleted(folder, ROTATION_GRACE_S)
    if not folder.is_dir():
        raise CheckpointRotatedError(
            f"checkpoint {directory}/{step} was deleted while it was read: the training run writing "
            f"there keeps only its newest train.keep_checkpoints; name a newer one, or the run dir for its "
            f"newest") from error


def wait_while_deleted(folder: Path, limit_s: float, still_s: float = 0.2) -> None:
    """Returns once `folder` is gone, its file count has held still `still_s`, or `limit_s` has passed."""
    deadline = time.monotonic() + limit_s
    count, moved = _file_count(folder), time.monotonic()
    while count is not None and (now := time.monotonic()) < deadline and now - moved < still_s:
        time.sleep(0.02)
        if (latest := _file_count(folder)) != count:
            count, moved = latest, time.monotonic()


def _file_count(folder: Path) -> int | None:
    """How many files `folder` holds now (None once it is gone)."""
    try:
        return sum(len(files) for _, _, files in os.walk(folder)) if folder.is_dir() else None
    except OSError:
        return None
