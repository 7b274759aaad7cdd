"""A checkpoint's checksums (dapo_jax/training/state/checksums.py), met through save and restore: flipped bytes
name the bad leaf, a NaN/inf state is refused with nothing written, a target of another shape is a changed
config (CheckpointError), not corruption."""

import numpy as np
import pytest

from dapo_jax.training.state.checkpoint import Checkpointer
from dapo_jax.training.state.checkpoint_errors import CheckpointCorruptError, CheckpointError, NonFiniteStateError
from tests.training.state.test_checkpoint import flip_64_bytes, large, largest_file, save_steps, state


def test_flipped_bytes_name_the_bad_leaf(tmp_path):
    save_steps(tmp_path, (1,))
    flip_64_bytes(largest_file(tmp_path / "1"))
    ckpt = Checkpointer(tmp_path)
    with pytest.raises(CheckpointCorruptError, match=r"1 is corrupt: state leaf \['w'\]"):
        ckpt.restore(1, large(0))
    ckpt.close()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_state_is_refused_and_nothing_written(tmp_path, bad):
    ckpt = Checkpointer(tmp_path, keep=3)
    ckpt.save(1, state(1), meta={})
    ckpt.wait()
    poisoned = {**state(2), "b": state(2)["b"].at[2].set(bad)}
    with pytest.raises(NonFiniteStateError, match=r"\['b'\] is not finite.*nothing was written"):
        ckpt.save(2, poisoned, meta={})
    ckpt.wait()
    assert ckpt.all_steps() == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1"]
    assert issubclass(NonFiniteStateError, CheckpointError) and issubclass(CheckpointError, RuntimeError)
    ckpt.close()


def test_a_target_that_does_not_fit_is_an_error_not_corruption(tmp_path):
    save_steps(tmp_path, (1,), make=state)
    ckpt = Checkpointer(tmp_path)
    with pytest.raises(CheckpointError, match=r"\['w'\] was saved with shape \(8, 4\), the target has \(16, 4\)") \
            as e:
        ckpt.restore_latest(state(0, rows=16))
    assert not isinstance(e.value, CheckpointCorruptError)
    assert ckpt.all_steps() == [1] and not (tmp_path / "corrupt").exists()  # nothing moved
    ckpt.close()
