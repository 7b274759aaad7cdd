"""Flash-style attention in plain JAX: memory linear in the sequence, exact to float rounding, any backend.

The S queries and keys are cut into blocks of `block` tokens. For query block i, key blocks j <= i are
visited in order with an online softmax (FlashAttention, Dao et al. 2022; the backward pass of
FlashAttention-2, Dao 2023):

    s_ij = q_i k_j^T / sqrt(D)   (masked -> -inf)     m_i <- max(m_i, max_j s_ij)
    l_i  <- l_i e^(m_old - m_i) + sum_j e^(s_ij - m_i)
    o_i  <- o_i e^(m_old - m_i) + e^(s_ij - m_i) v_j,   finally o_i / l_i,  lse_i = m_i + log l_i

so only `[B, H, block, block]` scores exist at once, never the `[S, S]` square or its mask: the mask of a
block pair comes from the tokens' ids (`attention.allowed`). The custom VJP keeps `q, k, v`, the output
and `lse` and recomputes each block's probabilities `p = e^(s - lse)`:

    dv_j = sum_i p_ij^T do_i,   ds_ij = p_ij (do_i v_j^T - delta_i),   delta_i = rowsum(do_i o_i)
    dq_i = sum_j ds_ij k_j / sqrt(D),   dk_j = sum_i ds_ij^T q_i / sqrt(D)

Blocks with nothing to attend are not computed: above the diagonal (causality, by the loop bounds), and
block pairs whose real segment-id ranges do not meet in any row (a packed row's other sequences). The
range test only ever skips pairs that hold no allowed (query, key), whatever the ids: it is a
necessary condition for a match. Scores, the softmax statistics and the accumulators are float32; the
probabilities meet `v` in `v`'s dtype, as in the reference.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from dapo_jax.models.attention_mask import MaskIds, allowed

_NEG_INF = -1e30
DEFAULT_BLOCK = 256


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, ids: MaskIds, *,
                        block: int = DEFAULT_BLOCK) -> jax.Array:
    """`q [B, S, H_kv, R, D]`, `k, v [B, S, H_kv, D]`, `ids` from `attention.mask_ids` ->
    `[B, S, H_kv, R, D]` in `v`'s dtype. `S` need not be a multiple of `block` (padded inside)."""
    b, s = q.shape[:2]
    blk = min(int(block), s)
    n = -(-s // blk)
    pad = n * blk - s
    seg, branch = ids
    if pad:  # padding tokens of their own: each sees only itself
        pad_ids = jnp.broadcast_to(-(s + 1 + jnp.arange(pad, dtype=jnp.int32)), (b, pad))
        seg = jnp.concatenate([seg, pad_ids], axis=1)
        branch = None if branch is None else jnp.pad(branch, ((0, 0), (0, pad)))
        q, k, v = (jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2)) for x in (q, k, v))
    needed = _needed_blocks(seg, n, blk)
    if branch is None:
        branch = jnp.zeros_like(seg)
    out = _flash(q, k, v, seg, branch, needed, blk)
    return out[:, :s]


def _needed_blocks(seg: jax.Array, n: int, blk: int) -> jax.Array:
    """`[n, n]` bool: query block i may see key block j (j <= i, and the real ids' ranges of the two blocks
    meet in some row; the diagonal always, for the padding tokens that see themselves)."""
    real = seg >= 0  # padding ids are negative; real ids (segment ids) are not
    blocks = seg.reshape(seg.shape[0], n, blk)
    r = real.reshape(blocks.shape)
    lo = jnp.min(jnp.where(r, blocks, jnp.iinfo(jnp.int32).max), axis=-1)  # [B, n]
    hi = jnp.max(jnp.where(r, blocks, jnp.iinfo(jnp.int32).min), axis=-1)
    meet = jnp.any((lo[:, :, None] <= hi[:, None, :]) & (lo[:, None, :] <= hi[:, :, None]), axis=0)
    idx = jnp.arange(n)
    return (meet & (idx[None, :] <= idx[:, None])) | (idx[None, :] == idx[:, None])


def _blocks(x, n, blk):
    """`[B, n*blk, ...]` -> `[n, B, blk, ...]`."""
    return jnp.moveaxis(x.reshape(x.shape[0], n, blk, *x.shape[2:]), 1, 0)


