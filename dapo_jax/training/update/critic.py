"""The critic of PPO and VAPO (docs/objectives.md#critic-ppo-vapo): a value model with its own optimizer and
jitted update.

    critic = Critic.build(cfg, mesh)                    # when cfg.objective_config.uses_critic
    cstate = critic.init_state                          # a TrainState: params, optimizer state, counters
    batch, cbatch = critic.prepare(cstate.params, batch, rewards, valid, correct, kl)   # inside jit
    state, m = train_step(state, batch)                 # the policy, with GAE advantages (+ VAPO's NLL)
    cstate, cm = critic.update(cstate, cbatch)          # the clipped value loss, token mean

`prepare` reads `V_old` from the critic, computes the policy's advantages (GAE with the policy's λ,
whitened) and the value targets (GAE with `critic_lambda` + V_old), and VAPO's NLL token weights for
the policy's optimizer batches. `pretrain` is VAPO's value pre-training: `value_pretrain_steps`
critic steps (each a rollout batch split into the critic's mini-batches) on rollouts of the frozen initial policy with λ = 1 (Monte-Carlo) targets, before
any policy update (the initial policy is the reference, so a KL-in-reward term is 0 there).

The critic update splits its batch into the `critic` section's `num_minibatches` optimizer steps of
`micro_batches` accumulated micro-batches; the value loss is a (sum, denominator) pair, so the
update does not depend on `micro_batches`. An update with anything non-finite is not applied.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dapo_jax.models.value_head import load_value_model, response_values
from dapo_jax.objectives.diagnostics import combine_stacked, finalize_metrics
from dapo_jax.objectives.gae import advantages_and_targets, value_loss
from dapo_jax.objectives.nll import nll_weights
from dapo_jax.objectives.registry import AGGREGATIONS
from dapo_jax.parallel.mesh import jit_keeping_layout
from dapo_jax.training.config.paths import resolve_path
from dapo_jax.training.update.accumulate import finite_update, scan_pieces, zero_sums
from dapo_jax.training.update.train_step import (Batch, TrainState, _split, init_train_state, make_optimizer,
                                                 map_prompt_chunks)


class CriticBatch(NamedTuple):
    """What one critic update trains on (`P` prompts, `G` responses, `S` prompt, `T` response tokens)."""

    prompt_ids: jax.Array  # [P, S] int32, left-padded
    prompt_mask: jax.Array  # [P, S]
    response_ids: jax.Array  # [P, G, T] int32
    response_mask: jax.Array  # [P, G, T] float32: tokens the value loss counts
    old_values: jax.Array  # [P, G, T] float32: V_old, the critic's values when the batch was prepared
    returns: jax.Array  # [P, G, T] float32: value targets G_t
    context_mask: jax.Array | None = None  # [P, G, T] an episode's every real id (tool ids too): the forward's mask


def critic_values(graphdef, params, prompt_ids, prompt_mask, response_ids, response_mask, context_mask=None):
    """`V_t` `[P, G, T]` (0 off `response_mask`) of the value model `nnx.merge(graphdef, params)`.

    context_mask: an agent episode's every real id (model, tool and template ids), the mask the forward
    attends with, as the policy's log-prob pass; the values are kept on `response_mask` (the model's ids)."""
    model = nnx.merge(graphdef, params)
    if context_mask is None:
        return response_values(model, prompt_ids, prompt_mask, response_ids, response_mask)
    values = response_values(model, prompt_ids, prompt_mask, response_ids, context_mask)
    return jnp.where(response_mask > 0, values, 0.0)


def policy_nll_weights(objective, mask, correct, *, num_minibatches: int, micro_batches: int):
    """VAPO's NLL weights `[P, G, T]` for the policy update that splits the batch like `train_step`
    (prompt r is in optimizer batch `(r // micro_batches) % num_minibatches`); None when μ = 0."""
    p = mask.shape[0]
    if objective.nll_coef == 0:
        return None
    order = _split(jnp.arange(p), num_minibatches, micro_batches).reshape(num_minibatches, -1)
    batch_ids = jnp.zeros((p,), jnp.int32).at[order].set(jnp.arange(num_minibatches, dtype=jnp.int32)[:, None])
    agg = AGGREGATIONS[objective.loss_agg]
    den = jax.vmap(lambda m: agg(jnp.zeros_like(m)[None], m[None],
                                 max_response_length=objective.max_response_length)[1])(mask)
    return nll_weights(correct, mask, batch_ids, den, coef=objective.nll_coef, num_batches=num_minibatches)


def make_critic_step(graphdef, tx: optax.GradientTransformation, schedule: optax.Schedule, *,
                     clip_eps: float | None, num_minibatches: int = 1, micro_batches: int = 1) -> Callable:
    """The jitted `step(state, CriticBatch) -> (state, metrics)` (state donated); metrics are named
    `critic/...`: loss, grad_norm, learning_rate, update_applied, nonfinite_updates and the value
    loss's diagnostics (`gae.value_loss`)."""

    def micro_loss(params, cb: CriticBatch):
        v = critic_values(graphdef, params, cb.prompt_ids, cb.prompt_mask, cb.response_ids, cb.response_mask,
                          cb.context_mask)
        loss_sum, den, metrics = value_loss(v, cb.old_values, cb.returns, cb.response_mask, clip_eps=clip_eps)
        return loss_sum, (den, metrics, {})

    def minibatch_update(carry, mini: CriticBatch):
        params, opt_state, step, skipped = carry
        (gsum, loss_sum, den, _), metrics = scan_pieces(micro_loss, params, mini, zero_sums(params, extra=()))
        # Σ∇loss_sum / Σden: the exact token mean
        params, opt_state, grad_norm, finite, apply = finite_update(tx, gsum, den, opt_state, params,
                                                                    finite=jnp.isfinite(loss_sum))
        out = {"loss": loss_sum / jnp.maximum(den, 1e-8), "grad_norm": grad_norm, "learning_rate": schedule(step),
               "update_applied": apply.astype(jnp.float32), "nonfinite_updates": (~finite).astype(jnp.float32),
               "pairs": combine_stacked(metrics)}
        carry = (params, opt_state, step + 1, skipped + (~finite).astype(jnp.int32))
        return carry, out

    def step_fn(state: TrainState, batch: CriticBatch):
        minis = jax.tree.map(lambda x: _split(x, num_minibatches, micro_batches), batch)
        (params, opt_state, step, skipped), per_mini = jax.lax.scan(minibatch_update, tuple(state), minis)
        pairs = per_mini.pop("pairs")
        metrics = {f"critic/{k}": jnp.mean(v) for k, v in per_mini.items()}
        metrics["critic/nonfinite_updates"] = jnp.sum(per_mini["nonfinite_updates"])
        metrics.update({f"critic/{k}": v for k, v in finalize_metrics(combine_stacked(pairs)).items()})
        return TrainState(params, opt_state, step, skipped), metrics

    return jit_keeping_layout(step_fn, donate_argnums=0)  # as the policy's: the state keeps its layout, committed


