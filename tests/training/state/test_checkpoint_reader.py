"""Read-only restores for eval and export (dapo_jax/training/state/checkpoint_reader.py): a corrupt newest is
skipped and nothing moved; while a real writer rotates, the newest is read bit-exactly and a rotated step is
never called corrupt."""

import subprocess
import sys
import warnings

import jax.numpy as jnp
import pytest

from dapo_jax.training.state.checkpoint_errors import (CheckpointCorruptError, CheckpointRotatedError,
                                                       CheckpointUnreadableError)
from dapo_jax.training.state.checkpoint_reader import restore_params
from tests.training.state.checkpoint_killer import big_state
from tests.training.state.test_checkpoint import ROOT, assert_same, flip_64_bytes, large, largest_file, save_steps, truncate


def test_restore_params_skips_a_corrupt_newest_and_moves_nothing(tmp_path):
    save_steps(tmp_path, (1, 2, 3))
    flip_64_bytes(largest_file(tmp_path / "3"))
    with pytest.warns(RuntimeWarning, match="3 is corrupt"):
        r = restore_params(tmp_path, large(0))
    assert r.step == 2
    assert_same(r.state, large(2))
    assert (tmp_path / "3").is_dir() and not (tmp_path / "corrupt").exists()
    with pytest.raises(CheckpointCorruptError, match="3 is corrupt"):
        restore_params(tmp_path, large(0), step=3)
    assert restore_params(tmp_path, large(0), step=1).step == 1
    for s in (1, 2):
        truncate(largest_file(tmp_path / str(s)))
    with pytest.warns(RuntimeWarning), pytest.raises(CheckpointUnreadableError, match=r"\[3, 2, 1\]"):
        restore_params(tmp_path, large(0))


def test_reads_while_a_writer_rotates_for_real_never_call_a_rotated_checkpoint_corrupt(tmp_path):
    """A process saves over and over (keep 2: Orbax deletes the older checkpoint at every save) while this
    one reads, as `eval` and `export` do during a training run. The newest is read bit-exactly (when it is
    deleted before or while it is read, the newest one then on disk is, with a warning saying so); a step
    named by number that rotation deleted is CheckpointRotatedError or FileNotFoundError, never corrupt."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.training.state.checkpoint_killer", str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    target = {k: jnp.zeros_like(v) for k, v in big_state(0).items()}
    read, met, outcomes = set(), 0, set()
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()[-2000:]
        for _ in range(6):  # the newest, while the writer rotates
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                r = restore_params(tmp_path, target)
            assert not [w for w in caught if "corrupt" in str(w.message)], [str(w.message) for w in caught]
            met += sum("was deleted while it was read" in str(w.message) for w in caught)
            assert_same(r.state, big_state(r.step))
            read.add(r.step)
        oldest = min(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit())
        for _ in range(40):  # one step by number, until rotation has deleted it
            try:
                r = restore_params(tmp_path, target, step=oldest)
                assert_same(r.state, big_state(oldest))
                outcomes.add("read")
            except (CheckpointRotatedError, FileNotFoundError) as e:
                outcomes.add(type(e).__name__)
                if isinstance(e, FileNotFoundError):
                    break
        assert proc.poll() is None, proc.stderr.read()[-2000:]  # the writer rotated all along
    finally:
        proc.kill()
        proc.wait()
    assert len(read) > 1 and "FileNotFoundError" in outcomes, (read, outcomes)
    print(f"newest read at steps {sorted(read)}, rotated under the reader {met} time(s); by number: {outcomes}")
