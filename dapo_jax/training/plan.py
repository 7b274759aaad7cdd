"""`dapo-jax plan CONFIG`: what a run needs per device, from its compiled programs, before anything runs.

    p = make_plan(cfg, device_memory_gib=None)   # lowers + compiles the rollout, log-prob and update programs
    print(format_plan(p)); p.fits

Nothing is loaded or allocated: the model is `nnx.eval_shape`d, every input is a
`jax.ShapeDtypeStruct` carrying the sharding the run gives it (parameters by `models.sharding`'s rules,
batches over ("data", "fsdp")), and each program is compiled ahead of time with
`jit(...).lower(...).compile()` for the configured mesh. XLA's `memory_analysis()` of a compiled
SPMD program is per device: arguments, outputs, temporaries (activations, gradients, the KV cache
and every other buffer the program allocates) and the bytes of outputs that reuse a donated argument.

Per device, a phase needs what stays resident (parameters, optimizer state, a reference copy when
the objective has a KL term, the critic's state) plus what its program adds:

    rollout  = resident + sampler temporaries (KV cache included) + its inputs and outputs
    logprob  = resident + log-prob temporaries + its batch and outputs   (recomputed log pi_old / reference)
    update   = resident - state + arguments + outputs - aliased + temporaries   (state donated)

and the plan's figure is the largest phase. Compared against the device's memory
(`memory_stats()["bytes_limit"]` where the backend reports it; on CPU the host's RAM shared by the
mesh's devices; `--device-memory` overrides). On the CPU backend the process also holds the JAX
runtime, compiled code and host copies of batches, so a measured peak RSS sits above the plan.

An accelerator topology can be compiled for without its hardware where JAX supports it:
`jax.experimental.topologies.get_topology_desc(name, platform="tpu")` (`--topology v5e:2x2`) needs
libtpu installed; CUDA topologies are not implemented by jax 0.10 (`NotImplementedError`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import types

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from dapo_jax.training.config import ConfigError, RunConfig, resolve_path

GiB = 2**30

# Published config.json values of models a config may name before they are downloaded: the plan needs
# shapes only. Matched by the model folder's name (case-insensitive substring).
KNOWN_SHAPES = {
    "qwen2.5-0.5b": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=896, intermediate_size=4864,
        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
        max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        hidden_act="silu", bos_token_id=151643, eos_token_id=151645, torch_dtype="bfloat16",
    ),
}


@dataclasses.dataclass(frozen=True)
class Program:
    """One compiled program's per-device `memory_analysis()` (bytes)."""

    name: str
    arguments: int
    outputs: int
    temporaries: int
    aliased: int
    code: int

    @classmethod
    def of(cls, name: str, compiled) -> "Program":
        m = compiled.memory_analysis()
        return cls(name, int(m.argument_size_in_bytes), int(m.output_size_in_bytes), int(m.temp_size_in_bytes),
                   int(m.alias_size_in_bytes), int(m.generated_code_size_in_bytes))


@dataclasses.dataclass
class MemoryPlan:
    """Per-device bytes of a run (see the module docstring for how the phases add up)."""

    mesh: dict
    devices: str  # e.g. "2 x cpu"
    model_source: str
    num_params: int
    params: int
    opt_state: int
    reference: int
    critic: int
    kv_cache: int  # analytic, inside the rollout's temporaries
    programs: dict[str, Program]
    phases: dict[str, int]
    capacity: int | None
    capacity_source: str

    @property
    def resident(self) -> int:
        return self.params + self.opt_state + self.reference + self.critic

    @property
    def peak(self) -> int:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.peak <= self.capacity


