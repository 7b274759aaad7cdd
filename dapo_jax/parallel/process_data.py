"""Each process's share of a rollout in a multi-process run (a TPU pod slice, a GPU cluster).

    start_processes(cfg.mesh.distributed)            # first thing: before any JAX call
    share = ProcessShare(mesh)
    prompts = share.prompts(stream, gen_batch)       # this process's rows of the next gen_batch prompts
    out = share.local(generate(params, *share.to_global((ids, mask), gen_batch), key))
    ... decode and score `out` (this process's rows only) into `local_groups` ...
    groups = share.gather(local_groups, gen_batch)   # the whole round, in global row order, on every process

The batch's rows are split over the mesh's ("data", "fsdp") devices in device order, so each
process's devices hold one contiguous block of rows: process p reads, pads, generates, decodes and
scores exactly the prompts of its block of each global generation batch (`rows`), which are the
rows the one-process run puts on those devices. The global prompt stream's position advances by the
whole batch in every process, so it is one position, the same everywhere, saved once in each
checkpoint: a run resumes onto another number of processes or another mesh and still reads the
prompts the uninterrupted run would have.

After scoring, the round's groups (tokens, log-probs, rewards; the small [P, G] fields and the
[P, G, T] ones) are all-gathered, so every process holds the same round: dynamic sampling's keep
decisions, the number of rounds, the trained batch and every metric are the same in all processes
(and equal to the one-process run's), so every process calls the jitted programs the same number of
times. When the mesh replicates the batch over several processes (a tensor axis across hosts), those
processes read the same block; the gather keeps one copy of each block.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from dapo_jax.parallel.mesh import batch_sharding, maybe_initialize_distributed


def start_processes(distributed=None) -> bool:
    """Starts `jax.distributed` for the config's `mesh.distributed` section (coordinator,
    num_processes, process_id; None or unset keys: detected from a TPU pod's metadata or SLURM /
    Open MPI variables, else one process). Must run before any other JAX call; returns whether this
    is a multi-process run."""
    if distributed is None:
        return maybe_initialize_distributed()
    return maybe_initialize_distributed(distributed.coordinator, distributed.num_processes, distributed.process_id,
                                        distributed.start_timeout_s)


def row_blocks(sharding: jax.sharding.Sharding, n: int) -> dict[int, tuple[int, int]]:
    """Process index -> the `[lo, hi)` rows of an `[n, ...]` batch laid out by `sharding` that its
    devices hold. Raises ValueError when a process's rows are not one contiguous block."""
    rows: dict[int, set[int]] = {}
    for device, index in sharding.devices_indices_map((n,)).items():
        rows.setdefault(device.process_index, set()).update(range(*index[0].indices(n)))
    blocks = {}
    for p, r in sorted(rows.items()):
        lo, hi = min(r), max(r) + 1
        if len(r) != hi - lo:
            raise ValueError(f"process {p}'s devices hold rows {sorted(r)} of a {n}-row batch, not one contiguous "
                             f"block: order the mesh's devices by process")
        blocks[p] = (lo, hi)
    return blocks


class ProcessShare:
    """This process's rows of the batches laid out over `mesh`'s ("data", "fsdp") axes."""

    def __init__(self, mesh):
        self.sharding = batch_sharding(mesh)
        self.process = jax.process_index()
        self.multi = jax.process_count() > 1

    @functools.lru_cache(maxsize=8)
    def _blocks(self, n: int) -> tuple[tuple[int, int], tuple[int, ...]]:
        """(this process's block, the process holding each distinct block in row order)."""
        blocks = row_blocks(self.sharding, n)
        owners: dict[tuple[int, int], int] = {}
        for p, block in sorted(blocks.items()):
            owners.setdefault(block, p)
        ordered = sorted(owners)
        size = ordered[0][1] - ordered[0][0]
        if ordered[0][0] != 0 or ordered[-1][1] != n or any(
                b[1] - b[0] != size or a[1] != b[0] for a, b in zip(ordered, ordered[1:])):
            raise ValueError(f"the processes' row blocks {ordered} do not split the {n}-row batch into equal parts")
        return blocks[self.process], tuple(owners[b] for b in ordered)

    def rows(self, n: int) -> tuple[int, int]:
        """`[lo, hi)`: this process's rows of an `n`-row batch."""
        return self._blocks(n)[0]

    def prompts(self, stream, n: int):
        """This process's rows of the stream's next `n` prompts (the stream advances by all `n`)."""
        examples = stream.next_examples(n)
        lo, hi = self.rows(n)
        return stream.pad(examples[lo:hi])

    def to_global(self, tree, n: int):
        """This process's rows (`[hi - lo, ...]` arrays) -> global `[n, ...]` arrays on the mesh."""
        lo, _ = self.rows(n)

        def put(x):
            x = np.asarray(x)

            def rows(index):
                start, stop, _ = index[0].indices(n)
                return x[(slice(start - lo, stop - lo), *index[1:])]

            return jax.make_array_from_callback((n, *x.shape[1:]), self.sharding, rows)

        return jax.tree.map(put, tree)

    def local(self, tree):
        """Global arrays laid out by rows -> this process's rows, as NumPy (the whole value on one process)."""
        if not self.multi:
            return jax.device_get(tree)

        def rows(x):
            n = x.shape[0]
            lo, hi = self.rows(n)
            x = jax.device_put(x, self.sharding)  # a no-op when the rows are already laid out so
            out = np.empty((hi - lo, *x.shape[1:]), x.dtype)
            filled = np.zeros(hi - lo, bool)
            for shard in x.addressable_shards:
                start, stop, _ = shard.index[0].indices(n)
                a, b = max(start, lo), min(stop, hi)
                if a < b:
                    out[a - lo:b - lo] = np.asarray(shard.data)[a - start:b - start]
                    filled[a - lo:b - lo] = True
            if not filled.all():
                raise RuntimeError(f"rows {lo}..{hi} of a {n}-row array are not all on this process's devices")
            return out

        return jax.tree.map(rows, tree)

    def gather(self, groups, n: int):
        """This process's `Groups` of an `n`-row batch -> the whole batch's, in global row order, on
        every process."""
        if not self.multi:
            return groups
        from jax.experimental import multihost_utils

        local = groups.state_dict()
        stacked = multihost_utils.process_allgather(local, tiled=False)  # [processes, rows, ...]
        owners = self._blocks(n)[1]
        whole = {k: np.concatenate([np.asarray(stacked[k][p], local[k].dtype) for p in owners]) for k in local}
        return type(groups).from_state_dict(whole)
