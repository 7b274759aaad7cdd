"""Left-padding prompts to a few fixed lengths, so the jitted sampler compiles once per bucket."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_BUCKETS = (64, 128, 256, 512, 1024, 2048)


def pad_to_bucket(
    prompts, buckets: Sequence[int] = DEFAULT_BUCKETS, pad_id: int = 0, *, mask=None
) -> tuple[np.ndarray, np.ndarray]:
    """Left-pads prompts to the smallest bucket that holds the longest one.

    Args:
      prompts: a list of 1-D token-id sequences (lists or arrays, any lengths), or a `[P, S]` array.
        With an array, `mask` ([P, S], 1 = real token) says which tokens are real; without it every
        token is real. Real tokens may sit anywhere in a row: they keep their order and move right.
      buckets: allowed lengths (any order).
      pad_id: the id written into padding.

    Returns:
      `(ids [P, bucket] int32, mask [P, bucket] int32)`, real tokens flush right (left padding).
    """
    buckets = sorted(int(b) for b in buckets)
    if not buckets or buckets[0] <= 0:
        raise ValueError(f"buckets must be positive lengths, got {buckets}")
    if isinstance(prompts, np.ndarray) or hasattr(prompts, "shape"):
        arr = np.asarray(prompts)
        if arr.ndim != 2:
            raise ValueError(f"prompts array must be [P, S], got shape {arr.shape}")
        m = np.ones(arr.shape, bool) if mask is None else np.asarray(mask).astype(bool)
        if m.shape != arr.shape:
            raise ValueError(f"mask shape {m.shape} != prompts shape {arr.shape}")
        rows = [arr[i][m[i]] for i in range(arr.shape[0])]
    else:
        if mask is not None:
            raise ValueError("mask is only accepted with a [P, S] prompts array")
        rows = []
        for i, row in enumerate(prompts):
            r = np.asarray(row)
            if r.ndim != 1:
                raise ValueError(f"prompt row {i} must be a 1-D token sequence, got shape {r.shape}")
            rows.append(r)
    if not rows:
        raise ValueError("no prompts to pad")
    for i, r in enumerate(rows):
        if r.size == 0:
            raise ValueError(f"prompt row {i} is empty (the sampler needs at least one real token)")
        if not np.issubdtype(r.dtype, np.integer):
            raise ValueError(f"prompt row {i} has non-integer dtype {r.dtype}")
    longest = max(r.size for r in rows)
    fitting = [b for b in buckets if b >= longest]
    if not fitting:
        row = max(range(len(rows)), key=lambda i: rows[i].size)
        raise ValueError(
            f"prompt row {row} has {longest} tokens, longer than the largest bucket {buckets[-1]}"
        )
    width = fitting[0]
    ids = np.full((len(rows), width), pad_id, np.int32)
    out_mask = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        ids[i, width - r.size:] = r
        out_mask[i, width - r.size:] = 1
    return ids, out_mask
