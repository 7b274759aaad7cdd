"""Orbax checkpoints: exact round trip, keep-last-N, restore onto another mesh, and every fault a user
meets (flipped bytes, truncated file, broken meta JSON, SIGKILL mid-save, a failed save) is detected,
quarantined and healed, never loaded silently. The checksums' own cases are in test_checksums.py, reads
during rotation in test_rotation.py and test_checkpoint_reader.py."""

import errno
import gc
import os
import random
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from dapo_jax.parallel.mesh import make_mesh
from dapo_jax.training.state.checkpoint import Checkpointer
from dapo_jax.training.state.checkpoint_errors import CheckpointUnreadableError
from dapo_jax.training.update.train_step import init_train_state
from tests.training.state.checkpoint_killer import big_carry, big_state

ROOT = Path(__file__).resolve().parents[3]


def state(seed, rows=8):
    k = jax.random.PRNGKey(seed)
    return {"w": jax.random.normal(k, (rows, 4)), "b": jnp.arange(4, dtype=jnp.float32) + seed,
            "step": jnp.asarray(seed, jnp.int32)}


def large(seed):
    """Big enough (128 KB) that the array data is the largest file of the checkpoint."""
    return state(seed, rows=8192)


def assert_same(tree, expected):
    for k, v in expected.items():
        got = np.asarray(tree[k])
        assert got.dtype == np.asarray(v).dtype
        np.testing.assert_array_equal(got, np.asarray(v))


def save_steps(directory, steps, make=large, keep=5):
    ckpt = Checkpointer(directory, keep=keep, async_save=False)
    for s in steps:
        ckpt.save(s, make(s), meta={"x": s})
    ckpt.close()


def largest_file(step_dir: Path) -> Path:
    return max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def flip_64_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def restore_latest_warnings(ckpt, target):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = ckpt.restore_latest(target)
    return r, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_round_trip_meta_carry_and_keep(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3):
        carry = {"ids": np.arange(6).reshape(2, 3) + step} if step == 3 else None
        ckpt.save(step, state(step), meta={"rng": [1, step], "stream": {"epoch": 0, "index": step}}, carry=carry)
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3]  # keep the newest 2
    r = ckpt.restore_latest(state(0))
    assert r.step == 3 and r.meta["stream"] == {"epoch": 0, "index": 3} and r.meta["rng"] == [1, 3]
    assert r.quarantined == [] and "checksums" not in r.meta
    assert_same(r.state, state(3))
    np.testing.assert_array_equal(r.carry["ids"], np.arange(6).reshape(2, 3) + 3)
    r2 = ckpt.restore(2, state(0))
    assert r2.carry is None and int(r2.state["step"]) == 2
    ckpt.close()


