"""The jitted programs of a run, built in one place: the trainer runs them, `dapo-jax plan` compiles them.

    tx, schedule = run_optimizer(cfg)
    programs = build_programs(cfg, policy=policy, model_cfg=model.config, mesh=mesh, tx=tx, schedule=schedule,
                              scfg=scfg, eval_scfg=eval_scfg, critic=critic, prompt_width=S)
    out = programs.generate(policy.sampler(params), ids, mask, key)          # a rollout round
    args, kw = programs.prepare_inputs(groups, trainer_params=policy.trainer(params), reference=ref, put=put)
    batch, cbatch = programs.prepare(*args, **kw)                              # log π_old / π_ref, advantages
    state, m = programs.train_step(state, batch, **policy.step_kwargs)       # the update (packed or not)

`training/loop.py` drives these programs; `training/plan/memory.py` lowers the same objects on abstract
inputs for a target mesh, so the plan budgets for exactly what a run executes: the packed update's
chunk programs when `optim.packing` is on (with the chunk shapes the run uses), LoRA's frozen base and
merged sampler weights, the critic, the reference policy, the sampler's compute dtype. Each program's
inputs are declared once, for the run's compile-ahead (training/update/compile_ahead.py) and the plan:

    programs.sampler_programs(sampler, key, width=S, put=put)    # "rollout", "eval rollout": a blank round
    programs.step_programs(state, critic_state, policy=policy, reference=ref, put=put, outputs=outputs)
    # "prepare" on `blank()`, then "update" or the packed update's stages (`PackedUpdate.stages`) on
    # what prepare returns, then "critic update": each a `compile_ahead.Program` (name, program, inputs)

`put` lays host arrays out (the run: over the mesh's rows; the plan: as abstract, laid-out shapes) and
`outputs` turns a program's outputs into the next one's inputs (the run: compiled, `run_outputs`; the
plan: by its layout rule); `prepare`'s inputs come from `RunPrograms.prepare_inputs`, the run's step
calls it too on its batch of groups. `make_update` builds the update the way a run does (the benchmarks
call it too).

`cfg` must be resolved (`training/config/run.py`'s `resolve`): the fast paths it left unset are chosen there.

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
import numpy as np
from flax import nnx

from dapo_jax.models.attention import AttentionUnavailable, describe, resolve, supports_branches
from dapo_jax.models.decoder import Decoder
from dapo_jax.objectives.distill import distill_advantages
from dapo_jax.objectives.loss import compute_advantages, token_kl
from dapo_jax.objectives.process import StepRewards
from dapo_jax.parallel.host import to_global
from dapo_jax.parallel.mesh import batch_divisor, batch_sharding
from dapo_jax.sampling.continuous import ContinuousSampler, default_refill
from dapo_jax.sampling.sampler import make_generate, shard_batch
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.resolve import is_resolved
from dapo_jax.training.config.run import RunConfig
from dapo_jax.training.episode_source import turn_engine
from dapo_jax.training.rollout import Groups
from dapo_jax.training.update.compile_ahead import Program, run_outputs
from dapo_jax.training.update.packed_step import PackedUpdate
from dapo_jax.training.update.train_step import (Batch, make_logprob_fn, make_optimizer, make_train_step,
                                                 map_prompt_chunks)


def resolve_attention(name: str, *, platform: str, seq_len: int) -> str:
    """The attention implementation `model.attention=name` runs as (models/attention.py's `resolve`)."""
    return resolve(name, platform=platform, seq_len=seq_len)


def attention_lengths(cfg: RunConfig) -> dict[str, int]:
    """Each cache-free program's tokens per row: the update and log-prob passes (prompt + response, or a
    packed row of that length), the sampler's prefill (the prompt)."""
    rows = cfg.data.max_prompt_length + cfg.response_tokens  # packed rows are as long (packed_step.py)
    return {"update": rows, "log-probs": rows, "prefill": cfg.data.max_prompt_length}


def attention_report(cfg: RunConfig, mesh) -> str:
    """Which attention implementation each program uses (a ConfigError when model.attention cannot run here)."""
    try:
        return describe(cfg.model.attention, mesh_platform(mesh), attention_lengths(cfg))
    except AttentionUnavailable as e:
        raise ConfigError(str(e)) from None


def shares_prompts(attention: str, mesh, seq_len: int) -> bool:
    """Whether the packed update's attention (`model.attention=attention` on `mesh`'s platform, rows of `seq_len`
    tokens) can share a group's prompt (branch ids): splash and gpu_flash cannot, and the update then packs
    each response with its own copy of the prompt (same result)."""
    return supports_branches(resolve_attention(attention, platform=mesh_platform(mesh), seq_len=seq_len))


def make_update(graphdef, tx, schedule, *, objective, optim, temperature: float, mesh, attention: str, seq_len: int,
                use_ref: bool = False) -> tuple[Callable, bool]:
    """`(train_step, share_prompts)`: the update as a run builds it from its `optim` section: with
    `optim.packing` the padding-free one (training/update/packed_step.py; a group's prompt shared when
    `optim.packing_share_prompts` and the attention allow it, `shares_prompts`), else training/update/train_step.py's.
    `train_step(state, batch, frozen=None) -> (state, metrics)`; seq_len: the update's rows' tokens (S + T)."""
    if optim.packing is None:
        raise ValueError("optim.packing is unset: resolve the config first (training/config/run.py's resolve)")
    share = bool(optim.packing) and optim.packing_share_prompts and shares_prompts(attention, mesh, seq_len)
    packed = {} if not optim.packing else {
        "chunk_rows": optim.packing_rows, "tail_rows": optim.packing_tail_rows, "share_prompts": share,
        "row_multiple": batch_divisor(mesh), "put": lambda x: to_global(x, batch_sharding(mesh))}
    train_step = (PackedUpdate if optim.packing else make_train_step)(
        graphdef, tx, schedule, objective=objective, num_minibatches=optim.num_minibatches,
        micro_batches=optim.micro_batches, temperature=temperature, use_ref=use_ref, **packed)
    return train_step, share


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
    batch_shape: tuple[int, int, int, int]  # (P, S, G, T) of the update's batch: train_batch prompts, G responses
    num_rewards: int  # K, the reward functions
    reward_parts: bool  # prepare takes each function's reward, [P, G, K] (multi_reward normalize_then_sum)
    step_rewards: bool  # prepare takes process supervision's step rewards, [P, G, T]
    distills: bool  # prepare takes the teacher's params (on-policy distillation)
    steps: int  # the step rewards' slots: T, an agent run's max_turns (its steps are its turns), 0 without
    episodes: bool  # an agent run: prepare takes the episodes' context mask (tool ids: context, no loss)
    engine: Any = None  # agents.engine.TurnEngine: an agent run's prefill / decode / append programs, or None
    engine_eval: Any = None  # the same at the evaluation's sampling settings (train.eval_*), or None
    adaptive_entropy: bool = False  # the update takes α_k, the adaptive entropy coefficient (objective.entropy_target)
    gen_batch: int = 0  # P of the samplers: rollout.gen_batch prompts a generation batch

    def sampler_programs(self, sampler, key, *, width: int, put: Callable, evaluation: bool = True) -> list[Program]:
        """The samplers (`generate`, "rollout"; with `evaluation`, `generate_eval`, "eval rollout") on a blank
        generation batch: `gen_batch` prompts of `width` ids, int32 ids and mask through `put` (the run: onto
        the mesh's rows; the plan: their abstract, laid-out shapes), `sampler` the sampler's weights and `key`
        the PRNG key as given (arrays or `jax.ShapeDtypeStruct`s)."""
        ids = put(np.zeros((self.gen_batch, width), np.int32))
        programs = [Program("rollout", self.generate, (sampler, ids, ids, key))]
        if evaluation:
            programs.append(Program("eval rollout", self.generate_eval, (sampler, ids, ids, key)))
        return programs

    def step_kwargs(self, policy, entropy_coef: float = 0.0) -> dict:
        """The update's keyword inputs: LoRA's frozen base (`policy.step_kwargs`) and, when the entropy coefficient
        adapts, α_k as a float32 scalar (an input, so a new α each step compiles nothing)."""
        if not self.adaptive_entropy:
            return policy.step_kwargs
        return {**policy.step_kwargs, "entropy_coef": np.float32(entropy_coef)}

    def step_programs(self, state, critic_state=None, *, policy, reference, put: Callable, teacher_params=None,
                      outputs: Callable = run_outputs) -> list[Program]:
        """The update half of a step on the run's blank batch (`blank()`), each program with its inputs: "prepare"
        (`prepare_inputs`), the update ("update", or the packed update's `stages`) on what `prepare` returns, and
        with a critic "critic update" on its batch. The one declaration of these inputs: the run compiles them
        ahead (training/step.py's `Learner.precompile`), `dapo-jax plan` lowers them (training/plan/programs.py).

        state / critic_state: the TrainStates (arrays or `jax.ShapeDtypeStruct`s); policy: the PolicyWeights;
        reference, teacher_params: π_ref's and the teacher's weights, or None; put: host arrays (a tree) -> the
        arguments (the run: `to_global` over the rows; the plan: abstract, laid-out shapes); outputs(layout, fn,
        args, kwargs): a program's outputs as the next one's inputs (`compile_ahead.run_outputs`: compiled; the
        plan: by `layout`)."""
        args, kwargs = self.prepare_inputs(
            self.blank(), trainer_params=policy.trainer(state.params), reference=reference, put=put,
            critic_params=None if critic_state is None else critic_state.params, teacher_params=teacher_params)
        batch, critic_batch = outputs("rows", self.prepare, args, kwargs)
        kw = self.step_kwargs(policy)
        update = (self.train_step.stages(state, batch, **kw, put=put, outputs=outputs) if self.packed else
                  [Program("update", self.train_step, (state, batch), kw)])
        critic = [] if self.critic is None else [Program("critic update", self.critic.update, (critic_state, critic_batch))]
        return [Program("prepare", self.prepare, args, kwargs), *update, *critic]

    def blank(self) -> Groups:
        """The all-zero batch of the update's shape and dtypes: what the run compiles `prepare` and the update
        for before its first rollout (training/update/compile_ahead.py), and what the plan lowers them on."""
        p, s, g, t = self.batch_shape
        return Groups.blank(p, s, g, t, steps=self.steps, parts=self.num_rewards, context=self.episodes)

    def prepare_inputs(self, groups: Groups, *, trainer_params, reference, put: Callable, critic_params=None,
                       teacher_params=None) -> tuple[tuple, dict]:
        """`prepare`'s `(args, kwargs)` for `groups`: its arrays through `put` (the run: `to_global` over the
        mesh's rows; the plan: their abstract, laid-out shapes), the weights as given (trainer_params: the
        trainer's view of the params, `policy.trainer(params)`; reference: π_ref's, or None). GFPO's dropped
        responses (`groups.selected`) leave the loss, its denominator and the advantages' statistics; padding
        groups (valid=False) carry none."""
        sel = groups.selected
        host = (groups.prompt_ids, groups.prompt_mask, groups.response_ids, groups.response_mask * sel[..., None],
                groups.old_logp, groups.reward_parts if self.reward_parts else groups.rewards,
                groups.valid[:, None] & sel)
        steps = StepRewards(groups.step_rewards, groups.step_ends, groups.step_mask) if self.step_rewards else None
        kwargs = {"steps": put(steps)}
        if self.critic is not None:
            kwargs.update(critic_params=critic_params, correct=put(groups.correct))
        if self.distills:
            kwargs["teacher_params"] = teacher_params
        if self.episodes:  # tool ids are context without loss (training/episode_source.py)
            kwargs["context_mask"] = put(groups.context_mask)
        return (trainer_params, reference, *put(host)), kwargs


def build_programs(cfg: RunConfig, *, policy, model_cfg, mesh, tx, schedule, scfg, eval_scfg, critic=None,
                   prompt_width: int | None = None, reward_weights=None, teacher=None,
                   stop_sequences: tuple = ()) -> RunPrograms:
    """The run's programs for `policy` (training/update/lora.py's PolicyWeights) on `mesh`.

    scfg / eval_scfg: the rollout's and the evaluation's `SamplingConfig`; critic: the `Critic` (PPO, VAPO) or
    None; prompt_width: the widest prompt bucket (continuous batching's prefill width; default
    data.max_prompt_length); reward_weights: reward.functions' weights, with `multi_reward: normalize_then_sum`
    (the rewards then come per function, [P, G, K], and are normalised in their group on the device);
    teacher: on-policy distillation's `training.update.distill.Teacher` (its graphdef), or None; stop_sequences:
    an agent run's turn-ending id sequences besides the EOS (the tool-call end marker: episode_source.py)."""
    if not is_resolved(cfg):
        raise ValueError("the programs are built from a resolved config: pass training.config.run.resolve(cfg)")
    objective, r, o = cfg.objective_config, cfg.rollout, cfg.optim
    lengths = attention_lengths(cfg)
    attention = {name: resolve_attention(cfg.model.attention, platform=mesh_platform(mesh), seq_len=lengths[key])
                 for name, key in (("rollout prefill", "prefill"), ("logprob", "log-probs"), ("update", "update"))}
    if critic is not None:
        attention["critic"] = attention["logprob"]
    graphdef = policy.graphdef
    sampler = sampler_graphdef(cfg, policy.sampler_graphdef, model_cfg)
    generate = make_generate(sampler, scfg, r.G)
    continuous = None if not r.continuous else ContinuousSampler(
        sampler, scfg, num_samples=r.G, slots=r.gen_batch,
        refill=r.continuous_refill or default_refill(r.gen_batch), prompt_width=prompt_width or cfg.data.max_prompt_length)
    generate_eval = make_generate(policy.sampler_graphdef, eval_scfg, cfg.train.eval_k)
    logprob = make_logprob_fn(graphdef, temperature=scfg.logprob_temperature)
    train_step, share = make_update(graphdef, tx, schedule, objective=objective, optim=o,
                                    temperature=scfg.logprob_temperature, mesh=mesh, attention=cfg.model.attention,
                                    seq_len=lengths["update"],
                                    use_ref=objective.needs_reference and objective.kl_in == "loss")
    adv_objective = objective if reward_weights is None or not objective.sums_normalised_rewards else \
        objective.model_copy(update={"reward_weights": tuple(float(w) for w in reward_weights)})
    # the log-prob passes run the update's micro-batches of prompts one at a time: the same rows (and the
    # same sharding) as a micro-batch of the update, so a batch whose update fits fits here too
    teacher_logprob = None if teacher is None else make_logprob_fn(teacher.graphdef,
                                                                   temperature=scfg.logprob_temperature)
    prepare = make_prepare(adv_objective, logprob, critic, recompute_old_logp=cfg.recompute_old_logp,
                           chunks=o.num_minibatches * o.micro_batches, teacher_logprob=teacher_logprob,
                           distill=cfg.distill)
    engine = engine_eval = None
    if cfg.agent is not None:  # multi-turn episodes (agents/engine.py), on the sampler's graphdef and dtype
        engine = turn_engine(cfg, sampler, scfg, stop_sequences)
        engine_eval = turn_engine(cfg, policy.sampler_graphdef, eval_scfg, stop_sequences)
    g = 1 if objective.supervised else r.G  # SFT: each example is a group of one response
    steps = (r.max_new_tokens if cfg.agent is None else cfg.agent.max_turns) if objective.needs_step_rewards else 0
    return RunPrograms(generate, generate_eval, continuous, logprob, prepare, train_step, critic, o.packing, share,
                       attention, (r.train_batch, cfg.data.max_prompt_length, g, cfg.response_tokens),
                       len(cfg.reward.functions), objective.sums_normalised_rewards, objective.needs_step_rewards,
                       teacher is not None, steps, cfg.agent is not None, engine, engine_eval,
                       adaptive_entropy=objective.adaptive_entropy, gen_batch=r.gen_batch)


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
    def logprobs(params, *rows, trained=None):
        logp = map_prompt_chunks(lambda *r: logprob_fn(params, *r)[0], chunks, *rows)
        return logp if trained is None else jnp.where(trained > 0, logp, 0.0)  # context ids: no log-prob

    @jax.jit
    def prepare(*args, **kwargs):
        """Every array of its batches laid out with their rows over the mesh's ("data", "fsdp"), where they
        divide (`shard_batch`): the update's inputs as the plan lays them out, whatever XLA would choose for
        an output (a constant π_ref of zeros came out replicated)."""
        return jax.tree.map(shard_batch, batches(*args, **kwargs))

    def batches(params, ref_params, prompt_ids, prompt_mask, response_ids, response_mask, old_logp,
                rewards, valid, steps=None, critic_params=None, correct=None, teacher_params=None, context_mask=None):
        """Reference / recomputed old log-probs and the advantages: [P, G, T] device tensors (from
        the step rewards `steps` instead of `rewards` when given: process supervision), and the
        critic's batch (None without a critic). `context_mask` [P, G, T]: the ids the forward attends to
        when more than the trained ones (an agent run's tool ids); the batch carries it to the update."""
        behaviour_logp = old_logp  # log μ: the sampler's own log-probs
        rows = (prompt_ids, prompt_mask, response_ids, response_mask if context_mask is None else context_mask)
        trained = None if context_mask is None else response_mask  # log-probs on the trained ids only
        if recompute_old_logp:
            old_logp = logprobs(params, *rows, trained=trained)
        ref_logp = jnp.zeros_like(old_logp)
        kl = None
        if ref_params is not None:
            ref_logp = logprobs(ref_params, *rows, trained=trained)
            kl = token_kl(objective, old_logp, ref_logp)
        batch = Batch(prompt_ids, prompt_mask, response_ids, response_mask.astype(jnp.float32),
                      old_logp, None, ref_logp, behaviour_logp if objective.needs_behaviour_logp else None,
                      context_mask=None if context_mask is None else context_mask.astype(jnp.float32))
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


__all__ = ["RunPrograms", "attention_lengths", "attention_report", "build_programs", "make_prepare", "make_update",
           "mesh_platform", "resolve_attention", "run_optimizer", "sampler_graphdef", "shares_prompts"]
