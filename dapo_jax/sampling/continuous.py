"""Continuous batching: a response that finishes leaves the decode batch and new prompts take its row.

    sampler = ContinuousSampler(graphdef, config, num_samples=G, slots=P, refill=k, prompt_width=S)
    for done in sampler.stream(state, next_prompts, key, max_prompts=N):   # a generator
        ...            # done.rollout: the next k finished groups, in admission order ([k, G, T] NumPy)
        if enough:     # e.g. dynamic sampling has kept its batch: the groups still decoding are dropped
            break

A rollout of `generate` (`sampler.py`) decodes `P` prompts together until its longest response
ends: on long chain-of-thought lengths most rows sit finished for most of the steps, and dynamic
sampling pays that tail once per round. Here the decode batch is `B = P*G` row slots, each at its
own step `t[b]` with its own copy of its prompt's cache (`G = 1` in `models.decode.decode_step`'s layout,
one cache slot per row). A `while_loop` (`_decode`) decodes until a requested number of rows has
completed (an EOS, or `T` tokens); the host copies those rows out and `admit`s the next prompts into
the free rows, `refill` prompts (`refill*G` rows) at a time: one prefill, its keys and values
written to each of the prompt's rows, and their token 0. A group is handed to the caller once its
G rows are complete, in admission order (`stream`). Both functions are jitted once (fixed shapes;
a partial refill pads with dropped rows), so nothing recompiles after the first call.

The samples are the ones `generate` draws: the prompt admitted `s`-th in a stream (its serial) reads
the uniforms `uniform(fold_in(key, s), (G, T))`, which is what `generate` draws for that prompt alone
with the key `fold_in(key, s)`; so its tokens are identical and its log-probs equal up to float
rounding (`tests/sampling/test_continuous.py`). The log-probs are the trainer's, as in `generate`.

What it costs: each step attends over all `T - 1` response slots (the rows are at different steps,
so `generate`'s blocks, which skip the empty slots, do not apply); the `G` rows of a prompt read `G`
copies of its keys and values instead of one; free rows compute padding until the host refills
them. `benchmarks/long_tail.py` measures it against `generate`. One process only: the host
decides the refills (a multi-process run would have to agree on them).
"""

from __future__ import annotations

from typing import Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dapo_jax.models.decode import (
    PromptCache, ResponseCache, decode_step, empty_response_cache, fused_layers, prompt_cache_from_prefill,
)
from dapo_jax.models.decoder import Decoder, KVCache, positions_from_mask
from dapo_jax.sampling.config import SamplingConfig, SamplingConfigError
from dapo_jax.sampling.processors import draw_tokens
from dapo_jax.sampling.sampler import Rollout, is_eos, shard_batch, tempered_entropy


class _Slots(NamedTuple):
    """The decode state of `B` row slots (one response each; a group's rows hold copies of its prompt)."""

    prompt: PromptCache  # [B, ...]: each row's prefilled prompt
    cache: ResponseCache  # [B, H_kv, 1, ...] with T - 1 response slots
    n_prompt: jax.Array  # [B] int32: real prompt tokens
    t: jax.Array  # [B] int32: the next token index each row draws
    live: jax.Array  # [B] bool: the row holds a response still decoding
    logits: jax.Array  # [B, V] float32, for token t
    done: jax.Array  # [B] bool: the row has emitted its EOS
    tokens: jax.Array  # [B, T] int32
    mask: jax.Array  # [B, T] int32
    logp: jax.Array  # [B, T] float32
    logq: jax.Array  # [B, T] float32
    entropy: jax.Array  # [B, T] float32
    uniforms: jax.Array | None  # [B, T] float32 (None when greedy)


_OUTPUTS = ("tokens", "mask", "logp", "logq", "entropy")


class Finished(NamedTuple):
    """Completed groups with consecutive serials (admission order)."""

    rollout: Rollout  # NumPy, [n, ...] / [n, G, T]
    payloads: list  # what `next_prompts` returned with each prompt
    serials: np.ndarray  # [n] int: each prompt's admission order in the stream (its uniforms' fold_in)


def _empty(model: Decoder, config: SamplingConfig, b: int, width: int) -> _Slots:
    """`b` free row slots: an empty prompt cache of `width` slots per row and `T - 1` response slots."""
    t_max = config.max_new_tokens
    prompt = prompt_cache_from_prefill(KVCache.init(model.config, b, width))
    zeros = lambda dt=jnp.float32: jnp.zeros((b, t_max), dt)  # noqa: E731
    return _Slots(
        prompt=prompt, cache=empty_response_cache(prompt, 1, t_max - 1),
        n_prompt=jnp.zeros((b,), jnp.int32), t=jnp.zeros((b,), jnp.int32), live=jnp.zeros((b,), bool),
        logits=jnp.zeros((b, model.config.vocab_size), jnp.float32), done=jnp.zeros((b,), bool),
        tokens=jnp.full((b, t_max), config.pad_token_id, jnp.int32), mask=zeros(jnp.int32),
        logp=zeros(), logq=zeros(), entropy=zeros(), uniforms=None if config.is_greedy else zeros(),
    )


