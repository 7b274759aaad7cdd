"""The decoder: a NumPy reference forward, KV-cache decode, padding isolation, dtype policy, remat.

(Logit parity with the transformers PyTorch models lives in test_hf_io.py.)
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax.models import Decoder, KVCache, ModelConfig, RopeScaling, positions_from_mask

BASE = dict(vocab_size=48, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6)
CONFIGS = {
    "qwen2": ModelConfig(model_type="qwen2", attention_bias=True, **BASE),
    "qwen3": ModelConfig(model_type="qwen3", qk_norm=True, tie_word_embeddings=True, **{**BASE, "head_dim": 16}),
    "llama3": ModelConfig(model_type="llama", rope_theta=500000.0, **BASE,
                          rope_scaling=RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                   original_max_position_embeddings=8)),
}
# bf16 matmuls (8-bit mantissa, eps 2^-8) over 2 layers: max error <= 4% of the largest |fp32 logit|
# (measured 1.2-1.6%), mean error <= 0.5%.
BF16_MAX_REL, BF16_MEAN_REL = 0.04, 0.005


def make_model(cfg, seed=0):
    """Random weights larger than the N(0, 0.02) init so that every term matters."""
    model = Decoder(cfg, rngs=nnx.Rngs(seed))
    key = jax.random.key(seed + 100)
    for i, (path, var) in enumerate(nnx.to_flat_state(nnx.state(model, nnx.Param))):
        x = var.get_value()
        noise = jax.random.normal(jax.random.fold_in(key, i), x.shape, jnp.float32)
        base = 1.0 if path[-1] == "weight" else 0.0  # RMSNorm scales around 1
        var.set_value((base + (0.2 if base else 0.25) * noise).astype(x.dtype))
    return model


def left_padded(b=3, s=7, vocab=48, seed=0, lengths=None):
    rng = np.random.default_rng(seed)
    lengths = lengths or list(rng.integers(1, s + 1, size=b))
    mask = (np.arange(s)[None, :] >= s - np.asarray(lengths)[:, None]).astype(np.int32)
    ids = np.where(mask == 1, rng.integers(1, vocab, size=(b, s)), 0)
    return jnp.asarray(ids), jnp.asarray(mask)


@nnx.jit
def full_logits(model, ids, mask):
    hidden, _ = model(ids, positions_from_mask(mask), mask)
    return model.logits(hidden)


# --------------------------------------------------------------------------- NumPy reference
def numpy_forward(model, ids, mask):
    """Plain float64 NumPy transcription of the HF Qwen2/Qwen3/Llama forward pass."""
    cfg = model.config
    p = jax.tree.map(lambda v: np.asarray(v, np.float64), nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    ids, mask = np.asarray(ids), np.asarray(mask).astype(bool)
    b, s = ids.shape
    pos = np.maximum(np.cumsum(mask, -1) - 1, 0) * mask

    def rms(x, w):
        return w * x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg.rms_norm_eps)

    d = cfg.head_dim
    inv = 1.0 / cfg.rope_theta ** (np.arange(0, d, 2) / d)
    if cfg.rope_scaling is not None:  # Llama 3: written from the formula in the HF reference
        sc = cfg.rope_scaling
        wavelen = 2 * np.pi / inv
        lo, hi = sc.original_max_position_embeddings / sc.low_freq_factor, sc.original_max_position_embeddings / sc.high_freq_factor
        ratio = (sc.original_max_position_embeddings / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor)
        new = []
        for f, w, r in zip(inv, wavelen, ratio):
            new.append(f if w < hi else f / sc.factor if w > lo else (1 - r) * f / sc.factor + r * f)
        inv = np.array(new)
    ang = pos[..., None] * inv  # [B, S, D/2]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(x):  # [B, S, H, D]
        rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)
        return x * cos[:, :, None] + rot * sin[:, :, None]

    x = p["embed_tokens"]["embedding"][ids]
    h, kvh = cfg.num_attention_heads, cfg.num_key_value_heads
    allowed = np.tril(np.ones((s, s), bool))[None] & mask[:, None, :] & mask[:, :, None]
    allowed |= np.eye(s, dtype=bool)[None]
    for i in range(cfg.num_hidden_layers):
        L, a = p["layers"][i], p["layers"][i]["self_attn"]
        y = rms(x, L["input_layernorm"]["weight"])
        proj = lambda name, n: (y @ a[name]["kernel"] + a[name].get("bias", 0.0)).reshape(b, s, n, d)  # noqa: E731
        q, k, v = proj("q_proj", h), proj("k_proj", kvh), proj("v_proj", kvh)
        if cfg.qk_norm:
            q, k = rms(q, a["q_norm"]["weight"]), rms(k, a["k_norm"]["weight"])
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, h // kvh, axis=2), np.repeat(v, h // kvh, axis=2)
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
        scores = np.where(allowed[:, None], scores, -np.inf)
        w = np.exp(scores - scores.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        x = x + np.einsum("bhqk,bkhd->bqhd", w, v).reshape(b, s, h * d) @ a["o_proj"]["kernel"]
        y = rms(x, L["post_attention_layernorm"]["weight"])
        m = L["mlp"]
        g = y @ m["gate_proj"]["kernel"]
        x = x + (g / (1 + np.exp(-g)) * (y @ m["up_proj"]["kernel"])) @ m["down_proj"]["kernel"]
    x = rms(x, p["norm"]["weight"])
    w_out = p["embed_tokens"]["embedding"].T if cfg.tie_word_embeddings else p["lm_head"]["kernel"]
    return x @ w_out


@pytest.mark.parametrize("name", CONFIGS)
def test_matches_numpy_reference(name):
    model = make_model(CONFIGS[name])
    ids, mask = left_padded(seed=1)
    got, want = np.asarray(full_logits(model, ids, mask)), numpy_forward(model, ids, mask)
    real = np.asarray(mask).astype(bool)
    assert np.abs(want[real]).max() > 1.0
    np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=0)


def test_causal_blocks_hand_cases():
    from dapo_jax.models.decoder import causal_blocks

    assert causal_blocks(20) == [(0, 20)]  # under two blocks of 64: one block, the whole square
    assert causal_blocks(127) == [(0, 127)]
    assert causal_blocks(128) == [(0, 64), (64, 128)]
    assert causal_blocks(200) == [(0, 67), (67, 134), (134, 200)]  # 3 blocks of ceil(200 / 3)
    assert causal_blocks(192) == [(i * 64, (i + 1) * 64) for i in range(3)]  # the main job's packed rows
    assert causal_blocks(4096) == [(i * 512, (i + 1) * 512) for i in range(8)]
    assert causal_blocks(1001)[-1] == (882, 1001)  # blocks of ceil(1001 / 8) = 126


@pytest.mark.parametrize("name", ["qwen2", "llama3"])
def test_long_rows_in_causal_blocks_match_numpy_reference(name):
    """S = 200 runs the cache-free attention in 3 query blocks (keys [0, hi) each): same logits as the
    reference's full S x S attention, padding included."""
    from dapo_jax.models.decoder import causal_blocks

    assert len(causal_blocks(200)) == 3
    model = make_model(CONFIGS[name])
    ids, mask = left_padded(b=2, s=200, seed=3, lengths=[200, 117])
    got, want = np.asarray(full_logits(model, ids, mask)), numpy_forward(model, ids, mask)
    real = np.asarray(mask).astype(bool)
    np.testing.assert_allclose(got[real], want[real], atol=1e-4, rtol=0)


