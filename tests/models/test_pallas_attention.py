"""models/pallas_attention.py: JAX's splash (TPU) and Pallas GPU flash kernels in the decoder's layout,
run in Pallas interpret mode on this CPU, against the reference: values and gradients with padding,
segments and grouped key/value heads, alone and under a mesh (shard_map over rows and heads)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.models import pallas_attention
from dapo_jax.models.attention import mask_ids, reference_attention
from dapo_jax.parallel.mesh import make_mesh

KERNELS = {"splash": pallas_attention.splash, "gpu_flash": pallas_attention.gpu_flash}


def case(b=2, s=37, g=2, r=2, d=8):
    real = np.ones((b, s), bool)
    real[0, :5] = False  # a left-padded prompt
    real[1, 30:] = False  # trailing padding
    seg = np.ones((b, s), np.int32)
    seg[1, 12:] = 2  # two packed sequences
    ids = mask_ids(jnp.asarray(real, jnp.int32), jnp.asarray(np.where(real, seg, 0)))
    ks = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(ks[0], (b, s, g, r, d))
    k, v = (jax.random.normal(kk, (b, s, g, d)) for kk in ks[1:3])
    w = jax.random.normal(ks[3], q.shape) * jnp.asarray(real)[:, :, None, None, None]
    return real, ids, q, k, v, w


def value_and_grads(fn, q, k, v, w):
    return fn(q, k, v), jax.grad(lambda *a: jnp.sum(fn(*a) * w), argnums=(0, 1, 2))(q, k, v)


@pytest.mark.parametrize("name", ["splash", "gpu_flash"])
def test_kernel_equals_the_reference(name):
    real, ids, q, k, v, w = case()
    kernel = KERNELS[name]
    want, want_g = value_and_grads(lambda *a: reference_attention(*a, ids), q, k, v, w)
    got, got_g = value_and_grads(lambda *a: kernel(*a, ids.segment_ids, interpret=True), q, k, v, w)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5)
    for a, b in zip(got_g, want_g):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


KIB = 1024


@pytest.mark.parametrize("itemsize, head_dim, blocks, need", [
    # bytes = itemsize * D * (block_q + 4 * block_k) forward, itemsize * D * 6 * block_bwd backward
    (2, 64, (128, 128, 32), (80 * KIB, 24 * KIB)),     # 2*64*640, 2*64*192: JAX's blocks, as before
    (2, 128, (128, 128, 32), (160 * KIB, 48 * KIB)),   # 2*128*640: ran on an H100, kept as before
    (2, 256, (128, 64, 32), (192 * KIB, 96 * KIB)),    # 2*256*640 = 320 KiB > 200 -> block_k 64: 2*256*384
    (4, 64, (128, 128, 32), (160 * KIB, 48 * KIB)),    # 4*64*640: ran on an H100, kept as before
    (4, 128, (128, 64, 32), (192 * KIB, 96 * KIB)),    # 4*128*640 = 320 KiB (the H100's failure) -> 4*128*384
    (4, 256, (64, 32, 32), (192 * KIB, 192 * KIB)),    # 640 -> 384 (k 64) -> 320 (q 64) -> 4*256*192 (k 32)
    (4, 80, (128, 64, 32), (192 * KIB, 96 * KIB)),     # head_dim padded to 128 as the kernel pads it
])
def test_gpu_block_sizes_fit_the_shared_memory_budget(itemsize, head_dim, blocks, need):
    """The blocks the GPU kernel gets for float32 (4 bytes) and bfloat16 (2) at head_dim 64/128/256 and a
    sequence of >= 128 tokens, and the shared memory they need, computed by hand (200 KiB budget)."""
    assert pallas_attention.gpu_block_sizes(128, head_dim, itemsize) == blocks
    assert pallas_attention.gpu_smem_bytes(*blocks, head_dim, itemsize) == need
    assert max(need) <= pallas_attention.GPU_SMEM_BUDGET == 200 * KIB


def test_gpu_block_sizes_of_short_sequences_and_the_smallest_blocks():
    assert pallas_attention.gpu_block_sizes(16, 16, 4) == (16, 16, 16)  # the tiny models: as before
    assert pallas_attention.gpu_block_sizes(64, 128, 4) == (64, 64, 32)  # 4*128*(64+256) = 160 KiB fits
    assert pallas_attention.gpu_block_sizes(64, 256, 4) == (64, 32, 32)
    with pytest.raises(ValueError, match="head_dim 4096"):
        pallas_attention.gpu_block_sizes(128, 4096, 4)  # 4*4096*80 at blocks 16: no block fits


def test_kernel_with_smaller_blocks_equals_the_reference(monkeypatch):
    """Halved blocks change the tiling only: with a budget that forces block_q 32, block_k 16 and the
    backward's 16 (the sequence padded to 64), the same values and gradients as the reference."""
    monkeypatch.setattr(pallas_attention, "GPU_SMEM_BUDGET", 4 * 8 * (32 + 4 * 16))
    assert pallas_attention.gpu_block_sizes(64, 8, 4, pallas_attention.GPU_SMEM_BUDGET) == (32, 16, 16)
    real, ids, q, k, v, w = case()
    want, want_g = value_and_grads(lambda *a: reference_attention(*a, ids), q, k, v, w)
    got, got_g = value_and_grads(lambda *a: pallas_attention.gpu_flash(*a, ids.segment_ids, interpret=True), q, k, v, w)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5)
    for a, b in zip(got_g, want_g):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_kernel_under_a_mesh_equals_one_device():
    """Rows over ("data", "fsdp") and key/value heads over "tensor", each device running the kernel on its
    shard (shard_map): the same values and gradients as without a mesh."""
    real, ids, q, k, v, w = case()
    fn = lambda *a: pallas_attention.gpu_flash(*a, ids.segment_ids, interpret=True)  # noqa: E731
    alone, alone_g = value_and_grads(fn, q, k, v, w)
    mesh = make_mesh(data=2, fsdp=1, tensor=2, devices=jax.devices()[:4])  # the run's mesh: Auto axes
    with jax.set_mesh(mesh):
        meshed, meshed_g = jax.jit(lambda *a: value_and_grads(fn, *a))(q, k, v, w)
    np.testing.assert_allclose(np.asarray(meshed)[real], np.asarray(alone)[real], atol=1e-6)
    for a, b in zip(meshed_g, alone_g):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


