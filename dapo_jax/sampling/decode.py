"""One-token decode step over a per-layer, head-major KV cache that XLA updates in place.

`Decoder.__call__(..., cache=KVCache)` is the reference semantics, but its cache is one stacked
`[L, B, S_max, H_kv, D]` array rebuilt with `jnp.stack` every call: inside a `while_loop` that is a
full copy of every layer's keys and values per generated token, plus a transpose of each layer's
cache for the attention einsum. This step computes exactly the same function with:

- one keys and one values array per layer (a tuple in the loop carry), each written with a single
  `dynamic_update_slice` at the current slot, so XLA aliases them in place;
- head-major layouts, keys `[B, H_kv, D, S_max]` and values `[B, H_kv, S_max, D]`, so `q·K` and
  `p·V` are plain batched matmuls (with keys `[.., S, D]` the CPU dot transposes the whole cache
  every step: measured 8x slower);
- `[q|k|v]` and `[gate|up]` kernels concatenated once per rollout (`fuse_layers`), and the RoPE
  angles computed once per step, not per layer.

For the new token at slot `j` (all earlier slots with `mask = 1` visible):

    s_k = q·k_k / sqrt(D)  (masked -> -1e30),   out = softmax(s)·V,   x += o_proj(out),   x += MLP(x)

It reuses the model's own submodules (norms, o/down projections, embedding, logits) and its
parameters, dtypes and casts. `tests/sampling` checks it token for token against transformers and the
model's full forward.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dapo_jax.models.decoder import Decoder, KVCache, rope_inv_freq

_NEG_INF = -1e30  # as the decoder: finite, so a fully masked row stays NaN-free


class FusedLayer(NamedTuple):
    """One layer's projections concatenated once per rollout: fewer, wider matmuls per step."""

    qkv: jax.Array  # [d, (H + 2 H_kv) D]
    qkv_bias: jax.Array | None  # [(H + 2 H_kv) D]
    gate_up: jax.Array  # [d, 2 I]


def fuse_layers(model: Decoder) -> tuple[FusedLayer, ...]:
    """`[q|k|v]` and `[gate|up]` kernels side by side (cast to the compute dtype), for every layer."""
    dtype = jnp.dtype(model.config.dtype)
    fused = []
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        qkv = jnp.concatenate([p.kernel[...] for p in projections], axis=1).astype(dtype)
        bias = None
        if projections[0].bias is not None:
            bias = jnp.concatenate([p.bias[...] for p in projections]).astype(dtype)
        gate_up = jnp.concatenate([mlp.gate_proj.kernel[...], mlp.up_proj.kernel[...]], axis=1).astype(dtype)
        fused.append(FusedLayer(qkv, bias, gate_up))
    return tuple(fused)


class DecodeCache(NamedTuple):
    """Per layer: keys `[B, H_kv, D, S_max]`, values `[B, H_kv, S_max, D]`; `mask[b, j]` = slot j is real."""

    k: tuple[jax.Array, ...]  # transposed, so q·K is a plain [r, D] x [D, S] matmul
    v: tuple[jax.Array, ...]
    mask: jax.Array  # [B, S_max] bool


def decode_cache_from_prefill(cache: KVCache, *, max_len: int, repeats: int = 1) -> DecodeCache:
    """The model's prefilled `KVCache` (`[L, P, S, H_kv, D]`, S filled slots) as a `DecodeCache` of
    `max_len` slots, each row repeated `repeats` times (row p -> rows p*G .. p*G+G-1)."""
    _, _, s, _, _ = cache.k.shape
    pad = max_len - s

    def keys(x):  # [P, S, H, D] -> [P*G, H, D, max_len]
        x = jnp.repeat(jnp.transpose(x, (0, 2, 3, 1)), repeats, axis=0)
        return jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, pad)))

    def values(x):  # [P, S, H, D] -> [P*G, H, max_len, D]
        x = jnp.repeat(jnp.swapaxes(x, 1, 2), repeats, axis=0)
        return jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0)))

    mask = jnp.pad(jnp.repeat(cache.mask, repeats, axis=0), ((0, 0), (0, pad)))
    n_layers = cache.k.shape[0]
    return DecodeCache(
        k=tuple(keys(cache.k[i]) for i in range(n_layers)),
        v=tuple(values(cache.v[i]) for i in range(n_layers)),
        mask=mask,
    )


