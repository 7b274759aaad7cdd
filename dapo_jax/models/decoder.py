"""One Flax NNX decoder for Qwen2/2.5, Qwen3 and Llama 3: GQA attention with RoPE, RMSNorm, SwiGLU.

The model knows nothing of RL. Its whole interface:

    model = Decoder(config, rngs=nnx.Rngs(0))
    hidden, cache = model(input_ids, positions, attention_mask, cache=None)   # [B, S, d]
    logits = model.logits(hidden)                                             # [B, S, V] float32
    w = model.output_embedding()                                              # [d, V]

`attention_mask[b, s] = 1` marks a real token. A query attends to keys at or before it that are
real; a padding query attends only to itself (so a padding position never attends to a real one,
and no real position attends to padding). With a `KVCache` the `S` new tokens are written at
slots `[cache.end, cache.end + S)` and attend over every filled slot: prefill and one-token decode
are the same call.

Without a cache, and for the prefill of a cache of exactly `S` slots, the mask is stated as per-token
ids (`attention.mask_ids`) and attention runs through `config.attention` (`models/attention.py`:
the reference, blockwise, splash or gpu_flash), so no `[B, S, S]` array is built unless the reference
is chosen. Decoding over a longer cache masks its slots directly (a few queries: `[B, S, K]` is small).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from dapo_jax.models import attention
from dapo_jax.models.config import ModelConfig

_NEG_INF = -1e30


class FusedLayer(NamedTuple):
    """One block's projections concatenated (`Block.fused`): `[q|k|v]` and `[gate|up]` in one matmul each."""

    qkv: jax.Array  # [d, (H + 2 H_kv) D]
    qkv_bias: jax.Array | None  # [(H + 2 H_kv) D]
    gate_up: jax.Array  # [d, 2 I]


class KVCache(NamedTuple):
    """Keys and values of every layer, `[L, B, S_max, H_kv, D]`; `mask[b, j]` = slot j holds a real token."""

    k: jax.Array
    v: jax.Array
    mask: jax.Array  # [B, S_max] bool
    end: jax.Array  # int32 scalar: slots [0, end) are filled

    @classmethod
    def init(cls, config: ModelConfig, batch: int, max_len: int, dtype=None) -> "KVCache":
        dtype = jnp.dtype(dtype or config.dtype)
        shape = (config.num_hidden_layers, batch, max_len, config.num_key_value_heads, config.head_dim)
        return cls(
            k=jnp.zeros(shape, dtype),
            v=jnp.zeros(shape, dtype),
            mask=jnp.zeros((batch, max_len), bool),
            end=jnp.zeros((), jnp.int32),
        )

    def repeat(self, n: int) -> "KVCache":
        """Each row repeated `n` times in place (row b -> rows b*n .. b*n+n-1): G responses share a prompt's prefill."""
        return KVCache(
            k=jnp.repeat(self.k, n, axis=1),
            v=jnp.repeat(self.v, n, axis=1),
            mask=jnp.repeat(self.mask, n, axis=0),
            end=self.end,
        )


def positions_from_mask(attention_mask: jax.Array, offset: jax.Array | int = 0) -> jax.Array:
    """RoPE positions of a (left- or right-) padded batch: real tokens count 0, 1, 2, ...; padding gets 0."""
    mask = attention_mask.astype(jnp.int32)
    return jnp.maximum(jnp.cumsum(mask, axis=-1) - 1 + offset, 0) * mask


# --------------------------------------------------------------------------- building blocks
class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, *, param_dtype):
        self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
        self.eps = eps

    def __call__(self, x):
        dtype = x.dtype
        x = x.astype(jnp.float32)
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return (self.weight[...].astype(jnp.float32) * x).astype(dtype)


def rope_inv_freq(config: ModelConfig) -> jax.Array:
    """Inverse frequencies `[D/2]`, with Llama 3's scaling applied where configured."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    s = config.rope_scaling
    if s is None:
        return inv_freq
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * inv_freq / s.factor + smooth * inv_freq
    scaled = jnp.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    is_medium = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return jnp.where(is_medium, smoothed, scaled)


def rope_angles(positions: jax.Array, inv_freq: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(cos, sin)`, each `[*positions.shape, 1, D]` float32: the rotation of every head at these positions
    (computed once and shared by every layer)."""
    freqs = positions[..., None].astype(jnp.float32) * inv_freq  # [..., D/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[..., None, :]
    return jnp.cos(emb), jnp.sin(emb)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """`x [..., H, D]` rotated by `rope_angles`' `cos, sin [..., 1, D]`: HF's rotate-half convention,
    `x cos + rotate_half(x) sin` with `rotate_half(x) = [-x2, x1]`, computed in float32."""
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (xf * cos + rotated * sin).astype(x.dtype)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """`x`: [B, S, H, D]; positions [B, S]. HF's rotate-half convention, computed in float32."""
    return rotate(x, *rope_angles(positions, inv_freq))


