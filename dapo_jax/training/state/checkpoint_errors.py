"""What can go wrong with a run's checkpoint: the errors the checkpoint modules raise.

`CheckpointError` is the user's to fix (exit code 2 in the CLI); the others narrow it down: corrupt (a file
unreadable or not matching its checksums), unreadable (none of the checkpoints is good), rotated (deleted
by the writing run's rotation while it was read: not corrupt) and non-finite (a save refused). A failed
save is `failed_save.CheckpointSaveError` (exit 6).
"""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or used as asked."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint's files cannot be read or do not match the checksums recorded at save time."""


class CheckpointUnreadableError(CheckpointError):
    """Checkpoints exist but none of them is readable."""


class CheckpointRotatedError(CheckpointError):
    """The checkpoint was deleted before or while it was read: the training run writing into the folder
    keeps only its newest `train.keep_checkpoints` (Orbax deletes the older ones). Not a corrupt one."""


class NonFiniteStateError(CheckpointError):
    """`save` refused a state holding NaN or inf; nothing was written."""
