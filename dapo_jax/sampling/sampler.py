"""The rollout engine: G sampled responses per prompt with a KV cache, under one `jit`.

    generate = make_generate(graphdef, config, num_samples=G)   # compiled once per prompt bucket
    rollout = generate(state, prompt_ids [P,S], prompt_mask [P,S], key)

1. Prefill each (left-padded) prompt once with the model's `KVCache` and keep it once per prompt
   (`models.decode.PromptCache`): the G responses (rows p*G .. p*G+G-1) share it.
2. Draw token 0 from the prefill's last logits; then `lax.while_loop`s feed token t-1 (RoPE
   position `n_prompt + t - 1`, response slot `t - 1`) through `models.decode.decode_step` and draw token
   t, until every row has emitted an EOS or T tokens exist. The response slots come in up to
   `_MAX_BLOCKS` blocks (of about `_MIN_BLOCK_SLOTS` slots or more), one `while_loop` each, so early steps do not
   attend over empty slots.
   All uniforms are drawn before the loops. With `config.compaction`, the unfinished rows move to
   a batch of half the size once at most half are left, on each batch device (`compaction.py`: a row
   never moves to another device), and later stages use one
   block of all `T - 1` slots (one more `while_loop` per stage).
3. After a row's EOS it emits `pad_token_id` with mask 0 and log-probs 0.
4. Each step also records the entropy of the distribution it draws from, at the sampling
   temperature and before top-k/top-p (the train step's `entropy` metric), so the entropy of every
   generated response is known, not only of the groups an update keeps.

The block being filled travels in the loop carry, so XLA updates it in place; nothing leaves the
device until the rollout is complete.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec

from dapo_jax.models.decode import (
    PromptCache, ResponseCache, concat_response_caches, decode_step, empty_response_cache, fused_layers,
    prompt_cache_from_prefill,
)
from dapo_jax.models.decoder import Decoder, KVCache, positions_from_mask
from dapo_jax.parallel.mesh import BATCH_AXES, batch_ways
from dapo_jax.sampling.compaction import (
    gather_prompt_cache, gather_response_cache, live_first, live_per_group, put_rows, stage_sizes,
    take_rows,
)
from dapo_jax.sampling.config import SamplingConfig
from dapo_jax.sampling.processors import draw_tokens


class Rollout(NamedTuple):
    """One rollout batch. `P` prompts, `G` responses each, `T = max_new_tokens` (always)."""

    prompt_ids: jax.Array  # [P, S] int32, left-padded
    prompt_mask: jax.Array  # [P, S] int32
    response_ids: jax.Array  # [P, G, T] int32; pad_token_id after the EOS
    response_mask: jax.Array  # [P, G, T] int32; 1 on real tokens including the EOS
    logprobs: jax.Array  # [P, G, T] f32: log_softmax(logits / temperature)[token]; 0 on padding
    sampled_logprobs: jax.Array  # [P, G, T] f32: under the truncated distribution sampled from
    entropy: jax.Array  # [P, G, T] f32: H(softmax(logits / temperature)) before top-k/top-p; 0 on padding
    lengths: jax.Array  # [P, G] int32 = response_mask.sum(-1)
    truncated: jax.Array  # [P, G] bool: reached T tokens without an EOS


# The response slots are filled in at most this many blocks, each by its own `while_loop` that
# attends to the blocks before it and to its own filled part: about 5/8 of the slots, not all T.
_MAX_BLOCKS = 4
# ... and one block per this many slots at most: each block is one more copy of the decode step to
# compile (about 0.3-0.5 s on a 2-core CPU for a 4-layer model), and a short one saves little attention.
# At 64 new tokens one block compiles the rollout 1.4 s faster and runs as fast; at 144, four blocks
# still run faster than one (docs/benchmarks.md, "The first step").
_MIN_BLOCK_SLOTS = 32


class _Carry(NamedTuple):
    """The decode state of one stage's `B_s` rows (`B_s = B` without compaction)."""

    t: jax.Array  # next token index to draw
    blocks: tuple[ResponseCache, ...]  # every block of response slots, filled up to t - 1
    logits: jax.Array  # [B_s, V] f32, for token t
    done: jax.Array  # [B_s] bool: an EOS was emitted before token t
    tokens: jax.Array  # [B_s, T]
    mask: jax.Array  # [B_s, T]
    logp: jax.Array  # [B_s, T]
    logq: jax.Array  # [B_s, T]
    entropy: jax.Array  # [B_s, T]


