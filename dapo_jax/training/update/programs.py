"""The jitted programs of a run, built in one place: the trainer runs them, `dapo-jax plan` compiles them.

    tx, schedule = run_optimizer(cfg)
    programs = build_programs(cfg, policy=policy, model_cfg=model.config, mesh=mesh, tx=tx, schedule=schedule,
                              scfg=scfg, eval_scfg=eval_scfg, critic=critic, prompt_width=S)
    out = programs.generate(policy.sampler(params), ids, mask, key)          # a rollout round
    batch, cbatch = programs.prepare(policy.trainer(params), ref, ...)        # log π_old / π_ref, advantages
    state, m = programs.train_step(state, batch, **policy.step_kwargs)       # the update (packed or not)

`training/loop.py` drives these programs; `training/plan/memory.py` lowers the same objects on abstract
inputs for a target mesh, so the plan budgets for exactly what a run executes: the packed update's
chunk programs when `optim.packing` is on (with the chunk shapes the run uses), LoRA's frozen base and
merged sampler weights, the critic, the reference policy, the sampler's compute dtype.

The cache-free attention (update, log-probs, critic, the sampler's prefill) is chosen for the mesh's
platform and each program's sequence length by `models.attention.resolve` (`model.attention`, "auto" =
splash on TPU, gpu_flash on GPU, reference or blockwise on CPU); the kernels cannot attend with the
packed update's shared prompts, so with them the packed step lays each response out with its own
copy of the prompt (`models.attention.supports_branches`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from dapo_jax.models.attention import AttentionUnavailable, describe, resolve, supports_branches
from dapo_jax.models.decoder import Decoder
from dapo_jax.objectives.distill import distill_advantages
from dapo_jax.objectives.loss import compute_advantages, token_kl
from dapo_jax.parallel.host import to_global
from dapo_jax.parallel.mesh import batch_divisor, batch_sharding
from dapo_jax.sampling.continuous import ContinuousSampler, default_refill
from dapo_jax.sampling.sampler import make_generate
from dapo_jax.training.config.run import ConfigError, RunConfig
from dapo_jax.training.update.packed_step import PackedUpdate
from dapo_jax.training.update.train_step import (Batch, make_logprob_fn, make_optimizer, make_train_step,
                                                 map_prompt_chunks)


def resolve_attention(name: str, *, platform: str, seq_len: int) -> str:
    """The attention implementation `model.attention=name` runs as (models/attention.py's `resolve`)."""
    return resolve(name, platform=platform, seq_len=seq_len)


def attention_lengths(cfg: RunConfig) -> dict[str, int]:
    """Each cache-free program's tokens per row: the update and log-prob passes (prompt + response, or a
    packed row of that length), the sampler's prefill (the prompt)."""
    rows = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens  # packed rows are as long (packed_step.py)
    return {"update": rows, "log-probs": rows, "prefill": cfg.data.max_prompt_length}


def attention_report(cfg: RunConfig, mesh) -> str:
    """Which attention implementation each program uses (a ConfigError when model.attention cannot run here)."""
    try:
        return describe(cfg.model.attention, mesh_platform(mesh), attention_lengths(cfg))
    except AttentionUnavailable as e:
        raise ConfigError(str(e)) from None


def update_shares_prompts(cfg: RunConfig, mesh) -> bool:
    """Whether the packed update's attention can share a group's prompt (branch ids): splash and gpu_flash
    cannot, and the update then packs each response with its own copy of the prompt (same result)."""
    impl = resolve_attention(cfg.model.attention, platform=mesh_platform(mesh), seq_len=attention_lengths(cfg)["update"])
    return supports_branches(impl)


def mesh_platform(mesh) -> str:
    return mesh.devices.flat[0].platform


def run_optimizer(cfg: RunConfig):
    """`(tx, schedule)` of the policy: AdamW over `train.steps x num_minibatches` optimizer updates."""
    o = cfg.optim
    return make_optimizer(o, decay_steps=cfg.train.steps * o.num_minibatches)


def sampler_graphdef(cfg: RunConfig, graphdef, model_cfg):
    """The model run in `rollout.sampler_dtype` (same parameters, another compute dtype), or `graphdef`."""
    if cfg.sampler_dtype == model_cfg.dtype:
        return graphdef
    sampler_cfg = model_cfg.replace(dtype=cfg.sampler_dtype)
    return nnx.split(nnx.eval_shape(lambda: Decoder(sampler_cfg, rngs=nnx.Rngs(0))))[0]


@dataclasses.dataclass
class RunPrograms:
    """Every jitted program of a run (and what chose them)."""

    generate: Callable  # (sampler state, prompt_ids [P, S], prompt_mask, key) -> Rollout, P = gen_batch
    generate_eval: Callable  # the same with train.eval_k samples at the evaluation's sampling settings
    continuous: Any  # sampling.continuous.ContinuousSampler, or None
    logprob: Callable  # (trainer params, prompt_ids, prompt_mask, response_ids, response_mask) -> (logp, entropy)
    prepare: Callable  # jitted: log π_old / π_ref recomputed, advantages (and the critic's batch)
    train_step: Callable  # (TrainState, Batch, frozen=None) -> (TrainState, metrics); packed or unpacked
    critic: Any  # training.update.critic.Critic, or None
    packed: bool
    share_prompts: bool  # packed: a group's responses share one copy of its prompt
    attention: dict[str, str]  # program -> the attention implementation it runs


def build_programs(cfg: RunConfig, *, policy, model_cfg, mesh, tx, schedule, scfg, eval_scfg, critic=None,
                   prompt_width: int | None = None, reward_weights=None, teacher=None) -> RunPrograms:
    """The run's programs for `policy` (training/update/lora.py's PolicyWeights) on `mesh`.

    scfg / eval_scfg: the rollout's and the evaluation's `SamplingConfig`; critic: the `Critic` (PPO, VAPO) or
    None; prompt_width: the widest prompt bucket (continuous batching's prefill width; default
    data.max_prompt_length); reward_weights: reward.functions' weights, with `multi_reward: normalize_then_sum`
    (the rewards then come per function, [P, G, K], and are normalised in their group on the device);
    teacher: on-policy distillation's `training.update.distill.Teacher` (its graphdef), or None."""
    objective, r, o = cfg.objective_config, cfg.rollout, cfg.optim
    lengths = attention_lengths(cfg)
    attention = {name: resolve_attention(cfg.model.attention, platform=mesh_platform(mesh), seq_len=lengths[key])
                 for name, key in (("rollout prefill", "prefill"), ("logprob", "log-probs"), ("update", "update"))}
    if critic is not None:
        attention["critic"] = attention["logprob"]
    share = o.packing_share_prompts and update_shares_prompts(cfg, mesh)
    graphdef = policy.graphdef
    sampler = sampler_graphdef(cfg, policy.sampler_graphdef, model_cfg)
    generate = make_generate(sampler, scfg, r.G)
    continuous = None if not r.continuous else ContinuousSampler(
        sampler, scfg, num_samples=r.G, slots=r.gen_batch,
        refill=r.continuous_refill or default_refill(r.gen_batch), prompt_width=prompt_width or cfg.data.max_prompt_length)
    generate_eval = make_generate(policy.sampler_graphdef, eval_scfg, cfg.train.eval_k)
    logprob = make_logprob_fn(graphdef, temperature=scfg.logprob_temperature)
    packed = {} if not o.packing else {  # the padding-free update (training/update/packed_step.py)
        "chunk_rows": o.packing_rows, "tail_rows": o.packing_tail_rows, "share_prompts": share,
        "row_multiple": batch_divisor(mesh), "put": lambda x: to_global(x, batch_sharding(mesh))}
    train_step = (PackedUpdate if o.packing else make_train_step)(
        graphdef, tx, schedule, objective=objective, num_minibatches=o.num_minibatches,
        micro_batches=o.micro_batches, temperature=scfg.logprob_temperature,
        use_ref=objective.needs_reference and objective.kl_in == "loss", **packed,
    )
    adv_objective = objective if reward_weights is None or objective.multi_reward != "normalize_then_sum" else \
        objective.model_copy(update={"reward_weights": tuple(float(w) for w in reward_weights)})
    # the log-prob passes run the update's micro-batches of prompts one at a time: the same rows (and the
    # same sharding) as a micro-batch of the update, so a batch whose update fits fits here too
    teacher_logprob = None if teacher is None else make_logprob_fn(teacher.graphdef,
                                                                   temperature=scfg.logprob_temperature)
    prepare = make_prepare(adv_objective, logprob, critic, recompute_old_logp=cfg.recompute_old_logp,
                           chunks=o.num_minibatches * o.micro_batches, teacher_logprob=teacher_logprob,
                           distill=cfg.distill)
    return RunPrograms(generate, generate_eval, continuous, logprob, prepare, train_step, critic, o.packing,
                       share if o.packing else False, attention)


def make_prepare(objective, logprob_fn, critic=None, *, recompute_old_logp: bool, chunks: int = 1,
                 teacher_logprob=None, distill=None) -> Callable:
    """The jitted step between the rollout and the update: recomputed log π_old (`recompute_old_logp`),
    the reference's log-probs and KL (when the objective has one), the advantages, and with a critic its
    values, GAE and batch. With `teacher_logprob` (the teacher's log-prob program) and `distill` (the
    config's section), on-policy distillation: the advantages become `w·A − β·(log π_old − log π_T)` per
    token (objectives/distill.py), the teacher's params passed as `teacher_params`.

    chunks: each forward pass (π_old, π_ref, the critic's values) runs over `P / chunks` prompts at a time
    (`train_step.map_prompt_chunks`, chunk j = prompts j, j + chunks, ... as the update's micro-batches):
    exact, as rows are independent, and its activations are a chunk's, not the batch's. P must divide
    into `chunks` (the run's train_batch does: config.py checks it for the update's split)."""
    def logprobs(params, *rows):
        return map_prompt_chunks(lambda *r: logprob_fn(params, *r)[0], chunks, *rows)

    @jax.jit
    def prepare(params, ref_params, prompt_ids, prompt_mask, response_ids, response_mask, old_logp,
                rewards, valid, steps=None, critic_params=None, correct=None, teacher_params=None):
        """Reference / recomputed old log-probs and the advantages: [P, G, T] device tensors (from
        the step rewards `steps` instead of `rewards` when given: process supervision), and the
        critic's batch (None without a critic)."""
        behaviour_logp = old_logp  # log μ: the sampler's own log-probs
        rows = (prompt_ids, prompt_mask, response_ids, response_mask)
        if recompute_old_logp:
            old_logp = logprobs(params, *rows)
        ref_logp = jnp.zeros_like(old_logp)
        kl = None
        if ref_params is not None:
            ref_logp = logprobs(ref_params, *rows)
            kl = token_kl(objective, old_logp, ref_logp)
        batch = Batch(prompt_ids, prompt_mask, response_ids, response_mask.astype(jnp.float32),
                      old_logp, None, ref_logp, behaviour_logp if objective.needs_behaviour_logp else None)
        if critic is not None:  # GAE on the critic's values, VAPO's NLL weights (training/update/critic.py)
            return critic.prepare(critic_params, batch, rewards, valid, correct, kl, chunks=chunks)
        adv = compute_advantages(objective, rewards if steps is None else steps, response_mask, kl, valid=valid)
        adv = jnp.broadcast_to(adv[..., None] if adv.ndim == 2 else adv, response_mask.shape) * response_mask
        if teacher_params is not None:  # on-policy distillation: the teacher scores the student's tokens
            teacher_logp = map_prompt_chunks(lambda *r: teacher_logprob(teacher_params, *r)[0], chunks, *rows)
            adv = distill_advantages(adv, old_logp, teacher_logp, response_mask, coef=distill.coef,
                                     task_weight=distill.task_weight)
            batch = batch._replace(teacher_logp=teacher_logp)
        return batch._replace(advantages=adv), None

    return prepare


__all__ = ["RunPrograms", "attention_lengths", "attention_report", "build_programs", "make_prepare", "mesh_platform",
           "resolve_attention", "run_optimizer", "sampler_graphdef", "update_shares_prompts"]