def _linear(cfg: ModelConfig, n_in: int, n_out: int, bias: bool, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(
        n_in, n_out, use_bias=bias, dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype),
        kernel_init=nnx.initializers.normal(0.02), rngs=rngs,
    )


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        h, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.cfg = cfg
        self.q_proj = _linear(cfg, cfg.hidden_size, h * d, cfg.attention_bias, rngs)
        self.k_proj = _linear(cfg, cfg.hidden_size, kv * d, cfg.attention_bias, rngs)
        self.v_proj = _linear(cfg, cfg.hidden_size, kv * d, cfg.attention_bias, rngs)
        self.o_proj = _linear(cfg, h * d, cfg.hidden_size, False, rngs)
        if cfg.qk_norm:
            pdt = jnp.dtype(cfg.param_dtype)
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps, param_dtype=pdt)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps, param_dtype=pdt)

    def project(self, x, cos, sin, fused: "FusedLayer | None" = None):
        """Queries `[N, H, D]`, keys and values `[N, H_kv, D]` of the tokens `x [N, d]`: the projections
        (one `[q|k|v]` matmul with `fused`), the QK-norm where configured, then RoPE (`rope_angles`'
        `cos, sin [N, 1, D]`) on the queries and keys. The full forward and the decode step both project here."""
        cfg = self.cfg
        n, d = x.shape[0], cfg.head_dim
        if fused is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:
            qkv = jnp.dot(x.astype(fused.qkv.dtype), fused.qkv)
            if fused.qkv_bias is not None:
                qkv = qkv + fused.qkv_bias
            n_q, n_kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
            q, k, v = qkv[:, :n_q], qkv[:, n_q:n_q + n_kv], qkv[:, n_q + n_kv:]
        q = q.reshape(n, cfg.num_attention_heads, d)
        k, v = k.reshape(n, cfg.num_key_value_heads, d), v.reshape(n, cfg.num_key_value_heads, d)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def __call__(self, x, positions, mask, inv_freq, layer_cache):
        """`mask`: the `MaskIds` of these S tokens (no cache, or a cache of exactly S slots: the prefill),
        or, with a longer cache, the `[B, S, K]` bool mask over its slots; `layer_cache`: None or
        (k [B,S_max,Hkv,D], v, start)."""
        cfg = self.cfg
        b, s, _ = x.shape
        cos, sin = rope_angles(positions.reshape(b * s), inv_freq)
        q, k, v = self.project(x.reshape(b * s, -1), cos, sin)  # tokens on one axis: see MLP.__call__
        k, v = k.reshape(b, s, *k.shape[1:]), v.reshape(b, s, *v.shape[1:])
        q = q.reshape(b, s, cfg.num_key_value_heads, cfg.num_query_groups, cfg.head_dim)
        new_kv = None
        if layer_cache is not None:
            ck, cv, start = layer_cache
            ck = jax.lax.dynamic_update_slice(ck, k.astype(ck.dtype), (0, start, 0, 0))
            cv = jax.lax.dynamic_update_slice(cv, v.astype(cv.dtype), (0, start, 0, 0))
            new_kv = (ck, cv)
            if isinstance(mask, attention.MaskIds):  # the prefill: the S tokens are the whole cache
                k, v = ck.astype(q.dtype), cv.astype(q.dtype)
            else:
                out = attention.softmax_attention(q, ck.astype(q.dtype), cv.astype(q.dtype), mask)
                return self.o_proj(out.reshape(b * s, -1)).reshape(b, s, -1), new_kv
        impl = attention.resolve(cfg.attention, platform=attention.current_platform(), seq_len=s)
        out = attention.attend(q, k, v, mask, implementation=impl)
        return self.o_proj(out.reshape(b * s, -1)).reshape(b, s, -1), new_kv