def test_causal_blocks_give_one_blocks_values_and_gradients_on_packed_rows(monkeypatch):
    """Packed rows (segments, trailing padding) of 160 tokens: the blocked attention's hidden states and
    parameter gradients equal those of a single block over the whole square (ATTENTION_BLOCK raised)."""
    import dapo_jax.models.attention as attention

    model = make_model(CONFIGS["qwen3"].replace(attention="reference"))
    graphdef, params = nnx.split(model, nnx.Param)
    rng = np.random.default_rng(4)
    segs = np.zeros((2, 160), np.int32)
    segs[0, :70], segs[0, 70:150] = 1, 2
    segs[1, :40], segs[1, 40:41], segs[1, 41:160] = 1, 2, 3
    pos = np.zeros_like(segs)
    for r in range(2):
        for sid in range(1, segs[r].max() + 1):
            pos[r, segs[r] == sid] = np.arange((segs[r] == sid).sum())
    ids = jnp.asarray(np.where(segs > 0, rng.integers(1, 48, segs.shape), 0))
    segs, pos = jnp.asarray(segs), jnp.asarray(pos)
    weights = jnp.asarray(rng.normal(size=(2, 160, 32)), jnp.float32) * (segs > 0)[..., None]

    def run(p):
        hidden, _ = nnx.merge(graphdef, p)(ids, pos, (segs > 0).astype(jnp.int32), segment_ids=segs)
        return jnp.sum(hidden * weights), hidden

    assert attention.causal_blocks(160) == [(0, 80), (80, 160)]  # a block boundary inside segment 2 of row 0
    blocked = jax.jit(jax.value_and_grad(run, has_aux=True))(params)
    monkeypatch.setattr(attention, "ATTENTION_BLOCK", 10 ** 6)
    assert attention.causal_blocks(160) == [(0, 160)]
    whole = jax.jit(jax.value_and_grad(run, has_aux=True))(params)
    chex.assert_trees_all_close(blocked[0][1], whole[0][1], atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(blocked[1], whole[1], atol=1e-4, rtol=1e-4)
    assert float(jnp.abs(jax.tree.leaves(whole[1])[0]).max()) > 0


@pytest.mark.parametrize("name", ["qwen2", "llama3"])
def test_shared_prefix_branches_match_each_sequence_alone(name):
    """A packed row of 64 (4 query blocks): segment 1 = a prefix of 10 tokens then branches of 12 and 20,
    segment 2 = a prefix of 5 then one branch of 10, then padding. Each branch's logits (and the
    prefix's) equal the NumPy reference on its sequence alone (prefix + branch, positions from 0)."""
    model = make_model(CONFIGS[name])
    rng = np.random.default_rng(5)
    layout = [(1, 0, 10), (1, 1, 12), (1, 2, 20), (2, 0, 5), (2, 1, 10)]  # (segment, branch, tokens)
    segs, branches, pos = (np.zeros((1, 64), np.int32) for _ in range(3))
    ids = np.zeros((1, 64), np.int32)
    spans, o = {}, 0
    for seg, br, n in layout:
        segs[0, o:o + n], branches[0, o:o + n], ids[0, o:o + n] = seg, br, rng.integers(1, 48, n)
        prefix = spans[(seg, 0)][1] - spans[(seg, 0)][0] if br else 0
        pos[0, o:o + n] = prefix + np.arange(n)
        spans[(seg, br)] = (o, o + n)
        o += n
    hidden, _ = model(jnp.asarray(ids), jnp.asarray(pos), jnp.asarray((segs > 0).astype(np.int32)),
                      segment_ids=jnp.asarray(segs), branch_ids=jnp.asarray(branches))
    got = np.asarray(model.logits(hidden))[0]
    for seg, br, n in layout:
        p0, p1 = spans[(seg, 0)]
        lo, hi = spans[(seg, br)]
        alone = ids[:, p0:p1] if br == 0 else np.concatenate([ids[:, p0:p1], ids[:, lo:hi]], 1)
        want = numpy_forward(model, alone, np.ones_like(alone))[0]
        np.testing.assert_allclose(got[lo:hi], want[-n:], atol=1e-4, rtol=0, err_msg=f"segment {seg} branch {br}")
    with pytest.raises(ValueError, match="need segment_ids"):
        model(jnp.asarray(ids), jnp.asarray(pos), jnp.ones((1, 64), jnp.int32), branch_ids=jnp.asarray(branches))


def test_positions_from_mask_hand_cases():
    mask = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(positions_from_mask(mask), [[0, 0, 0, 1, 2], [0, 1, 2, 0, 0], [0, 1, 2, 3, 4]])
    np.testing.assert_array_equal(positions_from_mask(jnp.array([[1, 1]]), offset=5), [[5, 6]])


# --------------------------------------------------------------------------- KV cache
@pytest.mark.parametrize("name", ["qwen2", "qwen3"])
def test_prefill_then_decode_equals_full_pass(name):
    cfg = CONFIGS[name]
    model = make_model(cfg, seed=2)
    prompt, pmask = left_padded(b=3, s=6, seed=3, lengths=[6, 3, 1])
    steps = 4
    new = jnp.asarray(np.random.default_rng(4).integers(1, cfg.vocab_size, size=(3, steps)))
    ids = jnp.concatenate([prompt, new], 1)
    mask = jnp.concatenate([pmask, jnp.ones((3, steps), jnp.int32)], 1)
    want = np.asarray(full_logits(model, ids, mask))

    step = nnx.jit(lambda m, i, p, a, c: m(i, p, a, cache=c))
    cache = KVCache.init(cfg, 3, 6 + steps)
    hidden, cache = step(model, prompt, positions_from_mask(pmask), pmask, cache)
    got = [model.logits(hidden)]
    pos = positions_from_mask(pmask)[:, -1:] + 1
    for t in range(steps):
        hidden, cache = step(model, new[:, t : t + 1], pos, jnp.ones((3, 1), jnp.int32), cache)
        got.append(model.logits(hidden))
        pos = pos + 1
    got = np.asarray(jnp.concatenate(got, 1))
    assert int(cache.end) == 6 + steps
    np.testing.assert_array_equal(np.asarray(cache.mask), np.asarray(mask).astype(bool))
    real = np.asarray(mask).astype(bool)
    np.testing.assert_allclose(got[real], want[real], atol=1e-5, rtol=0)


def test_cache_repeat_shares_a_prefill_across_group():
    cfg, g = CONFIGS["qwen2"], 3
    model = make_model(cfg, seed=5)
    prompt, pmask = left_padded(b=2, s=5, seed=6, lengths=[5, 2])
    prefill = nnx.jit(lambda m, i, a, c: m(i, positions_from_mask(a), a, cache=c)[1])
    cache = prefill(model, prompt, pmask, KVCache.init(cfg, 2, 8))
    rep = cache.repeat(g)
    ref = prefill(model, jnp.repeat(prompt, g, 0), jnp.repeat(pmask, g, 0), KVCache.init(cfg, 2 * g, 8))
    for a, b in zip(rep, ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    # Row b*g + j is prompt b.
    np.testing.assert_array_equal(np.asarray(rep.k[:, 4]), np.asarray(cache.k[:, 1]))


# --------------------------------------------------------------------------- padding isolation
@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_never_reaches_real_tokens(side):
    cfg = CONFIGS["qwen2"]  # untied, so the embedding gradient below sees only the input side
    model = make_model(cfg, seed=7)
    ids, mask = left_padded(b=3, s=7, seed=8, lengths=[7, 4, 2])
    if side == "right":
        ids, mask = ids[:, ::-1], mask[:, ::-1]
    real = np.asarray(mask).astype(bool)
    noisy_ids = jnp.where(mask == 1, ids, jnp.asarray(np.random.default_rng(9).integers(1, 48, size=ids.shape)))
    a, b = np.asarray(full_logits(model, ids, mask)), np.asarray(full_logits(model, noisy_ids, mask))
    np.testing.assert_array_equal(a[real], b[real])
    assert np.abs(a[~real] - b[~real]).max() > 1e-3  # the perturbation did change the padding positions

    # Gradient view: real logits do not depend on a token id used only as padding.
    pad_id = 0
    assert not np.any(np.asarray(ids)[real] == pad_id)

    def real_sum(m):
        return jnp.sum(jnp.where(mask[..., None] == 1, full_logits(m, ids, mask), 0.0) ** 2)

    grads = nnx.jit(nnx.grad(real_sum))(model)
    emb_grad = np.asarray(grads["embed_tokens"]["embedding"].get_value())
    assert np.all(emb_grad[pad_id] == 0) and np.abs(emb_grad[np.asarray(ids)[real]]).max() > 0


# --------------------------------------------------------------------------- dtype policy and remat
@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_bf16_compute_close_to_fp32(param_dtype):
    cfg = CONFIGS["qwen2"]
    model = make_model(cfg, seed=10)
    ids, mask = left_padded(seed=11)
    want = np.asarray(full_logits(model, ids, mask))
    low = Decoder(cfg.replace(dtype="bfloat16", param_dtype=param_dtype), rngs=nnx.Rngs(0))
    nnx.update(low, jax.tree.map(lambda x: x.astype(param_dtype), nnx.state(model, nnx.Param)))
    got = full_logits(low, ids, mask)
    assert got.dtype == jnp.float32  # logits always float32
    hidden, _ = nnx.jit(lambda m: m(ids, positions_from_mask(mask), mask))(low)
    assert hidden.dtype == jnp.bfloat16
    real = np.asarray(mask).astype(bool)
    err, scale = np.abs(np.asarray(got) - want)[real], np.abs(want[real]).max()
    assert err.max() <= BF16_MAX_REL * scale, (err.max(), scale)
    assert err.mean() <= BF16_MEAN_REL * scale, (err.mean(), scale)
    assert err.max() > 0  # bf16 really was used


def _loss_and_grads(model, ids, mask):
    """Mean next-token NLL over real positions and its gradient (jitted)."""
    targets = jnp.roll(ids, -1, axis=1)

    def loss(m):
        logp = jax.nn.log_softmax(full_logits(m, ids, mask))
        picked = jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
        return -jnp.sum(picked * mask) / mask.sum()

    return nnx.jit(nnx.value_and_grad(loss))(model)


def test_remat_full_gives_identical_values_and_gradients():
    cfg = CONFIGS["llama3"]
    ids, mask = left_padded(seed=12)
    results = {}
    for remat in ("none", "full", "dots_saveable"):
        results[remat] = _loss_and_grads(make_model(cfg.replace(remat=remat), seed=13), ids, mask)
    (v0, g0) = results["none"]
    for remat in ("full", "dots_saveable"):
        v, g = results[remat]
        np.testing.assert_allclose(float(v), float(v0), rtol=1e-6)
        for (p, a), (_, b) in zip(nnx.to_flat_state(g0), nnx.to_flat_state(g)):
            np.testing.assert_allclose(np.asarray(b.get_value()), np.asarray(a.get_value()), atol=1e-6, err_msg=f"{remat} {p}")
    assert np.abs(np.asarray(g0["lm_head"]["kernel"].get_value())).max() > 0


def _with_lora(model):
    from dapo_jax.models.lora import add_lora

    add_lora(model, rank=2, alpha=4, rngs=nnx.Rngs(3))
    for i, (_, var) in enumerate(nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))):
        var.set_value(0.3 * jax.random.normal(jax.random.key(50 + i), var.get_value().shape))
    return model


