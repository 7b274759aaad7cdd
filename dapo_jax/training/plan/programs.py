"""The run's programs on abstract inputs: what `dapo-jax plan` lowers, with the layouts the run gives them.

    world = build_world(cfg, model_cfg, mesh)       # nothing allocated: shapes and shardings only
    world.resident()                                # {"parameters": bytes per device, ...}
    for job in world.jobs():                        # every program a step runs, ready to lower
        job.lower()

The model is `nnx.eval_shape`d and its programs come from `training/update/programs.py`'s `build_programs`, the
function the trainer calls, with their inputs as the run declares them (`RunPrograms.sampler_programs`,
`step_programs`, the packed update's `stages`, a learned reward's `blank_call`): the plan adds only the
layouts, which arguments are resident and the bytes held beside each program (tests/training/plan/
test_programs.py lowers every program both ways and finds the same StableHLO). Every input is a
`jax.ShapeDtypeStruct` with the sharding the run gives it:
parameters (and their optimizer moments) by `models.sharding`'s rules, the critic's trunk likewise and its
head replicated, batches over ("data", "fsdp"), counters replicated. Inputs the run makes on the host
(prompts, the rollout's arrays back from the reward functions) have the host's dtypes (int32 ids, float32
masks and log-probs, bool validity).
"""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from dapo_jax.models.decoder import Decoder
from dapo_jax.models.generation_config import GenerationConfig
from dapo_jax.models.lora import add_lora
from dapo_jax.models.sharding import partition_spec, path_str
from dapo_jax.models.value_head import ValueModel
from dapo_jax.parallel.mesh import batch_sharding
from dapo_jax.training.build import sampling_config
from dapo_jax.training.config.run import RunConfig
from dapo_jax.training.plan.compile import shard_bytes
from dapo_jax.training.plan.model_config import critic_model_config, teacher_model_config
from dapo_jax.training.plan.reward_models import reward_model_shapes
from dapo_jax.training.update.critic import Critic
from dapo_jax.training.update.distill import Teacher
from dapo_jax.training.update.lora import PolicyWeights
from dapo_jax.training.update.programs import build_programs, run_optimizer
from dapo_jax.training.update.train_step import TrainState


@dataclasses.dataclass
class Job:
    """One program to compile: `fn.lower(*args, **kwargs)` on abstract arguments."""

    name: str
    phase: str  # rollout | eval rollout | log-prob | update | critic
    fn: Any  # a jitted function (or jit_keeping_layout)
    args: tuple
    kwargs: dict = dataclasses.field(default_factory=dict)
    resident: tuple = ()  # the arguments (subtrees of args / kwargs) that are resident state
    held: int = 0  # bytes alive beside it that are not its arguments
    attention: str = ""
    shape: str = ""  # what it computes on, in words
    layered: bool = True  # False: it does not depend on the policy's depth (compiled once, at full size)
    # the program it is the same computation as, on fewer rows (a shorter packed chunk): it needs at most that
    # program's memory, so a plan that extrapolates takes that program's figures instead of compiling it
    bounded_by: str | None = None

    def lower(self):
        return self.fn.lower(*self.args, **self.kwargs)


def _sds(x, sharding):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def place_params(state, mesh, *, prefix: str = ""):
    """Abstract parameters laid out by `models.sharding.PARTITION_RULES` (paths below `prefix`; others replicated)."""
    def place(path, v):
        name = path_str(path)
        value = v.get_value() if hasattr(v, "get_value") else v.value
        if prefix and not name.startswith(prefix):
            spec = PartitionSpec()
        else:
            spec = partition_spec(name[len(prefix):])
        return v.replace(_sds(value, NamedSharding(mesh, spec)))

    return nnx.map_state(place, state)


def like_params(opt_state, params, mesh):
    """Optimizer-state leaves shaped like the parameters take their shardings (as `tx.init` on sharded
    parameters gives); the rest (counts) are replicated."""
    structure = jax.tree.structure(params)
    replicated = NamedSharding(mesh, PartitionSpec())

    def is_params(node) -> bool:
        return jax.tree.structure(node) == structure

    def place(node):
        if is_params(node):
            return jax.tree.map(lambda x, p: _sds(x, p.sharding), node, params)
        return _sds(node, replicated)

    return jax.tree.map(place, opt_state, is_leaf=is_params)


