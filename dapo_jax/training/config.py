"""A run's whole configuration: YAML -> frozen, validated pydantic models.

    cfg = load_config("configs/tiny_dapo.yaml", ["rollout.G=8", "train.run_dir=runs/x"])

Every section forbids unknown keys. A bad key, a wrong type or an impossible value (G < 2,
a batch that does not split over the mesh, eps_high < eps_low, ...) raises `ConfigError`
naming the dotted key and the file, before any model is loaded. The objective is picked by
name through `dapo_jax.objectives.registry.load_objective`; nothing else looks at the name.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "tiny_dapo.yaml"


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the key and the file."""


class _Section(BaseModel):
    # inf/NaN are never a valid setting (`optim.lr=.inf` would NaN every parameter): refuse them here.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelSection(_Section):
    path: str = "dapo_jax/assets/tiny_base"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    param_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    remat: Literal["none", "full", "dots_saveable"] = "none"
    # attention without a KV cache (update, log-probs, critic, prefill): models/attention.py. auto = splash on
    # TPU, gpu_flash on GPU, on CPU reference for short rows and blockwise for long ones
    attention: Literal["auto", "reference", "blockwise", "splash", "gpu_flash"] = "auto"


class SourceSection(_Section):
    """One prompt source: the built-in synthetic task, or a file / folder / hub name read by `dapo_jax.data`."""

    name: str = "synthetic"  # "synthetic", a .jsonl/.json/.parquet/.csv file, a saved dataset dir, or a hub name
    split: str = "train"
    format: str = "synthetic"  # dapo_jax.data.datasets.FORMATS: gsm8k, math500, dapo_math, aime, amc, custom, ...
    prompt_field: str | None = None  # override the format's field paths (dotted)
    answer_field: str | None = None
    template: Literal["raw", "dapo", "chat", "dapo_chat"] = "raw"
    limit: int | None = Field(default=None, gt=0)
    options: dict[str, Any] = Field(default_factory=dict)  # synthetic task only: max_operand, ops, heldout_size


class DataSection(_Section):
    train: SourceSection = SourceSection()
    eval: SourceSection | None = SourceSection(split="heldout")
    eval_size: int = Field(default=64, gt=0)
    max_prompt_length: int = Field(default=64, gt=0)
    seed: int = 0


class ObjectiveSection(_Section):
    """`{name: dapo, eps_high: 0.3, ...}`: a registered objective plus field overrides."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str = "dapo"

    @property
    def overrides(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def build(self, *, max_response_length: int | None = None):
        """The `ObjectiveConfig` this section names; `max_response_length` fills the objective's if unset."""
        from dapo_jax.objectives.registry import load_objective

        cfg = load_objective(self.name, **self.overrides)
        if cfg.max_response_length is None and max_response_length is not None:
            cfg = load_objective(self.name, **{**self.overrides, "max_response_length": max_response_length})
        return cfg