class _Stage(NamedTuple):
    """What a stage's rows read and never write: fixed for the stage, gathered at each compaction."""

    rows: jax.Array  # [B_s] int32: each row's index in the full batch (p*G + g)
    prompt: PromptCache  # [P, ...] at the first stage, then one copy per row
    n_prompt: jax.Array  # [B_s] int32: real prompt tokens
    uniforms: jax.Array | None  # [B_s, T]: the row's pre-drawn uniforms (None when greedy)


_OUTPUTS = ("tokens", "mask", "logp", "logq", "entropy", "done")


def shard_batch(x: jax.Array) -> jax.Array:
    """Shard dim 0 over ("data", "fsdp") when a mesh with those axes is active and divides it."""
    ways = batch_ways()
    if ways == 1 or x.shape[0] % ways:
        return x
    spec = PartitionSpec(BATCH_AXES, *([None] * (x.ndim - 1)))
    return jax.lax.with_sharding_constraint(x, spec)


def shard_cache(cache):
    """A `PromptCache` or `ResponseCache` sharded over its prompt dimension."""
    return jax.tree.map(shard_batch, cache)


def _block_sizes(num_slots: int) -> list[int]:
    """`num_slots` split into at most `_MAX_BLOCKS` near-equal blocks, no more than `num_slots //
    _MIN_BLOCK_SLOTS` (one when fewer; none when 0)."""
    if num_slots <= 0:
        return []
    size = -(-num_slots // max(1, min(_MAX_BLOCKS, num_slots // _MIN_BLOCK_SLOTS)))
    return [min(size, num_slots - start) for start in range(0, num_slots, size)]


def is_eos(tokens: jax.Array, eos_token_ids: tuple[int, ...]) -> jax.Array:
    if not eos_token_ids:
        return jnp.zeros(tokens.shape, bool)
    return jnp.any(tokens[..., None] == jnp.asarray(eos_token_ids, tokens.dtype), axis=-1)


def tempered_entropy(logits: jax.Array, temperature: float) -> jax.Array:
    """`H = logsumexp(z) - Σ softmax(z)·z`, `z = logits / temperature`, `[B, V] -> [B]` float32.

    Written as `draw_tokens` writes its weights (`exp(z - max z)`), so XLA computes the exponentials
    once for both."""
    z = logits.astype(jnp.float32) / temperature
    shifted = z - jnp.max(z, axis=-1, keepdims=True)
    weights = jnp.exp(shifted)
    total = jnp.sum(weights, axis=-1)
    # weights == 0 where shifted == -inf (a masked logit): its term is 0, never 0 * inf
    return jnp.log(total) - jnp.sum(jnp.where(weights > 0, weights * shifted, 0.0), axis=-1) / total


def rollout_with_steps(
    model: Decoder, prompt_ids: jax.Array, prompt_mask: jax.Array, key: jax.Array,
    *, config: SamplingConfig, num_samples: int,
) -> tuple[Rollout, jax.Array]:
    """The traced body of `generate`; also returns the number of decode forwards run (early exit)."""
    p, s = prompt_ids.shape
    g, t_max = num_samples, config.max_new_tokens
    b = p * g
    prompt_ids = shard_batch(prompt_ids.astype(jnp.int32))
    prompt_mask = shard_batch(prompt_mask.astype(jnp.int32))

    # the model's own cached forward for the prefill (S slots), then the in-place decode layout
    positions = positions_from_mask(prompt_mask)
    hidden, cache = model(prompt_ids, positions, prompt_mask, cache=KVCache.init(model.config, p, s))
    # left padding puts every prompt's last real token in the last column
    last_logits = model.logits(hidden[:, -1])  # [P, V]
    prompt_cache = shard_cache(prompt_cache_from_prefill(cache))
    fused = fused_layers(model)  # loop-invariant: concatenated once, read every step
    logits = shard_batch(jnp.repeat(last_logits, g, axis=0))  # [B, V]
    n_prompt = jnp.repeat(prompt_mask.sum(axis=-1), g).astype(jnp.int32)  # [B]
    # every step's randomness at once, so the loop body runs no PRNG (on CPU a threefry call is a
    # small loop of its own); greedy draws none. Row b always reads row b's uniforms, wherever
    # compaction moves it.
    uniforms = None if config.is_greedy else shard_batch(jax.random.uniform(key, (b, t_max), jnp.float32))
    ways = batch_ways()  # compaction keeps every row on its device (compaction.py)
    stage = _Stage(jnp.arange(b, dtype=jnp.int32), prompt_cache, shard_batch(n_prompt), uniforms)

    def draw(carry: _Carry, stage: _Stage) -> _Carry:
        """Draws token t from carry.logits and records it (pad / mask 0 on finished rows)."""
        t = carry.t
        u = None if stage.uniforms is None else jax.lax.dynamic_slice_in_dim(stage.uniforms, t, 1, axis=1)[:, 0]
        tok, lp, lq = draw_tokens(u, carry.logits, config=config)
        ent = tempered_entropy(carry.logits, config.logprob_temperature)
        live = ~carry.done
        tok = jnp.where(live, tok, config.pad_token_id)
        lp, lq, ent = (jnp.where(live, x, 0.0) for x in (lp, lq, ent))
        col = lambda buf, v: jax.lax.dynamic_update_slice(buf, v[:, None].astype(buf.dtype), (0, t))
        return carry._replace(
            done=carry.done | (live & is_eos(tok, config.eos_token_ids)),
            tokens=col(carry.tokens, tok), mask=col(carry.mask, live.astype(jnp.int32)),
            logp=col(carry.logp, lp), logq=col(carry.logq, lq), entropy=col(carry.entropy, ent),
        )

    def fill_block(carry: _Carry, stage: _Stage, j: int, start: int, size: int, keep_going_above: int) -> _Carry:
        """Steps t = start+1 .. start+size: feeds token t-1 into block j's slot t-1-start, draws
        token t; stops early once no group of rows (one per batch device) has more than
        `keep_going_above / ways` unfinished rows."""

        def cond(carry: _Carry) -> jax.Array:
            return (carry.t <= start + size) & (live_per_group(carry.done, ways) > keep_going_above // ways)

        def body(carry: _Carry) -> _Carry:
            prev = jax.lax.dynamic_slice_in_dim(carry.tokens, carry.t - 1, 1, axis=1)[:, 0]  # [B_s]
            logits, block = decode_step(
                model, fused, stage.prompt, carry.blocks[:j], carry.blocks[j], prev,
                stage.n_prompt + carry.t - 1, carry.t - 1 - start,
            )
            blocks = (*carry.blocks[:j], shard_cache(block), *carry.blocks[j + 1:])
            carry = carry._replace(blocks=blocks, logits=shard_batch(logits))
            return draw(carry, stage)._replace(t=carry.t + 1)

        return jax.lax.while_loop(cond, body, carry)

    def compact(carry: _Carry, stage: _Stage, size: int) -> tuple[_Carry, _Stage]:
        """The `size` rows to go on with (every unfinished one): a gathered copy of their state, each
        group of rows (one per batch device) compacted within itself."""
        local = live_first(carry.done, size, ways)
        take = lambda x: shard_batch(take_rows(x, local))
        rows = take(stage.rows)
        # one block of all T - 1 slots from here on: one decode loop per later stage, not one per block
        merged = functools.reduce(concat_response_caches, [gather_response_cache(blk, local) for blk in carry.blocks])
        carry = carry._replace(
            blocks=(shard_cache(merged),),
            **{name: take(getattr(carry, name)) for name in ("logits", *_OUTPUTS)},
        )
        stage = _Stage(
            rows=rows, prompt=shard_cache(gather_prompt_cache(prompt_cache, rows // g, ways)),
            n_prompt=take(stage.n_prompt), uniforms=None if stage.uniforms is None else take(stage.uniforms),
        )
        return carry, stage

    zeros_bt = lambda dtype: shard_batch(jnp.zeros((b, t_max), dtype))
    sizes = _block_sizes(t_max - 1)  # tokens 0 .. T-2 are fed back (slots 0 .. T-2); the last never is
    carry = _Carry(
        t=jnp.zeros((), jnp.int32),
        blocks=tuple(shard_cache(empty_response_cache(prompt_cache, g, n)) for n in sizes),
        logits=logits, done=jnp.zeros((b,), bool),
        tokens=shard_batch(jnp.full((b, t_max), config.pad_token_id, jnp.int32)),
        mask=zeros_bt(jnp.int32), logp=zeros_bt(jnp.float32), logq=zeros_bt(jnp.float32),
        entropy=zeros_bt(jnp.float32),
    )
    carry = draw(carry, stage)._replace(t=jnp.ones((), jnp.int32))
    stages = stage_sizes(b, enabled=config.compaction, min_rows=config.compaction_min_rows, ways=ways)
    out = None  # {name: [B, ...]}: every row's outputs, written back at each compaction
    for k, rows in enumerate(stages):
        if k:
            out = _write_back(out, carry, stage, ways)
            carry, stage = compact(carry, stage, rows)
        next_rows = stages[k + 1] if k + 1 < len(stages) else 0
        start = 0
        for j, n in enumerate(sizes if k == 0 else [t_max - 1]):
            carry = fill_block(carry, stage, j, start, n, next_rows)
            start += n
    out = _write_back(out, carry, stage, ways)

    shape = lambda x: x.reshape(p, g, *x.shape[1:])
    lengths = out["mask"].sum(axis=-1).astype(jnp.int32)
    rollout = Rollout(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask,
        response_ids=shape(out["tokens"]), response_mask=shape(out["mask"]),
        logprobs=shape(out["logp"]), sampled_logprobs=shape(out["logq"]), entropy=shape(out["entropy"]),
        lengths=shape(lengths), truncated=shape(~out["done"]),
    )
    return rollout, carry.t - 1


def _write_back(out: dict | None, carry: _Carry, stage: _Stage, ways: int) -> dict:
    """`out` with the stage's rows written to their places (the stage's own arrays at the first stage);
    each group's rows go back into its own slice of `out`."""
    if out is None:  # the first stage holds every row, in order
        return {name: getattr(carry, name) for name in _OUTPUTS}
    per_group = next(iter(out.values())).shape[0] // ways
    local = (stage.rows % per_group).reshape(ways, -1)
    return {name: shard_batch(put_rows(out[name], local, getattr(carry, name))) for name in _OUTPUTS}


def make_generate(graphdef: nnx.GraphDef, config: SamplingConfig, num_samples: int, *, with_steps: bool = False):
    """A jitted `generate(state, prompt_ids [P,S], prompt_mask [P,S], key) -> Rollout`.

    `graphdef, state = nnx.split(model)`. It compiles once per prompt shape `[P, S]` (use
    `pad_to_bucket`); the same key gives an identical rollout. Under `jax.set_mesh(mesh)` the batch
    is sharded over ("data", "fsdp") and the weights keep the sharding they carry.
    With `with_steps=True` it returns `(rollout, decode_steps)`, the number of decode forwards run
    (< T - 1 when every row finished early).
    """
    if not isinstance(config, SamplingConfig):
        raise TypeError(f"config must be a SamplingConfig, got {type(config).__name__}")
    if not isinstance(num_samples, int) or num_samples <= 0:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")

    @jax.jit
    def generate_fn(state, prompt_ids, prompt_mask, key):
        if prompt_ids.ndim != 2 or prompt_ids.shape != prompt_mask.shape:
            raise ValueError(
                f"prompt_ids {tuple(prompt_ids.shape)} and prompt_mask {tuple(prompt_mask.shape)} "
                "must both be [P, S]"
            )
        model = nnx.merge(graphdef, state)
        out = rollout_with_steps(model, prompt_ids, prompt_mask, key, config=config, num_samples=num_samples)
        return out if with_steps else out[0]

    return generate_fn


_GENERATE_CACHE: dict = {}


def generate(
    model: Decoder, prompt_ids: jax.Array, prompt_mask: jax.Array, key: jax.Array,
    *, num_samples: int, config: SamplingConfig,
) -> Rollout:
    """Convenience: `make_generate(*nnx.split(model)...)` with the compiled function reused across calls."""
    graphdef, state = nnx.split(model)
    cache_key = (graphdef, config, num_samples)
    if cache_key not in _GENERATE_CACHE:
        _GENERATE_CACHE[cache_key] = make_generate(graphdef, config, num_samples)
    return _GENERATE_CACHE[cache_key](state, prompt_ids, prompt_mask, key)