@dataclasses.dataclass
class World:
    """The abstract state of a run of `model_cfg` on `mesh`, and its programs."""

    cfg: RunConfig
    model_cfg: Any
    mesh: Any
    policy: Any  # training/update/lora.py's PolicyWeights, its frozen base abstract
    programs: Any  # training/update/programs.py's RunPrograms
    state: Any  # TrainState, abstract
    reference: Any  # the reference policy's weights, or None
    critic_state: Any  # the critic's TrainState, or None
    reward_models: list = dataclasses.field(default_factory=list)  # training/plan/reward_models.py's RewardModelPlan
    teacher: Any = None  # on-policy distillation's frozen teacher (training/update/distill.py's Teacher, abstract), or None

    @property
    def group_size(self) -> int:
        """Responses per prompt in a training batch: rollout.G, or 1 for supervised fine-tuning (the data's
        response to each prompt: training/supervised.py)."""
        return 1 if self.cfg.objective_config.supervised else self.cfg.rollout.G

    @property
    def rows(self) -> NamedSharding:
        return batch_sharding(self.mesh)

    def batched(self, shape, dtype):
        ways = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        sharding = self.rows if shape and shape[0] % ways == 0 else NamedSharding(self.mesh, PartitionSpec())
        return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)

    def lay_out(self, tree):
        """A program's outputs as the run lays them out: rows over the batch devices."""
        return jax.tree.map(lambda x: self.batched(x.shape, x.dtype), tree)

    def resident(self) -> dict[str, int]:
        """Bytes per device the run holds from start to end."""
        s = self.state
        return {"parameters": shard_bytes(s.params), "optimizer state": shard_bytes((s.opt_state, s.step, s.skipped)),
                "frozen base (LoRA)": shard_bytes(self.policy.frozen) if self.policy.frozen is not None else 0,
                "reference": shard_bytes(self.reference) - self._shared_with_frozen(self.reference),
                "critic (parameters + optimizer)": shard_bytes(self.critic_state),
                "reward models (frozen)": sum(rm.param_bytes for rm in self.reward_models),
                "distillation teacher (frozen)": shard_bytes(self.teacher.params) if self.teacher is not None else 0}

    def _shared_with_frozen(self, ref) -> int:
        """Under LoRA the reference is `(frozen base, zero adapters)`: the base is the policy's own."""
        return shard_bytes(ref[0]) if isinstance(ref, tuple) else 0

    def sampler_state(self):
        """What the sampler merges with its graphdef: the parameters, or under LoRA the base with the adapted
        kernels merged (new arrays while a rollout runs); and which of its leaves are resident (all but
        the merged kernels)."""
        if self.policy.frozen is None:
            return self.state.params, (self.state.params,)
        merged = place_params(jax.eval_shape(self.policy.sampler, self.state.params), self.mesh)
        return merged, (_unadapted(merged, self.state.params),)

    def kv_cache(self) -> int:
        """Bytes per device of the rollout's KV cache: keys and values of every layer for the prompts (once
        each) and the `G` responses' `T - 1` slots, in the sampler's dtype; rows over the batch devices, KV
        heads over `tensor` (the k/v projections' columns are split over it)."""
        r, m, mesh = self.cfg.rollout, self.model_cfg, self.mesh.shape
        g = r.G
        if self.cfg.objective_config.supervised:  # SFT samples only to evaluate
            if self.cfg.data.eval is None:
                return 0
            g = self.cfg.train.eval_k
        slots = r.gen_batch * self.cfg.data.max_prompt_length + r.gen_batch * g * max(r.max_new_tokens - 1, 0)
        if self.cfg.agent is not None:  # the multi-turn engine: every row holds cache_slots + append_width slots
            slots = r.gen_batch * r.G * (self.cfg.agent_cache_slots + self.cfg.agent.append_width)
        per_slot = 2 * m.num_hidden_layers * m.num_key_value_heads * m.head_dim * jnp.dtype(self.cfg.sampler_dtype).itemsize
        heads = mesh["tensor"] if m.num_key_value_heads % mesh["tensor"] == 0 else 1
        return slots * per_slot // (mesh["data"] * mesh["fsdp"] * heads)

    # ------------------------------------------------------------------ the programs
    def put(self, tree):
        """Host arrays as the run lays them out, abstract: rows over the batch devices (where they divide)."""
        return jax.tree.map(lambda x: self.batched(x.shape, x.dtype), tree)

    def outputs(self, layout: str, fn, args: tuple, kwargs: dict | None = None):
        """A program's outputs as the next program's inputs (the `outputs` of the programs' declarations,
        `RunPrograms.step_programs`), laid out as the run gives them: `layout` "rows" (over the batch devices,
        where they divide), "replicated", or "own" (the program's `out_shardings`)."""
        out = fn.lower(*args, **(kwargs or {})).out_info
        if layout == "rows":
            return self.lay_out(out)
        if layout == "replicated":
            return jax.tree.map(lambda x: _sds(x, NamedSharding(self.mesh, PartitionSpec())), out)
        return jax.tree.map(lambda x: _sds(x, x.sharding), out)

    def jobs(self) -> list[Job]:
        """Every program a training step (and an evaluation) compiles, in the order the run first runs them, each
        on the inputs its declaration gives it (training/update/programs.py's `RunPrograms.sampler_programs`
        and `step_programs`) laid out as the run lays them out."""
        cfg, p = self.cfg, self.programs
        r, s, t = cfg.rollout, cfg.data.max_prompt_length, cfg.rollout.max_new_tokens
        sampler, sampler_resident = self.sampler_state()
        key = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=NamedSharding(self.mesh, PartitionSpec()))
        prefill = f"prefill {p.attention['rollout prefill']}, decode with the KV cache"
        compacted = ", row compaction" if r.compaction else ""  # later decode stages on fewer rows (sampling/compaction.py)
        rollout, *evaluation = p.sampler_programs(sampler, key, width=s, put=self.put,
                                                  evaluation=cfg.data.eval is not None)
        jobs = []
        if cfg.objective_config.supervised:  # SFT samples nothing to train on: its batch is the data's
            pass
        elif p.engine is not None:  # an agent run: the multi-turn engine's programs (training/episode_source.py)
            jobs += self._engine_jobs(p.engine, r.G, "rollout", sampler, sampler_resident, key, prefill)
            if cfg.data.eval is not None:
                jobs += self._engine_jobs(p.engine_eval, cfg.train.eval_k, "eval rollout", sampler, sampler_resident,
                                          key, prefill)
        elif p.continuous is None:
            jobs.append(Job(rollout.name, "rollout", rollout.fn, rollout.args, resident=sampler_resident,
                            attention=prefill,
                            shape=f"{r.gen_batch} prompts x {r.G} samples, S {s}, T {t}{compacted}"))
        else:
            jobs += self._continuous_jobs(sampler, sampler_resident, key, prefill)
        for rm in self.reward_models:  # between generation and the advantages, on every rollout and evaluation
            ids = rm.inputs[0]
            jobs.append(Job(f"reward model {rm.index}", "reward scoring", rm.score_fn, (rm.params, *rm.inputs),
                            resident=(rm.params,), layered=False,
                            shape=f"{ids.shape[0]} rows x {ids.shape[1]} tokens, reward.functions.{rm.index} "
                                  f"({rm.name}: {rm.path.name})"))
        if evaluation and p.engine is None:
            (ev,) = evaluation
            jobs.append(Job(ev.name, "eval rollout", ev.fn, ev.args, resident=sampler_resident, attention=prefill,
                            shape=f"{r.gen_batch} prompts x {cfg.train.eval_k} samples, S {s}, T {t}{compacted}"))
        return jobs + self._step_jobs()

    def _step_jobs(self) -> list[Job]:
        """The update half of a step, as `RunPrograms.step_programs` declares it; here only what the plan adds:
        which arguments are resident, the bytes held beside each program, the words."""
        cfg, p, state = self.cfg, self.programs, self.state
        o, r = cfg.optim, cfg.rollout
        programs = p.step_programs(state, self.critic_state, policy=self.policy, reference=self.reference,
                                   put=self.put, outputs=self.outputs,
                                   teacher_params=None if self.teacher is None else self.teacher.params)
        rows = f"{r.train_batch} prompts x {self.group_size} responses, S+T {cfg.data.max_prompt_length + r.max_new_tokens}"
        words = f"{o.num_minibatches} mini-batches x {o.micro_batches} micro-batches of {r.train_batch} prompts x " \
                f"{self.group_size}, S+T {cfg.data.max_prompt_length + r.max_new_tokens}"
        held = 0  # the packed step keeps the prepared batch while its mini-batches run
        tallest = None
        jobs = []
        for x in programs:
            (args, kwargs), job = x.inputs(), dict(attention=p.attention["update"])
            if x.name == "prepare":
                job = dict(phase="log-prob", attention=p.attention["logprob"], shape=self._prepare_words(),
                           resident=(args[0], args[1], kwargs.get("critic_params"), kwargs.get("teacher_params")))
            elif x.name == "update":
                job.update(phase="update", resident=(state, kwargs), shape=words)
            elif x.name == "critic update":
                job = dict(phase="critic", resident=(args[0],), attention=p.attention["critic"], shape=rows)
            elif x.name == "update: select":
                held = shard_bytes(args[0])
                pm = args[1].shape[0]
                job = dict(phase="update", shape=f"one mini-batch of {pm} prompts", layered=False)
            elif x.name == "update: start":
                job.update(phase="update", resident=(state.params, self.policy.frozen),
                           shape="the mini-batch's entropy statistics")
            elif x.name.startswith("update: chunk"):
                h, length = args[3][0].shape
                job.update(phase="update", resident=(state.params, self.policy.frozen),
                           shape=f"a packed chunk of {h} rows x {length} tokens (forward + backward)",
                           bounded_by=tallest)
                tallest = tallest or x.name  # the chunks come tallest first
            elif x.name == "update: apply":
                job = dict(phase="update", resident=(args[0],), shape="the AdamW update of one mini-batch")
            elif x.name == "update: finish":
                job = dict(phase="update", layered=False, shape="the step's metrics")
            else:
                raise ValueError(f"no plan for the program {x.name!r}")
            if x.name.startswith("update: "):
                job["held"] = held
            jobs.append(Job(x.name, fn=x.fn, args=args, kwargs=kwargs, **job))
        return jobs

    def _engine_jobs(self, engine, g: int, phase: str, sampler, sampler_resident, key, prefill) -> list[Job]:
        """An agent run's prefill, decode (one turn) and append over `gen_batch x g` rows of `cache_slots` slots,
        as `TurnEngine.programs` declares them; here only the words."""
        cfg = self.cfg
        ec = engine.config
        words = f"{cfg.rollout.gen_batch} prompts x {g} episodes, {ec.cache_slots} cache slots"
        shapes = {"prefill": f"{words}, S {cfg.data.max_prompt_length}",
                  "decode": f"{words}, a turn of at most {ec.sampling.max_new_tokens} ids",
                  "append": f"{words}, {ec.append_width} observation ids per chunk"}
        return [Job(f"{phase}: {name}", phase, fn, args, resident=sampler_resident, attention=prefill,
                    shape=shapes[name])
                for name, fn, args in engine.programs(sampler, cfg.rollout.gen_batch * g, cfg.data.max_prompt_length,
                                                      key, lay_out=self.lay_out, batched=self.batched)]

    def _prepare_words(self) -> str:
        cfg, passes = self.cfg, []
        if cfg.recompute_old_logp:
            passes.append("log pi_old")
        if self.reference is not None:
            passes.append("log pi_ref")
        if self.critic_state is not None:
            passes.append("critic values")
        if self.teacher is not None:
            passes.append("the teacher's log-probs")
        what = " + ".join(passes) if passes else "advantages only"
        r = cfg.rollout
        return (f"{what}: {r.train_batch} prompts x {self.group_size} responses, "
                f"S+T {cfg.data.max_prompt_length + r.max_new_tokens}")

    def _continuous_jobs(self, sampler, sampler_resident, key, prefill) -> list[Job]:
        cfg, cont = self.cfg, self.programs.continuous
        replicated = NamedSharding(self.mesh, PartitionSpec())
        words = f"{cfg.rollout.gen_batch} x {cont.g} row slots, S {cont.width}, T {cfg.rollout.max_new_tokens}"
        shapes = {"admit": f"{cont.refill} prompts into {words}", "decode": f"continuous decode of {words}"}
        return [Job(f"rollout: {name}", "rollout", fn, args, resident=sampler_resident, attention=prefill,
                    shape=shapes[name])
                for name, fn, args in cont.programs(sampler, key, lay_out=self.lay_out, host=lambda shape, dtype:
                                                     jax.ShapeDtypeStruct(shape, dtype, sharding=replicated))]


