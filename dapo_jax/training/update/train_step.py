"""The pure, jitted policy update of one rollout batch.

    tx, schedule = make_optimizer(cfg.optim)
    state = init_train_state(params, tx)
    step = make_train_step(graphdef, tx, schedule, objective=..., num_minibatches=..., ...)
    state, metrics = step(state, batch)          # state is donated

A rollout batch of `P` prompts x `G` responses x `T` tokens is split into `num_minibatches`
optimizer steps; each mini-batch into `micro_batches` accumulated with `lax.scan`. The objective
returns `(loss_sum, denominator)`; the denominator does not depend on the parameters, so

    grad L = Σ_micro ∇ loss_sum / Σ_micro denominator

is the exact gradient of the global token mean however the mini-batch is split (and over devices,
since the sums are global under jit's sharding). An update whose loss, gradient, new parameters or
new optimizer moments are not all finite (a NaN moment, an infinite learning rate, an overflow) is
not applied: params and optimizer state stay as they were, and it is counted in `state.skipped`
and in the step's `nonfinite_updates`, so the state in memory, and every checkpoint, stays finite.

Batch-level entropy statistics (the high-entropy mask's quantile, EDGE-GRPO's normaliser) come from
one no-gradient pass over the whole mini-batch, and so do the entropies the objective compares with
them: each micro-batch's gradient pass recomputes its entropies in another program, whose values may
differ from the first pass's in the last bit, and tied entropies (the G responses of a prompt share
their first token's context) would then fall on either side of a threshold they define. The
objective sees `h_pass + (h - stop_gradient(h))`: the pass's values exactly, the gradient pass's
derivative (for an entropy bonus), so the kept tokens do not depend on `micro_batches` or the mesh.
Objectives that select tokens over the whole batch by the current policy (Clip-Cov, KL-Cov:
`objectives.loss.batch_statistics`) take their statistics from the same pass, and see its log-probs the
same way, with a per-token draw u ~ U[0, 1) from the step number (so a resumed run draws the same).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dapo_jax.models.logprobs import response_logprobs
from dapo_jax.objectives import loss
from dapo_jax.objectives.diagnostics import combine_stacked
from dapo_jax.objectives.entropy_advantage import entropy_normaliser
from dapo_jax.objectives.loss import STATISTICS_KEY
from dapo_jax.objectives.policy_loss import high_entropy_threshold
from dapo_jax.parallel.mesh import jit_keeping_layout
from dapo_jax.training.update.accumulate import apply_accumulated, policy_sums, scan_pieces, step_metrics, zero_sums


class TrainState(NamedTuple):
    params: Any  # nnx.State of the trainable nnx.Param leaves
    opt_state: Any
    step: jax.Array  # int32: optimizer updates applied or attempted
    skipped: jax.Array  # int32: updates not applied because something in them was not finite


class Batch(NamedTuple):
    """One fixed-shape training batch (`P` prompts, `G` responses, `S` prompt, `T` response tokens)."""

    prompt_ids: jax.Array  # [P, S] int32, left-padded
    prompt_mask: jax.Array  # [P, S]
    response_ids: jax.Array  # [P, G, T] int32
    response_mask: jax.Array  # [P, G, T] float32: 1 on trained tokens (EOS included)
    old_logp: jax.Array  # [P, G, T] float32: log π_old at the sampling temperature
    advantages: jax.Array  # [P, G, T] float32
    ref_logp: jax.Array  # [P, G, T] float32 (zeros when no KL term is used)
    # [P, G, T] float32: log μ, the sampler's own log-probs, when an off-policy correction compares
    # them with a recomputed old_logp (docs/objectives.md#off-policy-correction); None = not carried
    behaviour_logp: jax.Array | None = None
    # [P, G, T] float32: VAPO's positive-example NLL weights (objectives/nll.py); None = no NLL term
    nll_weight: jax.Array | None = None
    # [P, G, T]: the tokens the forward attends to when more than the trained ones (agent episodes:
    # tool and template tokens are context with no loss, agents/batch.py); None = response_mask
    context_mask: jax.Array | None = None
    # [P, G, T] float32: the distillation teacher's log-probs of the tokens (objectives/distill.py), for its
    # metric; None = no teacher
    teacher_logp: jax.Array | None = None


def make_schedule(optim, *, decay_steps: int = 1) -> optax.Schedule:
    """Linear warm-up 0 -> `lr` over `warmup_steps`, then constant, or cosine to `min_lr_ratio*lr` over `decay_steps`."""
    if optim.schedule == "cosine":
        after = optax.cosine_decay_schedule(optim.lr, max(decay_steps, 1), alpha=optim.min_lr_ratio)
    else:
        after = optax.constant_schedule(optim.lr)
    if optim.warmup_steps == 0:
        return after
    warm = optax.linear_schedule(0.0, optim.lr, optim.warmup_steps)
    return optax.join_schedules([warm, after], [optim.warmup_steps])


def make_optimizer(optim, *, decay_steps: int = 1) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW (decoupled weight decay) after global-norm clipping; `decay_steps` = the cosine horizon
    in optimizer updates (train steps x num_minibatches)."""
    schedule = make_schedule(optim, decay_steps=decay_steps)
    parts = []
    if optim.grad_clip is not None:
        parts.append(optax.clip_by_global_norm(optim.grad_clip))
    parts.append(optax.adamw(schedule, b1=optim.b1, b2=optim.b2, eps=optim.eps, weight_decay=optim.weight_decay))
    return optax.chain(*parts), schedule