on_a_gpu = pytest.mark.skipif(jax.default_backend() != "gpu",
                              reason="compiles the Pallas GPU kernel for the GPU (Triton), not interpreted: needs a GPU")


def relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@on_a_gpu
@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 3e-2), (jnp.bfloat16, 3e-2)])
@pytest.mark.parametrize("s, d", [(300, 64), (37, 16), (1030, 128)])
def test_gpu_flash_compiled_for_the_gpu_equals_the_reference(dtype, tol, s, d):
    """The kernel as a GPU run compiles it (lengths off the block, the tiny models' head size 16, Qwen's 64
    and 128), against the float32 reference at full matmul precision: values and gradients, relative error.
    The kernel's float32 dots run as TF32 on an H100 (10-bit mantissa): at 1030 x 128 float32 the error
    went over 5e-3 there, so float32 gets bf16's bound; a wrong mask or block is off by far more. float32 at
    head_dim 128 runs blocks 128/64/32 (`gpu_block_sizes`): 128/128/32 asked for 262,656 bytes of shared
    memory where an H100 has 232,448."""
    real, ids, q, k, v, w = case(b=2, s=s, g=2, r=3, d=d)
    with jax.default_matmul_precision("highest"):
        want, want_g = jax.jit(lambda *a: value_and_grads(lambda *x: reference_attention(*x, ids), *a))(q, k, v, w)
    cast = [x.astype(dtype) for x in (q, k, v)]
    got, got_g = jax.jit(lambda *a: value_and_grads(
        lambda *x: pallas_attention.gpu_flash(*x, ids.segment_ids), *a))(*cast, w.astype(dtype))
    assert got.dtype == dtype and all(g.dtype == dtype for g in got_g)
    errors = [relative_error(np.asarray(got)[real], np.asarray(want)[real])] + [
        relative_error(a, b) for a, b in zip(got_g, want_g)]
    block = pallas_attention._padded(s, pallas_attention.GPU_BLOCK, 16)[0]
    blocks = pallas_attention.gpu_block_sizes(block, d, jnp.dtype(dtype).itemsize)
    print(f"blocks {blocks}: relative errors (out, dq, dk, dv)", ", ".join(f"{e:.3g}" for e in errors))
    assert errors[0] < tol
    for a, e in zip(got_g, errors[1:]):
        assert np.isfinite(np.asarray(a, np.float32)).all()
        assert e < tol


@pytest.mark.parametrize("name", ["splash", "gpu_flash"])
def test_kernel_in_programs_lowered_ahead_of_time_then_called(name):
    """What `dapo-jax plan` does, then what the run does: two programs of the same shape lowered on abstract
    inputs (the forward, and its gradient), compiled, then each called on real arrays: values and gradients
    equal the reference. A kernel cached with the first trace's values (splash's before issue 47) lowers
    the second program with those values as extra inputs, and the call then fails."""
    real, ids, q, k, v, w = case()
    kernel = functools.partial(KERNELS[name], segment_ids=ids.segment_ids, interpret=True)
    forward = jax.jit(lambda *a: kernel(*a))
    backward = jax.jit(jax.grad(lambda *a: jnp.sum(kernel(*a[:3]) * a[3]), argnums=(0, 1, 2)))
    abstract = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v, w)]
    compiled = forward.lower(*abstract[:3]).compile(), backward.lower(*abstract).compile()
    want, want_g = value_and_grads(lambda *a: reference_attention(*a, ids), q, k, v, w)
    np.testing.assert_allclose(np.asarray(compiled[0](q, k, v))[real], np.asarray(want)[real], atol=1e-5)
    for a, b in zip(compiled[1](q, k, v, w), want_g):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
