"""Device meshes, multi-host start-up and host<->mesh transfers; the parameter sharding rules live beside the model."""

from dapo_jax.parallel.host import to_global, to_host

from dapo_jax.parallel.mesh import (
    AXES,
    BATCH_AXES,
    MeshError,
    batch_divisor,
    batch_sharding,
    make_mesh,
    maybe_initialize_distributed,
    resolve_mesh_shape,
)

__all__ = [
    "AXES",
    "BATCH_AXES",
    "MeshError",
    "batch_divisor",
    "batch_sharding",
    "make_mesh",
    "maybe_initialize_distributed",
    "resolve_mesh_shape",
    "to_global",
    "to_host",
]