def init_train_state(params, tx: optax.GradientTransformation) -> TrainState:
    return TrainState(params, tx.init(params), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def batch_logprobs(graphdef, params, mb: Batch, *, temperature, grad_norms: bool = False):
    """`policy_logprobs` of a (micro-)batch: over its context tokens, 0 off its trained ones (and the output
    layer's per-token gradient norms with `grad_norms`, the `clip_grad_share` diagnostic)."""
    context = mb.response_mask if mb.context_mask is None else mb.context_mask
    out = policy_logprobs(graphdef, params, mb.prompt_ids, mb.prompt_mask, mb.response_ids, context,
                          temperature=temperature, grad_norms=grad_norms)
    if mb.context_mask is None:
        return out
    return tuple(jnp.where(mb.response_mask > 0, x, 0.0) for x in out)


def policy_logprobs(graphdef, params, prompt_ids, prompt_mask, response_ids, response_mask, *, temperature,
                    grad_norms: bool = False):
    """log π(response tokens) `[P, G, T]` and entropy `[P, G, T]`; each prompt `[P, S]` shared by its G responses.
    `params`: an nnx.State, or a tuple of States merged together (LoRA: `(frozen base, adapters)`)."""
    model = nnx.merge(graphdef, *params) if isinstance(params, tuple) else nnx.merge(graphdef, params)
    return response_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=temperature,
                             grad_norms=grad_norms)


def batch_level_statistics(mini: Batch, logprobs: Callable, *, objective, stats_fn, quantile, eda, policy_pass,
                           step=None):
    """`(stats, values)` of a mini-batch, shared by the unpacked and the packed update: the high-entropy
    mask's quantile, EDGE-GRPO's normaliser N and the objective's own statistics (`batch_statistics`), and
    the per-token values they were taken from (entropy, logp, priority; None when no pass is needed).
    `logprobs()`: `(logp, entropy)` of one no-gradient pass, shaped like `mini`'s masks, called only when
    a statistic needs it."""
    stats = {}
    if stats_fn is not None and not policy_pass:  # from the batch alone (normalised IS weights)
        stats.update(stats_fn(objective, logp=None, old_logp=mini.old_logp, advantages=mini.advantages,
                              mask=mini.response_mask, behaviour_logp=mini.behaviour_logp))
    if quantile is None and not eda and not policy_pass:
        return stats, None
    logp, entropy = logprobs()
    values = {"entropy": entropy}
    if quantile is not None:
        stats["entropy_threshold"] = high_entropy_threshold(entropy, mini.response_mask, quantile=quantile)
    if eda:
        stats["entropy_norm"] = entropy_normaliser(entropy, mini.response_mask)
    if policy_pass:
        values["logp"], values["priority"] = logp, statistics_priority(step, logp.shape)
        stats.update(stats_fn(objective, logp=logp, old_logp=mini.old_logp, advantages=mini.advantages,
                              mask=mini.response_mask, behaviour_logp=mini.behaviour_logp,
                              priority=values["priority"]))
    return stats, values


