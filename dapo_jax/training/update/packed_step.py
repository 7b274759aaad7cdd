"""The policy update on packed sequences: its work follows the real token count, not P·G·(S+T).

    update = PackedUpdate(graphdef, tx, schedule, objective=..., num_minibatches=..., ...)
    state, metrics = update(state, batch)      # same Batch, same TrainState, same metrics as train_step

Each mini-batch (the same prompts as `train_step`'s) is packed on the host (`data/packing.py`) into
chunks of a fixed `[R, L]` shape (and a shorter one, `[R/2, L]` by default, for what the
last chunk would hold, when it takes fewer rows: `data/packing.pack_with_tail`): whole groups, each
(prompt, response) sequence's real tokens end to end in a row, the responses of a group in one row
after one copy of its prompt (`share_prompts`), attention kept within a sequence by the decoder's
`segment_ids` and `branch_ids`. A jitted stage (`accumulate`)
adds one chunk's `∇loss_sum`, `loss_sum`, `den` and metrics to an accumulator (training/update/accumulate.py,
the core the unpacked and critic updates share); the number of chunks varies from step to step, so the
chunks run from a host loop (one compilation whatever the count), then one jitted `apply_accumulated`
makes the mini-batch's optimizer update.

Exactness: the chunk's per-token log-probs / entropies are gathered back into the mini-batch's
`[P, G, T]` layout (0 elsewhere, as `response_logprobs` gives on padding) and the objective
(`objective_terms`, unchanged) runs on that layout with the response mask restricted to the chunk's
groups. Every aggregation's `(loss_sum, den)` is a sum over responses (token_mean: tokens;
seq_mean_*: non-empty responses; Dr. GRPO: non-empty responses · T_max) and every group statistic
is either computed before the update (advantages) or inside one group, which a chunk holds whole,
so Σ_chunks equals the unpacked mini-batch's sums; the batch-level entropy statistics (high-entropy
quantile, EDGE-GRPO's normaliser, Clip-Cov / KL-Cov's covariance statistics) come from the same unpacked
no-gradient pass as `train_step`'s, and so do the entropies and log-probs every chunk's objective compares
with them (`accumulate.with_pass_values`).
Sequences whose response mask is all zero carry no loss and are not computed at all.
Agent episodes (a `context_mask`: tool and template tokens the forward attends to, with no loss) are
packed by their context mask, every context token in the row, and trained by their response mask: the
log-probs, entropies and token counts of context-only tokens are 0, as `train_step.batch_logprobs` gives.
"""

from __future__ import annotations

import threading
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from dapo_jax.data.packing import pack_with_tail, tail_heights
from dapo_jax.models.logprobs import output_grad_norms, token_logprobs
from dapo_jax.objectives.diagnostics import combine_metrics
from dapo_jax.objectives.loss import objective_terms
from dapo_jax.parallel.host import to_host
from dapo_jax.parallel.mesh import committed, jit_keeping_layout
from dapo_jax.training.update.compile_ahead import Program, run_outputs
from dapo_jax.training.update.accumulate import add_sums, apply_accumulated, policy_sums, step_metrics, zero_sums
from dapo_jax.training.update.train_step import (Batch, TrainState, _joined, batch_level_statistics, batch_logprobs,
                                         batch_statistics_of, with_entropy_coef)


def packed_logprobs(model, tokens, segment_ids, positions, targets, *, temperature, branch_ids=None,
                    grad_norms: bool = False):
    """log π(target) and entropy `[R, L]` at every packed position (one model call on the chunk); with
    `grad_norms` also the output layer's per-token gradient norms (`logprobs.output_grad_norms`)."""
    hidden, _ = model(tokens, positions, (segment_ids > 0).astype(jnp.int32), segment_ids=segment_ids,
                      branch_ids=branch_ids)
    w = model.output_embedding().astype(model.config.dtype)  # same casts as response_logprobs
    h = hidden.astype(w.dtype)
    out = token_logprobs(h, w, targets, temperature=temperature)
    return (*out, output_grad_norms(h, w, targets, temperature=temperature)) if grad_norms else out


