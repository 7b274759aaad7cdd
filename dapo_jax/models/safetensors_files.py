"""Safetensors files of a Hugging Face checkpoint folder, read and written without pickle, torch or remote code.

    tensors = open_checkpoint(folder)          # tensor name -> its SafetensorsFile, single file or sharded
    tensors["model.norm.weight"].array("model.norm.weight")   # a read-only memmap in the stored dtype

Tensors are read through ``np.memmap`` at the offsets of the safetensors header (bf16 included, which
``safetensors``' numpy backend cannot return), so a caller can read one device's slice without the whole
tensor in host memory. A file that is unreadable, truncated, missing from its index or holds a non-float
tensor raises ``CheckpointError`` naming the tensor and the file.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import jax
import ml_dtypes
import numpy as np

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
_FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64}


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model: names the tensor and the file."""


class SafetensorsFile:
    """Header + lazily memory-mapped tensors of one ``.safetensors`` file."""

    def __init__(self, file: Path):
        self.file = file
        try:
            with open(file, "rb") as f:
                (n,) = np.frombuffer(f.read(8), "<u8")
                header = json.loads(f.read(int(n)))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{file} is not a readable safetensors file: {e}") from e
        self.metadata = header.pop("__metadata__", None) or {}
        self.entries: dict[str, dict] = header
        self.data_start = 8 + int(n)
        end = max((int(e["data_offsets"][1]) for e in header.values() if isinstance(e, dict) and "data_offsets" in e),
                  default=0)
        size = file.stat().st_size
        if size < self.data_start + end:
            raise CheckpointError(f"{file} is truncated: {size} bytes, but its header needs {self.data_start + end}")

    def array(self, name: str) -> np.ndarray:
        """A read-only memmap view of tensor ``name`` in its stored dtype."""
        entry = self.entries[name]
        dtype = _FLOAT_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise CheckpointError(
                f"tensor {name!r} in {self.file} has dtype {entry['dtype']}; expected a float dtype "
                f"({', '.join(_FLOAT_DTYPES)})"
            )
        start, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if end - start != math.prod(shape) * np.dtype(dtype).itemsize:
            raise CheckpointError(f"tensor {name!r} in {self.file}: byte size does not match shape {shape}")
        if not shape or math.prod(shape) == 0:
            return np.zeros(shape, dtype)
        return np.memmap(self.file, dtype=dtype, mode="r", offset=self.data_start + start, shape=shape)


def open_checkpoint(root: Path) -> dict[str, SafetensorsFile]:
    """Tensor name -> the file that holds it, for a single or sharded checkpoint."""
    index = root / SAFETENSORS_INDEX
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{index} is not a valid safetensors index (needs 'weight_map'): {e}") from e
        files: dict[str, SafetensorsFile] = {}
        located = {}
        for name, shard in weight_map.items():
            if shard not in files:
                if not (root / shard).exists():
                    raise CheckpointError(f"shard file {root / shard} (holding tensor {name!r}) listed in {index} is missing")
                files[shard] = SafetensorsFile(root / shard)
            if name not in files[shard].entries:
                raise CheckpointError(f"tensor {name!r} is listed in {index} but absent from {root / shard}")
            located[name] = files[shard]
        return located
    single = root / SAFETENSORS_FILE
    if not single.exists():
        raise CheckpointError(f"no {SAFETENSORS_FILE} or {SAFETENSORS_INDEX} in {root}")
    f = SafetensorsFile(single)
    return {name: f for name in f.entries}


def checkpoint_tensor_names(path: str | os.PathLike) -> list[str]:
    """The tensor names stored in a checkpoint directory (for inspection and tests)."""
    return sorted(open_checkpoint(Path(path)))


def save_safetensors(arrays: dict[str, np.ndarray], file: Path) -> None:
    """`safetensors.numpy.save_file`, then the mode any other written file gets (0644 under the usual umask):
    the library creates the file 0600, which another user (a serving job, a colleague) cannot read."""
    from safetensors.numpy import save_file

    save_file(arrays, file, metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(file, 0o666 & ~umask)


def to_host(x: jax.Array) -> np.ndarray:
    """The whole array on this host (an array sharded over several hosts is all-gathered first)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))
