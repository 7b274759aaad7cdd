"""A run's whole configuration: YAML -> frozen, validated pydantic models.

    cfg = load_config("tiny_dapo", ["rollout.G=8", "train.run_dir=runs/x"])   # a packaged recipe, or a path


Every section forbids unknown keys. A bad key, a wrong type or an impossible value (G < 2,
a batch that does not split over the mesh, eps_high < eps_low, ...) raises `ConfigError`
naming the dotted key and the file, before any model is loaded. The objective is picked by
name through `dapo_jax.objectives.registry.load_objective`; nothing else looks at the name.

The sections live beside this file, one module per idea: `sections.py` (model, rollout, optim, lora, critic,
mesh, train, distill), `data.py`, `objective.py`, `reward.py` and `agent.py` (each with its checks against
the run); `overrides.py` reads a file and the command line into a tree, `keys.py` lists the keys and suggests
near ones, `paths.py` finds recipes and files, and `resolve.py` fills the fast paths a config leaves unset.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pydantic
import yaml
from pydantic import ValidationInfo, model_validator

from dapo_jax.objectives.off_policy import recompute_old_logp
from dapo_jax.training.config.agent import AgentSection, agent_checks
from dapo_jax.training.config.base import ConfigError, KeyedError, Section, did_you_mean
from dapo_jax.training.config.data import DataSection
from dapo_jax.training.config.keys import suggest
from dapo_jax.training.config.objective import ObjectiveSection, check_objective
from dapo_jax.training.config.overrides import anchor_paths, drop_stale_options, parse_overrides, set_dotted
from dapo_jax.training.config.paths import DEFAULT_CONFIG, find_config, recipes
from dapo_jax.training.config.reward import RewardSection, reward_checks
from dapo_jax.training.config.sections import (CriticSection, DistillSection, LoRASection, MeshSection, ModelSection,
                                               OptimSection, RolloutSection, TrainSection)


class RunConfig(Section):
    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    objective: ObjectiveSection = ObjectiveSection()
    rollout: RolloutSection = RolloutSection()
    optim: OptimSection = OptimSection()
    critic: CriticSection | None = None
    lora: LoRASection | None = None
    mesh: MeshSection = MeshSection()
    train: TrainSection = TrainSection()
    reward: RewardSection = RewardSection()
    distill: DistillSection | None = None  # on-policy distillation from a teacher; None = off
    agent: AgentSection | None = None  # multi-turn episodes with tools (docs/agents.md); None = single turns

    @model_validator(mode="before")
    @classmethod
    def _critic_inherits_optim(cls, data):
        """A `critic` section names what differs from `optim`: its other keys are `optim`'s (but `epochs`, the
        policy's: the critic makes one pass)."""
        if isinstance(data, dict) and isinstance(data.get("critic"), dict) and isinstance(data.get("optim"), dict):
            inherited = {k: v for k, v in data["optim"].items() if k != "epochs"}
            data = {**data, "critic": {**inherited, **data["critic"]}}
        return data

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> "RunConfig":
        r, o, m = self.rollout, self.optim, self.mesh
        shards = m.data * m.fsdp
        checks = [
            ("rollout.train_batch", r.train_batch % (o.num_minibatches * o.micro_batches) == 0,
             f"train_batch={r.train_batch} must split into num_minibatches={o.num_minibatches} x "
             f"micro_batches={o.micro_batches}"),
            ("rollout.train_batch", (r.train_batch // (o.num_minibatches * o.micro_batches or 1)) % shards == 0,
             f"each micro-batch of train_batch={r.train_batch} must split over the mesh's data*fsdp={shards} "
             f"devices (train_batch divisible by num_minibatches*micro_batches*data*fsdp)"),
            ("rollout.gen_batch", r.gen_batch % shards == 0,
             f"gen_batch={r.gen_batch} is not divisible over the mesh's data*fsdp={shards}"),
            ("rollout.max_gen_batches", r.max_gen_batches * r.gen_batch >= r.train_batch,
             f"max_gen_batches*gen_batch={r.max_gen_batches * r.gen_batch} can never fill "
             f"train_batch={r.train_batch}"),
            ("rollout.continuous", not (r.continuous and r.compaction),
             "continuous batching and rollout.compaction are alternatives: turn one off"),
            ("rollout.continuous", not (r.continuous and r.max_new_tokens < 2),
             f"continuous batching needs max_new_tokens >= 2, got {r.max_new_tokens}"),
            ("rollout.continuous_cap", r.continuous or not r.continuous_cap,
             "continuous_cap caps continuous batching's admissions: set rollout.continuous=true too"),
            ("rollout.continuous_refill", r.continuous_refill is None or r.gen_batch % r.continuous_refill == 0,
             f"continuous_refill={r.continuous_refill} must divide gen_batch={r.gen_batch} (groups are scored "
             f"continuous_refill at a time: one shape, one compilation)"),
            ("reward.functions", len(self.reward.functions) > 0, "at least one reward function is needed"),
            ("optim.packing_rows", o.packing_rows is None or (o.packing_rows % shards == 0 and o.packing_rows >= r.G),
             f"packing_rows={o.packing_rows} must be >= G={r.G} (a chunk holds whole groups) and divisible over "
             f"the mesh's data*fsdp={shards}"),
            ("optim.packing_tail_rows", o.packing_tail_rows is None or o.packing_tail_rows % shards == 0,
             f"packing_tail_rows={o.packing_tail_rows} must be divisible over the mesh's data*fsdp={shards}"),
            ("critic", r.train_batch % (self.critic_optim.num_minibatches * self.critic_optim.micro_batches
                                        * shards) == 0,
             f"train_batch={r.train_batch} must split into the critic's num_minibatches x micro_batches x the "
             f"mesh's data*fsdp={shards}"),
            ("critic.epochs", self.critic_optim.epochs == 1,
             f"epochs={self.critic_optim.epochs}: the critic makes one pass over each rollout batch (optim.epochs "
             f"repeats the policy's update only)"),
        ]
        checks += reward_checks(self.reward, m)
        for key, ok, msg in checks:
            if not ok:
                raise KeyedError(key, msg)
        check_objective(self.objective, response_tokens=self.response_tokens, rollout=r, optim=o, reward=self.reward,
                        mesh=m, distill=self.distill, agent=self.agent, context=info.context or {})
        return self

    @model_validator(mode="after")
    def _mixture_fits(self) -> "RunConfig":
        """A data mixture's sources may each have their own reward functions: the reward is then one
        number per response (`training/mixture.py`), so the objectives that read each function's
        part or a rule's steps are not available with one."""
        if self.data.sources is None:
            return self
        objective = self.objective_config
        if objective.sums_normalised_rewards:
            raise KeyedError("data.sources", "objective.multi_reward=normalize_then_sum combines each reward "
                             "function's own reward, and a mixture's sources have their own functions: use "
                             "multi_reward=sum, or one source")
        if objective.needs_step_rewards:
            raise KeyedError("data.sources", f"advantage={objective.advantage!r} needs step rewards: not with a "
                             f"mixture of sources yet")
        return self

    @model_validator(mode="after")
    def _agent_fits(self) -> "RunConfig":
        """A multi-turn run (`agent`): its limits and settings fit episodes (`agent.agent_checks`)."""
        if self.agent is None:
            return self
        named_discount = self.objective.build(max_response_length=self.response_tokens).process_discount
        checks = agent_checks(self.agent, objective=self.objective_config, objective_name=self.objective.name,
                              named_discount=named_discount, slots=self.agent_cache_slots, rollout=self.rollout,
                              data=self.data, mesh=self.mesh, distill=self.distill)
        for key, ok, msg in checks:
            if not ok:
                raise KeyedError(key, msg)
        return self

    @property
    def agent_cache_slots(self) -> int:
        """The multi-turn engine's KV slots per row (`agent.cache_slots`, else prompt + episode: each row writes
        its own ids at its own index, agents/engine.py)."""
        a = self.agent
        if a.cache_slots is not None:
            return a.cache_slots
        return self.data.max_prompt_length + a.max_episode_tokens

    @property
    def sampler_dtype(self) -> str:
        """The sampler's compute dtype (`rollout.sampler_dtype`, else the trainer's `model.dtype`)."""
        return self.rollout.sampler_dtype or self.model.dtype

    @property
    def recompute_old_logp(self) -> bool:
        """`rollout.recompute_old_logp` when set, else recompute when the sampler and the trainer compute
        in different dtypes or an off-policy correction needs π_old apart from μ (`off_policy.recompute_old_logp`)."""
        objective = self.objective_config
        if objective.off_policy_bypass and self.rollout.recompute_old_logp is None:
            return False  # bypass mode: π_old is the sampler's (objectives/config.py)
        return recompute_old_logp(self.rollout.recompute_old_logp, sampler_dtype=self.sampler_dtype,
                                  trainer_dtype=self.model.dtype,
                                  correction=objective.off_policy_correction if objective.needs_recomputed_old_logp
                                  else None)

    @property
    def critic_optim(self) -> CriticSection:
        """The `critic` section, or `optim`'s values when there is none (one pass: `optim.epochs` is the policy's)."""
        return self.critic if self.critic is not None else CriticSection(**{**self.optim.model_dump(), "epochs": 1})

    @functools.cached_property
    def objective_config(self):
        """The resolved `ObjectiveConfig` (frozen, hashable: a static jit argument); an agent run's
        `agent.discount` is its `process_discount`."""
        cfg = self.objective.build(max_response_length=self.response_tokens)
        if self.agent is not None and self.agent.discount != 1.0:
            cfg = cfg.model_copy(update={"process_discount": self.agent.discount})
        return cfg

    @property
    def response_tokens(self) -> int:
        """T, the update's response width: `agent.max_episode_tokens` in a multi-turn run (model and tool ids
        after the prompt), else `rollout.max_new_tokens`. It is also L_max, the overlong shaping's length
        (counted in model ids only for episodes), unless the objective sets max_response_length."""
        return self.agent.max_episode_tokens if self.agent is not None else self.rollout.max_new_tokens

    def to_yaml(self) -> str:
        data = self.model_dump(mode="json")
        resolved = self.objective_config
        dump = resolved.model_dump(mode="json") if hasattr(resolved, "model_dump") else {}
        dump.pop("name", None)
        data["objective"] = {"name": self.objective.name, **dump}
        return yaml.safe_dump(data, sort_keys=False)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Reads `path` (None = the embedded default; a recipe name or path: `find_config`), applies dotted
    overrides, validates everything.

    Relative paths in the file are looked up beside the file first (`overrides.anchor_paths`); relative paths
    in overrides are relative to the working directory, as typed in a shell.
    """
    path = find_config(path) if path is not None else DEFAULT_CONFIG
    if path.is_dir():
        path = path / "config.yaml"
    if not path.exists():
        stem = path.name.removesuffix(".yaml").removesuffix(".yml")
        raise ConfigError(f"config file {path} does not exist{did_you_mean(stem, recipes())}; the packaged "
                          f"recipes (by name): {', '.join(recipes())}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    anchor_paths(data, path.resolve().parent)
    parsed = parse_overrides(overrides)
    for key, value in parsed:
        set_dotted(data, key, value, str(path))
    drop_stale_options(data, {key for key, _ in parsed})
    return config_from_dict(data, source=str(path), overridden={key for key, _ in parsed})


def config_from_dict(data: dict, *, source: str = "<dict>", overridden: set[str] = frozenset()) -> RunConfig:
    """Validates a config tree; `overridden` (the dotted keys given on the command line) lets an error
    say whether a value came from the file or the command line."""
    try:
        return RunConfig.model_validate(data, context={"source": source, "overridden": set(overridden)})
    except pydantic.ValidationError as e:
        lines = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"]) or "<root>"
            ctx = err.get("ctx", {}).get("error")
            if isinstance(ctx, KeyedError):
                key = ctx.key if key == "<root>" else f"{key}.{ctx.key}" if not ctx.key.startswith(key) else ctx.key
                lines.append(f"{source}: {key}: {ctx.msg}")
                continue
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                lines.append(f"{source}: {key}: unknown key{suggest(err['loc'], RunConfig)}")
                continue
            lines.append(f"{source}: {key}: {msg} (got {err.get('input')!r})")
        raise ConfigError("; ".join(lines)) from None  # one line: the file, the dotted key, what is wrong


def save_config(config: RunConfig, run_dir: str | Path) -> Path:
    """Writes the resolved config to `run_dir/config.yaml` (what a resume and `eval` reload)."""
    out = Path(run_dir) / "config.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".yaml.tmp")
    tmp.write_text(config.to_yaml())
    tmp.replace(out)
    return out