# The reference attention's query blocks (models/attention.py), named here as before
causal_blocks = attention.causal_blocks


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.gate_proj = _linear(cfg, cfg.hidden_size, cfg.intermediate_size, False, rngs)
        self.up_proj = _linear(cfg, cfg.hidden_size, cfg.intermediate_size, False, rngs)
        self.down_proj = _linear(cfg, cfg.intermediate_size, cfg.hidden_size, False, rngs)

    def __call__(self, x, fused: "FusedLayer | None" = None):
        """SwiGLU, `down(silu(gate(x)) * up(x))`; with `fused`, gate and up are one `[gate|up]` matmul.

        The projections see `[B·S, d]`, not `[B, S, d]`: a weight gradient then contracts one token
        axis, which XLA's CPU dot takes as is; over two (B and S) XLA first writes transposed copies of
        the activations, a fifth of a training step's time (docs/benchmarks.md, "Tokens on one axis")."""
        t = x.reshape(-1, x.shape[-1])
        if fused is None:
            gate, up = self.gate_proj(t), self.up_proj(t)
        else:
            gate, up = jnp.split(jnp.dot(t.astype(fused.gate_up.dtype), fused.gate_up), 2, axis=-1)
        return self.down_proj(jax.nn.silu(gate) * up).reshape(x.shape)


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        pdt = jnp.dtype(cfg.param_dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=pdt)
        self.self_attn = Attention(cfg, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=pdt)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x, positions, mask, inv_freq, layer_cache):
        h, new_kv = self.self_attn(self.input_layernorm(x), positions, mask, inv_freq, layer_cache)
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, new_kv

    def decode(self, x, cos, sin, attend, fused: "FusedLayer | None" = None):
        """One token per row, `x [B, d]`, through the block, with the same arithmetic as `__call__`:

            q, k, v = project(norm(x)),   x += o_proj(attend(q, k, v)),   x += MLP(norm(x))

        `attend(q [B, H, D], k, v [B, H_kv, D]) -> (out [B, H, D], state)` is the caller's attention over
        its KV cache (it stores k, v and returns what it wrote as `state`). Returns `(x, state)`."""
        q, k, v = self.self_attn.project(self.input_layernorm(x), cos, sin, fused)
        out, state = attend(q, k, v)
        x = x + self.self_attn.o_proj(out.reshape(x.shape[0], -1))
        return x + self.mlp(self.post_attention_layernorm(x), fused), state

    def fused(self) -> "FusedLayer":
        """The block's `[q|k|v]` and `[gate|up]` kernels side by side, cast to the compute dtype: fewer,
        wider matmuls for a decode step (built once per rollout, outside its loop)."""
        attn, mlp, dtype = self.self_attn, self.mlp, jnp.dtype(self.self_attn.cfg.dtype)
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        qkv = jnp.concatenate([p.kernel[...] for p in projections], axis=1).astype(dtype)
        bias = None
        if projections[0].bias is not None:
            bias = jnp.concatenate([p.bias[...] for p in projections]).astype(dtype)
        gate_up = jnp.concatenate([mlp.gate_proj.kernel[...], mlp.up_proj.kernel[...]], axis=1).astype(dtype)
        return FusedLayer(qkv, bias, gate_up)


def _block_forward(block, x, positions, mask, inv_freq, layer_cache):
    return block(x, positions, mask, inv_freq, layer_cache)


_REMAT = {
    "none": _block_forward,
    "full": nnx.remat(_block_forward),
    "dots_saveable": nnx.remat(_block_forward, policy=jax.checkpoint_policies.dots_saveable),
}
_SCAN_REMAT = {"full": jax.checkpoint_policies.nothing_saveable, "dots_saveable": jax.checkpoint_policies.dots_saveable}


def _stacked_layers(layers, dtype) -> tuple[nnx.GraphDef, nnx.State]:
    """The blocks' graphdef and their states stacked along a new leading axis, for one `lax.scan`.

    Matmul weights (Linear kernels and biases, which `nnx.Linear` casts to the compute dtype before
    use anyway) are cast to `dtype` before stacking, so the stacked copy costs the compute dtype's
    bytes; norm weights and LoRA factors keep their dtype. The gradient flows back through the stack
    and the casts to every block's own parameters."""
    graphdef = nnx.graphdef(layers[0])

    def cast(path, x):
        name = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)][-1]
        return x.astype(dtype) if name in ("kernel", "bias") else x

    states = [jax.tree.map_with_path(cast, nnx.state(layer)) for layer in layers]
    return graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *states)