def _draw(st: _Slots, config: SamplingConfig, rows_on: jax.Array) -> _Slots:
    """Draws token `t[b]` from `st.logits` for the rows `rows_on`, then steps them: `t += 1`, and a
    row whose token was its EOS (or the `T`-th) completes."""
    t_max = config.max_new_tokens
    u = None
    if st.uniforms is not None:
        u = jnp.take_along_axis(st.uniforms, jnp.minimum(st.t, t_max - 1)[:, None], axis=1)[:, 0]
    tok, lp, lq = draw_tokens(u, st.logits, config=config)
    ent = tempered_entropy(st.logits, config.logprob_temperature)
    live = rows_on & ~st.done  # a live row is never done; a finished one draws nothing
    tok = jnp.where(live, tok, config.pad_token_id)
    lp, lq, ent = (jnp.where(live, x, 0.0) for x in (lp, lq, ent))
    rows, col = jnp.arange(st.t.shape[0]), jnp.where(live, st.t, t_max)  # column T: dropped
    put = lambda buf, v: buf.at[rows, col].set(v.astype(buf.dtype), mode="drop")  # noqa: E731
    done = st.done | (live & is_eos(tok, config.eos_token_ids))
    t = jnp.where(live, st.t + 1, st.t)
    return st._replace(
        done=done, t=t, live=st.live & ~done & (t < t_max),
        tokens=put(st.tokens, tok), mask=put(st.mask, live), logp=put(st.logp, lp), logq=put(st.logq, lq),
        entropy=put(st.entropy, ent),
    )


def _admit(model: Decoder, st: _Slots, rows, ids, mask, key, serials, *, config: SamplingConfig, g: int) -> _Slots:
    """Prefills `k` prompts into the row slots `rows` (`[k*G]`, prompt i's G rows at `i*G ..`; `B` =
    none: dropped) and draws their token 0."""
    k, width = ids.shape
    b, t_max = st.t.shape[0], config.max_new_tokens
    hidden, cache = model(ids, positions_from_mask(mask), mask, cache=KVCache.init(model.config, k, width))
    last = model.logits(hidden[:, -1])  # left padding: every prompt ends in the last column
    per_row = lambda x: jnp.repeat(x, g, axis=0)  # noqa: E731  prompt i -> rows i*G .. i*G+G-1
    put = lambda full, new: full.at[rows].set(new.astype(full.dtype), mode="drop")  # noqa: E731
    fresh = lambda x: jnp.zeros((k * g, *x.shape[1:]), x.dtype)  # noqa: E731
    uniforms = st.uniforms
    if uniforms is not None:
        draw = lambda s: jax.random.uniform(jax.random.fold_in(key, s), (g, t_max), jnp.float32)  # noqa: E731
        uniforms = put(uniforms, jax.vmap(draw)(serials).reshape(k * g, t_max))
    st = st._replace(
        prompt=jax.tree.map(lambda full, new: put(full, per_row(new)), st.prompt, prompt_cache_from_prefill(cache)),
        n_prompt=put(st.n_prompt, per_row(mask.sum(axis=-1))), t=put(st.t, fresh(st.t)),
        live=put(st.live, fresh(st.live) | True), logits=put(st.logits, per_row(last.astype(jnp.float32))),
        done=put(st.done, fresh(st.done)), tokens=put(st.tokens, fresh(st.tokens) + config.pad_token_id),
        mask=put(st.mask, fresh(st.mask)), logp=put(st.logp, fresh(st.logp)), logq=put(st.logq, fresh(st.logq)),
        entropy=put(st.entropy, fresh(st.entropy)), uniforms=uniforms,
    )
    admitted = jnp.zeros((b,), bool).at[rows].set(True, mode="drop")
    return jax.tree.map(shard_batch, _draw(st, config, admitted))


def _decode(model: Decoder, st: _Slots, want, *, config: SamplingConfig) -> _Slots:
    """Decodes every live row until `want` rows have completed (or none is live)."""
    t_max = config.max_new_tokens
    fused = fused_layers(model)  # loop-invariant

    def cond(carry):
        st, completed = carry
        return jnp.any(st.live) & (completed < want)

    def body(carry):
        st, completed = carry
        running = st.live
        prev = jnp.take_along_axis(st.tokens, jnp.clip(st.t - 1, 0, t_max - 1)[:, None], axis=1)[:, 0]
        # each row is its own "prompt" (G = 1 in the decode layout), at its own cache slot
        logits, cache = decode_step(model, fused, st.prompt, None, st.cache, prev, st.n_prompt + st.t - 1,
                                    jnp.clip(st.t - 1, 0, t_max - 2))
        st = _draw(st._replace(cache=cache, logits=logits), config, running)
        return jax.tree.map(shard_batch, st), completed + jnp.sum(running & ~st.live)

    return jax.lax.while_loop(cond, body, (st, jnp.zeros((), jnp.int32)))[0]


