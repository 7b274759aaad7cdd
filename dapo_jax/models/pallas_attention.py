"""The flash-attention kernels that ship with JAX, in the decoder's layout: splash on TPU, Pallas GPU on GPU.

    out = splash(q, k, v, segment_ids)       # q [B, S, H_kv, R, D], k, v [B, S, H_kv, D], segment_ids [B, S]
    out = gpu_flash(q, k, v, segment_ids)    # same shapes; [B, S, H_kv, R, D] in v's dtype

Both take the canonical segment ids of `attention.mask_ids` (a real token's sequence id, a unique negative
id for each padding token) with a causal mask, which is the decoder's whole mask when nothing shares a
prefix. The sequence is padded to a multiple of the kernel's block with tokens of their own ids; the
scores are scaled by `1/sqrt(D)` through the query (the kernels take unscaled logits: splash has no
scale argument, the GPU kernel's `sm_scale` is used there).

Pallas kernels cannot be partitioned by XLA, so under a mesh each runs per device through `shard_map`:
the batch over ("data", "fsdp") when it divides, the key/value heads over "tensor" when they divide,
the sequence whole (what `models/sharding.py`'s column-parallel q/k/v projections produce).
`interpret=True` runs them on any backend, slowly: the tests use it on CPU.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

SPLASH_BLOCK = 512  # tokens per splash block (the sequence is padded to a multiple of it, or of 128 when shorter)
GPU_BLOCK = 128


def _padded(s: int, block: int, smallest: int) -> tuple[int, int]:
    """`(block, padded length)`: `block`, or the power of two >= the sequence (and >= `smallest`) when
    shorter, so that the backward kernels' smaller blocks divide it."""
    blk = min(block, max(smallest, 1 << (s - 1).bit_length()))
    return blk, -(-s // blk) * blk


def _pad(q, k, v, seg, length):
    s = q.shape[1]
    if length == s:
        return q, k, v, seg
    extra = length - s
    ids = -(jnp.arange(extra, dtype=jnp.int32) + s + 1)  # padding tokens of their own, as mask_ids makes them
    seg = jnp.concatenate([seg, jnp.broadcast_to(ids, (seg.shape[0], extra))], axis=1)
    pad = lambda x: jnp.pad(x, ((0, 0), (0, extra)) + ((0, 0),) * (x.ndim - 2))  # noqa: E731
    return pad(q), pad(k), pad(v), seg


@functools.lru_cache(maxsize=32)
def _splash_kernel(heads: int, length: int, block: int, interpret: bool):
    """The kernel for one shape, built once. It holds arrays (the mask's block tables): built inside a `jit`
    trace they would be that trace's values, and the next program to use the cached kernel would fail with
    `UnexpectedTracerError`. `ensure_compile_time_eval` makes them concrete arrays whatever traces the call."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    mask = sa.MultiHeadMask([sa.CausalMask((length, length)) for _ in range(heads)])
    sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    with jax.ensure_compile_time_eval():
        return sa.make_splash_mha_single_device(mask, block_sizes=sizes, interpret=interpret)


def _splash_local(q, k, v, seg, *, interpret: bool):
    from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

    b, s, g, r, d = q.shape
    block, length = _padded(s, SPLASH_BLOCK, 128)
    q, k, v, seg = _pad(q, k, v, seg, length)
    kernel = _splash_kernel(g * r, length, block, interpret)
    qh = jnp.moveaxis(q.reshape(b, length, g * r, d), 2, 1)  # [B, H, S, D]; head h = kv * R + r
    qh = (qh.astype(jnp.float32) / math.sqrt(d)).astype(q.dtype)
    kh, vh = jnp.moveaxis(k, 2, 1), jnp.moveaxis(v, 2, 1)  # [B, H_kv, S, D]: GQA inside the kernel
    out = jax.vmap(lambda qq, kk, vv, ss: kernel(qq, kk, vv, segment_ids=SegmentIds(ss, ss)))(qh, kh, vh, seg)
    return jnp.moveaxis(out, 1, 2).reshape(b, length, g, r, d)[:, :s].astype(v.dtype)


def _gpu_local(q, k, v, seg, *, interpret: bool):
    from jax.experimental.pallas.ops.gpu import attention as gpu_attention

    b, s, g, r, d = q.shape
    block, length = _padded(s, GPU_BLOCK, 16)
    q, k, v, seg = _pad(q, k, v, seg, length)
    sizes = gpu_attention.BlockSizes(block_q=block, block_k=block, block_q_dkv=min(32, block),
                                     block_kv_dkv=min(32, block), block_q_dq=min(32, block), block_kv_dq=min(32, block))
    qh = q.reshape(b, length, g * r, d)
    kh, vh = jnp.repeat(k, r, axis=2), jnp.repeat(v, r, axis=2)  # head h = kv * R + r reads key head kv
    out = gpu_attention.mha(qh, kh, vh, seg, sm_scale=1.0 / math.sqrt(d), causal=True, block_sizes=sizes,
                            interpret=interpret)
    return out.reshape(b, length, g, r, d)[:, :s].astype(v.dtype)


def _per_device(local, q, k, v, seg):
    """`local` on each device's rows and heads under the ambient mesh (directly when there is none)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return local(q, k, v, seg)
    shape = dict(zip(mesh.axis_names, mesh.axis_sizes))
    rows = tuple(a for a in ("data", "fsdp") if a in shape)
    ways = math.prod(shape[a] for a in rows)
    batch = rows if rows and q.shape[0] % ways == 0 else None
    heads = "tensor" if "tensor" in shape and q.shape[2] % shape["tensor"] == 0 else None
    spec_q, spec_kv, spec_ids = P(batch, None, heads, None, None), P(batch, None, heads, None), P(batch, None)
    return jax.shard_map(local, in_specs=(spec_q, spec_kv, spec_kv, spec_ids), out_specs=spec_q,
                         check_vma=False)(q, k, v, seg)


def splash(q, k, v, segment_ids, *, interpret: bool = False):
    """Pallas TPU splash attention (causal, `SegmentIds`, grouped key/value heads)."""
    return _per_device(functools.partial(_splash_local, interpret=interpret), q, k, v, segment_ids)


def gpu_flash(q, k, v, segment_ids, *, interpret: bool = False):
    """Pallas GPU flash attention (causal, segment ids; key/value heads repeated to the query heads)."""
    return _per_device(functools.partial(_gpu_local, interpret=interpret), q, k, v, segment_ids)
