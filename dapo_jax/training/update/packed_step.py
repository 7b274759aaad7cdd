"""The policy update on packed sequences: its work follows the real token count, not P·G·(S+T).

    step = make_packed_train_step(graphdef, tx, schedule, objective=..., num_minibatches=..., ...)
    state, metrics = step(state, batch)        # same Batch, same TrainState, same metrics as train_step

Each mini-batch (the same prompts as `train_step`'s) is packed on the host (`data/packing.py`) into
chunks of a fixed `[R, L]` shape (and a shorter one, `[R/2, L]` by default, for what the
last chunk would hold, when it takes fewer rows: `data/packing.pack_with_tail`): whole groups, each
(prompt, response) sequence's real tokens end to end in a row, the responses of a group in one row
after one copy of its prompt (`share_prompts`), attention kept within a sequence by the decoder's
`segment_ids` and `branch_ids`. A jitted function
adds one chunk's `∇loss_sum`, `loss_sum`, `den` and metrics to an accumulator; the number of chunks
varies from step to step, so the chunks run from a host loop (one compilation whatever the count),
then one jitted `apply_accumulated` makes the mini-batch's optimizer update.

Exactness: the chunk's per-token log-probs / entropies are gathered back into the mini-batch's
`[P, G, T]` layout (0 elsewhere, as `response_logprobs` gives on padding) and the objective
(`objective_terms`, unchanged) runs on that layout with the response mask restricted to the chunk's
groups. Every aggregation's `(loss_sum, den)` is a sum over responses (token_mean: tokens;
seq_mean_*: non-empty responses; Dr. GRPO: non-empty responses · T_max) and every group statistic
is either computed before the update (advantages) or inside one group, which a chunk holds whole,
so Σ_chunks equals the unpacked mini-batch's sums; the batch-level entropy statistics (high-entropy
quantile, EDGE-GRPO's normaliser, Clip-Cov / KL-Cov's covariance statistics) come from the same unpacked
no-gradient pass as `train_step`'s, and so do the entropies and log-probs every chunk's objective compares
with them (`train_step.with_pass_values`).
Sequences whose response mask is all zero carry no loss and are not computed at all.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from dapo_jax.data.packing import pack_with_tail, tail_heights
from dapo_jax.models.logprobs import token_logprobs
from dapo_jax.objectives.diagnostics import combine_metrics
from dapo_jax.objectives.loss import objective_terms
from dapo_jax.parallel.host import to_host
from dapo_jax.parallel.mesh import committed, jit_keeping_layout
from dapo_jax.training.update.compile_ahead import compiled_outputs
from dapo_jax.training.update.train_step import (Batch, TrainState, _joined, apply_accumulated, batch_level_statistics,
                                                 batch_statistics_of, policy_logprobs, step_metrics, with_pass_values)


def packed_logprobs(model, tokens, segment_ids, positions, targets, *, temperature, branch_ids=None):
    """log π(target) and entropy `[R, L]` at every packed position (one model call on the chunk)."""
    hidden, _ = model(tokens, positions, (segment_ids > 0).astype(jnp.int32), segment_ids=segment_ids,
                      branch_ids=branch_ids)
    w = model.output_embedding().astype(model.config.dtype)  # same casts as response_logprobs
    return token_logprobs(hidden.astype(w.dtype), w, targets, temperature=temperature)


def minibatch_prompts(num_prompts: int, num_minibatches: int, micro_batches: int) -> list[np.ndarray]:
    """The prompt indices of each mini-batch, as `train_step._split` takes them."""
    n, m = num_minibatches, micro_batches
    rows = np.arange(num_prompts).reshape(-1, n, m)  # prompt q*n*m + i*m + j -> [q, i, j]
    return [np.sort(rows[:, i, :].ravel()) for i in range(n)]


def make_packed_train_step(
    graphdef, tx, schedule, *, objective, num_minibatches: int = 1, micro_batches: int = 1,
    temperature: float = 1.0, use_ref: bool = False, loss_terms: Callable | None = None,
    chunk_rows: int | None = None, row_length: int | None = None, put: Callable | None = None,
    row_multiple: int = 1, tail_rows: int | None = None, share_prompts: bool = True,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """`step(state, batch) -> (state, metrics)` equal to `make_train_step`'s (to float tolerance).

    chunk_rows: rows R of a packed chunk (default `default_chunk_rows`: half a micro-batch's responses,
      so a mini-batch of short responses takes one or two half-size chunks, not one full one);
    row_length: L (default S + T, so any sequence fits).
    put: host array -> device array for the chunks (default `jnp.asarray`; the trainer lays them out
      over the mesh's batch devices, so R must be a multiple of their count, `row_multiple`).
    tail_rows: the leftovers' shorter chunks are multiples of it below R (default `default_tail_rows`: R/2;
      0 = none). Every chunk shape compiles at the first step, whether or not it is used then.
    share_prompts: a group's responses in one row share one copy of the prompt (`data/packing.py`).
    """
    if loss_terms is None:
        loss_terms = objective_terms
    put = put or jnp.asarray
    quantile = getattr(objective, "high_entropy_quantile", None)
    eda = bool(getattr(objective, "entropy_driven_advantage", False))
    stats_fn, policy_pass = batch_statistics_of(objective, loss_terms)

    def chunk_loss(params, mini: Batch, chunk, stats, frozen=None):
        stats, pass_values = stats  # the statistics and the per-token values `[P, G, T]` of the no-gradient pass
        pass_values = pass_values or {}
        tokens, segs, pos, targets, branches, index, valid, groups = chunk
        model = nnx.merge(graphdef, frozen, params) if frozen is not None else nnx.merge(graphdef, params)
        logp, entropy = packed_logprobs(model, tokens, segs, pos, targets, temperature=temperature,
                                        branch_ids=branches if share_prompts else None)  # splash takes none
        logp = jnp.where(valid, logp.reshape(-1)[index], 0.0)
        entropy = with_pass_values(jnp.where(valid, entropy.reshape(-1)[index], 0.0), pass_values.get("entropy"))
        logp = with_pass_values(logp, pass_values.get("logp"))  # Clip-Cov / KL-Cov: the pass's values
        mask = mini.response_mask * groups[:, None, None].astype(mini.response_mask.dtype)
        extra_terms = dict(stats)
        if "priority" in pass_values:
            extra_terms["priority"] = pass_values["priority"]
        if mini.behaviour_logp is not None:
            extra_terms["behaviour_logp"] = mini.behaviour_logp
        if mini.nll_weight is not None:
            extra_terms["nll_weight"] = mini.nll_weight * groups[:, None, None]
        loss_sum, den, metrics = loss_terms(
            objective, logp=logp, old_logp=mini.old_logp, advantages=mini.advantages, mask=mask,
            ref_logp=mini.ref_logp if use_ref else None, entropy=entropy, **extra_terms,
        )
        m = mask.astype(jnp.float32)
        extra = {"entropy_sum": jnp.sum(jax.lax.stop_gradient(entropy) * m), "tokens": jnp.sum(m)}
        return loss_sum, (den, metrics, extra)

    grad_fn = jax.value_and_grad(chunk_loss, has_aux=True)

    def add_chunk(acc, params, mini, chunk, stats, frozen):
        (loss_sum, (den, metrics, extra)), grads = grad_fn(params, mini, chunk, stats, frozen)
        gsum, lsum, dsum, esum, msum = acc
        add = lambda a, b: jax.tree.map(jnp.add, a, b)  # noqa: E731
        return (add(gsum, grads), lsum + loss_sum, dsum + den, add(esum, extra), combine_metrics([msum, metrics])), None

    # the accumulator is fed back chunk after chunk (and donated: added to in place); it keeps the layout
    # zero_acc gave it, so no chunk compiles again on a mesh
    accumulate = jit_keeping_layout(add_chunk, donate_argnums=0)

    @jax.jit
    def start(params, mini: Batch, frozen, step=None):
        """The mini-batch's batch-level statistics (`batch_level_statistics`, as the unpacked update) and the
        per-token values `[P, G, T]` they were taken from (entropy, logp, priority; None when not needed)."""
        def logprobs():
            p = mini.response_ids.shape[0]
            split = jax.tree.map(lambda x: x.reshape(micro_batches, p // micro_batches, *x.shape[1:]), mini)
            return jax.tree.map(lambda x: x.reshape(mini.response_mask.shape), jax.lax.stop_gradient(
                jax.lax.map(lambda mb: policy_logprobs(
                    graphdef, _joined(frozen, params), mb.prompt_ids, mb.prompt_mask, mb.response_ids,
                    mb.response_mask, temperature=temperature), split)))

        return batch_level_statistics(mini, logprobs, objective=objective, stats_fn=stats_fn, quantile=quantile,
                                      eda=eda, policy_pass=policy_pass, step=step)

    zeros = []

    def zero_acc(params, mini, chunk, stats, frozen):
        """A zero accumulator: the gradient sum laid out as the parameters, the sums and metrics replicated
        on their mesh (built by one jitted function, compiled once)."""
        if not zeros:  # the metrics' names, from a trace (nothing compiles)
            names = jax.eval_shape(lambda *a: chunk_loss(*a)[1][1], params, mini, chunk, stats, frozen)
            first = jax.tree.leaves(params)[0].sharding
            rep = (NamedSharding(first.mesh, PartitionSpec()) if isinstance(first, NamedSharding) else first)

            def build(params):
                zero = lambda: jnp.zeros((), jnp.float32)  # noqa: E731
                return (jax.tree.map(jnp.zeros_like, params), zero(), zero(), {"entropy_sum": zero(), "tokens": zero()},
                        {k: _identity(k) for k in names})

            layout = (jax.tree.map(lambda x: x.sharding, params), rep, rep, rep, rep)
            zeros.append(jax.jit(build, out_shardings=layout))
        if isinstance(jax.tree.leaves(params)[0], jax.ShapeDtypeStruct):  # `dapo-jax plan`: its shape and layout
            return jax.eval_shape(zeros[0], params)
        return zeros[0](params)

    select = jax.jit(lambda batch, idx: jax.tree.map(lambda x: jnp.take(x, idx, axis=0), batch))
    # the carry (parameters, moments) is donated: the update is written over it, in place
    apply = jit_keeping_layout(lambda carry, acc: apply_accumulated(tx, schedule, carry, *acc), donate_argnums=0)
    finish = jax.jit(lambda outs, skipped: step_metrics(jax.tree.map(lambda *x: jnp.stack(x), *outs), skipped))

    def step(state: TrainState, batch: Batch, frozen=None):
        """`frozen`: weights merged with `state.params` but not trained (LoRA's base), as train_step's."""
        nonlocal first_call

        if batch.context_mask is not None:  # it packs the trained tokens only: a tool answer would vanish
            raise ValueError("the packed update does not take agent episodes (a context_mask) yet: "
                             "set optim.packing=false")
        state = committed(state)  # the chunks compile for the layout `apply` hands back (parallel/mesh.py)
        host = to_host((batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask))
        p = host[2].shape[0]
        rows, tail, length = _chunk_shape(host[0].shape[1], host[2].shape, num_minibatches * micro_batches,
                                          chunk_rows, tail_rows, row_length, row_multiple)
        carry, outs = (state.params, state.opt_state, state.step, state.skipped), []
        for idx in minibatch_prompts(p, num_minibatches, micro_batches):
            mini = select(batch, put(idx.astype(np.int32)))
            chunks = pack_with_tail(*(x[idx] for x in host), rows=rows, tail_rows=tail, length=length,
                                    share_prompts=share_prompts)
            stats = start(carry[0], mini, frozen, carry[2])
            for r in ({rows, *tail_heights(rows, tail)} - {c.tokens.shape[0] for c in chunks}) if first_call else ():
                # every chunk shape compiles at the first step, used or not, with each mini-batch's parameter
                # layout (the first mini-batch's come from the caller, the next from `apply`)
                empty = tuple(put(x) for x in _empty_chunk(r, length, host[2][idx].shape))
                accumulate(zero_acc(carry[0], mini, empty, stats, frozen), carry[0], mini, empty, stats, frozen)
            acc = None
            for chunk in chunks:
                chunk = tuple(put(x) for x in chunk)
                acc = acc if acc is not None else zero_acc(carry[0], mini, chunk, stats, frozen)
                acc, _ = accumulate(acc, carry[0], mini, chunk, stats, frozen)
            if acc is None:  # nothing to train on in this mini-batch: no update, as unpacked
                acc = zero_acc(carry[0], mini, tuple(put(x) for x in _empty_chunk(rows, length, host[2][idx].shape)),
                               stats, frozen)
            carry, out = apply(carry, acc)
            outs.append(out)
        first_call = False
        params, opt_state, stp, skipped = carry
        return TrainState(params, opt_state, stp, skipped), finish(outs, skipped)

    def precompile(state: TrainState, batch: Batch, frozen=None) -> list:
        """What `step(state, batch, frozen)` compiles at its first call, for `batch` given by its shapes and
        layouts (`jax.ShapeDtypeStruct`s, training/update/compile_ahead.py): the small programs here, then the
        chunk heights and the update as `(name, compile)` jobs. `step` then finds every program compiled;
        its first call still runs the chunk heights its batch does not use, on empty chunks."""
        state = committed(state)
        p, g, t = batch.response_ids.shape
        rows, tail, length = _chunk_shape(batch.prompt_ids.shape[1], (p, g, t), num_minibatches * micro_batches,
                                          chunk_rows, tail_rows, row_length, row_multiple)
        idx = put(minibatch_prompts(p, num_minibatches, micro_batches)[0].astype(np.int32))
        mini = compiled_outputs(select, batch, idx)
        stats = compiled_outputs(start, state.params, mini, frozen, state.step)
        zero_acc(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state.params),
                 mini, tuple(put(x) for x in _empty_chunk(rows, length, mini.response_ids.shape)), stats, frozen)
        acc = compiled_outputs(zeros[0], state.params)  # zero_acc's program, as it lays the accumulator out
        carry = (state.params, state.opt_state, state.step, state.skipped)

        def chunk(r):
            empty = tuple(put(x) for x in _empty_chunk(r, length, mini.response_ids.shape))
            return lambda: accumulate.lower(acc, state.params, mini, empty, stats, frozen).compile()

        def update():
            out = compiled_outputs(apply, carry, acc)[1]
            finish.lower([out] * num_minibatches, state.skipped).compile()

        heights = sorted({rows, *tail_heights(rows, tail)}, reverse=True)
        return [(f"update: chunk {r}x{length}", chunk(r)) for r in heights] + [("update: apply", update)]

    first_call = True
    step.precompile = precompile
    step.packing_stats = lambda batch: packing_stats(batch, num_minibatches, micro_batches, chunk_rows, row_length,
                                                     row_multiple, tail_rows, share_prompts)
    # what `dapo-jax plan` compiles (training/plan/memory.py): the jitted programs a step runs, and its chunk shapes
    step.programs = {"select": select, "start": start, "zero_acc": zero_acc, "accumulate": accumulate, "apply": apply,
                     "finish": finish}
    step.chunk_shape = lambda prompt_len, response_shape: _chunk_shape(
        prompt_len, response_shape, num_minibatches * micro_batches, chunk_rows, tail_rows, row_length, row_multiple)
    return step


def default_chunk_rows(micro_batch_rows: int, group_size: int, multiple: int = 1) -> int:
    """Rows of a packed chunk when none is set: half a micro-batch's responses, at least G (a chunk holds
    whole groups: G sequences of at most L tokens fit in G rows), rounded up to a multiple of the batch
    devices and at most the micro-batch. A chunk as large as the micro-batch computes as many positions
    as the unpacked update however short the responses (one chunk); smaller chunks cut the padding
    left in the last one but fit whole groups less tightly: on the cot_dapo update a quarter computed
    15,360 positions against a half's 12,288 (docs/benchmarks.md, "Padding-free update")."""
    rows = max(group_size, -(-micro_batch_rows // 2))
    return min(micro_batch_rows, -(-rows // multiple) * multiple)


def default_tail_rows(rows: int, multiple: int = 1) -> int:
    """The tail chunks' height step: half of R, rounded up to a multiple of the batch devices (0 when that is
    R), so one tail of R/2 rows. On the main job (R = 32 rows of 192, responses of 18-139 tokens) half-height
    tails took the update from 0.72-0.74 s to 0.55 s; quarter steps (R/4, R/2, 3R/4) saved up to a tenth more
    per update but compile two more chunk programs, a third of the first step on a CPU (docs/benchmarks.md,
    "The first step from a cold cache"; the tail chunks' runs of 2026-11-24 are in that page's git history).
    `optim.packing_tail_rows` sets the step (R/4: quarter steps)."""
    half = -(-rows // 2)
    tail = -(-half // multiple) * multiple
    return tail if tail < rows else 0


def _chunk_shape(prompt_len: int, response_shape, parts: int, rows: int | None, tail_rows: int | None,
                 length: int | None, multiple: int) -> tuple[int, int, int]:
    """(R, tail step, L) of the packed chunks: the given ones, else `default_chunk_rows` of a micro-batch
    (`parts` = num_minibatches x micro_batches of them), `default_tail_rows` of R (tails are used only
    with fewer rows than R, else 0) and S + T."""
    p, g, t = response_shape
    rows = rows or default_chunk_rows(p // parts * g, g, multiple)
    tail = default_tail_rows(rows, multiple) if tail_rows is None else tail_rows
    return rows, tail if 0 < tail < rows else 0, length or prompt_len + t


def _identity(name: str):
    """The neutral (value, count) pair of a metric for `combine_metrics` (sum, _min, _max)."""
    v = np.inf if name.endswith("_min") else -np.inf if name.endswith("_max") else 0.0
    return jnp.full((), v, jnp.float32), jnp.zeros((), jnp.float32)


def _empty_chunk(rows: int, length: int, shape) -> tuple:
    z = np.zeros((rows, length), np.int32)
    return (z, z, z, z, z, np.zeros(shape, np.int32), np.zeros(shape, bool), np.zeros(shape[0], bool))


def packing_stats(batch, num_minibatches: int, micro_batches: int, chunk_rows=None, row_length=None,
                  row_multiple: int = 1, tail_rows: int | None = None, share_prompts: bool = True) -> dict:
    """Host-side counts: real tokens (each sequence's prompt and response), the tokens laid out in the packed
    rows (fewer with shared prompts), the positions the unpacked and the packed update compute, chunks."""
    pids, pmask, rids, rmask = (np.asarray(x) for x in (batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                                          batch.response_mask))
    p, g, t = rids.shape
    rows, tail, length = _chunk_shape(pids.shape[1], rids.shape, num_minibatches * micro_batches, chunk_rows,
                                      tail_rows, row_length, row_multiple)
    chunks = [c for i in minibatch_prompts(p, num_minibatches, micro_batches)
              for c in pack_with_tail(pids[i], pmask[i], rids[i], rmask[i], rows=rows, tail_rows=tail, length=length,
                                      share_prompts=share_prompts)]
    shapes = [c.tokens.shape[0] for c in chunks]
    seq = (rmask > 0).sum(-1)
    real = int(((pmask > 0).sum(-1)[:, None] * (seq > 0) + seq).sum())
    return {"real_tokens": real, "packed_tokens": sum(int((c.segment_ids > 0).sum()) for c in chunks),
            "unpacked_positions": p * g * (pids.shape[1] + t),
            "packed_positions": sum(shapes) * length, "chunks": len(shapes), "tail_chunks": len(shapes) - shapes.count(rows),
            "unpacked_chunks": num_minibatches * micro_batches}
