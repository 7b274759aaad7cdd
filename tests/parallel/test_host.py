import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from dapo_jax.parallel.host import to_global, to_host
from dapo_jax.parallel.mesh import batch_sharding, make_mesh


def test_round_trip_over_a_sharded_mesh_keeps_values_and_layout():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    rng = np.random.default_rng(0)
    tree = {"ids": rng.integers(0, 100, (8, 5)).astype(np.int32), "logp": rng.normal(size=(8, 3, 4)).astype(np.float32)}
    out = to_global(tree, batch_sharding(mesh))
    assert out["ids"].sharding.spec == batch_sharding(mesh).spec
    # each of the 4 (data, fsdp) shards holds 2 of the 8 rows; tensor replicas hold the same rows
    assert {s.data.shape for s in out["logp"].addressable_shards} == {(2, 3, 4)}
    back = to_host(out)
    np.testing.assert_array_equal(back["ids"], tree["ids"])
    np.testing.assert_array_equal(back["logp"], tree["logp"])


def test_replicated_scalars_come_back():
    mesh = make_mesh(data=1, fsdp=8, tensor=1)
    x = to_global(np.float32(3.5), NamedSharding(mesh, P()))
    assert float(to_host(x)) == 3.5