def _unadapted(merged, adapters) -> list:
    """The leaves of the sampler's merged state that are the base's own arrays (not the kernels LoRA adapts,
    which are new arrays during a rollout)."""
    adapted = {path_str(path).rsplit("/lora/", 1)[0] + "/kernel" for path, _ in nnx.to_flat_state(adapters)
               if path_str(path).endswith("lora_a")}
    return [v.get_value() if hasattr(v, "get_value") else v.value for path, v in nnx.to_flat_state(merged)
            if path_str(path) not in adapted]


def fake_tokenizer(model_cfg):
    """What `build.sampling_config` reads of a tokenizer: no weights or files needed."""
    return types.SimpleNamespace(pad_token_id=model_cfg.pad_token_id or 0, eos_token_id=None)


def build_world(cfg: RunConfig, model_cfg, mesh) -> World:
    """The abstract run of `model_cfg` on `mesh`: parameters, optimizer state, reference, critic and programs."""
    objective = cfg.objective_config
    lora = cfg.lora

    def make():  # the model (with its adapters under LoRA) as the trainer builds it, abstract: nothing computed
        model = Decoder(model_cfg, rngs=nnx.Rngs(0))
        if lora is not None:
            add_lora(model, rank=lora.rank, alpha=lora.alpha, targets=tuple(lora.targets), rngs=nnx.Rngs(cfg.train.seed))
        return model

    model = nnx.eval_shape(make)
    policy, params = (PolicyWeights.of_adapted(model, lora) if lora is not None else PolicyWeights.build(model, None))
    params = place_params(params, mesh)
    if policy.frozen is not None:
        policy = dataclasses.replace(policy, frozen=place_params(policy.frozen, mesh))
    tx, schedule = run_optimizer(cfg)
    opt_state = like_params(jax.eval_shape(tx.init, params), params, mesh)
    scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, PartitionSpec()))
    state = TrainState(params, opt_state, scalar, scalar)
    reference = None
    if objective.needs_reference:
        reference = params if policy.frozen is None else (policy.frozen, params)
    critic = critic_state = None
    if objective.uses_critic:
        critic, critic_state = _abstract_critic(cfg, model_cfg, mesh)
    gen = GenerationConfig()
    tok = fake_tokenizer(model_cfg)
    teacher = abstract_teacher(cfg, mesh)
    with jax.set_mesh(mesh):
        programs = build_programs(cfg, policy=policy, model_cfg=model_cfg, mesh=mesh, tx=tx, schedule=schedule,
                                  scfg=sampling_config(cfg, tok, model_cfg, generation=gen),
                                  eval_scfg=sampling_config(cfg, tok, model_cfg, eval_mode=True, generation=gen),
                                  critic=critic, reward_weights=tuple(float(f.weight) for f in cfg.reward.functions),
                                  teacher=teacher)
    return World(cfg, model_cfg, mesh, policy, programs, state, reference, critic_state, reward_model_shapes(cfg, mesh),
                 teacher)