class RolloutSection(_Section):
    G: int = Field(default=8, ge=2)
    train_batch: int = Field(default=8, gt=0)  # prompts (groups) per optimizer batch
    gen_batch: int = Field(default=16, gt=0)  # prompts generated per dynamic-sampling round
    max_gen_batches: int = Field(default=10, gt=0)
    on_starvation: Literal["fail", "train_on_kept"] = "fail"
    carry_surplus: bool = False
    # Recompute log π_old with the trainer instead of taking the sampler's log-probs; None = follow
    # precision (`RunConfig.recompute_old_logp`): recompute when sampler_dtype differs from model.dtype
    # or an objective.off_policy_correction is on. An explicit true / false wins.
    recompute_old_logp: bool | None = None
    # The rollout sampler's compute dtype (same parameters); None = model.dtype. Evaluation keeps model.dtype.
    sampler_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    # One-step off-policy rollouts (training/overlap.py): step k+1 is generated with the params before
    # update k while that update runs; needs an objective.off_policy_correction (e.g. dapo_tis).
    overlap: bool = False
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    max_new_tokens: int = Field(default=16, gt=0)
    # Active-row compaction (dapo_jax/sampling/compaction.py): once at most half the rows are still
    # decoding, go on with a batch of half the size (down to compaction_min_rows); same rollout.
    compaction: bool = False
    compaction_min_rows: int = Field(default=8, ge=1)
    # Continuous batching (dapo_jax/sampling/continuous.py): gen_batch x G row slots decoding at once,
    # finished rows refilled with the next prompts, continuous_refill prompts at a time (None = a
    # quarter of gen_batch, dividing it), and dynamic sampling judging the groups in admission order
    # as they complete, that many at a time; one process only.
    continuous: bool = False
    continuous_refill: int | None = Field(default=None, ge=1)
    # Admit only the prompts the step still needs (the groups missing over the fraction kept so
    # far): ~40x fewer tokens drawn for dropped groups on cot_dapo, but fewer rows decoding at
    # once, which made the rollout slower on a 2-core CPU (docs/benchmarks.md, "Ragged rollouts").
    continuous_cap: bool = False


class OptimSection(_Section):
    lr: float = Field(default=1e-6, gt=0)
    warmup_steps: int = Field(default=0, ge=0)
    schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    weight_decay: float = Field(default=0.1, ge=0)
    b1: float = Field(default=0.9, ge=0, lt=1)
    b2: float = Field(default=0.999, ge=0, lt=1)
    eps: float = Field(default=1e-8, gt=0)
    grad_clip: float | None = Field(default=1.0, gt=0)
    num_minibatches: int = Field(default=1, gt=0)
    micro_batches: int = Field(default=1, gt=0)
    # Padding-free policy update (training/packed_step.py): the real tokens of every (prompt, response)
    # packed end to end into chunks of packing_rows x (max_prompt_length + max_new_tokens); same result.
    packing: bool = False
    # responses per chunk; None = half a micro-batch's, >= G, a multiple of data*fsdp
    # (packed_step.default_chunk_rows)
    packing_rows: int | None = Field(default=None, gt=0)
    # shorter chunks for the groups the last chunk would hold, of a multiple of this many rows, used when
    # they take fewer rows; None = a quarter of packing_rows (packed_step.default_tail_rows), 0 = none;
    # a multiple of data*fsdp
    packing_tail_rows: int | None = Field(default=None, ge=0)
    # a group's responses in one packed row share one copy of their prompt (data/packing.py); same result
    packing_share_prompts: bool = True


