"""Moving a batch between the host and a global (possibly multi-host) sharded array.

The loop decodes responses and scores rewards on the host, then puts the training batch back on the
mesh. On one process that is `device_get` / `device_put`; on several (a TPU pod slice, a GPU cluster)
each process only addresses its own devices, so the rollout is all-gathered to every process, every
process scores the same full batch, and each process then supplies the shards of its own devices.
"""

from __future__ import annotations

import jax
import numpy as np


def to_host(tree):
    """The global value of every array in `tree`, as NumPy, on every process."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)


def process_flags(flags) -> np.ndarray:
    """`[processes, k]` bool: every process's `k` flags, on every process (one tiny all-gather; no
    communication in a one-process run). Every process must call it at the same point."""
    local = np.asarray(flags, np.int32).reshape(-1)
    if jax.process_count() == 1:
        return local[None].astype(bool)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(local, tiled=False)).reshape(jax.process_count(), -1) > 0


def to_global(tree, sharding: jax.sharding.Sharding):
    """Host arrays (the same full value on every process) -> global arrays laid out by `sharding`."""

    def put(x):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(put, tree)
