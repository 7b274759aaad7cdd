"""One-token decode step over a head-major KV cache split into the prompts' part and the responses'.

The architecture is the decoder's own: each layer runs `Block.decode` (`models/decoder.py`), the same
projections, QK-norm, RoPE, output projection and MLP as the full forward, so a change of architecture is
made there once. What this module adds is the cache: its layouts and the attention of one new token over it.

`Decoder.__call__(..., cache=KVCache)` is the reference semantics, but its cache is one stacked
`[L, B, S_max, H_kv, D]` array rebuilt with `jnp.stack` every call: inside a `while_loop` that is a
full copy of every layer's keys and values per generated token. This step computes exactly the same
function with:

- the prompt's keys and values stored once per prompt (`PromptCache`, `[P, ...]`), not once per
  sample: the `G` samples of a prompt read them in one `[G r, D] x [D, S]` matmul;
- the response slots in blocks (`ResponseCache`, `[P, H_kv, G, ...]`): the rollout fills one block
  per `while_loop`, attending to the finished blocks (`past`, loop-invariant) and to the filled
  part of its own, so a step reads about 5/8 of the response slots, not all `T`;
- one array per layer, written with a single `dynamic_update_slice` per step (aliased in place; one
  per prompt when each prompt is at its own step, `slot [P]`);
- head-major layouts, keys `[..., D, slots]` and values `[..., slots, D]`, so `q·K` and `p·V` are
  plain batched matmuls (with keys `[.., S, D]` the CPU dot is 2-3x slower);
- `[q|k|v]` and `[gate|up]` kernels concatenated once per rollout (`fused_layers`, `Block.fused`), and the
  RoPE angles computed once per step, not per layer.

For the new token (every visible slot of its row, its own included):

    s_k = q·k_k / sqrt(D)  (masked -> -1e30),   out = softmax(s)·V,   x += o_proj(out),   x += MLP(x)

with one softmax over the concatenated prompt, past and block scores. `tests/sampling` checks it token
for token against transformers and the model's full forward; `tests/models/test_decode.py` checks one
step against the model's cached forward.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dapo_jax.models.decoder import Decoder, FusedLayer, KVCache, rope_angles, rope_inv_freq

_NEG_INF = -1e30  # as the decoder: finite, so a fully masked row stays NaN-free


def fused_layers(model: Decoder) -> tuple[FusedLayer, ...]:
    """Every block's `Block.fused()` kernels, computed once per rollout outside its decode loop."""
    return tuple(layer.fused() for layer in model.layers)


class PromptCache(NamedTuple):
    """The prefilled prompts, once per prompt (not per sample). Per layer: keys `[P, H_kv, D, S]`,
    values `[P, H_kv, S, D]`; the prompts are left-padded, so prompt p's real tokens fill the last
    `lengths[p]` slots: a length per prompt says what a step may see, no `[P, S]` mask is kept."""

    k: tuple[jax.Array, ...]  # transposed, so q·K is a plain [G r, D] x [D, S] matmul
    v: tuple[jax.Array, ...]
    lengths: jax.Array  # [P] int32: real (left-padded) prompt tokens


class ResponseCache(NamedTuple):
    """`n` consecutive response slots of the `G` samples of each prompt. Per layer: keys
    `[P, H_kv, G, D, n]`, values `[P, H_kv, G, n, D]` (row `b = p*G + g`)."""

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]


def prompt_cache_from_prefill(cache: KVCache) -> PromptCache:
    """The model's prefilled `KVCache` (`[L, P, S, H_kv, D]`) in the head-major decode layout."""
    n_layers = cache.k.shape[0]
    return PromptCache(
        k=tuple(jnp.transpose(cache.k[i], (0, 2, 3, 1)) for i in range(n_layers)),
        v=tuple(jnp.swapaxes(cache.v[i], 1, 2) for i in range(n_layers)),
        lengths=jnp.sum(cache.mask, axis=-1, dtype=jnp.int32),
    )


def empty_response_cache(prompt: PromptCache, num_samples: int, num_slots: int) -> ResponseCache:
    """A zero `ResponseCache` of `num_slots` slots shaped after `prompt`."""
    def zeros(x, *tail):
        p, h_kv = x.shape[:2]
        return jnp.zeros((p, h_kv, num_samples, *tail), x.dtype)

    d = prompt.v[0].shape[-1]
    return ResponseCache(
        k=tuple(zeros(x, d, num_slots) for x in prompt.k), v=tuple(zeros(x, num_slots, d) for x in prompt.v),
    )


def concat_response_caches(a: ResponseCache | None, b: ResponseCache) -> ResponseCache:
    """`a`'s slots followed by `b`'s (`b` when `a` is None)."""
    if a is None:
        return b
    return ResponseCache(
        k=tuple(jnp.concatenate(kk, axis=-1) for kk in zip(a.k, b.k)),
        v=tuple(jnp.concatenate(vv, axis=-2) for vv in zip(a.v, b.v)),
    )


