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
GPU_BACKWARD_BLOCK = 32  # the backward kernel's blocks (all four): JAX's default
GPU_SMEM_BUDGET = 200 * 1024  # bytes of shared memory a GPU kernel's blocks may ask for, by `gpu_smem_bytes`
GPU_STAGES = 2  # `mha`'s default num_stages: how many copies of a loop's loaded tiles the pipeline keeps


def _padded(s: int, block: int, smallest: int) -> tuple[int, int]:
    """`(block, padded length)`: `block`, or the power of two >= the sequence (and >= `smallest`) when
    shorter, so that the backward kernels' smaller blocks divide it."""
    blk = min(block, max(smallest, 1 << (s - 1).bit_length()))
    return blk, -(-s // blk) * blk


def gpu_smem_bytes(block_q: int, block_k: int, block_bwd: int, head_dim: int, itemsize: int,
                   stages: int = GPU_STAGES) -> tuple[int, int]:
    """`(forward, backward)`: the shared memory, in bytes, that JAX's Pallas GPU attention
    (`jax.experimental.pallas.ops.gpu.attention`) needs with these blocks, as Triton lays it out: the tiles
    a kernel's loop loads and feeds to its dots are kept in shared memory, `stages` copies of each (the
    software pipeline), the tiles loaded once before the loop one copy each, every tile
    `[block, head_dim padded to a power of two]` in the inputs' dtype (`itemsize` bytes).

    forward  = itemsize * D * (block_q + 2 * stages * block_k)    q once; k and v in the loop
    backward = itemsize * D * (2 + 2 * stages) * block_bwd        dK/dV scan: k, v once, q and dO in the
                                                                  loop; the dQ scan the same with the roles
                                                                  swapped; the scans do not overlap

    On an H100 (jax 0.11.2) float32, head_dim 128, blocks 128 asked for 262,656 bytes: the k and v
    stages' 262,144 and 512 of barriers (Triton kept q out of shared memory there: counting it errs on
    the safe side). The float32/64 and bfloat16/128 forwards at blocks 128 (131,072 bytes of k and v) ran.
    """
    d = 1 << (head_dim - 1).bit_length()
    forward = itemsize * d * (block_q + 2 * stages * block_k)
    backward = itemsize * d * (2 + 2 * stages) * block_bwd
    return forward, backward


def gpu_block_sizes(block: int, head_dim: int, itemsize: int, budget: int = GPU_SMEM_BUDGET,
                    stages: int = GPU_STAGES) -> tuple[int, int, int]:
    """`(block_q, block_k, block_bwd)` for the Pallas GPU kernel on a sequence padded to a multiple of
    `block` (a power of two >= 16): `block, block` forward and `min(32, block)` for the backward's four
    blocks when `gpu_smem_bytes` says they fit in `budget`, else halved until they do: the forward's
    block_k while it is >= block_q (it is counted `2 * stages` times, and a larger block_q keeps fewer
    programs re-reading k and v), else block_q; never below 16 (Triton's smallest dot). The halved blocks
    still divide the padded length, and only the tiling changes (the same sums in another order).

    The budget, 200 KiB, is an H100's (sm_90) 227 KiB a block may have (232,448 bytes) less 27 KiB for
    what the count leaves out (barriers, the scratch of layout conversions and row reductions, another
    Triton's pipelining). bfloat16 up to head_dim 128 and float32 up to 64 keep JAX's 128/128/32;
    float32 at 128 takes 128/64/32, at 256 64/32/32; bfloat16 at 256 128/64/32.
    """
    need = lambda bq, bk, bb: gpu_smem_bytes(bq, bk, bb, head_dim, itemsize, stages)  # noqa: E731
    bq, bk, bb = block, block, min(GPU_BACKWARD_BLOCK, block)
    while need(bq, bk, bb)[0] > budget and max(bq, bk) > 16:
        if bk >= bq:
            bk //= 2
        else:
            bq //= 2
    while need(bq, bk, bb)[1] > budget and bb > 16:
        bb //= 2
    if max(need(bq, bk, bb)) > budget:
        raise ValueError(f"the Pallas GPU attention kernel cannot fit head_dim {head_dim} at {itemsize} bytes "
                         f"in {budget} bytes of shared memory: use model.attention=blockwise")
    return bq, bk, bb


def _pad(q, k, v, seg, length):
    s = q.shape[1]
    if length == s:
        return q, k, v, seg
    extra = length - s
    ids = -(jnp.arange(extra, dtype=jnp.int32) + s + 1)  # padding tokens of their own, as mask_ids makes them
    seg = jnp.concatenate([seg, jnp.broadcast_to(ids, (seg.shape[0], extra))], axis=1)
    pad = lambda x: jnp.pad(x, ((0, 0), (0, extra)) + ((0, 0),) * (x.ndim - 2))  # noqa: E731
    return pad(q), pad(k), pad(v), seg


def _splash_kernel(heads: int, length: int, block: int, interpret: bool):
    """The kernel for one shape, built anew in each trace. It holds arrays (the mask's block tables) that
    become constants of the trace it is built in: a kernel cached across traces hands one program's values
    to the next (`UnexpectedTracerError`, or an AOT-lowered program expecting extra inputs), and making
    them concrete with `ensure_compile_time_eval` places them on a device, which a deviceless TPU compile
    (`dapo-jax plan --topology`) has none of."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    mask = sa.MultiHeadMask([sa.CausalMask((length, length)) for _ in range(heads)])
    sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
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
    itemsize = max(x.dtype.itemsize for x in (q, k, v))
    bq, bk, bb = gpu_block_sizes(block, d, itemsize, GPU_SMEM_BUDGET)  # what fits the GPU's shared memory
    sizes = gpu_attention.BlockSizes(block_q=bq, block_k=bk, block_q_dkv=bb, block_kv_dkv=bb, block_q_dq=bb,
                                     block_kv_dq=bb)
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
