"""models/blockwise_attention.py against the reference (today's attention, the oracle): values and
gradients, float32 tight and bfloat16 within bf16 rounding, with padding, several segments per row,
shared-prompt branches, GQA and lengths that are not multiples of the block; the blocks it skips; and
its memory, from compiled programs, growing linearly in the sequence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.models.attention import mask_ids, reference_attention
from dapo_jax.models.blockwise_attention import _needed_blocks, blockwise_attention
from tests.models.test_attention import layouts, numpy_mask


def inputs(dtype, b=3, s=23, g=2, r=3, d=8, seed=0):
    ks = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(ks[0], (b, s, g, r, d)).astype(dtype)
    k, v = (jax.random.normal(kk, (b, s, g, d)).astype(dtype) for kk in ks[1:3])
    w = jax.random.normal(ks[3], (b, s, g, r, d), jnp.float32)
    return q, k, v, w


def value_and_grads(fn, q, k, v, w, real):
    """The output and the gradients of `Σ out·w` over the real queries."""
    keep = jnp.asarray(real)[:, :, None, None, None]
    loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32) * w * keep)  # noqa: E731
    return fn(q, k, v), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)


@pytest.mark.parametrize("block", [4, 8, 16, 64])
@pytest.mark.parametrize("kind", ["causal", "segments", "branches"])
def test_float32_values_and_gradients_equal_the_reference(block, kind):
    real, seg, branch = layouts()
    ids = mask_ids(jnp.asarray(real, jnp.int32), None if kind == "causal" else jnp.asarray(seg),
                   jnp.asarray(branch) if kind == "branches" else None)
    q, k, v, w = inputs(jnp.float32)
    want, want_g = value_and_grads(lambda *a: reference_attention(*a, ids), q, k, v, w, real)
    got, got_g = value_and_grads(lambda *a: blockwise_attention(*a, ids, block=block), q, k, v, w, real)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-6)
    for a, b in zip(got_g, want_g):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    assert float(jnp.abs(got_g[1]).max()) > 0


def test_bfloat16_within_bf16_rounding_of_the_reference():
    real, seg, branch = layouts()
    ids = mask_ids(jnp.asarray(real, jnp.int32), jnp.asarray(seg), jnp.asarray(branch))
    q, k, v, w = inputs(jnp.bfloat16, seed=3)
    want, want_g = value_and_grads(lambda *a: reference_attention(*a, ids), q, k, v, w, real)
    got, got_g = value_and_grads(lambda *a: blockwise_attention(*a, ids, block=8), q, k, v, w, real)
    assert got.dtype == jnp.bfloat16
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    np.testing.assert_allclose(f32(got)[real], f32(want)[real], atol=3e-2, rtol=3e-2)
    for a, b in zip(got_g, want_g):
        assert a.dtype == jnp.bfloat16
        np.testing.assert_allclose(f32(a), f32(b), atol=6e-2, rtol=6e-2)


def test_skipped_blocks_hold_no_allowed_pair():
    """The block table: every block pair with an allowed (query, key) is visited, and packed rows skip some."""
    rng = np.random.default_rng(1)
    s, blk = 64, 8
    real = np.ones((2, s), bool)
    real[1, 60:] = False
    seg = np.ones((2, s), np.int32)
    bounds = np.sort(rng.choice(np.arange(4, s), 6, replace=False))
    for i, lo in enumerate(bounds):
        seg[0, lo:] = i + 2
    seg[1, 30:] = 2
    ids = mask_ids(jnp.asarray(real, jnp.int32), jnp.asarray(np.where(real, seg, 0)))
    needed = np.asarray(_needed_blocks(ids.segment_ids, s // blk, blk))
    mask = numpy_mask(real, np.where(real, seg, 0))
    has_pair = mask.reshape(2, s // blk, blk, s // blk, blk).any(axis=(0, 2, 4))
    assert np.all(needed[has_pair])  # never skips a pair that matters
    assert np.all(needed == np.tril(needed))  # causal
    assert (~needed & np.tril(np.ones_like(needed))).any()  # and skips below the diagonal too


def test_one_segment_per_row_is_unchanged_by_the_row_next_to_it():
    """Rows are independent: a row's output does not depend on the other rows (block skipping is
    decided over all rows, so this checks it never drops a pair one row needs)."""
    real, seg, _ = layouts()
    ids = mask_ids(jnp.asarray(real, jnp.int32), jnp.asarray(seg))
    q, k, v, _ = inputs(jnp.float32)
    alone = blockwise_attention(q[1:2], k[1:2], v[1:2], jax.tree.map(lambda x: x[1:2], ids), block=4)
    together = blockwise_attention(q, k, v, ids, block=4)[1:2]
    np.testing.assert_allclose(np.asarray(alone)[:, real[1]], np.asarray(together)[:, real[1]], atol=1e-6)


def compiled_temporaries(fn, s, block, dtype=jnp.bfloat16):
    """Bytes of temporaries of the compiled forward + backward at sequence length s."""
    b, g, r, d = 1, 2, 4, 64
    q = jax.ShapeDtypeStruct((b, s, g, r, d), dtype)
    kv = jax.ShapeDtypeStruct((b, s, g, d), dtype)
    mask = jax.ShapeDtypeStruct((b, s), jnp.int32)

    def loss(q, k, v, m):
        return jnp.sum(fn(q, k, v, mask_ids(m), block).astype(jnp.float32))

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv, mask).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_memory_grows_linearly_from_1k_to_8k():
    """From compiled programs (XLA's memory analysis, not a timing): blockwise temporaries grow about
    linearly in S, while the reference's grow with S^2."""
    blockwise = lambda q, k, v, ids, blk: blockwise_attention(q, k, v, ids, block=blk)  # noqa: E731
    reference = lambda q, k, v, ids, blk: reference_attention(q, k, v, ids)  # noqa: E731
    small, large = (compiled_temporaries(blockwise, s, 256) for s in (1024, 8192))
    assert large / small < 8 * 1.5, (small, large)  # 8x the tokens: about 8x the bytes, not 64x
    ref_small, ref_large = (compiled_temporaries(reference, s, None) for s in (1024, 4096))
    assert ref_large / ref_small > 10, (ref_small, ref_large)  # 4x the tokens: ~16x the bytes
    assert large < ref_large  # 8k blockwise below 4k reference