def decode_step(
    model: Decoder, fused: tuple[FusedLayer | None, ...], prompt: PromptCache,
    past: ResponseCache | tuple[ResponseCache, ...] | None,
    block: ResponseCache, tokens: jax.Array, positions: jax.Array, slot: jax.Array,
) -> tuple[jax.Array, ResponseCache]:
    """Feeds one token per row and returns the next-token logits.

    The context of row `b = p*G + g` is its prompt's real slots, every slot of `past` and
    `block`'s slots `[0, slot]`, the new token's own included.

    Args:
      model: the `Decoder` whose parameters to use.
      fused: `fused_layers(model)`, computed once outside the decode loop (an entry None: that block's
        separate projections, the same function in more matmuls).
      prompt: the `PromptCache` of the `P` prompts.
      past: the filled response slots before `block` (loop-invariant): a cache, a tuple of caches
        (consecutive blocks, read in place, never concatenated), or None.
      block: the response slots being filled; the new key/value goes to `slot`.
      tokens: `[B]` int token ids, `B = P*G`.
      positions: `[B]` int RoPE positions of those tokens.
      slot: int32 scalar, the same for every row, or `[P]`, one per prompt (continuous batching
        runs each row as its own prompt, `G = 1`, at its own step).

    Returns:
      `(logits [B, V] float32, block)` with the new keys/values written at `slot`.
    """
    cfg = model.config
    if past is None:
        past = ()
    elif isinstance(past, ResponseCache):
        past = (past,)
    b = tokens.shape[0]
    p, _, g = block.k[0].shape[:3]
    h_kv, r, d = cfg.num_key_value_heads, cfg.num_query_groups, cfg.head_dim
    width = prompt.v[0].shape[2]
    prompt_visible = (jnp.arange(width) >= width - prompt.lengths[:, None])[:, None, None, None, :]  # [P,1,1,1,S]
    slot = jnp.asarray(slot, jnp.int32)
    block_visible = jnp.arange(block.k[0].shape[-1]) <= slot[..., None]  # [n], or [P, n] per prompt
    if slot.ndim:
        block_visible = block_visible[:, None, None, None, :]  # [P, 1, 1, 1, n]
    cos, sin = rope_angles(positions, rope_inv_freq(cfg))  # [B, 1, D], once per step: every layer shares them

    def by_prompt(x):  # [B, H_kv, ...] -> [P, H_kv, G, ...]
        x = x.reshape(p, g, *x.shape[1:])
        return jnp.swapaxes(x, 1, 2)

    def attend(i: int):
        """Layer i's attention over the caches: writes k, v at `slot`, returns `(out [B, H, D], (k, v) block)`."""

        def over_caches(q, k, v):
            # one slot: a column of the block's keys, a row of its values
            bk = _write_slot(block.k[i], by_prompt(k)[..., None], slot, axis=4)
            bv = _write_slot(block.v[i], by_prompt(v)[..., None, :], slot, axis=3)
            qg = by_prompt(q.reshape(b, h_kv, r, d))  # [P, H_kv, G, r, D]; head h = kv * r + i, as the decoder
            dot = lambda spec, a, c: jnp.einsum(spec, a, c.astype(q.dtype), preferred_element_type=jnp.float32)
            parts = [jnp.where(prompt_visible, dot("pkgrd,pkds->pkgrs", qg, prompt.k[i]) / math.sqrt(d), _NEG_INF)]
            parts += [dot("pkgrd,pkgds->pkgrs", qg, earlier.k[i]) / math.sqrt(d) for earlier in past]
            parts.append(jnp.where(block_visible, dot("pkgrd,pkgds->pkgrs", qg, bk) / math.sqrt(d), _NEG_INF))
            probs = jax.nn.softmax(jnp.concatenate(parts, axis=-1), axis=-1).astype(q.dtype)
            edges = [part.shape[-1] for part in parts]
            probs = jnp.split(probs, [sum(edges[:j]) for j in range(1, len(edges))], axis=-1)
            mix = lambda spec, a, c: jnp.einsum(spec, a, c.astype(q.dtype))
            out = mix("pkgrs,pksd->pkgrd", probs[0], prompt.v[i])
            for j, earlier in enumerate(past):
                out = out + mix("pkgrs,pkgsd->pkgrd", probs[1 + j], earlier.v[i])
            out = out + mix("pkgrs,pkgsd->pkgrd", probs[-1], bv)
            return jnp.swapaxes(out, 1, 2).reshape(b, cfg.num_attention_heads, d), (bk, bv)

        return over_caches

    x = model.embed_tokens(tokens)  # [B, d]
    new_k, new_v = [], []
    for i, (layer, w) in enumerate(zip(model.layers, fused)):
        x, (bk, bv) = layer.decode(x, cos, sin, attend(i), w)
        new_k.append(bk)
        new_v.append(bv)
    logits = model.logits(model.norm(x))
    return logits, ResponseCache(tuple(new_k), tuple(new_v))


def _write_slot(cache: jax.Array, new: jax.Array, slot: jax.Array, *, axis: int) -> jax.Array:
    """`cache` `[P, ...]` with `new` (size 1 along `axis`) written at `slot` (a scalar, or one per prompt)."""
    new = new.astype(cache.dtype)
    if not slot.ndim:
        return jax.lax.dynamic_update_slice(cache, new, tuple(slot if a == axis else 0 for a in range(cache.ndim)))
    at = lambda c, x, s: jax.lax.dynamic_update_slice(c, x, tuple(s if a == axis - 1 else 0 for a in range(c.ndim)))
    return jax.vmap(at)(cache, new, slot)