def shard_bytes(tree) -> int:
    """Bytes per device of a tree of `ShapeDtypeStruct`s / arrays: each leaf's shard under its sharding."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.shape
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None:
            shape = sharding.shard_shape(shape)
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def plan_model_config(cfg: RunConfig):
    """`(ModelConfig, source)`: model.path's config.json, else the published shape its folder name names."""
    from dapo_jax.models.config import ModelConfig

    m = cfg.model
    overrides = dict(param_dtype=m.param_dtype, dtype=m.dtype, remat=m.remat, attention=m.attention)
    path = resolve_path(m.path)
    if (path / "config.json").exists():
        return ModelConfig.from_pretrained(path, **overrides), str(path / "config.json")
    for name, hf in KNOWN_SHAPES.items():
        if name in path.name.lower():
            return ModelConfig.from_hf_dict(hf, **overrides), f"{name}'s published config.json values ({path} is absent)"
    raise ConfigError(f"model.path: no config.json at {path}, and its name matches none of the shapes the plan knows "
                      f"({', '.join(KNOWN_SHAPES)}): download the model's config.json or set model.path=DIR")


def plan_devices(cfg: RunConfig, topology: str | None = None) -> list:
    """The devices the mesh takes: this host's, or a TPU topology's (compiled for without the hardware)."""
    if topology is None:
        devices = jax.devices()
    else:
        from jax.experimental import topologies

        try:
            devices = topologies.get_topology_desc(topology, platform="tpu").devices
        except (RuntimeError, NotImplementedError, ValueError) as e:
            raise ConfigError(f"--topology {topology}: {e} (targeting a TPU topology from this machine needs "
                              f"libtpu: pip install 'jax[tpu]')") from e
    n = cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.tensor
    if n > len(devices):
        raise ConfigError(f"mesh: data*fsdp*tensor={n} but only {len(devices)} devices are visible (on CPU, "
                          f"`dapo-jax plan --cpu-devices {n}` or XLA_FLAGS=--xla_force_host_platform_device_count={n})")
    return devices[:n]


def _capacity(devices, n: int, device_memory_gib: float | None) -> tuple[int | None, str]:
    if device_memory_gib is not None:
        return int(device_memory_gib * GiB), "--device-memory"
    stats = None
    try:
        stats = devices[0].memory_stats()
    except Exception:  # noqa: BLE001 - topology devices and some backends have none
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{devices[0].device_kind} memory_stats()"
    if devices[0].platform == "cpu" and hasattr(os, "sysconf"):
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return ram // n, f"host RAM {ram / GiB:.1f} GiB shared by {n} CPU device(s)"
    return None, "unknown (pass --device-memory GiB)"


def _abstract(tree, shardings):
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _like_params(opt_state, params):
    """Optimizer-state leaves shaped like the parameters take their shardings (as `tx.init` on sharded
    parameters gives); the rest (counts) are replicated."""
    structure = jax.tree.structure(params)
    replicated = NamedSharding(jax.tree.leaves(params)[0].sharding.mesh, PartitionSpec())

    def is_params(node) -> bool:
        return jax.tree.structure(node) == structure

    def place(node):
        if is_params(node):
            return _abstract(node, jax.tree.map(lambda p: p.sharding, params))
        return jax.ShapeDtypeStruct(node.shape, node.dtype, sharding=replicated)

    return jax.tree.map(place, opt_state, is_leaf=is_params)


