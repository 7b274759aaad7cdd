"""Rotation under a reader (dapo_jax/training/state/rotation.py): a read that fails while rotation is still
deleting the folder file by file is CheckpointRotatedError, a corrupt checkpoint whose folder stays is not."""

import threading
import time

import pytest

from dapo_jax.training.state.checkpoint import Checkpointer
from dapo_jax.training.state.checkpoint_errors import CheckpointCorruptError, CheckpointRotatedError
from tests.training.state.test_checkpoint import save_steps, state


def test_a_folder_rotation_is_still_deleting_is_rotated_not_corrupt(tmp_path, monkeypatch):
    """Rotation deletes a step folder file by file: a read can fail on a file already gone while the folder
    is still there (seen in CI). That read is CheckpointRotatedError, not corruption; a corrupt checkpoint
    whose folder stays is still CheckpointCorruptError."""
    save_steps(tmp_path, [1, 2], make=state)
    ckpt = Checkpointer(tmp_path, async_save=False)
    real_restore = ckpt.manager.restore
    folder = tmp_path / "2"

    def delete_slowly():
        for p in sorted((p for p in folder.rglob("*") if p.is_file()), reverse=True):
            p.unlink()
            time.sleep(0.01)
        for p in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            p.rmdir()
        folder.rmdir()

    def restore_during_deletion(step, args):
        if "state" in args:  # the meta was read; rotation starts deleting now
            threading.Thread(target=delete_slowly).start()
            time.sleep(0.005)
            raise FileNotFoundError(f"{folder}/state/manifest.ocdbt")
        return real_restore(step, args=args)

    monkeypatch.setattr(ckpt.manager, "restore", restore_during_deletion)
    with pytest.raises(CheckpointRotatedError):
        ckpt.restore(2, state(0))
    assert not folder.exists()
    monkeypatch.setattr(ckpt.manager, "restore", lambda step, args: (_ for _ in ()).throw(
        FileNotFoundError("gone")) if "state" in args else real_restore(step, args=args))
    t0 = time.monotonic()
    with pytest.raises(CheckpointCorruptError):
        ckpt.restore(1, state(0))
    assert time.monotonic() - t0 < 1.5  # a folder nothing deletes from is not waited on for long
    ckpt.close()