def test_train_state_of_an_nnx_model_round_trips(tmp_path):
    params = nnx.split(nnx.Linear(4, 3, rngs=nnx.Rngs(0)))[1]
    train_state = init_train_state(params, optax.adamw(1e-3))
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(7, train_state, meta={})
    r = ckpt.restore_latest(jax.eval_shape(lambda: train_state))
    for a, b in zip(jax.tree.leaves(r.state), jax.tree.leaves(train_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ckpt.close()


@pytest.mark.parametrize("damage", [flip_64_bytes, truncate])
def test_damaged_array_file_is_quarantined_and_previous_restored(tmp_path, damage):
    save_steps(tmp_path, (1, 2))
    damage(largest_file(tmp_path / "2"))
    ckpt = Checkpointer(tmp_path)
    r, warned = restore_latest_warnings(ckpt, large(0))
    assert r.step == 1 and r.meta["x"] == 1 and r.quarantined == [2]
    assert_same(r.state, large(1))
    assert len(warned) == 1 and f"{tmp_path}/2" in warned[0] and "corrupt" in warned[0]
    assert ckpt.all_steps() == [1] and Checkpointer(tmp_path).all_steps() == [1]  # out of Orbax's view
    assert [p.name.split("-")[0] for p in (tmp_path / "corrupt").iterdir()] == ["2"]
    ckpt.close()


def delete_file(path: Path) -> None:
    path.unlink()


def garble_json(path: Path) -> None:
    path.write_text('{"x": 2, "step"')


def change_a_value(path: Path) -> None:  # still valid JSON, same size: only the checksum can tell
    text = path.read_text()
    assert '"x": 2' in text
    path.write_text(text.replace('"x": 2', '"x": 7'))


@pytest.mark.parametrize("damage", [delete_file, garble_json, change_a_value])
def test_broken_meta_json_is_quarantined_and_previous_restored(tmp_path, damage):
    save_steps(tmp_path, (1, 2), make=state)
    damage(tmp_path / "2" / "meta" / "metadata")
    ckpt = Checkpointer(tmp_path)
    r, warned = restore_latest_warnings(ckpt, state(0))
    assert r.step == 1 and r.quarantined == [2] and len(warned) == 1 and "meta JSON" in warned[0]
    assert_same(r.state, state(1))
    ckpt.close()


def test_unreadable_newest_falls_back_to_previous(tmp_path):
    save_steps(tmp_path, (1, 2), make=state)
    for p in (tmp_path / "2" / "state").iterdir():  # the array data gone, as after a crash of a non-atomic filesystem
        if p.is_file() and p.name != "_METADATA":
            p.unlink()
    ckpt = Checkpointer(tmp_path, keep=3)
    with pytest.warns(RuntimeWarning, match="unreadable"):
        r = ckpt.restore_latest(state(0))
    assert r.step == 1 and r.meta["x"] == 1 and r.quarantined == [2]
    np.testing.assert_array_equal(np.asarray(r.state["w"]), np.asarray(state(1)["w"]))
    ckpt.close()


def test_none_readable_raises_and_keeps_raising(tmp_path):
    save_steps(tmp_path, (1, 2, 3))
    for s in (1, 2, 3):
        flip_64_bytes(largest_file(tmp_path / str(s)))
    ckpt = Checkpointer(tmp_path)
    with pytest.warns(RuntimeWarning), \
            pytest.raises(CheckpointUnreadableError, match=r"\[3, 2, 1\].*train.fresh_start=true"):
        ckpt.restore_latest(large(0))
    assert ckpt.all_steps() == []
    ckpt.close()
    # A second launch sees no checkpoint, only quarantined ones: still no silent restart from step 0.
    ckpt = Checkpointer(tmp_path)
    with pytest.raises(CheckpointUnreadableError, match="fresh_start"):
        ckpt.restore_latest(large(0))
    ckpt.close()


def test_no_checkpoint_gives_none(tmp_path):
    ckpt = Checkpointer(tmp_path / "empty")
    assert ckpt.restore_latest(state(0)) is None
    ckpt.close()


def test_the_redone_step_is_saved_again_and_becomes_the_newest(tmp_path):
    save_steps(tmp_path, (1, 2))
    truncate(largest_file(tmp_path / "2"))
    ckpt = Checkpointer(tmp_path, keep=5)
    r, _ = restore_latest_warnings(ckpt, large(0))
    assert r.step == 1
    redone = large(22)  # the redone step 2 differs from the lost one (another rollout)
    ckpt.save(2, redone, meta={"x": 22})
    ckpt.wait()
    assert ckpt.all_steps() == [1, 2]
    r, warned = restore_latest_warnings(ckpt, large(0))
    assert r.step == 2 and r.meta["x"] == 22 and r.quarantined == [] and warned == []
    assert_same(r.state, redone)
    ckpt.close()


def test_sigkill_mid_save_never_leaves_a_bad_newest(tmp_path):
    """Kill -9 a process saving 4 MB checkpoints back to back (async, keep=2) at a random moment, in
    several processes at once: the newest checkpoint restores bit-exactly or is skipped with a warning."""
    trials = 4
    procs, logs = [], []
    for t in range(trials):
        logs.append((tmp_path / f"stderr{t}").open("w"))
        cmd = [sys.executable, "-m", "tests.training.state.checkpoint_killer", str(tmp_path / f"run{t}")]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=logs[-1], text=True))
    delays = [random.uniform(0.0, 1.0) for _ in range(trials)]
    try:
        for t, (proc, delay) in enumerate(zip(procs, delays)):
            line = proc.stdout.readline()
            assert line.strip() == "ready", (tmp_path / f"stderr{t}").read_text()[-2000:]
            time.sleep(delay)
            proc.kill()
    finally:
        for proc, log in zip(procs, logs):
            proc.kill()
            proc.wait()
            log.close()
    target = {k: jnp.zeros_like(v) for k, v in big_state(0).items()}
    for t in range(trials):
        ckpt = Checkpointer(tmp_path / f"run{t}", keep=2)
        r, warned = restore_latest_warnings(ckpt, target)
        assert r is not None, f"trial {t} (killed {delays[t]:.2f} s after ready): nothing restored"
        assert all("moved it to" in w for w in warned), warned
        assert r.step == max(ckpt.all_steps())
        assert_same(r.state, big_state(r.step))
        np.testing.assert_array_equal(r.carry["ids"], big_carry(r.step)["ids"])
        assert r.meta["seed"] == r.step
        ckpt.close()