def make_logprob_fn(graphdef, *, temperature: float) -> Callable:
    """Jitted `(params, prompt_ids, prompt_mask, response_ids, response_mask) -> (logp, entropy)`."""
    return jax.jit(lambda params, *a: policy_logprobs(graphdef, params, *a, temperature=temperature))


def _joined(frozen, params):
    """The policy's weights: `params`, or `(frozen, params)` when a frozen base is passed (LoRA: training/update/lora.py)."""
    return params if frozen is None else (frozen, params)


def _split(x: jax.Array, num_minibatches: int, micro_batches: int) -> jax.Array:
    """`[P, ...]` -> `[num_minibatches, micro_batches, P/(n*m), ...]`, prompt `r` in micro-batch `r mod (n*m)`.

    The prompt axis is sharded in contiguous blocks over data*fsdp devices; taking every (n*m)-th
    prompt keeps each micro-batch spread evenly over all devices with no data movement.
    """
    p = x.shape[0] // (num_minibatches * micro_batches)
    x = x.reshape(p, num_minibatches, micro_batches, *x.shape[1:])
    return jnp.moveaxis(x, 0, 2)


def map_prompt_chunks(fn: Callable, chunks: int, *arrays):
    """`fn(*arrays)` computed `chunks` slices of the prompt axis at a time (`lax.map`), its outputs put
    back in prompt order: the same values as one call when `fn` treats prompts independently (a forward
    pass: every row's attention stays in its row), with the per-call activations of `P / chunks` prompts.

    arrays: `[P, ...]` each, `P` divisible by `chunks`; chunk `j` holds prompts `j, j + chunks, ...`
    (`_split`: with `P / chunks` divisible by the batch devices, each chunk keeps the rows' data/fsdp
    layout with no data movement). fn's outputs: a tree of `[P / chunks, ...]` arrays."""
    if chunks == 1:
        return fn(*arrays)
    p = arrays[0].shape[0]
    if p % chunks:
        raise ValueError(f"{p} prompts do not split into {chunks} chunks")
    split = [_split(x, 1, chunks)[0] for x in arrays]  # [chunks, P / chunks, ...]
    out = jax.lax.map(lambda xs: fn(*xs), split)
    return jax.tree.map(lambda y: jnp.moveaxis(y, 0, 1).reshape(p, *y.shape[2:]), out)