def abstract_teacher(cfg: RunConfig, mesh):
    """What `distill.load_teacher` would put on `mesh`, without reading a weight: the teacher's graphdef and
    its parameters as `jax.ShapeDtypeStruct`s laid out by the policy's rules (a frozen model beside the policy,
    at its full depth whatever depth the policy is compiled at); None without `distill`."""
    teacher_cfg = teacher_model_config(cfg)
    if teacher_cfg is None:
        return None
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Decoder(teacher_cfg, rngs=nnx.Rngs(0))))
    return Teacher(graphdef, place_params(params, mesh), str(cfg.distill.teacher))


def _abstract_critic(cfg: RunConfig, model_cfg, mesh):
    """The critic (training/update/critic.py) of an abstract value model: the trunk by the rules, the head replicated."""
    # the policy's model (at the depth this world is compiled at), or critic.path's when it names another
    # (make_plan then compiles every layer: the two have no common line in the layers)
    trunk = critic_model_config(cfg, model_cfg)
    model = nnx.eval_shape(lambda: ValueModel(Decoder(trunk, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1)))
    graphdef, params = nnx.split(model)
    params = place_params(params, mesh, prefix="trunk/")
    scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, PartitionSpec()))

    def init(params, tx):
        return TrainState(params, like_params(jax.eval_shape(tx.init, params), params, mesh), scalar, scalar)

    critic = Critic.from_split(cfg, graphdef, params, init=init)
    return critic, critic.init_state


def num_params(world: World) -> int:
    """Parameters of the model (the base's, LoRA adapters not counted)."""
    state = world.policy.frozen if world.policy.frozen is not None else world.state.params
    return sum(math.prod(x.shape) for x in jax.tree.leaves(state))


__all__ = ["Job", "World", "abstract_teacher", "build_world", "fake_tokenizer", "like_params", "num_params", "place_params"]