class ContinuousSampler:
    """Streams completed groups of `num_samples` responses while refilling the decode batch.

    Args:
      graphdef: `nnx.split(model)[0]`; `state` (the parameters) is passed to `stream`.
      config: as for `generate` (`compaction` does not apply and must be off).
      num_samples: G, responses per prompt.
      slots: P, the batch is `P*G` rows: as many rows as `generate` on `P` prompts.
      refill: prompts admitted together (one prefill of `refill` prompts into `refill*G` free rows);
        the free rows wait until there are that many, or until the prompts left fit them. Groups
        are also handed out `refill` at a time (`default_refill(slots)` is a quarter of the
        slots, dividing them).
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
        self.decode_calls = 0  # `_decode` calls so far (each a host round trip), for the benchmark
        self.dropped_tokens = 0  # tokens drawn for groups the last stream's caller never received
        merged = lambda fn: lambda state, *a, **kw: fn(nnx.merge(graphdef, state), *a, **kw)  # noqa: E731
        self._empty = jax.jit(merged(lambda model: jax.tree.map(
            shard_batch, _empty(model, config, slots * num_samples, prompt_width))))
        self._admit = jax.jit(merged(lambda model, st, *a: _admit(model, st, *a, config=config, g=num_samples)),
                              donate_argnums=1)
        self._decode = jax.jit(merged(lambda model, st, want: _decode(model, st, want, config=config)),
                               donate_argnums=1)

    def programs(self, state, key, *, lay_out: Callable = lambda tree: tree,
                 host: Callable = jax.ShapeDtypeStruct) -> list[tuple[str, Callable, tuple]]:
        """`(name, jitted program, arguments)` of the two programs `stream` runs, with the arguments it gives
        them, for `state` (the sampler's weights) and `key` as given (arrays or `jax.ShapeDtypeStruct`s):
        "admit" puts `refill` prompts (ids, mask [refill, prompt_width]) into free row slots, "decode" decodes
        until a number of rows has finished. The row slots are `ShapeDtypeStruct`s through `lay_out` (the
        plan: the run's layout); the host's int32 arguments are `host(shape, dtype)`."""
        k, g, w = self.refill, self.g, self.width
        slots = lay_out(jax.eval_shape(self._empty, state))
        ids = host((k, w), jnp.int32)
        return [("admit", self._admit, (state, slots, host((k * g,), jnp.int32), ids, ids, key, host((k,), jnp.int32))),
                ("decode", self._decode, (state, slots, host((), jnp.int32)))]

    def stream(self, state, next_prompts: Callable[[int], tuple[np.ndarray, np.ndarray, list]], key: jax.Array,
               *, max_prompts: int, in_flight: Callable[[], int] | None = None) -> Iterator[Finished]:
        """Yields the groups in the order their prompts were admitted, `refill` at a time, until
        `max_prompts` prompts have been admitted and decoded (the last chunk is smaller when `refill`
        does not divide `max_prompts`).

        A row that completes is copied out and its slot is free for the next prompts at once; a
        chunk is handed out as soon as its `refill` groups are complete, while the other rows go on
        decoding. The order is the admission order, not the order of completion, so a caller that
        stops early (dynamic sampling with its batch full) keeps no more short responses than it
        would have from `generate`: the groups it drops are the later prompts, whatever their lengths.
        Every chunk but the last has the same size, so what the caller computes on a chunk compiles
        once. `next_prompts(n)` returns `(ids [n, s], mask [n, s], payloads)`, left-padded, `s <=
        prompt_width`; it is called only for prompts about to be admitted. Closing the generator
        (a `break` in the caller's loop) drops the groups still decoding; `dropped_tokens` then
        counts the tokens drawn for the groups not handed out. `in_flight()`, asked before each
        admission, caps the prompts admitted and not yet handed out (the caller's estimate of how
        many more groups it needs; None = no cap); the prompts of the next chunk to hand out are
        admitted whatever it says, so the stream never stalls.
        """
        g, k, b = self.g, self.refill, self.slots * self.g
        st = self._empty(state)
        holder = np.full(b, -1)  # the serial whose response each row slot holds (-1: free)
        sample = np.zeros(b, int)  # and which of its G samples
        groups: dict[int, dict] = {}  # serial -> prompt, payload, and its rows' outputs as they complete
        admitted = handed = 0  # prompts admitted; groups handed out (serials < handed)
        self.dropped_tokens = 0

        def room(admitted: int, handed: int) -> int:  # prompts to admit at the next refill
            cap = max_prompts - admitted
            if in_flight is not None:  # but always the prompts the next chunk is waiting for: no stall
                cap = min(cap, max(in_flight() - (admitted - handed), min(handed + k, max_prompts) - admitted))
            return max(0, min(k, cap))

        try:
            while True:
                free = np.flatnonzero(holder < 0)
                while 0 < (n := room(admitted, handed)) and free.size >= n * g:
                    ids, mask, payloads = next_prompts(n)
                    ids, mask = self._pad(ids, mask, n)
                    rows = np.full(k * g, b, np.int32)
                    rows[:n * g] = free[:n * g]
                    serials = np.arange(admitted, admitted + k, dtype=np.int32)
                    st = self._admit(state, st, jnp.asarray(rows), jnp.asarray(ids), jnp.asarray(mask), key,
                                     jnp.asarray(serials))
                    for j in range(n):
                        groups[admitted + j] = dict(ids=ids[j], mask=mask[j], payload=payloads[j], left=g,
                                                    out={name: [None] * g for name in (*_OUTPUTS, "done")})
                        holder[free[j * g:(j + 1) * g]] = admitted + j
                        sample[free[j * g:(j + 1) * g]] = np.arange(g)
                    admitted += n
                    free = free[n * g:]
                complete = (holder >= 0) & ~np.asarray(jax.device_get(st.live))
                if complete.any():  # copied out before the rows are refilled
                    self._take(st, np.flatnonzero(complete), holder, sample, groups)
                    holder[complete] = -1
                while handed < max_prompts and all(
                        s in groups and not groups[s]["left"] for s in range(handed, min(handed + k, max_prompts))):
                    chunk = range(handed, min(handed + k, max_prompts))
                    yield self._finished(chunk, [groups.pop(s) for s in chunk])
                    handed = chunk.stop
                if handed == max_prompts:
                    return
                if complete.any():
                    continue
                # decode until a refill fits (a chunk that is ready by then is handed out then), or, with
                # every prompt admitted, until the next chunk's rows could be complete
                if n := room(admitted, handed):
                    want = n * g - free.size
                else:
                    want = sum(groups[s]["left"] for s in range(handed, min(handed + k, admitted)))
                if not (holder >= 0).any():  # a bug, not an input: fail rather than spin
                    raise RuntimeError(f"continuous batching stalled: nothing decoding, {admitted} admitted, "
                                       f"{handed} handed out of {max_prompts}")
                self.decode_calls += 1
                st = self._decode(state, st, jnp.asarray(max(want, 1), jnp.int32))
        except GeneratorExit:  # the caller stopped early: count the drawn tokens it never receives
            decoding = np.asarray(jax.device_get(st.mask))[holder >= 0].sum()
            waiting = sum(int(np.sum(m)) for grp in groups.values() for m in grp["out"]["mask"] if m is not None)
            self.dropped_tokens = int(decoding) + waiting
            raise

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

    @staticmethod
    def _take(st: _Slots, rows: np.ndarray, holder: np.ndarray, sample: np.ndarray, groups: dict) -> None:
        """Copies the completed `rows` into their groups (`holder[row]`'s sample `sample[row]`)."""
        host = dict(zip((*_OUTPUTS, "done"), jax.device_get(tuple(getattr(st, n) for n in (*_OUTPUTS, "done")))))
        for row in rows:
            group = groups[holder[row]]
            for name, values in host.items():
                group["out"][name][sample[row]] = np.asarray(values[row])
            group["left"] -= 1

    def _finished(self, serials: range, groups: list[dict]) -> Finished:
        stack = lambda name: np.stack([np.stack(grp["out"][name]) for grp in groups])  # noqa: E731
        resp_mask = stack("mask")
        rollout = Rollout(
            prompt_ids=np.stack([grp["ids"] for grp in groups]), prompt_mask=np.stack([grp["mask"] for grp in groups]),
            response_ids=stack("tokens"), response_mask=resp_mask, logprobs=stack("logp"),
            sampled_logprobs=stack("logq"), entropy=stack("entropy"),
            lengths=resp_mask.sum(axis=-1).astype(np.int32), truncated=~stack("done"),
        )
        return Finished(rollout, [grp["payload"] for grp in groups], np.asarray(serials))


def default_refill(slots: int) -> int:
    """The largest divisor of `slots` that is at most a quarter of it (1 for fewer than 4 slots)."""
    return max(d for d in range(1, max(1, slots // 4) + 1) if slots % d == 0)