class Decoder(nnx.Module):
    """A causal LM decoder; returns final-normed hidden states, and logits on request."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        cfg = self.config = config
        pdt = jnp.dtype(cfg.param_dtype)
        self.embed_tokens = nnx.Embed(
            cfg.vocab_size, cfg.hidden_size, dtype=jnp.dtype(cfg.dtype), param_dtype=pdt,
            embedding_init=nnx.initializers.normal(0.02), rngs=rngs,
        )
        self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, param_dtype=pdt)
        if not cfg.tie_word_embeddings:
            self.lm_head = _linear(cfg, cfg.hidden_size, cfg.vocab_size, False, rngs)

    def __call__(self, input_ids, positions, attention_mask, cache: KVCache | None = None, segment_ids=None,
                 branch_ids=None):
        """`input_ids`, `positions`, `attention_mask`: [B, S]. Returns (hidden [B, S, d], cache).

        `segment_ids` [B, S] int (optional, no cache): several sequences packed in one row; a query
        attends only to keys of its own segment (and `attention_mask` should be `segment_ids > 0`).
        `branch_ids` [B, S] int (optional, with `segment_ids`): sequences that share a prefix, laid out
        once as prefix, branch 1, branch 2, ...: keys of branch 0 (the prefix) are seen by every later
        query of the segment, keys of a branch b > 0 only by queries of branch b. Each branch then
        computes what its sequence (prefix + branch) alone would, with the prefix's tokens computed once."""
        cfg = self.config
        s = input_ids.shape[1]
        if branch_ids is not None and segment_ids is None:
            raise ValueError("branch_ids (shared prefixes) need segment_ids")
        if cache is None or cache.k.shape[2] == s:  # without a cache, or the prefill of one of S slots
            if cache is not None and segment_ids is not None:
                raise ValueError("segment_ids (packed sequences) cannot be used with a KVCache")
            mask = attention.mask_ids(attention_mask, segment_ids, branch_ids)  # [B, S] ids, no [S, K] array
            key_real = attention_mask.astype(bool)
        else:
            if segment_ids is not None:
                raise ValueError("segment_ids (packed sequences) cannot be used with a KVCache")
            real = attention_mask.astype(bool)
            q_idx = cache.end + jnp.arange(s)
            k_idx = jnp.arange(cache.mask.shape[1])
            key_real = jax.lax.dynamic_update_slice(cache.mask, real, (0, cache.end))
            mask = (k_idx[None, :] <= q_idx[:, None])[None] & key_real[:, None, :] & real[:, :, None]
            mask = mask | (k_idx[None, :] == q_idx[:, None])[None]  # a padding query attends to itself
        inv_freq = rope_inv_freq(cfg)
        x = self.embed_tokens(input_ids)
        if cache is None and cfg.remat != "none" and len(self.layers) > 1:
            return self.norm(self._scan_layers(x, positions, mask, inv_freq)), None
        forward = _REMAT[cfg.remat]
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else (cache.k[i], cache.v[i], cache.end)
            x, kv = forward(layer, x, positions, mask, inv_freq, layer_cache)
            if kv is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])
        hidden = self.norm(x)
        if cache is not None:
            cache = KVCache(jnp.stack(new_k), jnp.stack(new_v), key_real, cache.end + s)
        return hidden, cache

    def _scan_layers(self, x, positions, mask, inv_freq):
        """The blocks without a KV cache (training, log-probs, the critic) as one `lax.scan` over their
        stacked weights, with `config.remat` applied to the scan body.

        Same arithmetic as calling the blocks one by one. The reason is memory: XLA's CPU scheduler
        drops remat's ordering between unrolled layers (a checkpointed 24-layer stack keeps every
        layer's activations and weight casts alive into the backward pass), while a scan body is
        recomputed one layer at a time on every backend. It also compiles one block instead of L."""
        graphdef, stacked = _stacked_layers(self.layers, jnp.dtype(self.config.dtype))

        def body(h, state):
            h, _ = nnx.merge(graphdef, state)(h, positions, mask, inv_freq, None)
            return h, None

        body = jax.checkpoint(body, policy=_SCAN_REMAT[self.config.remat], prevent_cse=False)
        return jax.lax.scan(body, x, stacked)[0]

    def output_embedding(self) -> jax.Array:
        """The `[d, V]` matrix that maps hidden states to logits (the embedding's transpose when tied)."""
        if self.config.tie_word_embeddings:
            return self.embed_tokens.embedding[...].T
        return self.lm_head.kernel[...]

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Full-vocabulary logits `[..., V]` in float32 (use `models.logprobs` to avoid materialising them)."""
        if self.config.tie_word_embeddings:  # contract E [V, d] directly: no transposed copy of it (CPU)
            w, spec = self.embed_tokens.embedding[...].astype(self.config.dtype), "...d,vd->...v"
        else:
            w, spec = self.lm_head.kernel[...].astype(self.config.dtype), "...d,dv->...v"
        return jnp.einsum(spec, hidden.astype(w.dtype), w, preferred_element_type=jnp.float32)
