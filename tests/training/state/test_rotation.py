"""Rotation under a reader (dapo_jax/training/state/rotation.py): a read that fails while rotation is still
deleting the folder file by file is CheckpointRotatedError, a corrupt checkpoint whose folder stays is not."""

import threading
import time

import pytest

from dapo_jax.training.state import rotation
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
    with pytest.raises(CheckpointCorruptError):
        ckpt.restore(1, state(0))
    ckpt.close()


class _Clock:
    """time.monotonic and time.sleep of rotation.py, on a clock that moves only when it sleeps."""

    def __init__(self):
        self.now, self.sleeps = 0.0, 0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
        self.sleeps += 1


@pytest.mark.parametrize("deleted_for", [0, 5, 1000])
def test_the_wait_lasts_while_files_disappear_and_stops_once_the_count_holds_still(tmp_path, monkeypatch, deleted_for):
    """A folder nothing deletes from is left after `still_s` of a steady file count (10 polls), not after the
    whole grace; one losing a file at each of its first `deleted_for` polls is waited on that much longer;
    the grace bounds the wait however long deletion goes on."""
    folder = tmp_path / "3"
    folder.mkdir()
    for i in range(2000):
        (folder / f"f{i}").touch()
    clock = _Clock()
    monkeypatch.setattr(rotation, "time", clock)
    real_count = rotation._file_count

    def count_then_delete(f):
        if clock.sleeps and clock.sleeps <= deleted_for:  # rotation deletes one file between polls
            next(folder.iterdir()).unlink()
        return real_count(f)

    monkeypatch.setattr(rotation, "_file_count", count_then_delete)
    rotation.wait_while_deleted(folder, limit_s=2.0, still_s=0.2)
    # polls of 0.02 s: the count holds still 10 polls after the last deletion (11 when ten 0.02 s sum to
    # just under 0.2 s), or the 2 s grace (100 polls, 101 likewise) ends
    expected = min(deleted_for + 10, 100)
    assert expected <= clock.sleeps <= expected + 1