def _unblocks(x):
    """`[n, B, blk, ...]` -> `[B, n*blk, ...]`."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], -1, *x.shape[3:])


def _block_mask(i, j, blk, seg_b, br_b):
    """`[B, 1, 1, blk, blk]`: query block i against key block j."""
    pos = jnp.arange(blk)
    ok = allowed(MaskIds(seg_b[i], br_b[i]), MaskIds(seg_b[j], br_b[j]), i * blk + pos, j * blk + pos)
    return ok[:, None, None]


def _scores(qi, kj, ok):
    """`[B, G, R, q, k]` float32 scores of `qi [B, q, G, R, D]` against `kj [B, k, G, D]`, masked."""
    s = jnp.einsum("bqgrd,bkgd->bgrqk", qi, kj, preferred_element_type=jnp.float32) / math.sqrt(qi.shape[-1])
    return jnp.where(ok, s, _NEG_INF)


def _first(row):
    """The first True of a bool vector (its length when none)."""
    return jnp.argmax(jnp.concatenate([row, jnp.ones((1,), bool)]))


def _forward(q, k, v, seg, branch, needed, blk):
    n = needed.shape[0]
    qb, kb, vb = _blocks(q, n, blk), _blocks(k, n, blk), _blocks(v, n, blk)
    seg_b, br_b = _blocks(seg, n, blk), _blocks(branch, n, blk)
    bsz, _, g, r, d = qb.shape[1:]

    def query_block(i):
        qi = qb[i]

        def visit(j, carry):
            m, l, acc = carry
            ok = _block_mask(i, j, blk, seg_b, br_b)
            s = _scores(qi, kb[j], ok)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            p = jnp.where(ok, jnp.exp(s - m_new[..., None]), 0.0)
            scale = jnp.exp(m - m_new)
            l = l * scale + jnp.sum(p, axis=-1)
            acc = acc * scale[..., None] + jnp.einsum("bgrqk,bkgd->bgrqd", p.astype(v.dtype), vb[j],
                                                      preferred_element_type=jnp.float32)
            return m_new, l, acc

        def step(j, carry):
            return jax.lax.cond(needed[i, j], visit, lambda _, c: c, j, carry)

        init = (jnp.full((bsz, g, r, blk), _NEG_INF, jnp.float32), jnp.zeros((bsz, g, r, blk), jnp.float32),
                jnp.zeros((bsz, g, r, blk, d), jnp.float32))
        m, l, acc = jax.lax.fori_loop(_first(needed[i]), i + 1, step, init)
        out = jnp.einsum("bgrqd->bqgrd", acc / l[..., None]).astype(v.dtype)
        return out, m + jnp.log(l)

    out, lse = jax.lax.map(query_block, jnp.arange(n))
    return _unblocks(out), lse  # [B, S, G, R, D], [n, B, G, R, blk]


@partial(jax.custom_vjp, nondiff_argnums=(6,))
def _flash(q, k, v, seg, branch, needed, blk):
    return _forward(q, k, v, seg, branch, needed, blk)[0]


def _flash_fwd(q, k, v, seg, branch, needed, blk):
    out, lse = _forward(q, k, v, seg, branch, needed, blk)
    return out, (q, k, v, seg, branch, needed, out, lse)


def _flash_bwd(blk, residuals, d_out):
    q, k, v, seg, branch, needed, out, lse = residuals
    n = needed.shape[0]
    qb, kb, vb, dob = (_blocks(x, n, blk) for x in (q, k, v, d_out))
    seg_b, br_b = _blocks(seg, n, blk), _blocks(branch, n, blk)
    scale = 1.0 / math.sqrt(q.shape[-1])
    delta = jnp.einsum("bsgrd,bsgrd->bgrs", d_out.astype(jnp.float32), out.astype(jnp.float32))
    delta = jnp.moveaxis(delta.reshape(*delta.shape[:3], n, blk), 3, 0)  # [n, B, G, R, blk], like lse

    def probs(i, j):
        """`(p, ds)` of block pair (i, j), both `[B, G, R, q, k]` float32."""
        ok = _block_mask(i, j, blk, seg_b, br_b)
        p = jnp.where(ok, jnp.exp(_scores(qb[i], kb[j], ok) - lse[i][..., None]), 0.0)
        dp = jnp.einsum("bqgrd,bkgd->bgrqk", dob[i], vb[j], preferred_element_type=jnp.float32)
        return p, p * (dp - delta[i][..., None])

    def dq_block(i):
        def visit(j, dq):
            _, ds = probs(i, j)
            return dq + jnp.einsum("bgrqk,bkgd->bqgrd", ds.astype(k.dtype), kb[j], preferred_element_type=jnp.float32)

        step = lambda j, dq: jax.lax.cond(needed[i, j], visit, lambda _, x: x, j, dq)  # noqa: E731
        dq = jax.lax.fori_loop(_first(needed[i]), i + 1, step, jnp.zeros(qb.shape[1:], jnp.float32))
        return (dq * scale).astype(q.dtype)

    def dkv_block(j):
        def visit(i, carry):
            dk, dv = carry
            p, ds = probs(i, j)
            dv = dv + jnp.einsum("bgrqk,bqgrd->bkgd", p.astype(v.dtype), dob[i], preferred_element_type=jnp.float32)
            dk = dk + jnp.einsum("bgrqk,bqgrd->bkgd", ds.astype(q.dtype), qb[i], preferred_element_type=jnp.float32)
            return dk, dv

        step = lambda i, c: jax.lax.cond(needed[i, j], visit, lambda _, x: x, i, c)  # noqa: E731
        last = n - _first(needed[::-1, j])  # one past the last query block that sees key block j
        zeros = jnp.zeros(kb.shape[1:], jnp.float32)
        dk, dv = jax.lax.fori_loop(j, last, step, (zeros, zeros))
        return (dk * scale).astype(k.dtype), dv.astype(v.dtype)

    dq = _unblocks(jax.lax.map(dq_block, jnp.arange(n)))
    dk, dv = jax.lax.map(dkv_block, jnp.arange(n))
    return dq, _unblocks(dk), _unblocks(dv), None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)