def test_restore_onto_a_different_mesh(tmp_path):
    devices = jax.devices()
    assert len(devices) >= 8, "conftest gives 8 fake CPU devices"
    mesh_a = make_mesh(1, 2, 1, devices=devices[:2])
    src = jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh_a, P("fsdp") if x.ndim else P())), state(5))
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(5, src, meta={})
    mesh_b = make_mesh(2, 2, 2, devices=devices[:8])
    target_sharding = {"w": NamedSharding(mesh_b, P(("data", "fsdp"), "tensor")),
                       "b": NamedSharding(mesh_b, P("tensor")), "step": NamedSharding(mesh_b, P())}
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state(0), target_sharding)
    r = ckpt.restore_latest(target)
    assert r.state["w"].sharding == target_sharding["w"]
    np.testing.assert_array_equal(np.asarray(r.state["w"]), np.asarray(state(5)["w"]))
    ckpt.close()


# ----------------------------------------------------------------------------- a save that fails
@pytest.mark.parametrize("code, says", [(errno.EROFS, "read-only [EROFS]"), (errno.ENOSPC, "no space left"),
                                        (errno.EACCES, "permission denied [EACCES]")])
def test_a_failed_async_save_is_reported_at_the_next_check_and_leaves_no_thread_waiting(tmp_path, monkeypatch,
                                                                                      code, says):
    """The folder of step 2's save cannot be made (the OSError Orbax's `mkdir` meets on a read-only, full
    or unwritable folder): `check`, called at the next step boundary, raises one line naming the folder,
    the cause and the last good checkpoint, Orbax's threads that wait for the failed save are released,
    and checkpoint 1 restores."""
    from dapo_jax.training.state.checkpoint import CheckpointSaveError

    ckpt = Checkpointer(tmp_path, keep=3)
    ckpt.save(1, state(1), meta={"x": 1})
    ckpt.wait()
    mkdir = os.mkdir

    def failing_mkdir(path, *a, **k):
        if "2.orbax-checkpoint-tmp" in os.fsdecode(path):
            raise OSError(code, os.strerror(code), os.fsdecode(path))
        return mkdir(path, *a, **k)

    monkeypatch.setattr(os, "mkdir", failing_mkdir)
    with pytest.raises(CheckpointSaveError) as raised:
        ckpt.save(2, state(2), meta={"x": 2})
        for _ in range(600):  # the save fails in Orbax's background thread; a step boundary sees it
            ckpt.check()
            time.sleep(0.05)
    message = str(raised.value)
    assert says in message and str(tmp_path) in message and f"{tmp_path}/1, intact" in message
    assert "\n" not in message and raised.value.exit_code == 6
    with pytest.raises(CheckpointSaveError):  # every later call says the same, nothing is retried
        ckpt.check()
    ckpt.__exit__(CheckpointSaveError, raised.value, None)  # as the trainer's `with` does: nothing waited for
    monkeypatch.undo()
    deadline = time.monotonic() + 30  # a bound against a hang, not a speed assertion
    while time.monotonic() < deadline and _orbax_threads_waiting():
        time.sleep(0.05)
    assert not _orbax_threads_waiting()
    del ckpt, raised
    with warnings.catch_warnings():  # the cancelled threads' coroutines, never run, are collected here
        warnings.simplefilter("ignore", RuntimeWarning)
        gc.collect()
    again = Checkpointer(tmp_path)
    assert again.all_steps() == [1]
    assert_same(again.restore_latest(state(0)).state, state(1))
    again.close()