class LoRASection(_Section):
    """LoRA adapters (models/lora.py) on every layer's `targets` projections: only they are trained and
    checkpointed; the base weights stay frozen and are the reference policy. No `lora` section (or
    `lora=null`) = full fine-tuning."""

    rank: int = Field(default=8, gt=0)
    alpha: float = Field(default=16.0, gt=0)  # the update is scaled by alpha / rank, as in PEFT
    targets: list[Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> "LoRASection":
        if len(set(self.targets)) != len(self.targets):
            raise _KeyedError("targets", f"{self.targets} names a projection twice")
        return self


class CriticSection(OptimSection):
    """The critic's own optimizer, learning rate and update split, read only when the objective has a
    critic (`advantage: gae`: PPO, VAPO); `path`: the Hugging Face folder whose decoder weights start
    its trunk (None = model.path, the policy's initial weights). No `critic` section = `optim`'s values;
    a partial one takes `optim`'s values for the keys it does not name."""

    path: str | None = None


class DistributedSection(_Section):
    coordinator: str | None = None
    num_processes: int | None = Field(default=None, gt=0)
    process_id: int | None = Field(default=None, ge=0)


class MeshSection(_Section):
    data: int = Field(default=1, gt=0)
    fsdp: int = Field(default=1, gt=0)
    tensor: int = Field(default=1, gt=0)
    distributed: DistributedSection | None = None


class WandbSection(_Section):
    """Weights & Biases settings, used when `train.loggers` lists `wandb` (see dapo_jax.training.loggers)."""

    project: str = "dapo-jax"
    entity: str | None = None
    name: str | None = None  # None = the run dir's name
    group: str | None = None
    tags: list[str] = Field(default_factory=list)
    mode: Literal["online", "offline", "disabled"] | None = None  # None = WANDB_MODE from the environment, else online


class TrainSection(_Section):
    steps: int = Field(default=10, ge=0)
    # also stop once the steps have generated this many responses (Σ generated groups x G, kept or not;
    # the step that passes it is the last): equal-budget comparisons (scripts/league.py); None = steps only
    max_samples: int | None = Field(default=None, gt=0)
    seed: int = 0
    eval_every: int = Field(default=0, ge=0)  # 0 = only at the start and the end
    eval_k: int = Field(default=4, gt=0)
    eval_temperature: float = Field(default=1.0, ge=0)  # 0 = greedy
    eval_top_p: float = Field(default=1.0, gt=0, le=1)
    eval_top_k: int = Field(default=0, ge=0)  # 0 = off
    checkpoint_every: int = Field(default=0, ge=0)  # 0 = only at the end
    keep_checkpoints: int = Field(default=2, gt=0)
    run_dir: str = "runs/tiny_dapo"
    progress: bool = True
    tensorboard: bool = True  # the older switch, read only when `loggers` is not set
    loggers: list[Literal["tensorboard", "wandb"]] | None = None  # None = [tensorboard] if tensorboard else []
    wandb: WandbSection = WandbSection()
    rollouts_every: int = Field(default=50, ge=0)  # RUN_DIR/rollouts/STEP.jsonl every N steps (and the first); 0 = never
    rollouts_sample: int = Field(default=16, gt=0)  # groups (prompts, with all their responses) per logged step
    max_nonfinite_steps: int = Field(default=3, gt=0)  # this many steps in a row with a non-finite update stop the run
    fresh_start: bool = False  # when every checkpoint in run_dir is unreadable: start over instead of failing

    @property
    def active_loggers(self) -> tuple[str, ...]:
        """Where metrics go besides metrics.jsonl: `loggers` when set, else TensorBoard if `tensorboard`."""
        if self.loggers is not None:
            return tuple(dict.fromkeys(self.loggers))
        return ("tensorboard",) if self.tensorboard else ()


class RewardFunction(_Section):
    name: str  # dapo_jax.rewards.REWARDS (integer, dapo_answer, gsm8k, boxed, math_verify, format) or "synthetic"
    weight: float = 1.0
    options: dict[str, Any] = Field(default_factory=dict)  # the check's keyword options


class RewardSection(_Section):
    functions: list[RewardFunction] = Field(default_factory=lambda: [RewardFunction(name="synthetic")])
    right: float | None = None  # None = the objective's reward_correct
    wrong: float | None = None  # None = the objective's reward_wrong
    on_error: Literal["raise", "wrong"] = "wrong"


class RunConfig(_Section):
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

    @model_validator(mode="before")
    @classmethod
    def _critic_inherits_optim(cls, data):
        """A `critic` section names what differs from `optim`: its other keys are `optim`'s."""
        if isinstance(data, dict) and isinstance(data.get("critic"), dict) and isinstance(data.get("optim"), dict):
            data = {**data, "critic": {**data["optim"], **data["critic"]}}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
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
        ]
        from dapo_jax.rewards import REWARDS as known

        checks += [(f"reward.functions.{i}.name", f.name in known, f"unknown reward {f.name!r}; known: {known}")
                   for i, f in enumerate(self.reward.functions)]
        for key, ok, msg in checks:
            if not ok:
                raise _KeyedError(key, msg)
        try:
            objective = self.objective.build(max_response_length=r.max_new_tokens)
            if objective.gfpo:  # GFPO keeps k of the G generated responses: k <= G
                from dapo_jax.training.group_filter import GroupFilter

                GroupFilter(objective, group_size=r.G)
        except (ValueError, TypeError, KeyError, pydantic.ValidationError) as e:
            raise _KeyedError("objective", f"{type(e).__name__}: {e}") from e
        if o.packing and objective.kind == "gdpo":
            raise _KeyedError("optim.packing", "kind='gdpo' is not supported packed (its groups_used metric counts "
                              "the batch's prompts): set optim.packing=false")
        from dapo_jax.rewards.steps import STEP_REWARDS

        if objective.needs_step_rewards and self.reward.functions[0].name not in STEP_REWARDS:
            raise _KeyedError("reward.functions.0.name", f"advantage={objective.advantage!r} needs step rewards, and "
                              f"{self.reward.functions[0].name!r} has none (step rewards: {sorted(STEP_REWARDS)})")
        if objective.max_response_length is not None and objective.max_response_length < r.max_new_tokens:
            raise _KeyedError("objective.max_response_length",
                              f"{objective.max_response_length} < rollout.max_new_tokens={r.max_new_tokens}")
        if r.overlap and objective.off_policy_correction is None:
            raise _KeyedError("rollout.overlap", f"overlapped rollouts are one update stale and objective "
                              f"{self.objective.name!r} has no off-policy correction for them: use "
                              f"objective.name=dapo_tis or set objective.off_policy_correction (token_tis, "
                              f"seq_tis, token_mask, seq_mask)")
        if r.overlap and m.distributed is not None and m.distributed.num_processes != 1:
            raise _KeyedError("rollout.overlap", "not in a multi-process run (mesh.distributed): the rollout thread "
                              "and the update would launch collectives in an order that may differ between processes")
        if r.continuous and m.distributed is not None and m.distributed.num_processes != 1:
            raise _KeyedError("rollout.continuous", "not in a multi-process run (mesh.distributed): each process's "
                              "host would decide its own refills, from its own finished groups")
        if objective.off_policy_correction is not None and r.recompute_old_logp is False:
            raise _KeyedError("rollout.recompute_old_logp",
                              f"objective.off_policy_correction={objective.off_policy_correction!r} compares the "
                              f"trainer's log pi_old with the sampler's log mu; with recompute_old_logp=false they "
                              f"are the same array, every weight is 1 and nothing is masked: set it to true or "
                              f"leave it unset (it then follows the correction)")
        return self

    @property
    def sampler_dtype(self) -> str:
        """The sampler's compute dtype (`rollout.sampler_dtype`, else the trainer's `model.dtype`)."""
        return self.rollout.sampler_dtype or self.model.dtype

    @property
    def recompute_old_logp(self) -> bool:
        """`rollout.recompute_old_logp` when set, else recompute when the sampler and the trainer compute
        in different dtypes or an off-policy correction needs π_old apart from μ (`off_policy.recompute_old_logp`)."""
        from dapo_jax.objectives.off_policy import recompute_old_logp

        return recompute_old_logp(self.rollout.recompute_old_logp, sampler_dtype=self.sampler_dtype,
                                  trainer_dtype=self.model.dtype,
                                  correction=self.objective_config.off_policy_correction)

    @property
    def critic_optim(self) -> CriticSection:
        """The `critic` section, or `optim`'s values when there is none."""
        return self.critic if self.critic is not None else CriticSection(**self.optim.model_dump())

    @functools.cached_property
    def objective_config(self):
        """The resolved `ObjectiveConfig` (frozen, hashable: a static jit argument)."""
        return self.objective.build(max_response_length=self.rollout.max_new_tokens)

    def to_yaml(self) -> str:
        data = self.model_dump(mode="json")
        resolved = self.objective_config
        dump = resolved.model_dump(mode="json") if hasattr(resolved, "model_dump") else {}
        dump.pop("name", None)
        data["objective"] = {"name": self.objective.name, **dump}
        return yaml.safe_dump(data, sort_keys=False)


