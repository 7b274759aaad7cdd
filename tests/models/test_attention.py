"""models/attention.py: the ids that state the mask, the choice of implementation, and the reference
against a NumPy softmax of the decoder's documented mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.models import attention
from dapo_jax.models.attention import AttentionUnavailable, mask_ids, resolve


def numpy_mask(real, seg=None, branch=None):
    """The decoder's mask as documented, element by element: a real query sees earlier real keys of its
    segment (and of its branch or the shared prefix); a padding query sees only itself."""
    b, s = real.shape
    seg = np.ones((b, s), int) if seg is None else seg
    out = np.zeros((b, s, s), bool)
    for r in range(b):
        for i in range(s):
            for j in range(i + 1):
                ok = real[r, i] and real[r, j] and seg[r, i] == seg[r, j]
                if branch is not None:
                    ok = ok and (branch[r, j] == 0 or branch[r, i] == branch[r, j])
                out[r, i, j] = ok or i == j
    return out


def numpy_attention(q, k, v, mask):
    """float64 softmax attention: q [B, S, G, R, D], k/v [B, S, G, D], mask [B, S, S]."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = np.einsum("bqgrd,bkgd->bgrqk", q, k) / np.sqrt(q.shape[-1])
    s = np.where(mask[:, None, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bgrqk,bkgd->bqgrd", p, v)


def layouts(s=23):
    """(real, segment_ids, branch_ids) of three kinds of rows: left-padded prompt + right-padded response,
    packed segments with trailing padding, shared-prompt branches."""
    real = np.ones((3, s), bool)
    real[0, :4] = False
    real[0, 19:] = False
    real[1, 20:] = False
    real[2, 21:] = False
    seg = np.ones((3, s), np.int32)
    seg[1, 8:] = 2
    seg[1, 13:] = 3
    seg[2, 12:] = 2
    branch = np.zeros((3, s), np.int32)
    branch[2, 5:9], branch[2, 9:12] = 1, 2  # segment 1: prefix 0..4, branches 1 and 2
    branch[2, 15:18], branch[2, 18:21] = 1, 2  # segment 2: prefix 12..14
    return real, np.where(real, seg, 0), branch


def test_mask_ids_state_the_documented_mask():
    real, seg, branch = layouts()
    ids = mask_ids(jnp.asarray(real, jnp.int32), jnp.asarray(seg), jnp.asarray(branch))
    pos = jnp.arange(real.shape[1])
    got = np.asarray(attention.allowed(ids, ids, pos, pos))
    np.testing.assert_array_equal(got, numpy_mask(real, seg, branch))
    assert np.all(np.asarray(ids.segment_ids)[~real] < 0)  # padding: ids of their own
    assert len(set(np.asarray(ids.segment_ids)[0][~real[0]])) == int((~real[0]).sum())


@pytest.mark.parametrize("with_branches", [False, True])
def test_reference_matches_a_float64_softmax_of_the_documented_mask(with_branches):
    real, seg, branch = layouts()
    rng = np.random.default_rng(0)
    q = rng.normal(size=(3, 23, 2, 3, 8)).astype(np.float32)
    k, v = (rng.normal(size=(3, 23, 2, 8)).astype(np.float32) for _ in range(2))
    br = branch if with_branches else None
    ids = mask_ids(jnp.asarray(real, jnp.int32), jnp.asarray(seg), None if br is None else jnp.asarray(br))
    got = attention.reference_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), ids)
    np.testing.assert_allclose(np.asarray(got), numpy_attention(q, k, v, numpy_mask(real, seg, br)), atol=2e-6)


def test_auto_picks_per_backend_and_length():
    assert resolve("auto", platform="tpu", seq_len=8) == "splash"
    assert resolve("auto", platform="gpu", seq_len=8) == "gpu_flash"
    assert resolve("auto", platform="cpu", seq_len=attention.CPU_BLOCKWISE_FROM - 1) == "reference"
    assert resolve("auto", platform="cpu", seq_len=attention.CPU_BLOCKWISE_FROM) == "blockwise"
    for name in ("reference", "blockwise"):
        assert resolve(name, platform="tpu", seq_len=8) == name


@pytest.mark.parametrize(("name", "platform"), [("splash", "cpu"), ("splash", "gpu"), ("gpu_flash", "cpu"),
                                                ("gpu_flash", "tpu")])
def test_an_explicit_kernel_off_its_backend_is_one_line_error(name, platform):
    with pytest.raises(AttentionUnavailable, match=f"model.attention={name} needs a .* runs on {platform}") as e:
        resolve(name, platform=platform, seq_len=8)
    assert "\n" not in str(e.value)
    with attention.pallas_interpret():  # the tests run the kernels in interpret mode on CPU
        assert resolve(name, platform=platform, seq_len=8) == name


def test_kernels_refuse_branches():
    assert attention.supports_branches("reference") and attention.supports_branches("blockwise")
    assert not attention.supports_branches("splash") and not attention.supports_branches("gpu_flash")
    real, seg, branch = layouts()
    ids = mask_ids(jnp.asarray(real, jnp.int32), jnp.asarray(seg), jnp.asarray(branch))
    x = jnp.zeros((3, 23, 1, 1, 8))
    with pytest.raises(AttentionUnavailable, match="branch_ids"):
        attention.attend(x, x[:, :, :, 0], x[:, :, :, 0], ids, implementation="splash")


def test_current_platform_follows_the_mesh():
    assert attention.current_platform() == jax.default_backend()
    mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
    with jax.set_mesh(mesh):
        assert attention.current_platform() == "cpu"
