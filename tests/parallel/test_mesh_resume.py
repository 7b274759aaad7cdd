"""A checkpoint written on one mesh resumes on another: the mesh is not part of the math.

The run dir accepts a changed `mesh.*` on resume (and still refuses a change of the trajectory),
the restored arrays take the NEW mesh's shardings, and a run of 4 steps on fsdp=4 equals one that
trained 2 steps on fsdp=4 and 2 more on data=2 x tensor=2 (4 of the 8 fake devices).
"""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from dapo_jax.parallel.mesh import make_mesh
from dapo_jax.training.state.checkpoint import Checkpointer
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import load_config
from dapo_jax.training.metrics import read_metrics
from dapo_jax.training.state.run_dir import RunDir
from tests.training.conftest import make_tiny_model, tiny_overrides

COMPARED = ("reward_mean", "accuracy", "kept_fraction", "gen_rounds", "loss", "grad_norm", "entropy")


def test_a_changed_mesh_may_resume_and_other_changes_may_not(tmp_path):
    def cfg(*extra):
        return load_config(None, [f"train.run_dir={tmp_path / 'r'}", "mesh.fsdp=4", *extra])

    RunDir(cfg()).save_config()
    RunDir(cfg("mesh.fsdp=1", "mesh.data=2", "mesh.tensor=2", "mesh.distributed.coordinator=h:1",
               "mesh.distributed.num_processes=2", "mesh.distributed.process_id=1")).check_same_config()
    with pytest.raises(ConfigError, match=r"rollout.G: 8 -> 3\); these keys change the trajectory \(only the mesh"):
        RunDir(cfg("mesh.data=2", "rollout.G=3")).check_same_config()


def test_restore_lays_arrays_out_on_the_new_mesh(tmp_path):
    devices = jax.devices()[:4]
    old, new = make_mesh(1, 4, 1, devices=devices), make_mesh(2, 1, 2, devices=devices)
    w = np.arange(8 * 4, dtype=np.float32).reshape(8, 4)
    state = {"w": jax.device_put(w, NamedSharding(old, P("fsdp", None))), "n": jnp.int32(3)}
    ckpt = Checkpointer(tmp_path / "c", async_save=False)
    ckpt.save(1, state, meta={})
    target = {"w": jax.device_put(jnp.zeros_like(w), NamedSharding(new, P(None, "tensor"))),
              "n": jax.device_put(jnp.int32(0), NamedSharding(new, P()))}
    restored = ckpt.restore(1, target).state
    ckpt.close()
    assert restored["w"].sharding == target["w"].sharding
    assert {s.data.shape for s in restored["w"].addressable_shards} == {(8, 2)}
    np.testing.assert_array_equal(np.asarray(restored["w"]), w)
    assert int(restored["n"]) == 3


@pytest.mark.slow
def test_fsdp4_run_resumed_on_data2_tensor2_equals_the_uninterrupted_run(tmp_path, capsys):
    from dapo_jax.training.loop import train

    model = make_tiny_model(tmp_path / "model")
    extra = {"train.steps": 4, "train.checkpoint_every": 2, "data.eval": "null", "mesh.fsdp": 4}
    straight = tmp_path / "straight"
    train(load_config(None, tiny_overrides(model, straight, **extra)))
    # the run as it stood after step 2 (its checkpoint 2 and metrics up to step 2), resumed on another mesh
    moved = tmp_path / "moved"
    shutil.copytree(straight, moved)
    shutil.rmtree(moved / "checkpoints" / "4")
    rows = [line for line in (moved / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= 2]
    (moved / "metrics.jsonl").write_text("".join(line + "\n" for line in rows))
    capsys.readouterr()
    train(load_config(None, tiny_overrides(model, moved, **{**extra, "mesh.fsdp": 1, "mesh.data": 2,
                                                              "mesh.tensor": 2})))
    assert "resumed from step 2" in capsys.readouterr().out
    a = [r for r in read_metrics(straight) if "grad_norm" in r]
    b = [r for r in read_metrics(moved) if "grad_norm" in r]
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    for key in COMPARED:
        np.testing.assert_allclose([r[key] for r in b], [r[key] for r in a], rtol=1e-5, atol=1e-6, err_msg=key)
