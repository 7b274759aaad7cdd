"""Orbax checkpoints: exact round trip, keep-last-N, unreadable newest -> previous, restore onto another mesh."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from dapo_jax.parallel.mesh import make_mesh
from dapo_jax.training.checkpoint import Checkpointer


def state(seed):
    k = jax.random.PRNGKey(seed)
    return {"w": jax.random.normal(k, (8, 4)), "b": jnp.arange(4, dtype=jnp.float32) + seed,
            "step": jnp.asarray(seed, jnp.int32)}


def test_round_trip_meta_carry_and_keep(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3):
        carry = {"ids": np.arange(6).reshape(2, 3) + step} if step == 3 else None
        ckpt.save(step, state(step), meta={"rng": [1, step], "stream": {"epoch": 0, "index": step}}, carry=carry)
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3]  # keep the newest 2
    r = ckpt.restore_latest(state(0))
    assert r.step == 3 and r.meta["stream"] == {"epoch": 0, "index": 3} and r.meta["rng"] == [1, 3]
    for k, v in state(3).items():
        np.testing.assert_array_equal(np.asarray(r.state[k]), np.asarray(v))
    np.testing.assert_array_equal(r.carry["ids"], np.arange(6).reshape(2, 3) + 3)
    r2 = ckpt.restore(2, state(0))
    assert r2.carry is None and int(r2.state["step"]) == 2
    ckpt.close()


def test_unreadable_newest_falls_back_to_previous(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=3, async_save=False)
    ckpt.save(1, state(1), meta={"x": 1})
    ckpt.save(2, state(2), meta={"x": 2})
    ckpt.close()
    # Corrupt the newest: remove its array data (as a crash of a non-atomic filesystem might).
    for p in (tmp_path / "2" / "state").iterdir():
        if p.is_dir():
            shutil.rmtree(p)
        elif p.name != "_METADATA":
            p.unlink()
    ckpt = Checkpointer(tmp_path, keep=3)
    with pytest.warns(RuntimeWarning, match="unreadable"):
        r = ckpt.restore_latest(state(0))
    assert r.step == 1 and r.meta["x"] == 1
    np.testing.assert_array_equal(np.asarray(r.state["w"]), np.asarray(state(1)["w"]))
    ckpt.close()


def test_no_checkpoint_gives_none(tmp_path):
    ckpt = Checkpointer(tmp_path / "empty")
    assert ckpt.restore_latest(state(0)) is None
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
