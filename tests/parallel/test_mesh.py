"""The ("data", "fsdp", "tensor") mesh helper on the 8 fake CPU devices of tests/conftest.py, and the
start-up of a multi-process run (a process that never comes)."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as P

from dapo_jax.parallel import mesh as mesh_lib
from dapo_jax.parallel import (
    AXES, MeshError, batch_divisor, batch_sharding, make_mesh, maybe_initialize_distributed,
    resolve_mesh_shape,
)
from tests.parallel.test_multiprocess import _free_port
from tests.training.conftest import make_tiny_model, tiny_overrides

REPO = Path(__file__).resolve().parents[2]


def test_eight_fake_devices():
    assert jax.device_count() == 8


def test_default_is_fsdp_over_every_device():
    mesh = make_mesh()
    assert mesh.axis_names == AXES == ("data", "fsdp", "tensor")
    assert dict(mesh.shape) == {"data": 1, "fsdp": 8, "tensor": 1}
    assert mesh.axis_types == (AxisType.Auto,) * 3


@pytest.mark.parametrize(
    "kw,want",
    [
        (dict(data=2, fsdp=2, tensor=2), (2, 2, 2)),
        (dict(fsdp=2, tensor=4), (1, 2, 4)),
        (dict(data=-1, fsdp=1, tensor=2), (4, 1, 2)),
        (dict(data=2, fsdp=4, tensor=-1), (2, 4, 1)),
    ],
)
def test_resolves_the_free_axis(kw, want):
    assert resolve_mesh_shape(8, **kw) == want
    assert tuple(make_mesh(**kw).shape.values()) == want


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(data=3, fsdp=1, tensor=1), r"3 slots but there are 8 devices"),
        (dict(data=3, fsdp=-1), r"8 devices are not divisible.*3"),
        (dict(data=-1, fsdp=-1), r"only one mesh axis may be -1"),
        (dict(fsdp=0), r"'fsdp' must be a positive integer"),
    ],
)
def test_bad_shapes_fail_clearly(kw, match):
    with pytest.raises(MeshError, match=match):
        make_mesh(**kw)


def test_subset_of_devices():
    devices = jax.devices()[:4]
    mesh = make_mesh(fsdp=2, tensor=2, devices=devices)
    assert set(mesh.devices.flat) == set(devices)
    with pytest.raises(MeshError, match="4 devices"):
        make_mesh(fsdp=8, devices=devices)


def test_batch_sharding_splits_rows_over_data_and_fsdp():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharding = batch_sharding(mesh)
    assert sharding.spec == P(("data", "fsdp"))
    assert batch_divisor(mesh) == 4
    x = jax.device_put(jnp.arange(8 * 3).reshape(8, 3), sharding)
    shards = {tuple(s.data.shape) for s in x.addressable_shards}
    assert shards == {(2, 3)}  # 8 rows over 4 batch shards, columns whole; tensor axis replicates
    np.testing.assert_array_equal(np.asarray(x), np.arange(24).reshape(8, 3))


@pytest.fixture
def no_cluster_env(monkeypatch):
    for var in ("JAX_COORDINATOR_ADDRESS", "MEGASCALE_COORDINATOR_ADDRESS", "SLURM_NTASKS",
                "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES"):
        monkeypatch.delenv(var, raising=False)
    calls = []
    monkeypatch.setattr(mesh_lib.jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(mesh_lib.jax.distributed, "initialize", lambda **kw: calls.append(kw))
    return calls


def test_single_process_does_not_initialize(no_cluster_env):
    assert maybe_initialize_distributed() is False
    assert no_cluster_env == []


def test_explicit_arguments_are_forwarded(no_cluster_env):
    assert maybe_initialize_distributed("host0:1234", 4, 2) is True
    assert no_cluster_env == [dict(coordinator_address="host0:1234", num_processes=4, process_id=2,
                                   initialization_timeout=360)]


@pytest.mark.parametrize("var,value", [("SLURM_NTASKS", "2"), ("TPU_WORKER_HOSTNAMES", "w0,w1"),
                                       ("JAX_COORDINATOR_ADDRESS", "h:1")])
def test_cluster_environment_triggers_autodetection(no_cluster_env, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    assert maybe_initialize_distributed() is True
    assert no_cluster_env == [dict(coordinator_address=None, num_processes=None, process_id=None,
                                   initialization_timeout=360)]


def test_already_initialized_is_a_no_op(no_cluster_env, monkeypatch):
    monkeypatch.setattr(mesh_lib.jax.distributed, "is_initialized", lambda: True)
    assert maybe_initialize_distributed("host0:1234", 4, 0) is True
    assert no_cluster_env == []


def test_committed_places_only_uncommitted_arrays():
    loose = jnp.arange(4.0)  # made without a device: uncommitted
    placed = jax.device_put(jnp.ones(3), jax.devices()[1])
    tree = {"a": loose, "b": placed, "n": 3}
    out = mesh_lib.committed(tree)
    assert not loose.committed and out["a"].committed
    np.testing.assert_array_equal(np.asarray(out["a"]), np.arange(4.0))
    assert out["a"].sharding == loose.sharding  # same device, now for good
    assert out["b"] is placed and out["n"] == 3
    assert mesh_lib.committed(out) is out  # nothing to do: the same tree back


def _collectives(compiled_text: str) -> set[str]:
    import re

    return set(re.findall(r" (all-gather|all-to-all|collective-permute)\(", compiled_text))


@pytest.mark.skipif(jax.device_count() < 4, reason="needs the fake CPU devices from tests/conftest.py")
def test_per_batch_shard_runs_top_k_on_each_devices_rows():
    """`lax.top_k` over a batch split 4 ways: XLA alone gathers every row onto every device;
    through `per_batch_shard` nothing crosses devices, and the values are the same."""
    mesh = make_mesh(data=2, fsdp=2, tensor=1, devices=jax.devices()[:4])
    x = jax.random.normal(jax.random.key(0), (8, 50))
    top = lambda a: jax.lax.top_k(a, 5)
    with jax.set_mesh(mesh):
        xs = jax.device_put(x, jax.NamedSharding(mesh, P(mesh_lib.BATCH_AXES)))
        plain = jax.jit(top).lower(xs).compile()
        shard = jax.jit(lambda a: mesh_lib.per_batch_shard(top, a)).lower(xs).compile()
        values, index = shard(xs)
        # rows that do not divide over the batch devices: computed as a whole, the same
        np.testing.assert_array_equal(jax.jit(lambda a: mesh_lib.per_batch_shard(top, a))(x[:6])[0], top(x[:6])[0])
    assert "all-gather" in _collectives(plain.as_text())  # what per_batch_shard is for
    assert _collectives(shard.as_text()) == set()
    want_v, want_i = top(x)
    np.testing.assert_array_equal(values, want_v)
    np.testing.assert_array_equal(index, want_i)
    assert {s.data.shape for s in values.addressable_shards} == {(2, 5)}


def test_a_run_whose_second_process_never_starts_ends_in_one_line_and_exit_7(tmp_path):
    """Process 0 of a 2-process run alone (process 1 never starts): after mesh.distributed.start_timeout_s
    it says so in one line and exits 7 (before: JAX's C++ abort after 300 s, "another task died", exit 134),
    having written nothing."""
    run_dir = tmp_path / "run"
    args = [*tiny_overrides(make_tiny_model(tmp_path / "model"), run_dir), f"mesh.distributed.coordinator=localhost:"
            f"{_free_port()}", "mesh.distributed.num_processes=2", "mesh.distributed.process_id=0",
            "mesh.distributed.start_timeout_s=2"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    done = subprocess.run([sys.executable, "-m", "dapo_jax.cli", "train", "tiny_dapo", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 7, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("dapo-jax:")]
    assert len(lines) == 1 and lines[0].startswith("dapo-jax: PeerLost: process 0 waited 2 s (mesh.distributed."
                                                   "start_timeout_s) for the run's 2 processes to start"), lines
    assert "Traceback" not in done.stderr and "Check failure stack trace" not in done.stderr
    assert not (run_dir / "config.yaml").exists() and not (run_dir / "checkpoints").exists()
