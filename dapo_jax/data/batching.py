"""Left-padding variable-length prompts into a few fixed shapes (so jit compiles a few programs, not one per length)."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def default_buckets(max_length: int, *, smallest: int = 16) -> tuple[int, ...]:
    """Powers of two from ``smallest`` up to, and always ending with, ``max_length``."""
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    buckets, b = [], smallest
    while b < max_length:
        buckets.append(b)
        b *= 2
    return tuple(buckets) + (max_length,)


def bucket_length(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``length`` tokens."""
    for b in sorted(buckets):
        if length <= b:
            return b
    raise ValueError(f"a prompt of {length} tokens is longer than the largest bucket {max(buckets)}")


def left_pad(sequences: Sequence[Sequence[int]], *, pad_id: int, buckets: Sequence[int] | None = None,
             length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded ``ids [n, L]`` int32 and ``mask [n, L]`` int32 (1 on real tokens).

    ``L`` is ``length`` if given, else the smallest bucket holding the longest sequence (else the
    longest length). Left padding puts every prompt's last token in the last column, where decoding starts.
    """
    longest = max((len(s) for s in sequences), default=0)
    if length is None:
        length = bucket_length(longest, buckets) if buckets else longest
    if longest > length:
        raise ValueError(f"a sequence of {longest} tokens does not fit length {length}")
    ids = np.full((len(sequences), length), pad_id, np.int32)
    mask = np.zeros((len(sequences), length), np.int32)
    for i, s in enumerate(sequences):
        if len(s):
            ids[i, length - len(s):] = s
            mask[i, length - len(s):] = 1
    return ids, mask