def test_layer_scan_with_lora_gives_the_layer_loops_values_and_gradients():
    """remat != none runs the blocks as one lax.scan over their stacked weights; LoRA adapters ride
    along in the stack and get their gradients back (float32: equal to float tolerance)."""
    cfg = CONFIGS["qwen3"].replace(num_hidden_layers=3)
    ids, mask = left_padded(seed=16)
    (v0, g0), (v1, g1) = (_loss_and_grads(_with_lora(make_model(cfg.replace(remat=r), seed=17)), ids, mask)
                          for r in ("none", "full"))
    np.testing.assert_allclose(float(v1), float(v0), rtol=1e-6)
    flat0, flat1 = nnx.to_flat_state(g0), nnx.to_flat_state(g1)
    assert [p for p, _ in flat0] == [p for p, _ in flat1]
    assert sum("lora_b" in str(p) for p, _ in flat1) == 3 * len(("q", "k", "v", "o", "gate", "up", "down"))
    for (p, a), (_, b) in zip(flat0, flat1):
        # rtol: a float32 sum in another order (AVX-512 hosts: 1.3e-6 apart in an embedding gradient of 1.5)
        np.testing.assert_allclose(np.asarray(b.get_value()), np.asarray(a.get_value()), rtol=1e-5, atol=1e-6,
                                   err_msg=str(p))


