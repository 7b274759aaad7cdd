"""A checkpoint's own checksums: what `Checkpointer.save` records and `restore` verifies.

`fingerprints` gives, per leaf (keyed by its tree path), the CRC-32 of its bytes gathered on the host with its
shape and dtype, refusing a NaN or inf float leaf when asked; `verify` recomputes them on read and
`check_fits` tells a changed config (another model or optimizer: `CheckpointError`) from a corrupt file
(`CheckpointCorruptError`). Orbax checks none of this (its zarr3 arrays carry a CRC of the chunk index only),
hence our own. An array sharded over several hosts is not checksummed (crc32 None).
"""

from __future__ import annotations

import json
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from dapo_jax.training.state.checkpoint_errors import CheckpointCorruptError, CheckpointError, NonFiniteStateError


def _crc32(data) -> str:
    return f"{zlib.crc32(data):08x}"


def json_crc32(obj) -> str:
    return _crc32(json.dumps(obj, sort_keys=True).encode())


def _host(x) -> np.ndarray | None:
    """The whole array on this host; None for an array sharded over several hosts."""
    if isinstance(x, jax.Array):
        if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        if not x.is_fully_addressable:
            return None
        return np.asarray(jax.device_get(x))
    return np.asarray(x)


def fingerprints(tree, *, refuse_non_finite: str | None = None) -> dict[str, dict]:
    """Tree path -> {crc32, shape, dtype} of every leaf; crc32 None for a multi-host array.

    With `refuse_non_finite` (the checkpoint's name), a float leaf holding NaN or inf raises
    NonFiniteStateError."""
    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = jax.tree_util.keystr(path)
        host = _host(x)
        dtype = x.dtype if host is None else host.dtype
        if refuse_non_finite and jnp.issubdtype(dtype, jnp.inexact):
            finite = bool(jnp.isfinite(x).all()) if host is None else bool(np.isfinite(host).all())
            if not finite:
                detail = "" if host is None else f" ({np.isnan(host).sum()} NaN, {np.isinf(host).sum()} inf)"
                raise NonFiniteStateError(f"refusing to save {refuse_non_finite}: state leaf {name} is not "
                                          f"finite{detail}; nothing was written")
        crc = None if host is None else _crc32(np.ascontiguousarray(host).reshape(-1).view(np.uint8))
        out[name] = {"crc32": crc, "shape": list(np.shape(x)), "dtype": str(dtype)}
    return out


def verify(tree, record: dict[str, dict], where: str, item: str) -> None:
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = jax.tree_util.keystr(path)
        rec = record.get(name)
        if rec is None:
            raise CheckpointCorruptError(f"checkpoint {where} is corrupt: {item} leaf {name} has no checksum record")
        host = _host(x)
        if rec["crc32"] is None or host is None or str(host.dtype) != rec["dtype"]:
            continue  # multi-host array or a deliberate cast: nothing to compare
        if _crc32(np.ascontiguousarray(host).reshape(-1).view(np.uint8)) != rec["crc32"]:
            raise CheckpointCorruptError(f"checkpoint {where} is corrupt: {item} leaf {name} does not match "
                                         f"the checksum recorded when it was saved")


def check_fits(target, record: dict[str, dict], where: str) -> None:
    """An intact record that does not fit the target is a changed config, not a corrupt file."""
    leaves = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(target)[0]}
    missing, extra = sorted(record.keys() - leaves.keys()), sorted(leaves.keys() - record.keys())
    if missing or extra:
        raise CheckpointError(f"checkpoint {where} does not fit the restore target: saved leaves not in the "
                              f"target {missing[:3]}, target leaves not saved {extra[:3]} (model or optimizer "
                              f"changed?)")
    for name, x in leaves.items():
        if list(np.shape(x)) != record[name]["shape"]:
            raise CheckpointError(f"checkpoint {where} does not fit the restore target: {name} was saved with "
                                  f"shape {tuple(record[name]['shape'])}, the target has {tuple(np.shape(x))}")
