"""The device mesh: three named axes, ``("data", "fsdp", "tensor")``.

- ``data``: pure data parallelism; parameters are replicated over it.
- ``fsdp``: the batch is split over it *and* parameters are sharded over it (ZeRO-3 style);
  XLA all-gathers a layer's weights just before use.
- ``tensor``: Megatron-style tensor parallelism inside each layer (heads, MLP width, vocab).

The batch's leading dimension is split over ``("data", "fsdp")`` together, so a batch of ``B`` rows
needs ``B % (data * fsdp) == 0``.

Multi-host (TPU pods, GPU clusters): call :func:`maybe_initialize_distributed` first in every
process, then :func:`make_mesh` over ``jax.devices()`` (all hosts' devices); every process runs the
same program (SPMD) and feeds its own slice of the batch.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
from collections.abc import Sequence

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

log = logging.getLogger(__name__)


class MeshError(ValueError):
    """A mesh shape that does not fit the devices (or the model)."""


def resolve_mesh_shape(n_devices: int, *, data: int = 1, fsdp: int = -1, tensor: int = 1) -> tuple[int, int, int]:
    """`(data, fsdp, tensor)` with the single ``-1`` axis replaced by the devices left over."""
    shape = {"data": data, "fsdp": fsdp, "tensor": tensor}
    free = [name for name, size in shape.items() if size == -1]
    for name, size in shape.items():
        if size != -1 and (not isinstance(size, int) or size < 1):
            raise MeshError(f"mesh axis {name!r} must be a positive integer or -1, got {size!r}")
    if len(free) > 1:
        raise MeshError(f"only one mesh axis may be -1 (the rest of the devices), got {free}")
    fixed = math.prod(size for size in shape.values() if size != -1)
    if free:
        if n_devices % fixed:
            raise MeshError(
                f"cannot fill axis {free[0]!r}: {n_devices} devices are not divisible by the other axes' product "
                f"{fixed} ({shape})"
            )
        shape[free[0]] = n_devices // fixed
    elif fixed != n_devices:
        raise MeshError(f"mesh {shape} has {fixed} slots but there are {n_devices} devices; their product must match")
    return shape["data"], shape["fsdp"], shape["tensor"]


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``("data", "fsdp", "tensor")`` mesh with Auto axis types (XLA propagates the shardings).

    One axis may be ``-1``: it takes the devices left over (by default ``fsdp``, so ``make_mesh()``
    is plain FSDP over every device). Raises :class:`MeshError` when the product of the axis sizes
    does not equal the device count.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_mesh_shape(len(devices), data=data, fsdp=fsdp, tensor=tensor)
    return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (batch) dimension over ``("data", "fsdp")``; every other dimension replicated."""
    return NamedSharding(mesh, P(BATCH_AXES))


