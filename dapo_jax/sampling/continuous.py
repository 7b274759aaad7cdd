"""Continuous batching: a group that finishes leaves the decode batch and a new prompt takes its slot.

    sampler = ContinuousSampler(graphdef, config, num_samples=G, slots=P, refill=k, prompt_width=S)
    for done in sampler.stream(state, next_prompts, key, max_prompts=N):   # a generator
        ...            # done.rollout: the next k finished groups, in admission order ([k, G, T] NumPy)
        if enough:     # e.g. dynamic sampling has kept its batch: the groups still decoding are dropped
            break

A rollout of `generate` (`sampler.py`) decodes `P` prompts together until its longest response
ends: on long chain-of-thought lengths most rows sit finished for most of the steps, and dynamic
sampling pays that tail once per round. Here the decode batch is `P` prompt slots of `G` rows each,
and every slot is at its own step `t[p]` (the `G` rows of a prompt start together, so they share
it; `decode.decode_step` takes one cache slot per prompt). A `while_loop` (`advance`) decodes until
a requested number of groups has completed (every row has emitted an EOS or `T` tokens exist); the
host copies those groups out, hands them to the caller in admission order (`stream`) and `admit`s
the next prompts into the free slots, `refill` at a time: one prefill of `refill` prompts, written into the slots' prompt cache, and their token 0.
Both are jitted once (fixed shapes; a partial refill pads with dropped rows), so nothing recompiles
after the first call.

The samples are the ones `generate` draws: the prompt admitted `s`-th in a stream (its serial) reads
the uniforms `uniform(fold_in(key, s), (G, T))`, which is what `generate` draws for that prompt alone
with the key `fold_in(key, s)`; so its tokens are identical and its log-probs equal up to float
rounding (`tests/sampling/test_continuous.py`). The log-probs are the trainer's, as in `generate`.

What it costs: each step attends over all `T - 1` response slots (the slots are at different
steps, so `generate`'s blocks, which skip the empty slots, do not apply), and a slot between
groups computes padding until the host refills it. `scripts/bench_long_tail.py` measures it.
One process only: the host decides the refills (a multi-process run would have to agree on them).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dapo_jax.models.decoder import Decoder, KVCache, positions_from_mask
from dapo_jax.sampling.config import SamplingConfig, SamplingConfigError
from dapo_jax.sampling.decode import (
    PromptCache, ResponseCache, decode_step, fuse_layers, prompt_cache_from_prefill,
)
from dapo_jax.sampling.processors import draw_tokens
from dapo_jax.sampling.sampler import Rollout, is_eos, shard_batch, tempered_entropy


class _Slots(NamedTuple):
    """The decode state of `P` prompt slots (`B = P*G` rows, row `b = p*G + g`)."""

    prompt: PromptCache  # [P, ...]: each slot's prefilled prompt
    cache: ResponseCache  # [P, H_kv, G, ...] with T - 1 response slots
    n_prompt: jax.Array  # [P] int32: real prompt tokens
    t: jax.Array  # [P] int32: the next token index each slot draws
    live: jax.Array  # [P] bool: the slot holds a group still decoding
    logits: jax.Array  # [B, V] float32, for token t
    done: jax.Array  # [B] bool: the row has emitted its EOS
    tokens: jax.Array  # [B, T] int32
    mask: jax.Array  # [B, T] int32
    logp: jax.Array  # [B, T] float32
    logq: jax.Array  # [B, T] float32
    entropy: jax.Array  # [B, T] float32
    uniforms: jax.Array | None  # [B, T] float32 (None when greedy)


class Finished(NamedTuple):
    """Completed groups with consecutive serials (admission order)."""

    rollout: Rollout  # NumPy, [n, ...] / [n, G, T]
    payloads: list  # what `next_prompts` returned with each prompt
    serials: np.ndarray  # [n] int: each prompt's admission order in the stream (its uniforms' fold_in)


def _empty(model: Decoder, config: SamplingConfig, slots: int, g: int, width: int) -> _Slots:
    cfg = model.config
    b, t_max = slots * g, config.max_new_tokens
    dtype = jnp.dtype(cfg.dtype)
    h_kv, d, n = cfg.num_key_value_heads, cfg.head_dim, t_max - 1
    layers = range(cfg.num_hidden_layers)
    zeros = lambda shape, dt=jnp.float32: jnp.zeros(shape, dt)  # noqa: E731
    return _Slots(
        prompt=PromptCache(k=tuple(zeros((slots, h_kv, d, width), dtype) for _ in layers),
                           v=tuple(zeros((slots, h_kv, width, d), dtype) for _ in layers),
                           mask=zeros((slots, width), bool)),
        cache=ResponseCache(k=tuple(zeros((slots, h_kv, g, d, n), dtype) for _ in layers),
                            v=tuple(zeros((slots, h_kv, g, n, d), dtype) for _ in layers)),
        n_prompt=zeros((slots,), jnp.int32), t=zeros((slots,), jnp.int32), live=zeros((slots,), bool),
        logits=zeros((b, cfg.vocab_size)), done=zeros((b,), bool),
        tokens=jnp.full((b, t_max), config.pad_token_id, jnp.int32), mask=zeros((b, t_max), jnp.int32),
        logp=zeros((b, t_max)), logq=zeros((b, t_max)), entropy=zeros((b, t_max)),
        uniforms=None if config.is_greedy else zeros((b, t_max)),
    )


def _draw(st: _Slots, config: SamplingConfig, g: int, rows_on: jax.Array) -> _Slots:
    """Draws token `t[p]` from `st.logits` for the rows `rows_on` (pad / mask 0 on finished rows)."""
    t_max = config.max_new_tokens
    t_row = jnp.repeat(st.t, g)
    u = None
    if st.uniforms is not None:
        u = jnp.take_along_axis(st.uniforms, jnp.minimum(t_row, t_max - 1)[:, None], axis=1)[:, 0]
    tok, lp, lq = draw_tokens(u, st.logits, config=config)
    ent = tempered_entropy(st.logits, config.logprob_temperature)
    live = rows_on & ~st.done
    tok = jnp.where(live, tok, config.pad_token_id)
    lp, lq, ent = (jnp.where(live, x, 0.0) for x in (lp, lq, ent))
    rows, col = jnp.arange(t_row.shape[0]), jnp.where(rows_on, t_row, t_max)  # column T: dropped
    put = lambda buf, v: buf.at[rows, col].set(v.astype(buf.dtype), mode="drop")  # noqa: E731
    return st._replace(
        done=st.done | (live & is_eos(tok, config.eos_token_ids)),
        tokens=put(st.tokens, tok), mask=put(st.mask, live), logp=put(st.logp, lp), logq=put(st.logq, lq),
        entropy=put(st.entropy, ent),
    )


def _advance_slots(st: _Slots, stepped: jax.Array, g: int, t_max: int) -> _Slots:
    """`t += 1` on the slots that drew a token; a slot whose rows are all done (or at `T`) completes."""
    t = jnp.where(stepped, st.t + 1, st.t)
    complete = jnp.all(st.done.reshape(-1, g), axis=1) | (t >= t_max)
    return st._replace(t=t, live=st.live & ~complete)


def _admit(model: Decoder, st: _Slots, idx, ids, mask, key, serials, *, config: SamplingConfig, g: int) -> _Slots:
    """Prefills `k` prompts into the slots `idx` (`P` = none: dropped) and draws their token 0."""
    k, width = ids.shape
    slots, t_max = st.t.shape[0], config.max_new_tokens
    hidden, cache = model(ids, positions_from_mask(mask), mask, cache=KVCache.init(model.config, k, width))
    last = model.logits(hidden[:, -1])  # left padding: every prompt ends in the last column
    slot_put = lambda full, new: full.at[idx].set(new.astype(full.dtype), mode="drop")  # noqa: E731
    rows = (idx[:, None] * g + jnp.arange(g)).reshape(-1)  # >= B for a dropped slot
    row_put = lambda full, new: full.at[rows].set(new.astype(full.dtype), mode="drop")  # noqa: E731
    fresh = lambda x: jnp.zeros((k * g, *x.shape[1:]), x.dtype)  # noqa: E731
    uniforms = st.uniforms
    if uniforms is not None:
        draw = lambda s: jax.random.uniform(jax.random.fold_in(key, s), (g, t_max), jnp.float32)  # noqa: E731
        uniforms = row_put(uniforms, jax.vmap(draw)(serials).reshape(k * g, t_max))
    st = st._replace(
        prompt=jax.tree.map(slot_put, st.prompt, prompt_cache_from_prefill(cache)),
        n_prompt=slot_put(st.n_prompt, mask.sum(axis=-1)), t=slot_put(st.t, jnp.zeros(k, jnp.int32)),
        live=slot_put(st.live, jnp.ones(k, bool)),
        logits=row_put(st.logits, jnp.repeat(last.astype(jnp.float32), g, axis=0)),
        done=row_put(st.done, fresh(st.done)), tokens=row_put(st.tokens, fresh(st.tokens) + config.pad_token_id),
        mask=row_put(st.mask, fresh(st.mask)), logp=row_put(st.logp, fresh(st.logp)),
        logq=row_put(st.logq, fresh(st.logq)), entropy=row_put(st.entropy, fresh(st.entropy)), uniforms=uniforms,
    )
    admitted = jnp.zeros((slots,), bool).at[idx].set(True, mode="drop")
    st = _draw(st, config, g, jnp.repeat(admitted, g))
    return jax.tree.map(shard_batch, _advance_slots(st, admitted, g, t_max))


def _decode(model: Decoder, st: _Slots, want, *, config: SamplingConfig, g: int) -> _Slots:
    """Decodes every live slot until `want` groups have completed (or none is live)."""
    t_max = config.max_new_tokens
    fused = fuse_layers(model)  # loop-invariant

    def cond(carry):
        st, completed = carry
        return jnp.any(st.live) & (completed < want)

    def body(carry):
        st, completed = carry
        running = st.live
        t_row = jnp.repeat(st.t, g)
        prev = jnp.take_along_axis(st.tokens, jnp.clip(t_row - 1, 0, t_max - 1)[:, None], axis=1)[:, 0]
        positions = jnp.repeat(st.n_prompt, g) + t_row - 1
        logits, cache = decode_step(model, fused, st.prompt, None, st.cache, prev, positions,
                                    jnp.clip(st.t - 1, 0, t_max - 2))
        st = _draw(st._replace(cache=cache, logits=logits), config, g, jnp.repeat(running, g))
        st = jax.tree.map(shard_batch, _advance_slots(st, running, g, t_max))
        return st, completed + jnp.sum(running & ~st.live)

    return jax.lax.while_loop(cond, body, (st, jnp.zeros((), jnp.int32)))[0]


class ContinuousSampler:
    """Streams completed groups of `num_samples` responses while refilling the decode batch.

    Args:
      graphdef: `nnx.split(model)[0]`; `state` (the parameters) is passed to `stream`.
      config: as for `generate` (`compaction` does not apply and must be off).
      num_samples: G, responses per prompt.
      slots: P, prompts decoding at once (the batch is `P*G` rows).
      refill: prompts admitted together (one prefill); a slot waits until `refill` are free, or
        until the prompts left to admit fit the free slots. Groups are also handed out `refill` at
        a time (`default_refill(slots)` is a quarter of the slots, dividing them).
      prompt_width: S, every prompt is left-padded to this many tokens.
    """

    def __init__(self, graphdef: nnx.GraphDef, config: SamplingConfig, *, num_samples: int, slots: int,
                 refill: int, prompt_width: int):
        if config.compaction:
            raise SamplingConfigError("compaction and continuous batching are alternatives: turn compaction off")
        if config.max_new_tokens < 2:
            raise SamplingConfigError(f"continuous batching needs max_new_tokens >= 2, got {config.max_new_tokens}")
        for name, value in (("num_samples", num_samples), ("slots", slots), ("prompt_width", prompt_width)):
            if not isinstance(value, int) or value < 1:
                raise SamplingConfigError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(refill, int) or not 1 <= refill <= slots:
            raise SamplingConfigError(f"refill must be an int in [1, slots={slots}], got {refill!r}")
        self.config, self.g, self.slots, self.refill, self.width = config, num_samples, slots, refill, prompt_width
        merged = lambda fn: lambda state, *a, **kw: fn(nnx.merge(graphdef, state), *a, **kw)  # noqa: E731
        self._empty = jax.jit(merged(lambda model: jax.tree.map(
            shard_batch, _empty(model, config, slots, num_samples, prompt_width))))
        self._admit = jax.jit(merged(lambda model, st, *a: _admit(model, st, *a, config=config, g=num_samples)),
                              donate_argnums=1)
        self._decode = jax.jit(merged(lambda model, st, want: _decode(model, st, want, config=config, g=num_samples)),
                               donate_argnums=1)

    def stream(self, state, next_prompts: Callable[[int], tuple[np.ndarray, np.ndarray, list]], key: jax.Array,
               *, max_prompts: int) -> Iterator[Finished]:
        """Yields the groups in the order their prompts were admitted, `refill` at a time, until
        `max_prompts` prompts have been admitted and decoded (the last chunk is smaller when `refill`
        does not divide `max_prompts`).

        A chunk is handed out as soon as its `refill` groups have all completed, while later slots go
        on decoding. The order is the admission order, not the order of completion, so a caller that
        stops early (dynamic sampling with its batch full) keeps no more short responses than it would
        have from `generate`: the groups it drops are the later prompts, whatever their lengths.
        Every chunk but the last has the same size, so what the caller computes on a chunk compiles
        once. `next_prompts(n)` returns `(ids [n, s], mask [n, s], payloads)`, left-padded, `s <=
        prompt_width`; it is called only for prompts about to be admitted. Closing the generator
        (a `break` in the caller's loop) drops the groups still decoding.
        """
        p, k = self.slots, self.refill
        st = self._empty(state)
        occupied = np.zeros(p, bool)
        held: list[Any] = [None] * p  # (prompt ids, mask, payload, serial) of each occupied slot
        ready: dict[int, tuple] = {}  # serial -> completed group (host copy), not yet handed out
        admitted = handed = 0  # prompts admitted; groups handed out (serials < handed)
        while True:
            free = np.flatnonzero(~occupied)
            while admitted < max_prompts and free.size and (free.size >= k or max_prompts - admitted <= free.size):
                n = min(k, free.size, max_prompts - admitted)
                ids, mask, payloads = next_prompts(n)
                ids, mask = self._pad(ids, mask, n)
                idx = np.full(k, p, np.int32)
                idx[:n] = free[:n]
                serials = np.arange(admitted, admitted + k, dtype=np.int32)
                st = self._admit(state, st, jnp.asarray(idx), jnp.asarray(ids), jnp.asarray(mask), key,
                                 jnp.asarray(serials))
                for j in range(n):
                    held[free[j]] = (ids[j], mask[j], payloads[j], admitted + j)
                occupied[free[:n]] = True
                admitted += n
                free = free[n:]
            complete = occupied & ~np.asarray(jax.device_get(st.live))
            if complete.any():  # copied out before the slots are refilled
                ready.update((group[3], group) for group in self._take(st, np.flatnonzero(complete), held))
                occupied &= ~complete
            while handed < max_prompts and all(s in ready for s in range(handed, min(handed + k, max_prompts))):
                chunk = range(handed, min(handed + k, max_prompts))
                yield self._finished([ready.pop(s) for s in chunk])
                handed = chunk.stop
            if handed == max_prompts:
                return
            if complete.any():
                continue
            # decode until the next chunk's groups could be complete, or until a refill fits
            want = sum(s not in ready for s in range(handed, min(handed + k, admitted)))
            if admitted < max_prompts:
                want = min(want, k - free.size)
            st = self._decode(state, st, jnp.asarray(max(want, 1), jnp.int32))

    def _pad(self, ids, mask, n: int) -> tuple[np.ndarray, np.ndarray]:
        """`[n, s]` left-padded prompts -> `[refill, S]`, padded with `pad_token_id` (extra rows: one real
        token, dropped)."""
        ids, mask = np.asarray(ids, np.int32), np.asarray(mask, np.int32)
        if ids.shape != mask.shape or ids.ndim != 2 or ids.shape[0] != n or ids.shape[1] > self.width:
            raise ValueError(f"next_prompts({n}) must return ids and mask [{n}, s <= {self.width}], "
                             f"got {ids.shape} and {mask.shape}")
        out_ids = np.full((self.refill, self.width), self.config.pad_token_id, np.int32)
        out_mask = np.zeros((self.refill, self.width), np.int32)
        out_ids[:n, self.width - ids.shape[1]:] = ids
        out_mask[:n, self.width - ids.shape[1]:] = mask
        out_mask[n:, -1] = 1
        return out_ids, out_mask

    def _take(self, st: _Slots, slots: np.ndarray, held: list) -> list[tuple]:
        """Host copies of the completed `slots`' groups: (prompt ids, mask, payload, serial, outputs)."""
        g = self.g
        rows = (slots[:, None] * g + np.arange(g)).reshape(-1)
        outs = [np.asarray(x)[rows].reshape(len(slots), g, -1)
                for x in jax.device_get((st.tokens, st.mask, st.logp, st.logq, st.entropy, st.done[:, None]))]
        return [(*held[s], [o[j] for o in outs]) for j, s in enumerate(slots)]

    @staticmethod
    def _finished(groups: list[tuple]) -> Finished:
        ids, mask, payloads, serials, outs = zip(*groups)
        tokens, resp_mask, logp, logq, ent, done = (np.stack(x) for x in zip(*outs))
        rollout = Rollout(
            prompt_ids=np.stack(ids), prompt_mask=np.stack(mask), response_ids=tokens, response_mask=resp_mask,
            logprobs=logp, sampled_logprobs=logq, entropy=ent, lengths=resp_mask.sum(axis=-1).astype(np.int32),
            truncated=~done[..., 0],
        )
        return Finished(rollout, list(payloads), np.asarray(serials))


def default_refill(slots: int) -> int:
    """The largest divisor of `slots` that is at most a quarter of it (1 for fewer than 4 slots)."""
    return max(d for d in range(1, max(1, slots // 4) + 1) if slots % d == 0)