def test_layer_scan_in_bf16_is_as_accurate_as_the_layer_loop():
    """With bf16 compute and float32 parameters the scan stacks the matmul weights already cast to
    bf16. Its loss and float32 gradients are as close to the float32 model's as the layer loop's (XLA
    fuses the bf16 roundings differently in a scan body, so the two bf16 results differ by bf16 noise)."""
    cfg = CONFIGS["qwen2"].replace(num_hidden_layers=3)
    ids, mask = left_padded(seed=14)
    results = {}
    for name, c in (("f32", cfg), ("loop", cfg.replace(dtype="bfloat16")),
                    ("scan", cfg.replace(dtype="bfloat16", remat="full"))):
        value, grads = _loss_and_grads(make_model(c, seed=15), ids, mask)
        results[name] = float(value), nnx.to_flat_state(grads)
    (v32, g32), (v_loop, g_loop), (v_scan, g_scan) = results["f32"], results["loop"], results["scan"]
    assert v_scan != v_loop  # bf16 really was used on both paths
    assert abs(v_scan - v32) <= 1.5 * abs(v_loop - v32) + 2**-8 * abs(v32)
    assert [p for p, _ in g_scan] == [p for p, _ in g_loop] == [p for p, _ in g32]
    for (p, ref), (_, a), (_, b) in zip(g32, g_loop, g_scan):
        ref, a, b = (np.asarray(x.get_value()) for x in (ref, a, b))
        assert a.dtype == b.dtype == np.float32, p
        err_loop, err_scan = (np.linalg.norm(x - ref) / np.linalg.norm(ref) for x in (a, b))
        assert err_scan <= 1.5 * err_loop + 0.01, (p, err_scan, err_loop)


def test_remat_frees_activations_on_cpu():
    """The property the layer scan exists for: with remat, the backward pass keeps one block's
    activations at a time (XLA's CPU backend ignores remat between unrolled layers)."""
    cfg = CONFIGS["llama3"].replace(hidden_size=128, intermediate_size=512, num_hidden_layers=6, head_dim=32)
    ids = jnp.ones((2, 256), jnp.int32)
    temp = {}
    for remat in ("none", "full"):
        model = Decoder(cfg.replace(remat=remat), rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(model, nnx.Param)

        def loss(p):
            hidden, _ = nnx.merge(graphdef, p)(ids, positions_from_mask(ids), ids)
            return jnp.sum(hidden.astype(jnp.float32) ** 2)

        temp[remat] = jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes
    assert temp["full"] < 0.5 * temp["none"], temp
