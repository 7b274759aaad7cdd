"""The chunked log-prob/entropy kernel against NumPy float64 formulas, autodiff and a tiny Decoder."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder
from dapo_jax.models.logprobs import naive_token_logprobs, output_grad_norms, response_logprobs, token_logprobs


# --------------------------------------------------------------------------- NumPy references
def np_logprobs(h, w, y, temperature=1.0):
    """float64 log_softmax(h·W/τ)[y] and −Σ p log p, written without any JAX."""
    z = np.asarray(h, np.float64) @ np.asarray(w, np.float64) / temperature
    z = z - z.max(-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
    logp = np.take_along_axis(log_p, np.asarray(y)[..., None], -1)[..., 0]
    return logp, -(np.exp(log_p) * log_p).sum(-1)


def np_loss(h, w, y, a, b, temperature):
    logp, ent = np_logprobs(h, w, y, temperature)
    return float((a * logp).sum() + (b * ent).sum())


def make_inputs(seed, shape_bt, d, v, dtype=jnp.float32, scale=1.0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    h = (scale * jax.random.normal(k1, (*shape_bt, d))).astype(dtype)
    w = (scale * jax.random.normal(k2, (d, v))).astype(dtype)
    y = jax.random.randint(k3, shape_bt, 0, v)
    return h, w, y


def weighted_loss(fn, y, a, b):
    """Σ a·logp + Σ b·H: exercises the logp and the entropy cotangents at once, per position."""

    def loss(h, w):
        logp, ent = fn(h, w, y)
        return jnp.sum(a * logp) + jnp.sum(b * ent)

    return loss


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1e-12)


# --------------------------------------------------------------------------- values
@pytest.mark.parametrize(
    "chunk_size,vocab_chunk", [(1, None), (3, 7), (8, 16), (13, None), (64, 50), (5, 1000), (4, 49)]
)
def test_values_match_numpy_fp32(chunk_size, vocab_chunk):
    h, w, y = make_inputs(0, (3, 13), 8, 50)
    fn = jax.jit(partial(token_logprobs, temperature=0.7, chunk_size=chunk_size, vocab_chunk=vocab_chunk))
    logp, ent = fn(h, w, y)
    ref_logp, ref_ent = np_logprobs(h, w, y, 0.7)
    assert logp.dtype == ent.dtype == jnp.float32
    assert logp.shape == ent.shape == (3, 13)
    np.testing.assert_allclose(logp, ref_logp, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, atol=1e-5, rtol=1e-5)


@settings(max_examples=10, deadline=None)
@given(
    b=st.integers(1, 3), t=st.integers(1, 11), v=st.integers(2, 40),
    chunk=st.integers(1, 12), vocab_chunk=st.one_of(st.none(), st.integers(1, 45)),
    temperature=st.sampled_from([0.3, 1.0, 1.7]), seed=st.integers(0, 2**16),
)
def test_values_property(b, t, v, chunk, vocab_chunk, temperature, seed):
    h, w, y = make_inputs(seed, (b, t), 6, v, scale=2.0)
    fn = jax.jit(partial(token_logprobs, chunk_size=chunk, vocab_chunk=vocab_chunk))
    logp, ent = fn(h, w, y, temperature=temperature)
    ref_logp, ref_ent = np_logprobs(h, w, y, temperature)
    np.testing.assert_allclose(logp, ref_logp, atol=3e-5, rtol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, atol=3e-5, rtol=1e-5)
    # log-probs are <= 0 and entropies >= 0 up to the fp32 rounding the value checks allow
    assert np.all(np.asarray(logp) <= 3e-5) and np.all(np.asarray(ent) >= -3e-5)
    assert np.all(np.asarray(ent) <= np.log(v) + 1e-4)


def test_hand_computed_case():
    # h·W = [0, log 3] at τ=1: p = [1/4, 3/4]; H = −(¼ log ¼ + ¾ log ¾).
    h = jnp.array([[[1.0]]])
    w = jnp.array([[0.0, np.log(3.0)]])
    for vocab_chunk in (None, 1):
        logp, ent = token_logprobs(h, w, jnp.array([[1]]), vocab_chunk=vocab_chunk)
        np.testing.assert_allclose(logp, [[np.log(0.75)]], rtol=1e-6)
        np.testing.assert_allclose(ent, [[-(0.25 * np.log(0.25) + 0.75 * np.log(0.75))]], rtol=1e-6)
    # τ = 2 halves the logits: p ∝ [1, √3].
    logp, _ = token_logprobs(h, w, jnp.array([[0]]), temperature=2.0)
    np.testing.assert_allclose(logp, [[np.log(1 / (1 + np.sqrt(3)))]], rtol=1e-6)


def test_naive_reference_matches_numpy():
    h, w, y = make_inputs(1, (2, 9), 8, 30)
    logp, ent = naive_token_logprobs(h, w, y, temperature=1.3)
    ref_logp, ref_ent = np_logprobs(h, w, y, 1.3)
    np.testing.assert_allclose(logp, ref_logp, atol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, atol=1e-5)


def test_extreme_logits_stay_finite():
    # Logits of ±3000 overflow a naive exp; the online log-sum-exp must not.
    h, w, y = make_inputs(2, (2, 5), 4, 23, scale=30.0)
    for vocab_chunk in (None, 4):
        logp, ent = token_logprobs(h, w, y, chunk_size=2, vocab_chunk=vocab_chunk)
        ref_logp, ref_ent = np_logprobs(h, w, y)
        assert np.all(np.isfinite(logp)) and np.all(np.isfinite(ent))
        np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-2)
        np.testing.assert_allclose(ent, ref_ent, atol=1e-3)


def test_leading_dims_and_temperature_as_array():
    h, w, y = make_inputs(3, (2, 3, 7), 8, 20)
    logp, ent = jax.jit(lambda h, w, y, tau: token_logprobs(h, w, y, temperature=tau, chunk_size=3))(
        h, w, y, jnp.float32(0.6)
    )
    ref_logp, ref_ent = np_logprobs(h, w, y, 0.6)
    assert logp.shape == (2, 3, 7)
    np.testing.assert_allclose(logp, ref_logp, atol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, atol=1e-5)


def test_out_of_range_target_is_nan_and_bad_shapes_are_named():
    h, w, y = make_inputs(4, (1, 4), 8, 10)
    y = y.at[0, 2].set(10)
    for vocab_chunk in (None, 3):
        logp, _ = token_logprobs(h, w, y, vocab_chunk=vocab_chunk)
        assert np.isnan(logp[0, 2]) and np.all(np.isfinite(np.delete(np.asarray(logp[0]), 2)))
    with pytest.raises(ValueError, match="targets"):
        token_logprobs(h, w, y[:, :3])
    with pytest.raises(ValueError, match="targets"):
        token_logprobs(h, w, y.astype(jnp.float32))
    with pytest.raises(ValueError, match="w must be"):
        token_logprobs(h, w.T, y)
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(h, w, y, chunk_size=0)


# --------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("chunk_size,vocab_chunk", [(1, None), (4, None), (5, 7), (13, 16), (32, 64)])
def test_gradients_match_autodiff_of_naive(chunk_size, vocab_chunk):
    h, w, y = make_inputs(5, (2, 13), 8, 50)
    k = jax.random.split(jax.random.key(9))
    a = jax.random.normal(k[0], y.shape)
    b = jax.random.normal(k[1], y.shape)

    def ours(h, w, y):
        return token_logprobs(h, w, y, temperature=0.8, chunk_size=chunk_size, vocab_chunk=vocab_chunk)

    def naive(h, w, y):
        return naive_token_logprobs(h, w, y, temperature=0.8)

    def grads(kernel):
        return jax.jit(lambda h, w, a, b: jax.grad(weighted_loss(kernel, y, a, b), argnums=(0, 1))(h, w))

    ours_grad, naive_grad = grads(ours), grads(naive)
    for coef in [(a, b), (a, 0 * b), (0 * a, b)]:  # both, logp only, entropy only
        g, g_ref = ours_grad(h, w, *coef), naive_grad(h, w, *coef)
        for x, ref in zip(g, g_ref):
            assert x.dtype == jnp.float32
            assert rel_err(x, ref) < 1e-5, rel_err(x, ref)


@pytest.mark.parametrize("vocab_chunk", [None, 6])
def test_gradients_match_numpy_finite_differences(vocab_chunk):
    # Fully independent of JAX's autodiff: float64 central differences of the NumPy formula.
    h, w, y = make_inputs(6, (2, 5), 4, 17)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=y.shape), rng.normal(size=y.shape)
    loss = weighted_loss(
        lambda h, w, y: token_logprobs(h, w, y, temperature=1.5, chunk_size=2, vocab_chunk=vocab_chunk),
        y, jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32),
    )
    gh, gw = jax.grad(loss, argnums=(0, 1))(h, w)
    hn, wn, eps = np.asarray(h, np.float64), np.asarray(w, np.float64), 1e-6
    for _ in range(3):
        uh, uw = rng.normal(size=hn.shape), rng.normal(size=wn.shape)
        fd_h = (np_loss(hn + eps * uh, wn, y, a, b, 1.5) - np_loss(hn - eps * uh, wn, y, a, b, 1.5)) / (2 * eps)
        fd_w = (np_loss(hn, wn + eps * uw, y, a, b, 1.5) - np_loss(hn, wn - eps * uw, y, a, b, 1.5)) / (2 * eps)
        np.testing.assert_allclose(np.sum(np.asarray(gh) * uh), fd_h, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.sum(np.asarray(gw) * uw), fd_w, rtol=1e-4, atol=1e-4)


def test_padded_tail_gets_no_gradient_leak():
    # T=7 with chunk 4 pads one position internally; the gradient w.r.t. a position whose outputs
    # carry no weight must be exactly 0, and real positions must not see the padding.
    h, w, y = make_inputs(7, (1, 7), 4, 11)
    a = jnp.zeros((1, 7)).at[0, 6].set(1.0)
    gh, _ = jax.grad(weighted_loss(lambda h, w, y: token_logprobs(h, w, y, chunk_size=4), y, a, a), argnums=(0, 1))(h, w)
    assert np.all(np.asarray(gh[0, :6]) == 0.0) and np.any(np.asarray(gh[0, 6]) != 0.0)


# --------------------------------------------------------------------------- bf16
@pytest.mark.parametrize("vocab_chunk", [None, 16])
def test_bf16_inputs(vocab_chunk):
    h, w, y = make_inputs(8, (2, 12), 32, 100, dtype=jnp.bfloat16)
    logp, ent = token_logprobs(h, w, y, temperature=0.9, chunk_size=5, vocab_chunk=vocab_chunk)
    assert logp.dtype == ent.dtype == jnp.float32
    # bf16·bf16 products are exact in fp32 and accumulated in fp32: against the bf16-rounded inputs
    # in float64 only the summation order differs.
    ref_logp, ref_ent = np_logprobs(np.asarray(h, np.float32), np.asarray(w, np.float32), y, 0.9)
    np.testing.assert_allclose(logp, ref_logp, atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, atol=1e-4, rtol=1e-5)

    a = jnp.asarray(np.random.default_rng(1).normal(size=y.shape), jnp.float32)
    ours = jax.grad(
        weighted_loss(lambda h, w, y: token_logprobs(h, w, y, temperature=0.9, chunk_size=5,
                                                     vocab_chunk=vocab_chunk), y, a, 0.1 * a),
        argnums=(0, 1),
    )(h, w)
    ref = jax.grad(
        weighted_loss(lambda h, w, y: naive_token_logprobs(h, w, y, temperature=0.9), y, a, 0.1 * a),
        argnums=(0, 1),
    )(h.astype(jnp.float32), w.astype(jnp.float32))
    for x, r in zip(ours, ref):
        assert x.dtype == jnp.bfloat16
        # The logit cotangent is rounded to bf16 before the backward matmuls (as in bf16 autodiff):
        # stated tolerance 2e-2 of the gradient's max magnitude.
        assert rel_err(x, r) < 2e-2, rel_err(x, r)


# --------------------------------------------------------------------------- memory
def temp_bytes(fn, *args):
    stats = jax.jit(fn).lower(*args).compile().memory_analysis()
    if stats is None:
        pytest.skip("memory_analysis() is not available on this backend")
    return stats.temp_size_in_bytes


@pytest.mark.parametrize("vocab_chunk", [None, 1024])
def test_compiled_memory_is_bounded_by_the_chunk(vocab_chunk):
    b, d, v, chunk = 2, 16, 8192, 16
    block = b * chunk * v * 4 if vocab_chunk is None else b * chunk * vocab_chunk * 4
    w_bytes = d * v * 4

    def measure(t, kernel):
        h, w, y = jnp.ones((b, t, d)), jnp.ones((d, v)), jnp.zeros((b, t), jnp.int32)
        ones = jnp.ones((b, t))
        grad = jax.grad(weighted_loss(kernel, y, ones, ones), argnums=(0, 1))
        return temp_bytes(kernel, h, w, y), temp_bytes(grad, h, w)

    naive_fwd, naive_bwd = measure(256, naive_token_logprobs)
    assert naive_fwd >= b * 256 * v * 4  # the measurement does see full logits when they exist

    def ours(h, w, y):
        return token_logprobs(h, w, y, chunk_size=chunk, vocab_chunk=vocab_chunk)

    fwd, bwd = measure(256, ours)
    fwd_long, bwd_long = measure(1024, ours)
    # A few logit-sized blocks, plus the float32 dW accumulator (and one block of it per vocab chunk).
    assert fwd < 2 * block + w_bytes, fwd
    assert bwd < 4 * block + 2 * w_bytes, bwd
    assert bwd < naive_bwd / 10, (bwd, naive_bwd)
    # 4x the sequence: the temporaries grow only by the [B, T, d]-sized residuals, not by B*T*V.
    assert fwd_long - fwd < b * 768 * v * 4 / 50, (fwd, fwd_long)
    assert bwd_long - bwd < b * 768 * v * 4 / 50, (bwd, bwd_long)


# --------------------------------------------------------------------------- sharding
def test_batch_sharded_inputs_give_the_same_result():
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    h, w, y = make_inputs(10, (8, 10), 8, 30)
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    hs, ys = jax.device_put(h, spec), jax.device_put(y, spec)
    loss = lambda h, w, y: jnp.sum(token_logprobs(h, w, y, chunk_size=3)[0])  # noqa: E731
    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    (val, (gh, gw)), (val_ref, (gh_ref, gw_ref)) = fn(hs, w, ys), fn(h, w, y)
    assert gh.sharding.is_equivalent_to(spec, gh.ndim)  # the batch sharding survives the chunking
    np.testing.assert_allclose(val, val_ref, rtol=1e-6)
    np.testing.assert_allclose(gh, gh_ref, atol=1e-6)
    np.testing.assert_allclose(gw, gw_ref, atol=1e-5)


# --------------------------------------------------------------------------- response_logprobs
def tiny_model(tie=False, model_type="qwen2"):
    cfg = ModelConfig(
        model_type=model_type, vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=tie,
        attention_bias=model_type == "qwen2", qk_norm=model_type == "qwen3",
    )
    return Decoder(cfg, rngs=nnx.Rngs(0))


def padded_batch(rng, prompt_lens, response_lens, s, t, v):
    """Left-padded prompts, right-padded responses, pad id −1 (must never be looked up)."""
    b = len(prompt_lens)
    pids, pmask = np.full((b, s), -1), np.zeros((b, s), np.int32)
    rids, rmask = np.full((b, t), -1), np.zeros((b, t), np.int32)
    for i, (lp, lr) in enumerate(zip(prompt_lens, response_lens)):
        pids[i, s - lp:], pmask[i, s - lp:] = rng.integers(0, v, lp), 1
        rids[i, :lr], rmask[i, :lr] = rng.integers(0, v, lr), 1
    return pids, pmask, rids, rmask


def direct_reference(model, pids, pmask, rids, rmask, temperature):
    """Each row's unpadded prompt+response packed at the start of one batch (trailing filler is
    invisible to earlier positions under causal attention), positions 0..n-1, `model.logits`,
    then a float64 NumPy log_softmax: no left padding, no `positions_from_mask`, no chunking."""
    b, t = rids.shape
    rows = [np.concatenate([pids[i][pmask[i] == 1], rids[i][rmask[i] == 1]]) for i in range(b)]
    n = max(len(r) for r in rows)
    ids = np.zeros((b, n), np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    graphdef, state = nnx.split(model)

    @jax.jit
    def logits(state, ids):
        m = nnx.merge(graphdef, state)
        hidden, _ = m(ids, jnp.broadcast_to(jnp.arange(n), ids.shape), jnp.ones_like(ids))
        return m.logits(hidden)

    z_all = np.asarray(logits(state, jnp.asarray(ids)), np.float64) / temperature
    logp, ent = np.zeros((b, t)), np.zeros((b, t))
    for i in range(b):
        lp, lr = int(pmask[i].sum()), int(rmask[i].sum())
        z = z_all[i, lp - 1 : lp + lr - 1]
        z = z - z.max(-1, keepdims=True)
        log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
        logp[i, :lr] = log_p[np.arange(lr), rows[i][lp:]]
        ent[i, :lr] = -(np.exp(log_p) * log_p).sum(-1)
    return logp, ent


def jitted_response_logprobs(model, **options):
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda state, *args: response_logprobs(nnx.merge(graphdef, state), *args, **options))
    return lambda *args: fn(state, *(jnp.asarray(x) for x in args))


@pytest.mark.parametrize("tie,model_type,vocab_chunk", [(False, "qwen2", None), (True, "qwen3", 16)])
def test_response_logprobs_matches_direct_model_logits(tie, model_type, vocab_chunk):
    model = tiny_model(tie, model_type)
    rng = np.random.default_rng(0)
    pids, pmask, rids, rmask = padded_batch(rng, [5, 2, 7, 1], [6, 3, 0, 9], s=7, t=9, v=61)
    fn = jitted_response_logprobs(model, temperature=0.7, chunk_size=4, vocab_chunk=vocab_chunk)
    logp, ent = fn(pids, pmask, rids, rmask)
    ref_logp, ref_ent = direct_reference(model, pids, pmask, rids, rmask, 0.7)
    np.testing.assert_allclose(logp, ref_logp, atol=2e-5)
    np.testing.assert_allclose(ent, ref_ent, atol=2e-5)
    assert np.all(np.asarray(logp)[rmask == 0] == 0.0) and np.all(np.asarray(ent)[rmask == 0] == 0.0)
    assert np.all(np.asarray(logp)[rmask == 1] < 0.0)


def test_response_logprobs_grouped_shape_and_gradient():
    model = tiny_model()
    rng = np.random.default_rng(1)
    p, g, s, t = 2, 3, 4, 5
    pids, pmask, _, _ = padded_batch(rng, [3, 4], [0, 0], s=s, t=t, v=61)
    _, _, rids, rmask = padded_batch(rng, [1] * (p * g), [5, 2, 4, 1, 3, 5], s=1, t=t, v=61)
    rids, rmask = rids.reshape(p, g, t), rmask.reshape(p, g, t)
    args = tuple(jnp.asarray(x) for x in (pids, pmask, rids, rmask))
    fn = jitted_response_logprobs(model, chunk_size=2)
    logp, ent = fn(*args)
    assert logp.shape == ent.shape == (p, g, t)
    flat = fn(*(jnp.repeat(x, g, 0) for x in args[:2]), *(x.reshape(p * g, t) for x in args[2:]))
    np.testing.assert_allclose(logp.reshape(p * g, t), flat[0], atol=1e-6)

    # The gradient of a masked loss reaches the weights, finite, and matches the naive kernel's.
    graphdef, params = nnx.split(model)

    def loss(params, chunk, vocab_chunk):
        m = nnx.merge(graphdef, params)
        lp, en = response_logprobs(m, *args, chunk_size=chunk, vocab_chunk=vocab_chunk)
        return jnp.sum(lp) + 0.01 * jnp.sum(en)

    grad = jax.jit(jax.grad(loss), static_argnums=(1, 2))
    grads = grad(params, 2, 8)
    leaves = jax.tree.leaves(grads)
    assert all(np.all(np.isfinite(x)) for x in leaves)
    assert np.any(np.asarray(grads["lm_head"]["kernel"][...]) != 0)
    grads_big_chunk = grad(params, 64, None)  # one chunk, no vocab chunking
    for x, ref in zip(leaves, jax.tree.leaves(grads_big_chunk)):
        assert rel_err(x, ref) < 1e-5


def test_response_logprobs_rejects_mismatched_shapes():
    model = tiny_model()
    ids = jnp.zeros((2, 4), jnp.int32)
    with pytest.raises(ValueError, match="response_mask"):
        response_logprobs(model, ids, ids, ids, ids[:, :3])
    with pytest.raises(ValueError, match="prompt_ids"):
        response_logprobs(model, ids[:1], ids[:1], ids, ids)


# --------------------------------------------------------------------------- the output layer's gradient norms
def np_output_grad_norms(h, w, y, temperature):
    """float64 Frobenius norm of d log_softmax(h·W/τ)[y] / dW, the matrix written out: h (onehot(y) − p)ᵀ / τ."""
    h, w = np.asarray(h, np.float64), np.asarray(w, np.float64)
    z = h @ w / temperature
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    onehot = np.eye(w.shape[1])[np.asarray(y)]
    jac = h[..., :, None] * (onehot - p)[..., None, :] / temperature  # [..., d, V]
    return np.sqrt((jac ** 2).sum((-2, -1)))


@pytest.mark.parametrize("chunk_size", [3, 128])
def test_output_grad_norms_match_the_written_out_gradient(chunk_size):
    h, w, y = make_inputs(5, (2, 7), 6, 11, scale=0.8)
    got = jax.jit(partial(output_grad_norms, temperature=0.7, chunk_size=chunk_size))(h, w, y)
    np.testing.assert_allclose(np.asarray(got), np_output_grad_norms(h, w, y, 0.7), rtol=2e-5)
    # and autodiff's gradient of one token's log-prob, for one token
    g = jax.grad(lambda w: naive_token_logprobs(h, w, y, temperature=0.7)[0][1, 4])(w)
    np.testing.assert_allclose(float(jnp.linalg.norm(g)), float(got[1, 4]), rtol=2e-5)
    # the bounds the ablation pages use: (1 − p_y) ‖h‖/τ <= norm <= √2 (1 − p_y) ‖h‖/τ
    p_y = np.exp(np_logprobs(h, w, y, 0.7)[0])
    base = (1 - p_y) * np.linalg.norm(np.asarray(h, np.float64), axis=-1) / 0.7
    assert np.all(np.asarray(got) >= base * (1 - 1e-5)) and np.all(np.asarray(got) <= np.sqrt(2) * base * (1 + 1e-5))


def test_response_logprobs_grad_norms_are_zero_on_padding_and_leave_logp_alone():
    model = tiny_model()
    rng = np.random.default_rng(4)
    args = tuple(jnp.asarray(x) for x in padded_batch(rng, [3, 4], [5, 2], s=4, t=5, v=61))
    logp, ent = response_logprobs(model, *args)
    logp2, ent2, norms = response_logprobs(model, *args, grad_norms=True)
    np.testing.assert_array_equal(np.asarray(logp), np.asarray(logp2))
    real = np.asarray(args[3]) > 0
    assert np.all(np.asarray(norms)[~real] == 0) and np.all(np.asarray(norms)[real] > 0)