def decode_step(
    model: Decoder, fused: tuple[FusedLayer, ...], cache: DecodeCache, tokens: jax.Array, positions: jax.Array,
    slot: jax.Array,
) -> tuple[jax.Array, DecodeCache]:
    """Feeds one token per row and returns the next-token logits.

    Args:
      model: the `Decoder` whose parameters to use.
      fused: `fuse_layers(model)`, computed once outside the decode loop.
      cache: the `DecodeCache`; slots `[0, slot)` hold the context.
      tokens: `[B]` int token ids, written at cache slot `slot` (a scalar, the same for every row).
      positions: `[B]` int RoPE positions of those tokens.
      slot: int32 scalar.

    Returns:
      `(logits [B, V] float32, cache)` with the new keys/values written and `mask[:, slot] = 1`.
    """
    cfg = model.config
    b = tokens.shape[0]
    h_kv, r, d = cfg.num_key_value_heads, cfg.num_query_groups, cfg.head_dim
    mask = jax.lax.dynamic_update_slice(cache.mask, jnp.ones((b, 1), bool), (0, slot))
    visible = mask[:, None, None, :]  # [B, 1, 1, S_max]
    dtype = jnp.dtype(cfg.dtype)
    n_q, n_kv = cfg.num_attention_heads * d, h_kv * d
    # RoPE angles once per step (every layer shares them); same float32 math as `apply_rope`
    freqs = positions[:, None].astype(jnp.float32) * rope_inv_freq(cfg)  # [B, D/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, None, :]  # [B, 1, D]
    cos, sin = jnp.cos(emb), jnp.sin(emb)

    def rope(x):  # [B, H, D]
        xf = x.astype(jnp.float32)
        rotated = jnp.concatenate([-xf[..., d // 2:], xf[..., : d // 2]], axis=-1)
        return (xf * cos + rotated * sin).astype(x.dtype)

    x = model.embed_tokens(tokens)  # [B, d]
    new_k, new_v = [], []
    for layer, w, ck, cv in zip(model.layers, fused, cache.k, cache.v):
        attn = layer.self_attn
        qkv = jnp.dot(layer.input_layernorm(x).astype(dtype), w.qkv)
        if w.qkv_bias is not None:
            qkv = qkv + w.qkv_bias
        q = qkv[:, :n_q].reshape(b, cfg.num_attention_heads, d)
        k = qkv[:, n_q : n_q + n_kv].reshape(b, h_kv, d)
        v = qkv[:, n_q + n_kv :].reshape(b, h_kv, d)
        if cfg.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = rope(q), rope(k)
        # [B, H_kv, D] is one slot (a column of the keys, a row of the values)
        ck = jax.lax.dynamic_update_slice(ck, k[..., None].astype(ck.dtype), (0, 0, 0, slot))
        cv = jax.lax.dynamic_update_slice(cv, v[:, :, None].astype(cv.dtype), (0, 0, slot, 0))
        new_k.append(ck)
        new_v.append(cv)
        qg = q.reshape(b, h_kv, r, d)  # head h = g * r + i, as the decoder groups them
        scores = jnp.einsum("bgrd,bgdk->bgrk", qg, ck.astype(q.dtype), preferred_element_type=jnp.float32)
        scores = jnp.where(visible, scores / math.sqrt(d), _NEG_INF)
        probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
        out = jnp.einsum("bgrk,bgkd->bgrd", probs, cv.astype(q.dtype)).reshape(b, -1)
        x = x + attn.o_proj(out)
        gate, up = jnp.split(jnp.dot(layer.post_attention_layernorm(x).astype(dtype), w.gate_up), 2, axis=-1)
        x = x + layer.mlp.down_proj(jax.nn.silu(gate) * up)
    logits = model.logits(model.norm(x))
    return logits, DecodeCache(tuple(new_k), tuple(new_v), mask)