def make_plan(cfg: RunConfig, *, device_memory_gib: float | None = None, topology: str | None = None,
              log=None, only: tuple[str, ...] | None = None) -> MemoryPlan:
    """Compiles the run's rollout, log-prob and update programs on abstract inputs and adds them up
    (`only`: the names of the programs to compile, e.g. `("update",)`; default all)."""
    from dapo_jax.models.decoder import Decoder
    from dapo_jax.models.generation_config import GenerationConfig
    from dapo_jax.models.sharding import check_divisible, partition_spec
    from dapo_jax.parallel.mesh import batch_sharding, make_mesh
    from dapo_jax.sampling.sampler import make_generate
    from dapo_jax.training.loop import _sampler_graphdef, sampling_config
    from dapo_jax.training.train_step import Batch, init_train_state, make_logprob_fn, make_optimizer, make_train_step

    log = log or (lambda *_: None)
    objective = cfg.objective_config
    r, o, m = cfg.rollout, cfg.optim, cfg.mesh
    model_cfg, source = plan_model_config(cfg)
    devices = plan_devices(cfg, topology)
    mesh = make_mesh(m.data, m.fsdp, m.tensor, devices=devices)
    check_divisible(model_cfg, mesh)
    capacity, capacity_source = _capacity(devices, len(devices), device_memory_gib)
    s, t, g = cfg.data.max_prompt_length, r.max_new_tokens, r.G
    programs: dict[str, Program] = {}

    def compile_(name, fn, *args):
        if only is not None and name not in only:
            return
        log(f"compiling {name} ...")
        programs[name] = Program.of(name, fn.lower(*args).compile())

    with jax.set_mesh(mesh):
        graphdef, params = nnx.split(nnx.eval_shape(lambda: Decoder(model_cfg, rngs=nnx.Rngs(0))))
        params = nnx.map_state(lambda path, v: v.replace(jax.ShapeDtypeStruct(
            v.get_value().shape, v.get_value().dtype, sharding=NamedSharding(mesh, partition_spec(path)))), params)
        tx, schedule = make_optimizer(o, decay_steps=cfg.train.steps * o.num_minibatches)
        state = jax.eval_shape(lambda p: init_train_state(p, tx), params)
        scalar = NamedSharding(mesh, PartitionSpec())
        state = state._replace(params=params, opt_state=_like_params(state.opt_state, params),
                               step=_abstract(state.step, scalar), skipped=_abstract(state.skipped, scalar))
        rows = batch_sharding(mesh)
        sds = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rows)  # noqa: E731
        fake_tokenizer = types.SimpleNamespace(pad_token_id=model_cfg.pad_token_id or 0, eos_token_id=None)
        scfg = sampling_config(cfg, fake_tokenizer, model_cfg, generation=GenerationConfig())
        key = jax.ShapeDtypeStruct((2,), jnp.uint32)
        prompts = (sds((r.gen_batch, s), jnp.int32), sds((r.gen_batch, s), jnp.int32))
        compile_("rollout", make_generate(_sampler_graphdef(cfg, graphdef, model_cfg), scfg, g), params, *prompts, key)
        if cfg.data.eval is not None:
            escfg = sampling_config(cfg, fake_tokenizer, model_cfg, eval_mode=True, generation=GenerationConfig())
            compile_("eval rollout", make_generate(graphdef, escfg, cfg.train.eval_k), params, *prompts, key)

        p = r.train_batch
        f32 = lambda: sds((p, g, t), jnp.float32)  # noqa: E731
        batch = Batch(sds((p, s), jnp.int32), sds((p, s), jnp.int32), sds((p, g, t), jnp.int32), f32(), f32(), f32(),
                      f32(), f32() if objective.needs_behaviour_logp else None,
                      f32() if objective.uses_critic and objective.nll_coef else None)
        if cfg.recompute_old_logp or objective.needs_reference:
            logprob = make_logprob_fn(graphdef, temperature=scfg.logprob_temperature)
            compile_("logprob", logprob, params, *batch[:4])
        step = make_train_step(graphdef, tx, schedule, objective=objective, num_minibatches=o.num_minibatches,
                               micro_batches=o.micro_batches, temperature=scfg.logprob_temperature,
                               use_ref=objective.needs_reference and objective.kl_in == "loss")
        compile_("update", step, state, batch)

    params_b, opt_b = shard_bytes(params), shard_bytes(state.opt_state)
    state_b = shard_bytes(state)
    reference = params_b if objective.needs_reference else 0
    critic = 0
    if objective.uses_critic:  # a value model (the trunk + a scalar head) with its own AdamW state
        critic_params = params_b + (model_cfg.hidden_size + 1) * 4
        critic = critic_params + 2 * critic_params
    resident = params_b + opt_b + reference + critic
    phases = {}
    for name, prog in programs.items():
        if name == "update":
            phases[name] = resident - state_b + prog.arguments + prog.outputs - prog.aliased + prog.temporaries
        else:  # the parameters in its arguments are the resident ones
            phases[name] = resident - params_b + prog.arguments + prog.outputs + prog.temporaries
    ways = mesh.shape["data"] * mesh.shape["fsdp"]
    kv_dtype = jnp.dtype(cfg.sampler_dtype).itemsize
    slots = r.gen_batch * s + r.gen_batch * g * max(t - 1, 0)
    kv_cache = 2 * model_cfg.num_hidden_layers * slots * model_cfg.num_key_value_heads * model_cfg.head_dim * kv_dtype
    num_params = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    return MemoryPlan(
        mesh=dict(mesh.shape), devices=f"{len(devices)} x {devices[0].device_kind}", model_source=source,
        num_params=num_params, params=params_b, opt_state=opt_b, reference=reference, critic=critic,
        kv_cache=kv_cache // ways, programs=programs, phases=phases, capacity=capacity,
        capacity_source=capacity_source,
    )


