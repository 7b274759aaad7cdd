"""models/decode.py: one decode step per token equals the model's full forward over the whole sequence; the
fused projections equal the separate ones; `Block.decode` is `Block.__call__` for one token."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.models import attention
from dapo_jax.models.decode import decode_step, empty_response_cache, fused_layers, prompt_cache_from_prefill
from dapo_jax.models.decoder import KVCache, positions_from_mask, rope_angles, rope_inv_freq
from tests.models.test_decoder import CONFIGS, make_model


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_decode_steps_equal_the_full_forward(name):
    """2 left-padded prompts (3 and 5 real tokens of 5) x G = 2 samples, 4 tokens fed one step at a time into a
    block of 4 slots: each step's logits equal the full forward's (no cache) at that token, float32."""
    cfg = CONFIGS[name]
    model = make_model(cfg)
    p, g, s, n = 2, 2, 5, 4
    rng = np.random.default_rng(0)
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], np.int32)
    ids = rng.integers(1, cfg.vocab_size, size=(p, s)).astype(np.int32) * mask
    fed = rng.integers(1, cfg.vocab_size, size=(p * g, n)).astype(np.int32)  # row b = p*G + g

    _, cache = model(jnp.asarray(ids), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask),
                     cache=KVCache.init(cfg, p, s))
    prompt = prompt_cache_from_prefill(cache)
    block = empty_response_cache(prompt, g, n)
    fused = fused_layers(model)
    n_prompt = np.repeat(mask.sum(-1), g)
    steps = []
    for t in range(n):
        logits, block = decode_step(model, fused, prompt, None, block, jnp.asarray(fed[:, t]),
                                    jnp.asarray(n_prompt + t), jnp.int32(t))
        steps.append(np.asarray(logits))

    full_ids = np.concatenate([np.repeat(ids, g, axis=0), fed], axis=1)  # [B, S + n], the prompt's padding kept
    full_mask = np.concatenate([np.repeat(mask, g, axis=0), np.ones((p * g, n), np.int32)], axis=1)
    hidden, _ = model(jnp.asarray(full_ids), positions_from_mask(jnp.asarray(full_mask)), jnp.asarray(full_mask))
    want = np.asarray(model.logits(hidden))[:, s:]  # [B, n, V]
    np.testing.assert_allclose(np.stack(steps, axis=1), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_projections_equal_the_separate_ones(name):
    cfg = CONFIGS[name]
    model = make_model(cfg)
    x = jax.random.normal(jax.random.key(1), (6, cfg.hidden_size))
    cos, sin = rope_angles(jnp.arange(6), rope_inv_freq(cfg))
    layer = model.layers[1]
    for a, b in zip(layer.self_attn.project(x, cos, sin), layer.self_attn.project(x, cos, sin, layer.fused())):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(layer.mlp(x)), np.asarray(layer.mlp(x, layer.fused())), rtol=1e-5, atol=1e-5)


def test_rope_angles_by_hand():
    """cos/sin of position x inverse frequency, the D/2 frequencies repeated (HF's rotate-half layout)."""
    inv = jnp.asarray([1.0, 0.1])
    cos, sin = rope_angles(jnp.asarray([0, 3]), inv)
    assert cos.shape == (2, 1, 4)
    np.testing.assert_allclose(np.asarray(cos[1, 0]), np.cos([3.0, 0.3, 3.0, 0.3]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(sin[1, 0]), np.sin([3.0, 0.3, 3.0, 0.3]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(cos[0, 0]), np.ones(4))


def test_block_decode_is_the_block_for_one_token():
    """A first token attends only to itself: `Block.decode` with that attention equals `Block.__call__` on it."""
    cfg = CONFIGS["qwen3"]
    model = make_model(cfg)
    layer = model.layers[0]
    x = jax.random.normal(jax.random.key(2), (3, cfg.hidden_size))
    positions = jnp.asarray([0, 4, 9])  # any position: a lone token's attention is its own value
    cos, sin = rope_angles(positions, rope_inv_freq(cfg))

    def own_value(q, k, v):  # softmax over one key is 1: each query head reads its group's value
        return jnp.repeat(v, cfg.num_query_groups, axis=1), None

    got, _ = layer.decode(x, cos, sin, own_value, layer.fused())
    mask = jnp.ones((3, 1), jnp.int32)
    want, _ = layer(x[:, None], positions[:, None], attention.mask_ids(mask), rope_inv_freq(cfg), None)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want[:, 0]), rtol=1e-5, atol=1e-5)