def _orbax_threads_waiting() -> list[str]:
    from orbax.checkpoint._src.futures import future

    return [t.name for t in threading.enumerate() if isinstance(t, future._SignalingThread) and t.is_alive()]


def test_save_failure_causes_come_from_oserrors_and_tensorstore_messages(tmp_path):
    from dapo_jax.training.state.checkpoint import save_failure

    tensorstore = ValueError('RESOURCE_EXHAUSTED: Error writing "w/0" in OCDBT database at local file "x": Failed to '
                             "write 5378048 bytes to file 11: No space left on device [os_error_code='28']")
    e = save_failure(tmp_path, 4, tensorstore, 3)
    assert "no space left on the device" in str(e) and "[ENOSPC]" in str(e) and f"{tmp_path}/3" in str(e)
    wrapped = RuntimeError("commit failed")
    wrapped.__cause__ = OSError(errno.EROFS, "Read-only file system")
    assert "read-only [EROFS]" in str(save_failure(tmp_path, 4, wrapped, None))
    assert "no checkpoint was completed" in str(save_failure(tmp_path, 1, wrapped, None))
    other = str(save_failure(tmp_path, 4, RuntimeError("odd\nsecond line"), 2))
    assert "RuntimeError: odd;" in other and "second line" not in other


def test_a_full_disk_in_tensorstores_words_is_a_save_failure_not_out_of_memory():
    """absl names ENOSPC `RESOURCE_EXHAUSTED`, like a device out of memory (which is re-raised as is):
    the OS error number beside it makes it a failed save (exit 6), not a crash (exit 1)."""
    from dapo_jax.training.state.checkpoint import _is_out_of_memory

    disk = ValueError("RESOURCE_EXHAUSTED: Failed to write 5378048 bytes to file 11: No space left on device "
                      "[os_error_code='28']")
    assert not _is_out_of_memory(disk)
    assert _is_out_of_memory(RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 2.00GiB"))
    assert _is_out_of_memory(MemoryError())


def test_the_closed_loop_echoes_of_a_failed_save_are_not_printed(monkeypatch):
    """Tensorstore reports each write it completes after the failed save's event loop closed through
    `sys.unraisablehook` (a traceback per write, without a header): those echoes are dropped, others not."""
    import asyncio
    import sys
    import types

    from dapo_jax.training.state.failed_save import quiet_orbax_errors

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_type))
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: seen.append(kind))
    quiet_orbax_errors()
    loop = asyncio.new_event_loop()
    loop.close()
    for error in (lambda: loop.call_soon_threadsafe(print), lambda: 1 / 0):
        try:
            error()
        except Exception as e:  # noqa: BLE001
            tb = e.__traceback__.tb_next.tb_next  # the frames below this test's lambda, as a callback raised them
            sys.unraisablehook(types.SimpleNamespace(exc_type=type(e), exc_value=e, exc_traceback=tb,
                                                     err_msg=None, object=None))
            sys.excepthook(type(e), e, tb)
    assert seen == [ZeroDivisionError, ZeroDivisionError]