def human(x: int) -> str:
    """Bytes in the largest unit that keeps a figure >= 1: `12.3 MiB`."""
    for unit, size in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= size:
            return f"{x / size:.2f} {unit}"
    return f"{x} B"


def format_plan(plan: MemoryPlan) -> str:
    """The per-device table `dapo-jax plan` prints (every figure also exact, in bytes, in `plan_dict`)."""
    mesh = ", ".join(f"{k}={v}" for k, v in plan.mesh.items())
    row = lambda label, x: f"  {label:<34} {human(x):>12}"  # noqa: E731
    lines = [
        f"model: {plan.num_params / 1e6:.1f}M parameters ({plan.model_source})",
        f"mesh: {mesh} on {plan.devices}; every figure is per device",
        row("parameters", plan.params),
        row("optimizer state", plan.opt_state),
        row("reference model", plan.reference),
        row("critic (parameters + optimizer)", plan.critic),
        row("resident", plan.resident),
        row("KV cache (in the rollout's temporaries)", plan.kv_cache),
    ]
    for prog in plan.programs.values():
        lines.append(f"  program {prog.name:<13} arguments {human(prog.arguments):>11}  outputs {human(prog.outputs):>11}"
                     f"  temporaries {human(prog.temporaries):>11}  aliased {human(prog.aliased):>11}")
    for name, total in plan.phases.items():
        lines.append(row(f"phase {name}", total))
    cap = "unknown" if plan.capacity is None else human(plan.capacity)
    lines.append(f"peak {human(plan.peak)} ({plan.peak_phase}) of {cap} per device [{plan.capacity_source}]")
    if not plan.fits:
        lines.append(f"WARNING: will not fit: the {plan.peak_phase} phase needs {human(plan.peak)} per device, "
                     f"{human(plan.peak - plan.capacity)} more than the {human(plan.capacity)} available")
    return "\n".join(lines)


def plan_dict(plan: MemoryPlan) -> dict:
    """The plan as JSON-able numbers (bytes)."""
    out = dataclasses.asdict(plan)
    out.update(resident=plan.resident, peak=plan.peak, peak_phase=plan.peak_phase, fits=plan.fits)
    return out


def set_cpu_devices(n: int) -> None:
    """`n` virtual CPU devices; must run before JAX starts its backends."""
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError as e:
        raise ConfigError(f"--cpu-devices {n}: {e}") from e


__all__ = ["KNOWN_SHAPES", "MemoryPlan", "Program", "format_plan", "human", "make_plan", "plan_dict", "plan_model_config",
           "set_cpu_devices", "shard_bytes"]