def minibatch_prompts(num_prompts: int, num_minibatches: int, micro_batches: int) -> list[np.ndarray]:
    """The prompt indices of each mini-batch, as `train_step._split` takes them."""
    n, m = num_minibatches, micro_batches
    rows = np.arange(num_prompts).reshape(-1, n, m)  # prompt q*n*m + i*m + j -> [q, i, j]
    return [np.sort(rows[:, i, :].ravel()) for i in range(n)]


class PackedUpdate:
    """`update(state, batch, frozen=None) -> (state, metrics)` equal to `make_train_step`'s (to float tolerance).

    A step runs its stages, each a jitted program, per mini-batch from a host loop:

        mini = update.select(batch, prompt_indices)               # the mini-batch's rows, on the device
        stats = update.start(params, mini, frozen, step)          # its batch-level statistics
        acc = update.accumulate(acc, params, mini, chunk, stats, frozen)[0]   # per packed chunk, from `zero_acc`
        carry, out = update.apply(carry, acc)                     # the optimizer update
        metrics = update.finish(outs, skipped)                    # the step's metrics, after the last

    chunk_rows: rows R of a packed chunk (default `default_chunk_rows`: half a micro-batch's responses,
      so a mini-batch of short responses takes one or two half-size chunks, not one full one);
    row_length: L (default S + T, so any sequence fits).
    put: host array -> device array for the chunks (default `jnp.asarray`; the trainer lays them out
      over the mesh's batch devices, so R must be a multiple of their count, `row_multiple`).
    tail_rows: the leftovers' shorter chunks are multiples of it below R (default `default_tail_rows`: R/2;
      0 = none). Every chunk shape compiles at the first step, whether or not it is used then.
    share_prompts: a group's responses in one row share one copy of the prompt (`data/packing.py`).
    """

    def __init__(self, graphdef, tx, schedule, *, objective, num_minibatches: int = 1, micro_batches: int = 1,
                 temperature: float = 1.0, use_ref: bool = False, loss_terms: Callable | None = None,
                 chunk_rows: int | None = None, row_length: int | None = None, put: Callable | None = None,
                 row_multiple: int = 1, tail_rows: int | None = None, share_prompts: bool = True):
        loss_terms = loss_terms or objective_terms
        self.graphdef, self.objective, self.loss_terms = graphdef, objective, loss_terms
        self.num_minibatches, self.micro_batches = num_minibatches, micro_batches
        self.temperature, self.use_ref, self.share_prompts = temperature, use_ref, share_prompts
        self.chunk_rows, self.row_length, self.tail_rows = chunk_rows, row_length, tail_rows
        self.row_multiple = row_multiple
        self.put = put or jnp.asarray
        self._quantile = getattr(objective, "high_entropy_quantile", None)
        self._eda = bool(getattr(objective, "entropy_driven_advantage", False))
        self.grad_norms = bool(getattr(objective, "clip_grad_share", False))  # the diagnostic's extra pass
        self._stats_fn, self._policy_pass = batch_statistics_of(objective, loss_terms)
        self._zero = None  # zero_acc's program: built at its first call, from a chunk's metric names
        self._zero_lock = threading.Lock()  # one program, also when `stages` runs on a compile-ahead thread
        self._all_heights_run = False  # the first step runs every chunk height, used or not

        self.select = jax.jit(lambda batch, idx: jax.tree.map(lambda x: jnp.take(x, idx, axis=0), batch))
        self.start = jax.jit(self._start)
        # the accumulator is fed back chunk after chunk (and donated: added to in place); it keeps the layout
        # zero_acc gave it, so no chunk compiles again on a mesh
        self.accumulate = jit_keeping_layout(self._add_chunk, donate_argnums=0)
        # the carry (parameters, moments) is donated: the update is written over it, in place
        self.apply = jit_keeping_layout(lambda carry, acc: apply_accumulated(tx, schedule, carry, *acc),
                                        donate_argnums=0)
        self.finish = jax.jit(lambda outs, skipped: step_metrics(jax.tree.map(lambda *x: jnp.stack(x), *outs),
                                                                 skipped))

    def chunk_shape(self, prompt_len: int, response_shape) -> tuple[int, int, int]:
        """(R, tail step, L) of the chunks of a batch of `[P, S]` prompts and `[P, G, T]` responses."""
        return _chunk_shape(prompt_len, response_shape, self.num_minibatches * self.micro_batches, self.chunk_rows,
                            self.tail_rows, self.row_length, self.row_multiple)

    def packing_stats(self, batch) -> dict:
        """`packing_stats` of `batch` as this update packs it."""
        return packing_stats(batch, self.num_minibatches, self.micro_batches, self.chunk_rows, self.row_length,
                             self.row_multiple, self.tail_rows, self.share_prompts)

    def _start(self, params, mini: Batch, frozen, step=None):
        """The mini-batch's batch-level statistics (`batch_level_statistics`, as the unpacked update) and the
        per-token values `[P, G, T]` they were taken from (entropy, logp, priority; None when not needed)."""
        def logprobs():
            p, m = mini.response_ids.shape[0], self.micro_batches
            split = jax.tree.map(lambda x: x.reshape(m, p // m, *x.shape[1:]), mini)
            return jax.tree.map(lambda x: x.reshape(mini.response_mask.shape), jax.lax.stop_gradient(
                jax.lax.map(lambda mb: batch_logprobs(self.graphdef, _joined(frozen, params), mb,
                                                      temperature=self.temperature), split)))

        return batch_level_statistics(mini, logprobs, objective=self.objective, stats_fn=self._stats_fn,
                                      quantile=self._quantile, eda=self._eda, policy_pass=self._policy_pass, step=step)

    def _chunk_loss(self, params, mini: Batch, chunk, stats, frozen=None):
        """`policy_sums` of one packed chunk: its log-probs / entropies gathered back into the mini-batch's
        `[P, G, T]` layout (0 elsewhere), the loss mask restricted to the chunk's groups."""
        stats, pass_values = stats  # the statistics and the per-token values `[P, G, T]` of the no-gradient pass
        tokens, segs, pos, targets, branches, index, valid, groups = chunk
        model = nnx.merge(self.graphdef, frozen, params) if frozen is not None else nnx.merge(self.graphdef, params)
        logp, entropy, *norms = packed_logprobs(model, tokens, segs, pos, targets, temperature=self.temperature,
                                                branch_ids=branches if self.share_prompts else None,  # splash: none
                                                grad_norms=self.grad_norms)
        if mini.context_mask is not None:  # an episode: its context-only tokens are in the forward, not the loss
            valid = valid & (mini.response_mask > 0)
        logp, entropy, *norms = (jnp.where(valid, x.reshape(-1)[index], 0.0) for x in (logp, entropy, *norms))
        in_chunk = groups[:, None, None]
        return policy_sums(self.loss_terms, self.objective, mini, logp, entropy,
                           mask=mini.response_mask * in_chunk.astype(mini.response_mask.dtype),
                           nll_weight=None if mini.nll_weight is None else mini.nll_weight * in_chunk,
                           stats=stats, pass_values=pass_values or {}, use_ref=self.use_ref,
                           grad_norms=norms[0] if norms else None)

    def _add_chunk(self, acc, params, mini, chunk, stats, frozen):
        (loss_sum, (den, metrics, extra)), grads = jax.value_and_grad(self._chunk_loss, has_aux=True)(
            params, mini, chunk, stats, frozen)
        *sums, msum = acc
        return (*add_sums(tuple(sums), grads, loss_sum, den, extra), combine_metrics([msum, metrics])), None

    def zero_acc(self, params, mini, chunk, stats, frozen):
        """A zero accumulator (`zero_sums` and the metrics' neutral pairs): the gradient sum laid out as the
        parameters, the sums and metrics replicated on their mesh (one jitted program, compiled once)."""
        return self._zero_program(params, mini, chunk, stats, frozen)(params)

    def _zero_program(self, params, mini, chunk, stats, frozen):
        """`zero_acc`'s jitted program `params -> accumulator`, built at its first call from a trace of a chunk's
        metric names (nothing compiles); `params` arrays or `jax.ShapeDtypeStruct`s (their layouts)."""
        with self._zero_lock:
            if self._zero is None:
                names = jax.eval_shape(lambda *a: self._chunk_loss(*a)[1][1], params, mini, chunk, stats, frozen)
                first = jax.tree.leaves(params)[0].sharding
                rep = (NamedSharding(first.mesh, PartitionSpec()) if isinstance(first, NamedSharding) else first)
                layout = (jax.tree.map(lambda x: x.sharding, params), rep, rep, rep, rep)

                def zero_accumulator(params):
                    return (*zero_sums(params), {k: _identity(k, v[0].shape) for k, v in names.items()})

                self._zero = jax.jit(zero_accumulator, out_shardings=layout)
        return self._zero

    def __call__(self, state: TrainState, batch: Batch, frozen=None, entropy_coef=None):
        """`frozen`: weights merged with `state.params` but not trained (LoRA's base), `entropy_coef` the
        adaptive entropy coefficient α_k, as train_step's."""
        state = committed(state)  # the chunks compile for the layout `apply` hands back (parallel/mesh.py)
        host = to_host((batch.prompt_ids, batch.prompt_mask, batch.response_ids, _context(batch)))
        rows, tail, length = self.chunk_shape(host[0].shape[1], host[2].shape)
        carry, outs = (state.params, state.opt_state, state.step, state.skipped), []
        for idx in minibatch_prompts(host[2].shape[0], self.num_minibatches, self.micro_batches):
            mini = self.select(batch, self.put(idx.astype(np.int32)))
            chunks = pack_with_tail(*(x[idx] for x in host), rows=rows, tail_rows=tail, length=length,
                                    share_prompts=self.share_prompts)  # on the host: one at a time on the device
            stats = self.start(carry[0], mini, frozen, carry[2])
            stats = (with_entropy_coef(stats[0], entropy_coef), stats[1])
            if not self._all_heights_run:
                # every chunk height compiles at the first step, used or not, with each mini-batch's parameter
                # layout (the first mini-batch's come from the caller, the next from `apply`)
                for r in {rows, *tail_heights(rows, tail)} - {c.tokens.shape[0] for c in chunks}:
                    empty = self._empty(r, length, idx.size, host[2].shape)
                    self.accumulate(self.zero_acc(carry[0], mini, empty, stats, frozen), carry[0], mini, empty,
                                    stats, frozen)
            acc = None
            for chunk in chunks:
                chunk = tuple(self.put(x) for x in chunk)
                acc = acc if acc is not None else self.zero_acc(carry[0], mini, chunk, stats, frozen)
                acc, _ = self.accumulate(acc, carry[0], mini, chunk, stats, frozen)
            if acc is None:  # nothing to train on in this mini-batch: no update, as unpacked
                acc = self.zero_acc(carry[0], mini, self._empty(rows, length, idx.size, host[2].shape), stats, frozen)
            carry, out = self.apply(carry, acc)
            outs.append(out)
        self._all_heights_run = True
        return TrainState(*carry), self.finish(outs, carry[3])

    def _empty(self, rows: int, length: int, prompts: int, response_shape, put: Callable | None = None) -> tuple:
        """An empty chunk of `rows` x `length` for a mini-batch of `prompts` prompts, through `put` (default the
        update's own: on the device)."""
        return tuple((put or self.put)(x) for x in _empty_chunk(rows, length, (prompts, *response_shape[1:])))

    def stages(self, state: TrainState, batch: Batch, frozen=None, entropy_coef=None, *, put: Callable | None = None,
               outputs: Callable = run_outputs) -> list[Program]:
        """Every program `update(state, batch, frozen, entropy_coef)` runs, with the inputs it gives it, for `batch`
        given by its shapes and layouts (`jax.ShapeDtypeStruct`s or arrays): "update: select" (the first
        mini-batch's rows), "update: start", "update: chunk RxL" for each chunk height (tallest first; empty
        chunks), "update: apply", "update: finish". The one declaration of the stages' inputs: the run compiles
        them ahead (training/step.py's `Learner.precompile`), `dapo-jax plan` lowers them (training/plan/programs.py).

        put: a host array of the chunks (and the mini-batch's prompt indices) -> its argument (default the
        update's own `put`, onto the mesh; the plan: its abstract, laid-out shape). outputs(layout, fn, args,
        kwargs): a program's outputs as the next one's inputs (the run: `compile_ahead.run_outputs`, what the
        compiled program gives; the plan: by `layout`, "rows" over the batch devices, "replicated", or "own",
        as the program's `out_shardings` set them)."""
        state = committed(state)
        put = put or self.put
        p, g, t = batch.response_ids.shape
        rows, tail, length = self.chunk_shape(batch.prompt_ids.shape[1], (p, g, t))
        idx = put(minibatch_prompts(p, self.num_minibatches, self.micro_batches)[0].astype(np.int32))
        mini = outputs("rows", self.select, (batch, idx))
        start = (state.params, mini, frozen, state.step)
        stats = outputs("replicated", self.start, start)
        stats = (with_entropy_coef(stats[0], entropy_coef), stats[1])
        pm = mini.response_ids.shape[0]

        def empty(r):
            return self._empty(r, length, pm, (p, g, t), put)

        first = empty(rows)
        acc = outputs("own", self._zero_program(state.params, mini, first, stats, frozen), (state.params,))
        carry = (state.params, state.opt_state, state.step, state.skipped)
        heights = sorted({rows, *tail_heights(rows, tail)}, reverse=True)
        # finish's inputs are apply's outputs: derived (apply compiled, in a run) when asked
        return [Program("update: select", self.select, (batch, idx)),
                Program("update: start", self.start, start),
                *(Program(f"update: chunk {r}x{length}", self.accumulate,
                          (acc, state.params, mini, first if r == rows else empty(r), stats, frozen)) for r in heights),
                Program("update: apply", self.apply, (carry, acc)),
                Program("update: finish", self.finish, lambda: (
                    [outputs("replicated", self.apply, (carry, acc))[1]] * self.num_minibatches, state.skipped))]


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


def _identity(name: str, shape: tuple = ()):
    """The neutral (value, count) pair of a metric for `combine_metrics` (sum, _min, _max), its value `shape`d
    (a histogram's bins)."""
    v = np.inf if name.endswith("_min") else -np.inf if name.endswith("_max") else 0.0
    return jnp.full(shape, v, jnp.float32), jnp.zeros((), jnp.float32)


def _context(batch):
    """The `[P, G, T]` mask of the tokens a sequence holds (its context mask, else its response mask)."""
    return batch.response_mask if batch.context_mask is None else batch.context_mask


def _empty_chunk(rows: int, length: int, shape) -> tuple:
    z = np.zeros((rows, length), np.int32)
    return (z, z, z, z, z, np.zeros(shape, np.int32), np.zeros(shape, bool), np.zeros(shape[0], bool))


def packing_stats(batch, num_minibatches: int, micro_batches: int, chunk_rows=None, row_length=None,
                  row_multiple: int = 1, tail_rows: int | None = None, share_prompts: bool = True) -> dict:
    """Host-side counts: real tokens (each sequence's prompt and response, its context with an episode's
    `context_mask`), the tokens laid out in the packed rows (fewer with shared prompts), the positions the
    unpacked and the packed update compute, chunks."""
    pids, pmask, rids, rmask = (np.asarray(x) for x in (batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                                          _context(batch)))
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