def make_train_step(
    graphdef,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    *,
    objective,
    num_minibatches: int = 1,
    micro_batches: int = 1,
    temperature: float = 1.0,
    use_ref: bool = False,
    loss_terms: Callable | None = None,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
    """Builds the jitted `step(state, batch, frozen=None, entropy_coef=None) -> (state, metrics)`; `state` is
    donated. `frozen`: weights merged with `state.params` but not trained (LoRA's base; training/update/lora.py).
    `entropy_coef`: the step's adaptive entropy coefficient α_k (a float32 scalar, Skywork-OR1's,
    objectives/adaptive_entropy.py), handed to the objective beside the batch-level statistics.

    `loss_terms(objective, *, logp, old_logp, advantages, mask, ref_logp, entropy) -> (loss_sum, den, metrics)`
    defaults to `dapo_jax.objectives.loss.objective_terms`.
    """
    if loss_terms is None:
        loss_terms = loss.objective_terms

    quantile = getattr(objective, "high_entropy_quantile", None)
    eda = bool(getattr(objective, "entropy_driven_advantage", False))
    grad_norms = bool(getattr(objective, "clip_grad_share", False))
    stats_fn, policy_pass = batch_statistics_of(objective, loss_terms)

    def entropy_stats(params, mini: Batch, frozen=None, step=None):
        """Batch-level statistics over every valid token of the mini-batch (all its micro-batches, and
        all devices under jit's sharding): `batch_level_statistics` of one extra forward pass, without
        gradient, so the kept tokens and the scaled advantages do not depend on `micro_batches` or the
        mesh (module docstring). Values `[micro_batches, P/m, G, T]`."""
        return batch_level_statistics(mini, lambda: jax.lax.stop_gradient(jax.lax.map(lambda mb: batch_logprobs(
            graphdef, _joined(frozen, params), mb, temperature=temperature), mini)), objective=objective,
            stats_fn=stats_fn, quantile=quantile, eda=eda, policy_pass=policy_pass, step=step)

    def minibatch_update(carry, mini: Batch, frozen=None, entropy_coef=None):
        params = carry[0]
        stats, pass_values = entropy_stats(params, mini, frozen, carry[2])
        stats = with_entropy_coef(stats, entropy_coef)

        def micro_loss(params, piece):
            mb, values = piece  # a micro-batch and its values of the no-gradient pass (or None)
            logp, entropy, *norms = batch_logprobs(graphdef, _joined(frozen, params), mb, temperature=temperature,
                                                   grad_norms=grad_norms)
            return policy_sums(loss_terms, objective, mb, logp, entropy, mask=mb.response_mask,
                               nll_weight=mb.nll_weight, stats=stats, pass_values=values or {}, use_ref=use_ref,
                               grad_norms=norms[0] if norms else None)

        (gsum, loss_sum, den, extra), metrics = scan_pieces(micro_loss, params, (mini, pass_values), zero_sums(params))
        return apply_accumulated(tx, schedule, carry, gsum, loss_sum, den, extra, combine_stacked(metrics))

    def step_fn(state: TrainState, batch: Batch, frozen=None, entropy_coef=None):
        minis = jax.tree.map(lambda x: _split(x, num_minibatches, micro_batches), batch)
        carry = (state.params, state.opt_state, state.step, state.skipped)
        update = functools.partial(minibatch_update, frozen=frozen, entropy_coef=entropy_coef)
        (params, opt_state, step, skipped), per_mini = jax.lax.scan(update, carry, minis)
        return TrainState(params, opt_state, step, skipped), step_metrics(per_mini, skipped)

    return jit_keeping_layout(step_fn, donate_argnums=0)  # the state keeps its layout: nothing recompiles


def batch_statistics_of(objective, loss_terms) -> tuple[Callable | None, bool]:
    """(the objective's batch-statistics function or None, whether it needs a policy pass), for the
    default `objective_terms` only (a custom `loss_terms` takes no statistics)."""
    if loss_terms is not loss.objective_terms or not isinstance(objective, loss.ObjectiveConfig):
        return None, False
    if not loss.needs_batch_statistics(objective):
        return None, False
    return loss.batch_statistics, loss.needs_policy_pass(objective)


def statistics_priority(step, shape):
    """Clip-Cov's per-token draw u ~ U[0, 1) for optimizer update `step` (a fixed key when None).

    Drawn in the mini-batch's prompt order `[P_mini, G, T]` (the packed step's layout); for a split
    shape `[micro_batches, P/m, G, T]` laid out as `_split` lays the prompts out (micro-batch j, row i
    = prompt i·m + j), so a token's draw does not depend on micro_batches."""
    key = jax.random.PRNGKey(STATISTICS_KEY)
    key = key if step is None else jax.random.fold_in(key, step)
    if len(shape) == 4:
        m, p = shape[:2]
        u = jax.random.uniform(key, (p * m, *shape[2:]), jnp.float32)
        return jnp.swapaxes(u.reshape(p, m, *shape[2:]), 0, 1)
    return jax.random.uniform(key, shape, jnp.float32)


def with_entropy_coef(stats: dict, entropy_coef) -> dict:
    """The batch-level statistics with the step's adaptive entropy coefficient α_k added (the objective's
    `entropy_coef` keyword), or as they are when there is none."""
    return stats if entropy_coef is None else {**stats, "entropy_coef": entropy_coef}