def batch_divisor(mesh) -> int:
    """The number of batch shards of `mesh` (concrete or abstract): a global batch size must be a multiple of it."""
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def batch_ways() -> int:
    """How many ways the batch dimension is split under the active mesh (1 without one)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not all(a in mesh.axis_names for a in BATCH_AXES):
        return 1
    return batch_divisor(mesh)


def per_batch_shard(fn, *arrays: jax.Array):
    """`fn(*arrays)` run on each batch device's rows (dim 0 of every array and every output) through
    `shard_map` when the active mesh splits the batch and the rows divide evenly; directly otherwise.

    For row-wise work that XLA's partitioner does not split along the batch: it computes `lax.top_k`
    by gathering every row onto every device (in a rollout, every row's logits at every step). `fn`
    must treat rows independently; its inputs are replicated over the other mesh axes."""
    ways = batch_ways()
    if ways == 1 or any(x.shape[0] % ways for x in arrays):
        return fn(*arrays)
    return jax.shard_map(fn, in_specs=P(BATCH_AXES), out_specs=P(BATCH_AXES), check_vma=False)(*arrays)


def _in_multiprocess_cluster() -> bool:
    env = os.environ
    if env.get("JAX_COORDINATOR_ADDRESS") or env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return True
    if int(env.get("SLURM_NTASKS", "1")) > 1 or int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
        return True
    return "," in env.get("TPU_WORKER_HOSTNAMES", "")


START_TIMEOUT_S = 300  # mesh.distributed.start_timeout_s: how long a process waits for all the others to start
PEER_LOST_EXIT_CODE = 7  # as parallel.peers.PeerLost: another process of the run is gone, or never came


def _not_all_started(process_id: int | None, num_processes: int | None, coordinator: str | None,
                     timeout_s: float) -> None:
    """The start-up watchdog's end: one line, then exit at once. JAX's own end (its client aborting from
    C++ when `initialization_timeout` passes, "another task died", a stack dump, exit 134) never comes:
    `jax.distributed.initialize` waits inside C++ with the GIL released, so this thread runs meanwhile."""
    me = "this process" if process_id is None else f"process {process_id}"
    n = f"{num_processes}" if num_processes is not None else "all"
    where = coordinator or "the coordinator found in the cluster's environment"
    print(f"dapo-jax: PeerLost: {me} waited {timeout_s:g} s (mesh.distributed.start_timeout_s) for the run's {n} "
          f"processes to start and join at {where}, and not all did: start every process with the same command "
          f"(process_id 0 to {n} - 1) and check that every host reaches the coordinator; nothing was written",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(PEER_LOST_EXIT_CODE)


def maybe_initialize_distributed(
    coordinator_address: str | None = None, num_processes: int | None = None, process_id: int | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
) -> bool:
    """Starts JAX's multi-process runtime when this process is one of several; returns whether it did.

    Must run before anything touches ``jax.devices()``. Cases:

    - Single process (a laptop, one GPU box, a single TPU VM): no arguments and no cluster variables
      -> does nothing and returns ``False``.
    - TPU pod slice: every worker calls it with no arguments; ``jax.distributed.initialize`` finds
      the coordinator from the TPU metadata (``TPU_WORKER_HOSTNAMES``).
    - SLURM or Open MPI GPU cluster: no arguments either; JAX reads ``SLURM_*`` / ``OMPI_*``.
    - Anything else (a hand-launched GPU cluster, Kubernetes): pass ``coordinator_address="host0:1234"``,
      ``num_processes`` and this process's ``process_id`` (or set ``JAX_COORDINATOR_ADDRESS`` etc.).

    Calling it again after a successful initialisation is a no-op that returns ``True``. A process still
    waiting for the others after ``start_timeout_s`` seconds prints one line and exits 7.
    """
    if jax.distributed.is_initialized():
        return True
    explicit = any(arg is not None for arg in (coordinator_address, num_processes, process_id))
    if not explicit and not _in_multiprocess_cluster():
        return False
    watchdog = threading.Timer(start_timeout_s, _not_all_started,
                               args=(process_id, num_processes, coordinator_address, start_timeout_s))
    watchdog.daemon = True
    watchdog.start()
    try:  # JAX's own bound comes later: its abort never comes first
        jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                                   process_id=process_id, initialization_timeout=math.ceil(start_timeout_s) + 60)
    finally:
        watchdog.cancel()
    log.info("jax.distributed initialised: process %d of %d", jax.process_index(), jax.process_count())
    return True


def committed(tree):
    """`tree` with every uncommitted array placed on its device for good (`jax.device_put` to its own
    sharding; the committed ones are returned as they are). A jitted function compiles once for
    uncommitted arguments and once more for committed ones. Its outputs are committed, so a state fed
    back to it would compile a second time at step 2. This happens with parameters from a plain
    `nnx.split(model)` made without a mesh."""
    if all(getattr(x, "committed", True) for x in jax.tree.leaves(tree)):
        return tree
    return jax.tree.map(lambda x: jax.device_put(x, x.sharding) if not getattr(x, "committed", True) else x, tree)


class jit_keeping_layout:  # noqa: N801 - used like jax.jit
    """`jax.jit(fn)` for `fn(state, ...) -> (new_state, aux)` whose `new_state` keeps the layout of the
    first call's `state` (its leaves' shardings): left to itself XLA may pick another output layout
    (e.g. an fsdp-sharded weight comes back transposed over the mesh), and the next call, and every
    other program that takes the state (the sampler), compiles again for it. The state is `committed`
    first, so a state that came in uncommitted does not compile again when it comes back."""

    def __init__(self, fn, *, donate_argnums=0):
        self.fn, self.donate_argnums, self._jitted = fn, donate_argnums, None
        self._lock = threading.Lock()  # one jitted function, also when another thread compiles it ahead

    def _for(self, state):
        with self._lock:
            if self._jitted is None:
                layout = jax.tree.map(lambda x: getattr(x, "sharding", None), state)
                self._jitted = jax.jit(self.fn, donate_argnums=self.donate_argnums, out_shardings=(layout, None))
        return self._jitted

    def __call__(self, state, *args, **kwargs):
        state = committed(state)
        return self._for(state)(state, *args, **kwargs)

    def lower(self, state, *args, **kwargs):
        state = committed(state)  # as `__call__` compiles it (abstract shapes pass through)
        return self._for(state).lower(state, *args, **kwargs)
