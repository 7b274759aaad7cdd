"""Which keys each query of a packed, padded batch sees, as per-token ids: the mask every attention
implementation computes block by block (`attention.py`'s docstring states it), never an `[S, K]` array.

    ids = mask_ids(attention_mask, segment_ids, branch_ids)     # MaskIds of [B, S] int32 ids
    ok = allowed(ids_q, ids_k, q_pos, k_pos)                    # [B, Sq, Sk] bool for one block
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class MaskIds(NamedTuple):
    """Which keys each query sees, as per-token ids (see the module docstring)."""

    segment_ids: jax.Array  # [B, S] int32: a real token's sequence id; -(i + 1) for a padding token i
    branch_ids: jax.Array | None  # [B, S] int32: 0 = the segment's shared prefix, b > 0 = its branch b


def mask_ids(attention_mask: jax.Array, segment_ids: jax.Array | None = None,
             branch_ids: jax.Array | None = None) -> MaskIds:
    """The canonical ids of the decoder's inputs (`attention_mask [B, S]`, 1 = real token)."""
    real = attention_mask.astype(bool)
    s = real.shape[-1]
    seg = jnp.ones(real.shape, jnp.int32) if segment_ids is None else segment_ids.astype(jnp.int32)
    seg = jnp.where(real, seg, -(jnp.arange(s, dtype=jnp.int32) + 1))
    return MaskIds(seg, None if branch_ids is None else branch_ids.astype(jnp.int32))


def allowed(q_ids: MaskIds, k_ids: MaskIds, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
    """`[B, Sq, Sk]` bool: which of the keys at `k_pos [Sk]` the queries at `q_pos [Sq]` see."""
    ok = (k_pos[None, :] <= q_pos[:, None])[None]
    ok = ok & (q_ids.segment_ids[:, :, None] == k_ids.segment_ids[:, None, :])
    if q_ids.branch_ids is not None:
        qb, kb = q_ids.branch_ids[:, :, None], k_ids.branch_ids[:, None, :]
        ok = ok & ((kb == 0) | (qb == kb))
    return ok


def slice_ids(ids: MaskIds, lo: int, hi: int) -> MaskIds:
    return MaskIds(*(None if x is None else x[:, lo:hi] for x in ids))


__all__ = ["MaskIds", "allowed", "mask_ids", "slice_ids"]
