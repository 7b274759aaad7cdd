"""The multi-turn sampler's device programs: prefill, decode a turn, append observation tokens.

    engine = TurnEngine(graphdef, EngineConfig(sampling, cache_slots=C, append_width=A, stop_sequences=...))
    es = engine.prefill(state, prompt_ids [B,S], prompt_mask [B,S])
    es, turn = engine.decode(state, es, active [B], budget [B], key)    # until EOS / stop / budget
    es = engine.append(state, es, ids [B,A], n_new [B])                 # the observations' ids

All `B` rows (prompts x G) share one `KVCache` array (the model's own, `models/decoder.py`), but each
row has its own write index `end [B]`: a row's ids go to its own slots `[end[b], end[b] + n)` and
only its own ids advance it, so an idle row (paused while its tool runs, finished, or shorter than
the widest append) takes no slot. Each program runs the model's cached forward (`Decoder.__call__`
with a cache) once per row under `jax.vmap`, so the row's `end` is its own scalar there: the same
per-row write as `models/decode.py`'s `slot [P]` (a vmapped `dynamic_update_slice`), and the same
forward math as the single-index engine, computed row by row. The array has `C + A` slots (`C =
cache_slots`, `A = append_width`): a row holds at most `C` real ids, and the last `A` are scratch
that an idle row's mask-0 writes may land in without touching anyone's history (no query ever
attends to a mask-0 slot). A row's RoPE positions count only its real tokens (`pos [B]`), so its
keys, values and logits are those of its conversation alone, laid out contiguously: what the
trainer's forward computes over `prompt + episode`. Nothing of the history is ever computed again:
an append is a prefill of the new tokens over the cache, and decoding resumes from its logits.

Fixed shapes: `prefill` compiles once per prompt width, `decode` and `append` once each; the number
of turns, their lengths and the number of append chunks are loop counts on the host and in a
`while_loop`, never shapes. `C` must cover one row's own prompt width and episode (its model and
observation ids), not the batch's longest turns; a row that has filled its `C` slots ends its turn
with reason 4 ("context").

A turn ends at an EOS id (reason 1), at the end of a stop sequence of ids such as Qwen2.5's
`</tool_call>` (reason 2, the marker's ids included in the turn), when the row's token budget is
spent (3), or when the row's own slots are full (4). Sampling is `sampling.processors.draw_tokens`, the
single-turn sampler's, with one uniform per row and step from `fold_in(key, step)`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec

from dapo_jax.models.decoder import KVCache, positions_from_mask
from dapo_jax.parallel.mesh import BATCH_AXES, batch_ways
from dapo_jax.sampling.config import SamplingConfig
from dapo_jax.sampling.processors import draw_tokens
from dapo_jax.sampling.sampler import is_eos, shard_batch, tempered_entropy

REASONS = {0: "running", 1: "eos", 2: "stop", 3: "budget", 4: "context"}


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """`sampling.max_new_tokens` is the most tokens one turn may draw (the episode budget `T`)."""

    sampling: SamplingConfig
    cache_slots: int  # C: slots of one row: its prompt width + its own episode ids
    append_width: int  # A: observation ids appended per chunk
    stop_sequences: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self):
        if self.append_width <= 0 or self.cache_slots <= 0:
            raise ValueError(f"append_width and cache_slots must be > 0, got {self.append_width}, {self.cache_slots}")
        if any(not seq for seq in self.stop_sequences):
            raise ValueError("stop_sequences must not hold an empty sequence")


class EngineState(NamedTuple):
    cache: KVCache  # [L, B, C + A, H_kv, D]; cache.end [B] int32: each row's next free slot
    logits: jax.Array  # [B, V] float32: the next token's logits of each row
    pos: jax.Array  # [B] int32: the next token's RoPE position (the row's real tokens so far)


class TurnOutput(NamedTuple):
    tokens: jax.Array  # [B, D] int32, the turn's ids from column 0, pad after
    logp: jax.Array  # [B, D] float32: log_softmax(logits / temperature)[token]; 0 after the turn
    logq: jax.Array  # [B, D] float32: under the truncated distribution sampled from
    entropy: jax.Array  # [B, D] float32
    count: jax.Array  # [B] int32: tokens drawn this turn
    reason: jax.Array  # [B] int32: see REASONS (0 for a row that was not active)
    steps: jax.Array  # int32: decode steps run (a row takes a slot only on its own drawing steps)


def _stop_table(stop_sequences) -> jax.Array | None:
    """`[K, L]` stop sequences right-aligned, padded on the left with -1 (matches anything)."""
    if not stop_sequences:
        return None
    width = max(len(s) for s in stop_sequences)
    return jnp.asarray([[-1] * (width - len(s)) + list(s) for s in stop_sequences], jnp.int32)


def ends_with_stop(window: jax.Array, table: jax.Array) -> jax.Array:
    """`[B]`: the row's last `L` ids (`window [B, L]`, -2 before the turn's first) end with a stop sequence."""
    hit = (table[None] == -1) | (window[:, None, :] == table[None])  # [B, K, L]
    return jnp.any(jnp.all(hit, axis=-1), axis=-1)


def shard_kv(cache: KVCache) -> KVCache:
    """The cache's rows (axis 1 of keys and values, 0 of the mask) over ("data", "fsdp") under a mesh
    that divides them, as `sampler.shard_batch` does for `[B, ...]` arrays: each device keeps its rows."""
    ways = batch_ways()
    if ways == 1 or cache.mask.shape[0] % ways:
        return cache
    kv = PartitionSpec(None, BATCH_AXES)
    return cache._replace(k=jax.lax.with_sharding_constraint(cache.k, kv),
                          v=jax.lax.with_sharding_constraint(cache.v, kv), mask=shard_batch(cache.mask))


def rows_forward(model, ids, positions, real, cache: KVCache) -> tuple[jax.Array, KVCache]:
    """The model's cached forward with a write index per row: row b's `S` ids go to slots
    `[end[b], end[b] + S)` (its padding ids, `real` 0, as mask-0 slots) and `end[b]` advances by its
    real ids only. `ids`, `positions`, `real` `[B, S]`; `cache.end [B]`. Returns `(hidden [B, S, d], cache)`.

    `Decoder.__call__` once per row under `jax.vmap` (its scalar `end` becomes the row's own), so the
    arithmetic is the model's: nothing of attention, RoPE or the blocks is written again here."""

    def one(ids, positions, real, k, v, mask, end):
        hidden, cache = model(ids[None], positions[None], real[None],
                              cache=KVCache(k[:, None], v[:, None], mask[None], end))
        return hidden[0], cache.k[:, 0], cache.v[:, 0], cache.mask[0]

    hidden, k, v, mask = jax.vmap(one, in_axes=(0, 0, 0, 1, 1, 0, 0), out_axes=(0, 1, 1, 0))(
        ids, positions, real, cache.k, cache.v, cache.mask, cache.end)
    return hidden, shard_kv(KVCache(k, v, mask, cache.end + real.sum(axis=-1).astype(jnp.int32)))


class TurnEngine:
    """The three jitted programs over one `graphdef` (weights are passed as `state` on each call)."""

    def __init__(self, graphdef: nnx.GraphDef, config: EngineConfig):
        self.graphdef, self.config = graphdef, config
        self.prefill = jax.jit(self._prefill)
        self.decode = jax.jit(self._decode)
        self.append = jax.jit(self._append)

    def programs(self, state, rows: int, prompt_width: int, key, *, lay_out: Callable = lambda tree: tree,
                 batched: Callable = jax.ShapeDtypeStruct) -> list[tuple[str, Callable, tuple]]:
        """`(name, jitted program, arguments)` of the three programs an episode batch runs
        (agents/episodes.py), with the arguments it gives them, for `rows` episodes whose prompts are
        `prompt_width` ids wide: "prefill" (ids, mask [rows, prompt_width] int32), "decode" one turn (active
        bool [rows], budget int32 [rows]), "append" one chunk of observation ids (int32 [rows, append_width],
        their counts int32 [rows]). `state` (the sampler's weights) and `key` as given; the engine's state is
        `jax.eval_shape` of prefill through `lay_out` (the plan: the run's layout); the per-row host arrays
        are `batched(shape, dtype)`."""
        ids = batched((rows, prompt_width), jnp.int32)
        es = lay_out(jax.eval_shape(self.prefill, state, ids, ids))
        per_row = batched((rows,), jnp.int32)
        return [("prefill", self.prefill, (state, ids, ids)),
                ("decode", self.decode, (state, es, batched((rows,), jnp.bool_), per_row, key)),
                ("append", self.append, (state, es, batched((rows, self.config.append_width), jnp.int32), per_row))]

    def _prefill(self, state, prompt_ids, prompt_mask) -> EngineState:
        """Left-padded prompts into a fresh cache of `C + A` slots; every row's `end` is the prompt width."""
        model = nnx.merge(self.graphdef, state)
        b, s = prompt_ids.shape
        if s > self.config.cache_slots:
            raise ValueError(f"prompt width {s} exceeds cache_slots={self.config.cache_slots}")
        ids, mask = shard_batch(prompt_ids.astype(jnp.int32)), shard_batch(prompt_mask.astype(jnp.int32))
        cache = KVCache.init(model.config, b, self.config.cache_slots + self.config.append_width)
        hidden, cache = model(ids, positions_from_mask(mask), mask, cache=shard_kv(cache))
        logits = shard_batch(model.logits(hidden[:, -1]))  # left padding: every last column is real
        cache = cache._replace(end=shard_batch(jnp.full((b,), s, jnp.int32)))
        return EngineState(shard_kv(cache), logits, mask.sum(axis=-1).astype(jnp.int32))

    def _append(self, state, es: EngineState, ids, n_new) -> EngineState:
        """Row b's first `n_new[b]` ids of `ids [B, A]` written after its history; rows with 0 keep their
        logits and their `end`. The caller keeps `end[b] + n_new[b] <= C` (`run_episodes` does)."""
        model = nnx.merge(self.graphdef, state)
        width = ids.shape[1]
        real = (jnp.arange(width)[None, :] < n_new[:, None]).astype(jnp.int32)  # [B, A]
        positions = (es.pos[:, None] + jnp.arange(width)[None, :]) * real
        hidden, cache = rows_forward(model, shard_batch(ids.astype(jnp.int32)), positions, real, es.cache)
        last = jnp.take_along_axis(hidden, jnp.maximum(n_new - 1, 0)[:, None, None], axis=1)[:, 0]  # [B, d]
        logits = jnp.where((n_new > 0)[:, None], model.logits(last), es.logits)
        return EngineState(cache, shard_batch(logits), es.pos + n_new.astype(jnp.int32))

    def _decode(self, state, es: EngineState, active, budget, key) -> tuple[EngineState, TurnOutput]:
        """Draws tokens for the `active` rows until each ends its turn (see the module docstring)."""
        model = nnx.merge(self.graphdef, state)
        cfg = self.config.sampling
        b, d_max, slots = es.logits.shape[0], cfg.max_new_tokens, self.config.cache_slots
        table = _stop_table(self.config.stop_sequences)
        window = jnp.full((b, 1 if table is None else table.shape[1]), -2, jnp.int32)
        zeros = lambda dtype: shard_batch(jnp.zeros((b, d_max), dtype))
        out = TurnOutput(shard_batch(jnp.full((b, d_max), cfg.pad_token_id, jnp.int32)), zeros(jnp.float32),
                         zeros(jnp.float32), zeros(jnp.float32), jnp.zeros((b,), jnp.int32),
                         jnp.zeros((b,), jnp.int32), jnp.zeros((), jnp.int32))
        active = active.astype(bool)

        def cond(carry):
            es, active, out, _ = carry
            return (out.steps < d_max) & jnp.any(active & (es.cache.end < slots))

        def body(carry):
            es, active, out, window = carry
            i = out.steps
            # a row whose own C slots are full draws nothing more: it stays `active` and ends as "context"
            full = active & (es.cache.end >= slots)
            active = active & ~full
            u = None if cfg.is_greedy else jax.random.uniform(jax.random.fold_in(key, i), (b,), jnp.float32)
            tok, lp, lq = draw_tokens(u, es.logits, config=cfg)
            ent = tempered_entropy(es.logits, cfg.logprob_temperature)
            tok = jnp.where(active, tok, cfg.pad_token_id).astype(jnp.int32)
            col = lambda buf, v: jax.lax.dynamic_update_slice(
                buf, jnp.where(active, v, 0 if buf.dtype != jnp.int32 else cfg.pad_token_id)[:, None].astype(buf.dtype),
                (0, i))
            count = out.count + active
            window = jnp.where(active[:, None], jnp.concatenate([window[:, 1:], tok[:, None]], axis=1), window)
            stop = jnp.zeros((b,), bool) if table is None else ends_with_stop(window, table)
            spent = count >= jnp.minimum(budget, d_max)
            why = jnp.where(is_eos(tok, cfg.eos_token_ids), 1, jnp.where(stop, 2, jnp.where(spent, 3, 0)))
            reason = jnp.where(active & (why > 0), why, out.reason)
            # the drawn token enters the cache in the same step, so an append after it follows it
            fed = active.astype(jnp.int32)[:, None]
            hidden, cache = rows_forward(model, tok[:, None], (es.pos * active)[:, None], fed, es.cache)
            logits = jnp.where(active[:, None], model.logits(hidden[:, 0]), es.logits)
            es = EngineState(cache, shard_batch(logits), es.pos + active)
            out = TurnOutput(col(out.tokens, tok), col(out.logp, lp), col(out.logq, lq), col(out.entropy, ent),
                             count, reason, i + 1)
            return es, (active & (why == 0)) | full, out, window

        es, active, out, _ = jax.lax.while_loop(cond, body, (es, active, out, window))
        # still drawing when the loop ended: the row's cache was full (the budget ends a turn inside the loop)
        return es, out._replace(reason=jnp.where(active, 4, out.reason))