class _KeyedError(ValueError):
    def __init__(self, key: str, msg: str):
        super().__init__(f"{key}: {msg}")
        self.key, self.msg = key, msg


def _set_dotted(tree: dict, dotted: str, value: Any, source: str) -> None:
    keys = dotted.split(".")
    node = tree
    for i, k in enumerate(keys[:-1]):
        child = node.get(k)
        if child is None:
            child = node[k] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: override {dotted!r}: {'.'.join(keys[:i + 1])} is not a section")
        node = child
    node[keys[-1]] = value


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> list[tuple[str, Any]]:
    """`["a.b=3", "c=[1, 2]"]` -> [("a.b", 3), ("c", [1, 2])]; values parsed by `yaml.safe_load`.
    `objective=NAME` is `objective.name=NAME`: another recipe, with the config's objective field overrides."""
    parsed = []
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw.strip() else None
        if key.strip() == "objective" and isinstance(value, str):  # `objective=gfpo`: the recipe by name
            key = "objective.name"
        parsed.append((key.strip(), value))
    return parsed


BUILT_IN_TASKS = ("synthetic", "cot")  # data sources generated in code; `options` are theirs alone
_PATH_KEYS = (("model", "path"), ("data", "train", "name"), ("data", "eval", "name"))


def _anchor_paths(data: dict, config_dir: Path) -> None:
    """A relative model/data path written in a config file means a path beside that file when one
    exists there (made absolute, so the run dir's copy of the config still finds it); otherwise it
    stays as written and `resolve_path` looks in the working directory, then the repository root."""
    for keys in _PATH_KEYS:
        node = data
        for k in keys[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        value = node.get(keys[-1]) if isinstance(node, dict) else None
        if not isinstance(value, str) or value in BUILT_IN_TASKS or Path(value).expanduser().is_absolute():
            continue
        beside = config_dir / value
        if beside.exists():
            node[keys[-1]] = str(beside.resolve())


def _drop_stale_options(data: dict, overridden: set[str]) -> None:
    """An override that points `data.X.name` at a file drops the config file's `data.X.options`
    (they belong to the built-in task it replaces), unless the options are overridden too."""
    for src in ("train", "eval"):
        node = (data.get("data") or {}).get(src)
        if (f"data.{src}.name" in overridden and f"data.{src}.options" not in overridden
                and isinstance(node, dict) and node.get("name") not in BUILT_IN_TASKS):
            node.pop("options", None)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Reads `path` (None = the embedded default), applies dotted overrides, validates everything.

    Relative paths in the file are looked up beside the file first (`_anchor_paths`); relative paths
    in overrides are relative to the working directory, as typed in a shell.
    """
    path = Path(path) if path is not None else DEFAULT_CONFIG
    if path.is_dir():
        path = path / "config.yaml"
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    _anchor_paths(data, path.resolve().parent)
    parsed = parse_overrides(overrides)
    for key, value in parsed:
        _set_dotted(data, key, value, str(path))
    _drop_stale_options(data, {key for key, _ in parsed})
    return config_from_dict(data, source=str(path))


def config_from_dict(data: dict, *, source: str = "<dict>") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except pydantic.ValidationError as e:
        lines = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"]) or "<root>"
            ctx = err.get("ctx", {}).get("error")
            if isinstance(ctx, _KeyedError):
                key = ctx.key if key == "<root>" else f"{key}.{ctx.key}" if not ctx.key.startswith(key) else ctx.key
                lines.append(f"{source}: {key}: {ctx.msg}")
                continue
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
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


def resolve_path(path: str | Path) -> Path:
    """A path as given if it exists (or is absolute), else relative to the repository root."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    candidate = REPO_ROOT / p
    return candidate if candidate.exists() else p