@dataclasses.dataclass
class Critic:
    """A critic objective's value model (`graphdef`), its first state and its jitted functions."""

    objective: Any  # ObjectiveConfig with uses_critic
    graphdef: Any
    init_state: TrainState
    update: Callable  # (TrainState, CriticBatch) -> (TrainState, metrics)
    num_minibatches: int  # the POLICY update's split (for the NLL weights)
    micro_batches: int

    @classmethod
    def build(cls, cfg, mesh) -> "Critic":
        """From a `RunConfig`: the value model from `critic.path` (default `model.path`) on `mesh`,
        AdamW by the `critic` section (cosine horizon: train steps + pre-training steps)."""
        model = load_value_model(resolve_path(cfg.critic_optim.path or cfg.model.path), mesh=mesh, seed=cfg.train.seed,
                                 param_dtype=cfg.model.param_dtype, dtype=cfg.model.dtype, remat=cfg.model.remat,
                                 attention=cfg.model.attention)
        graphdef, params = nnx.split(model)
        return cls.from_split(cfg, graphdef, params)

    @classmethod
    def from_split(cls, cfg, graphdef, params, *, init: Callable = init_train_state) -> "Critic":
        """The critic of the value model `nnx.merge(graphdef, params)`; `init(params, tx)` makes its first
        state (`dapo-jax plan` passes abstract parameters and an abstract `init`)."""
        objective, optim = cfg.objective_config, cfg.critic_optim
        updates = (cfg.train.steps + objective.value_pretrain_steps) * optim.num_minibatches
        tx, schedule = make_optimizer(optim, decay_steps=updates)
        update = make_critic_step(graphdef, tx, schedule, clip_eps=objective.value_clip,
                                  num_minibatches=optim.num_minibatches, micro_batches=optim.micro_batches)
        return cls(objective, graphdef, init(params, tx), update, cfg.optim.num_minibatches, cfg.optim.micro_batches)

    def prepare(self, critic_params, batch: Batch, rewards, valid, correct, kl=None, *, objective=None, chunks: int = 1):
        """`(policy Batch with GAE advantages and NLL weights, CriticBatch)`; jit-able.

        rewards, valid, correct: `[P, G]`; kl: `[P, G, T]` (KL in the reward) or None; chunks: the values'
        forward pass runs over `P / chunks` prompts at a time (`train_step.map_prompt_chunks`, exact).
        An episode's batch (`batch.context_mask`): the values' forward sees every id, GAE and the value loss
        run over the model's ids (`response_mask`) only, skipping tool and template ids (objectives/gae.py)."""
        objective = objective or self.objective
        mask = batch.response_mask
        rows = (batch.prompt_ids, batch.prompt_mask, batch.response_ids, mask)
        if batch.context_mask is not None:
            rows = (*rows, batch.context_mask)
        values = map_prompt_chunks(lambda *r: critic_values(self.graphdef, critic_params, *r), chunks, *rows)
        adv, targets = advantages_and_targets(objective, rewards, mask, values, kl, valid=valid)
        m = mask * jnp.asarray(valid, jnp.float32)[..., None]
        nll = policy_nll_weights(objective, m, correct, num_minibatches=self.num_minibatches,
                                 micro_batches=self.micro_batches)
        cbatch = CriticBatch(batch.prompt_ids, batch.prompt_mask, batch.response_ids, m, values, targets,
                             batch.context_mask)
        return batch._replace(advantages=adv, nll_weight=nll), cbatch

    def pretrain(self, state: TrainState, draw: Callable[[int], tuple], say=print) -> tuple[TrainState, dict]:
        """VAPO's value pre-training: `value_pretrain_steps` updates, update `i` on `draw(i)` =
        `(prompt_ids, prompt_mask, response_ids, response_mask, rewards, valid)` device arrays of a
        rollout of the frozen initial policy, with λ = 1 targets. Returns (state, summary metrics)."""
        n = self.objective.value_pretrain_steps
        if n == 0:
            return state, {}
        mc = self.objective.model_copy(update={"critic_lambda": 1.0, "kl_beta": 0.0, "nll_coef": 0.0})
        # an agent run's batches carry the episodes' context mask (tool ids: in the forward, not in the loss)
        build = jax.jit(lambda params, ids, pmask, rids, rmask, rewards, valid, context=None: self.prepare(
            params, Batch(ids, pmask, rids, rmask, None, jnp.zeros(rmask.shape, jnp.float32), None,
                          context_mask=context),
            rewards, valid, jnp.zeros(rewards.shape, bool), objective=mc)[1])
        first = last = None
        for i in range(n):
            state, m = self.update(state, build(state.params, *draw(i)))
            last = {k: float(v) for k, v in m.items()}
            first = first or last
        say(f"[dapo-jax] value pre-training: {n} critic steps (one rollout batch each, in the critic's "
            f"mini-batches) on the initial policy's rollouts, value loss "
            f"{first['critic/value_loss']:.4f} -> {last['critic/value_loss']:.4f}", flush=True)
        return state, {"critic/pretrain_steps": float(n), "critic/pretrain_value_loss_first": first["critic/value_loss"],
                       "critic/pretrain_value_loss_last": last["critic/value_loss"]}
