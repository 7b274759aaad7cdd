"""Each process's rows of a batch (parallel/process_data.py), on the 8 fake devices of one process and
on a stand-in for a multi-process device layout (the two-process run itself: test_multiprocess.py)."""

import dataclasses

import jax
import numpy as np
import pytest

from dapo_jax.parallel.mesh import batch_sharding, make_mesh
from dapo_jax.parallel.process_data import ProcessShare, row_blocks


@dataclasses.dataclass(frozen=True)
class FakeDevice:
    id: int
    process_index: int


class FakeSharding:
    """`devices_indices_map` of a batch split in `shards` equal blocks over `devices` in order, each
    block replicated `replicas` times (a tensor axis)."""

    def __init__(self, processes: list[int], shards: int, replicas: int):
        self.devices = [FakeDevice(i, p) for i, p in enumerate(processes)]
        self.shards, self.replicas = shards, replicas

    def devices_indices_map(self, shape):
        n = shape[0] // self.shards
        return {d: (slice((i // self.replicas) * n, (i // self.replicas + 1) * n),)
                for i, d in enumerate(self.devices)}


def test_each_process_holds_a_contiguous_block_in_device_order():
    # 2 processes x 4 devices, batch over data*fsdp = 4 shards, tensor = 2 replicas
    sharding = FakeSharding([0, 0, 0, 0, 1, 1, 1, 1], shards=4, replicas=2)
    assert row_blocks(sharding, 16) == {0: (0, 8), 1: (8, 16)}
    # a tensor axis across the processes: both hold every row
    assert row_blocks(FakeSharding([0, 1], shards=1, replicas=2), 8) == {0: (0, 8), 1: (0, 8)}


def test_interleaved_devices_are_refused():
    with pytest.raises(ValueError, match="not one contiguous block"):
        row_blocks(FakeSharding([0, 1, 0, 1], shards=4, replicas=1), 8)


def test_one_process_reads_the_whole_batch_and_round_trips_it():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    share = ProcessShare(mesh)
    assert share.rows(8) == (0, 8)
    x = np.arange(8 * 3, dtype=np.int32).reshape(8, 3)
    g = share.to_global(x, 8)
    assert g.sharding == batch_sharding(mesh)
    np.testing.assert_array_equal(share.local(g), x)
    sentinel = object()
    assert share.gather(sentinel, 8) is sentinel  # one process: nothing to gather


def test_prompts_advance_the_stream_by_the_whole_batch(monkeypatch):
    share = ProcessShare(make_mesh(data=1, fsdp=8, tensor=1))
    monkeypatch.setattr(share, "rows", lambda n: (2, 4))  # as process 1 of 4 would

    class Stream:
        taken = 0

        def next_examples(self, n):
            out = list(range(self.taken, self.taken + n))
            self.taken += n
            return out

        def pad(self, examples):
            return examples

    s = Stream()
    assert share.prompts(s, 8) == [2, 3] and s.taken == 8
    assert share.prompts(s, 8) == [10, 11] and s.taken == 16
    assert jax.process_count() == 1
