"""A run's whole configuration: YAML -> frozen, validated pydantic models.

    cfg = load_config("tiny_dapo", ["rollout.G=8", "train.run_dir=runs/x"])   # a packaged recipe, or a path


Every section forbids unknown keys. A bad key, a wrong type or an impossible value (G < 2,
a batch that does not split over the mesh, eps_high < eps_low, ...) raises `ConfigError`
naming the dotted key and the file, before any model is loaded. The objective is picked by
name through `dapo_jax.objectives.registry.load_objective`; nothing else looks at the name.
"""

from __future__ import annotations

import difflib
import functools
import math
import typing
import warnings
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.objectives.off_policy import recompute_old_logp
from dapo_jax.objectives.registry import CONFIG_DIR as OBJECTIVES, load_objective
from dapo_jax.rewards import REWARDS
from dapo_jax.rewards.custom import is_custom_name
from dapo_jax.rewards.reward_model import LEARNED_REWARDS
from dapo_jax.rewards.steps import STEP_REWARDS
from dapo_jax.training.group_filter import GroupFilter

PACKAGE_DIR = Path(__file__).resolve().parents[2]
# The folder holding the package: the checkout in a clone or an editable install, site-packages in a
# wheel install. Relative paths the packaged recipes name (`dapo_jax/assets/tiny_base`) resolve there.
REPO_ROOT = PACKAGE_DIR.parent
CONFIG_DIR = PACKAGE_DIR / "configs"  # the recipes ship inside the package, so any install finds them
DEFAULT_CONFIG = CONFIG_DIR / "tiny_dapo.yaml"


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the key and the file."""


class _Section(BaseModel):
    # inf/NaN are never a valid setting (`optim.lr=.inf` would NaN every parameter): refuse them here.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelSection(_Section):
    path: str = "dapo_jax/assets/tiny_base"  # a Hugging Face folder: config.json, safetensors weights, tokenizer
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # compute dtype (norms, softmax stay float32)
    param_dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # the master weights and Adam moments
    remat: Literal["none", "full", "dots_saveable"] = "none"  # recompute activations in the backward pass
    # attention without a KV cache (update, log-probs, critic, prefill): models/attention.py. auto = splash on
    # TPU, gpu_flash on GPU, on CPU reference for short rows and blockwise for long ones
    attention: Literal["auto", "reference", "blockwise", "splash", "gpu_flash"] = "auto"
    # resume although model.path's weights, tokenizer or config files changed since the run started (logged;
    # training/state/model_identity.py)
    accept_changed: bool = False


class SourceSection(_Section):
    """One prompt source: the built-in synthetic task, or a file / folder / hub name read by `dapo_jax.data`."""

    name: str = "synthetic"  # "synthetic", a .jsonl/.json/.parquet/.csv file, a saved dataset dir, or a hub name
    split: str = "train"  # the split of a hub dataset or of the built-in tasks (train / heldout)
    format: str = "synthetic"  # dapo_jax.data.datasets.FORMATS: gsm8k, math500, dapo_math, aime, amc, custom, ...
    prompt_field: str | None = None  # override the format's field paths (dotted)
    answer_field: str | None = None  # likewise for the answer
    # prompt text: data/templates.py (r1_zero, R1-Zero's <think>/<answer> conversation: docs/rewards.md)
    template: Literal["raw", "dapo", "chat", "dapo_chat", "r1_zero", "r1_zero_chat"] = "raw"
    limit: int | None = Field(default=None, gt=0)  # the first N problems only
    options: dict[str, Any] = Field(default_factory=dict)  # synthetic task only: max_operand, ops, heldout_size


class MixtureSource(_Section):
    """One source of a data mixture, `data.sources.NAME` (docs/mixtures.md, data/mixture.py)."""

    train: SourceSection = SourceSection()  # its prompts: any source data.train can name
    weight: float = Field(default=1.0, gt=0)  # sampling proportion: each prompt drawn is this source's w.p. w / Σ w
    reward: RewardSection | None = None  # its reward functions; None = the run's reward section


class DifficultySection(_Section):
    """Difficulty filtering (training/difficulty.py): a prompt every response of which was right (or wrong)
    in each of its last `visits` visits is drawn no more."""

    visits: int = Field(default=2, gt=0)  # k: the visits that must all agree
    drop: Literal["all_right", "all_wrong", "both"] = "all_right"  # solved prompts, unsolved ones, or both


class DataSection(_Section):
    train: SourceSection = SourceSection()
    eval: SourceSection | None = SourceSection(split="heldout")
    eval_size: int = Field(default=64, gt=0)  # held-out problems per evaluation
    max_prompt_length: int = Field(default=64, gt=0)  # in tokens; longer prompts are skipped and counted
    seed: int = 0  # the order prompts are drawn in, and the built-in tasks' problems (both splits)
    order_seed: int | None = None  # the training prompts' order alone (default: seed); experiments vary it per seed
    accept_changed: bool = False  # resume although data.train's path or prompts changed since the run started (logged)
    # a mixture: NAME -> {train, weight, reward}, read instead of data.train (docs/mixtures.md); None = data.train
    sources: dict[str, MixtureSource] | None = None
    difficulty: DifficultySection | None = None  # drop prompts that were all right / all wrong lately; None = off
    # resume with another data section: a new round of training on new data (logged in RUN_DIR/rounds.jsonl)
    new_round: bool = False

    @model_validator(mode="before")
    @classmethod
    def _train_null(cls, data):
        """`data.train: null` beside `data.sources` (a recipe's data.train switched off on the command line)."""
        if isinstance(data, dict) and "train" in data and data["train"] is None and data.get("sources") is not None:
            data = {k: v for k, v in data.items() if k != "train"}
        return data

    @model_validator(mode="after")
    def _one_kind_of_source(self) -> "DataSection":
        if self.sources is None:
            return self
        if not self.sources:
            raise _KeyedError("sources", "an empty mixture: name at least one source, or remove data.sources")
        for name in self.sources:
            if not name or not all(c.isalnum() or c in "_-" for c in name):
                raise _KeyedError(f"sources.{name}", "a source's name is letters, digits, _ and - (it names "
                                  "metrics: source/NAME/accuracy)")
        if self.train != SourceSection():
            raise _KeyedError("train", "a mixture reads data.sources: remove data.train or set it to null (or remove "
                              "data.sources)")
        return self


class ObjectiveSection(_Section):
    """`{name: dapo, eps_high: 0.3, ...}`: a registered objective plus field overrides."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str = "dapo"

    @property
    def overrides(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def build(self, *, max_response_length: int | None = None):
        """The `ObjectiveConfig` this section names; `max_response_length` fills the objective's if unset."""
        for key in self.overrides:
            if key not in ObjectiveConfig.model_fields:
                raise _KeyedError(key, f"unknown objective key{did_you_mean(key, ObjectiveConfig.model_fields)}")
        cfg = load_objective(self.name, **self.overrides)
        if cfg.max_response_length is None and max_response_length is not None:
            cfg = load_objective(self.name, **{**self.overrides, "max_response_length": max_response_length})
        return cfg


class RolloutSection(_Section):
    G: int = Field(default=8, ge=2)  # responses per prompt (the group)
    train_batch: int = Field(default=8, gt=0)  # prompts (groups) per optimizer batch
    gen_batch: int = Field(default=16, gt=0)  # prompts generated per dynamic-sampling round
    max_gen_batches: int = Field(default=10, gt=0)  # dynamic-sampling rounds per step at most
    # when max_gen_batches rounds keep fewer than train_batch groups: stop (exit 3), or train on those kept
    on_starvation: Literal["fail", "train_on_kept"] = "fail"
    carry_surplus: bool = False  # kept groups beyond train_batch go to the next step instead of being dropped
    # Recompute log π_old with the trainer instead of taking the sampler's log-probs; None = follow
    # precision (`RunConfig.recompute_old_logp`): recompute when sampler_dtype differs from model.dtype
    # or an objective.off_policy_correction is on. An explicit true / false wins.
    recompute_old_logp: bool | None = None
    # The rollout sampler's compute dtype (same parameters); None = model.dtype. Evaluation keeps model.dtype.
    sampler_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    # One-step off-policy rollouts (training/overlap.py): step k+1 is generated with the params before
    # update k while that update runs; needs an objective.off_policy_correction (e.g. dapo_tis).
    overlap: bool = False
    temperature: float = Field(default=1.0, gt=0)  # sampling temperature (the log-probs are of logits / T)
    top_p: float = Field(default=1.0, gt=0, le=1)  # nucleus sampling; 1 = off
    top_k: int = Field(default=0, ge=0)  # 0 = off
    max_new_tokens: int = Field(default=16, gt=0)  # the response budget L_max in tokens (EOS included)
    # Active-row compaction (dapo_jax/sampling/compaction.py): once at most half the rows are still
    # decoding (on each batch device: rows never change device), go on with a batch of half the size
    # (down to compaction_min_rows); same rollout.
    # None = on unless rollout.continuous (its alternative) or gen_batch x G cannot halve to
    # compaction_min_rows: chosen by `resolve`
    compaction: bool | None = None
    compaction_min_rows: int = Field(default=8, ge=1)  # the smallest batch compaction goes down to
    # Continuous batching (dapo_jax/sampling/continuous.py): gen_batch x G row slots decoding at once,
    # finished rows refilled with the next prompts, continuous_refill prompts at a time (None = a
    # quarter of gen_batch, dividing it), and dynamic sampling judging the groups in admission order
    # as they complete, that many at a time; one process only.
    continuous: bool = False
    continuous_refill: int | None = Field(default=None, ge=1)  # prompts admitted at a time; None = gen_batch / 4
    # Admit only the prompts the step still needs (the groups missing over the fraction kept so
    # far): ~40x fewer tokens drawn for dropped groups on cot_dapo, but fewer rows decoding at
    # once, which made the rollout slower on a 2-core CPU (docs/benchmarks.md, "Ragged rollouts").
    continuous_cap: bool = False


class OptimSection(_Section):
    lr: float = Field(default=1e-6, gt=0)  # AdamW learning rate (after warm-up)
    warmup_steps: int = Field(default=0, ge=0)  # linear warm-up from 0
    schedule: Literal["constant", "cosine"] = "constant"  # after warm-up; cosine decays to min_lr_ratio * lr
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)  # the cosine schedule's floor
    weight_decay: float = Field(default=0.1, ge=0)  # AdamW's decoupled weight decay
    b1: float = Field(default=0.9, ge=0, lt=1)  # Adam's first-moment decay
    b2: float = Field(default=0.999, ge=0, lt=1)  # Adam's second-moment decay
    eps: float = Field(default=1e-8, gt=0)  # Adam's epsilon
    grad_clip: float | None = Field(default=1.0, gt=0)  # global gradient-norm clip; null = off
    num_minibatches: int = Field(default=1, gt=0)  # optimizer updates per rollout batch
    micro_batches: int = Field(default=1, gt=0)  # gradient accumulation within a mini-batch (same update)
    # Padding-free policy update (training/update/packed_step.py): the real tokens of every (prompt, response)
    # packed end to end into chunks of packing_rows x (max_prompt_length + max_new_tokens); same result.
    # None = on, except for kind=gdpo (its per-prompt metric needs the unpacked layout): chosen by `resolve`
    packing: bool | None = None
    # responses per chunk; None = half a micro-batch's, >= G, a multiple of data*fsdp
    # (packed_step.default_chunk_rows)
    packing_rows: int | None = Field(default=None, gt=0)
    # shorter chunks for the groups the last chunk would hold, of a multiple of this many rows, used when
    # they take fewer rows; None = half of packing_rows (packed_step.default_tail_rows), 0 = none;
    # a multiple of data*fsdp
    packing_tail_rows: int | None = Field(default=None, ge=0)
    # a group's responses in one packed row share one copy of their prompt (data/packing.py); same result
    packing_share_prompts: bool = True


class LoRASection(_Section):
    """LoRA adapters (models/lora.py) on every layer's `targets` projections: only they are trained and
    checkpointed; the base weights stay frozen and are the reference policy. No `lora` section (or
    `lora=null`) = full fine-tuning."""

    rank: int = Field(default=8, gt=0)  # r: A is [in, r], B is [r, out]
    alpha: float = Field(default=16.0, gt=0)  # the update is scaled by alpha / rank, as in PEFT
    # the projections that get adapters (every layer), without repeats
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

    path: str | None = None  # the trunk's starting weights; None = model.path


class DistributedSection(_Section):
    coordinator: str | None = None  # host:port of process 0; all None = read from the cluster's environment
    num_processes: int | None = Field(default=None, gt=0)  # processes in the run (hosts)
    process_id: int | None = Field(default=None, ge=0)  # this process's index
    # how long a process waits for every process of the run to start and join; then one line and exit 7
    start_timeout_s: float = Field(default=300.0, gt=0)


class MeshSection(_Section):
    data: int = Field(default=1, gt=0)  # devices that hold replicas (batch split over data x fsdp)
    fsdp: int = Field(default=1, gt=0)  # devices the parameters are sharded over (ZeRO-3)
    tensor: int = Field(default=1, gt=0)  # tensor parallelism (Megatron-style); heads and vocab must divide
    distributed: DistributedSection | None = None


class WandbSection(_Section):
    """Weights & Biases settings, used when `train.loggers` lists `wandb` (see dapo_jax.training.loggers)."""

    project: str = "dapo-jax"  # the W&B project
    entity: str | None = None  # the W&B team or user; None = the account's default
    name: str | None = None  # None = the run dir's name
    group: str | None = None  # W&B's run group (seeds of one setting, ...)
    tags: list[str] = Field(default_factory=list)  # W&B's run tags
    mode: Literal["online", "offline", "disabled"] | None = None  # None = WANDB_MODE from the environment, else online


class TrainSection(_Section):
    steps: int = Field(default=10, ge=0)  # optimizer steps (rollout + update); a resumed run goes on to it
    # also stop once the steps have generated this many responses (Σ generated groups x G, kept or not;
    # the step that passes it is the last): equal-budget comparisons (scripts/league.py); None = steps only
    max_samples: int | None = Field(default=None, gt=0)
    seed: int = 0  # sampling keys (training and evaluation) and initialisation
    eval_every: int = Field(default=0, ge=0)  # 0 = only at the start and the end
    # stop at the first eval_every evaluation whose eval/accuracy reaches this (early stopping: the bundled
    # base models' warm-ups, scripts/make_*_base.py); the run then ends as at `steps`; None = off
    stop_at_accuracy: float | None = Field(default=None, ge=0, le=1)
    eval_k: int = Field(default=4, gt=0)  # samples per held-out problem (avg@k, pass@k, maj@k)
    eval_temperature: float = Field(default=1.0, ge=0)  # 0 = greedy
    eval_top_p: float = Field(default=1.0, gt=0, le=1)  # 1 = off
    eval_top_k: int = Field(default=0, ge=0)  # 0 = off
    checkpoint_every: int = Field(default=0, ge=0)  # 0 = only at the end
    keep_checkpoints: int = Field(default=2, gt=0)  # the newest N are kept
    run_dir: str = "runs/tiny_dapo"  # metrics, logs, rollouts, checkpoints; rerunning into it resumes
    progress: bool = True  # the progress bar
    tensorboard: bool = True  # the older switch, read only when `loggers` is not set
    loggers: list[Literal["tensorboard", "wandb"]] | None = None  # None = [tensorboard] if tensorboard else []
    wandb: WandbSection = WandbSection()
    # RUN_DIR/rollouts/STEP.jsonl every N steps (and the first); 0 = never
    rollouts_every: int = Field(default=50, ge=0)
    rollouts_sample: int = Field(default=16, gt=0)  # groups (prompts, with all their responses) per logged step
    max_nonfinite_steps: int = Field(default=3, gt=0)  # this many steps in a row with a non-finite update stop the run
    fresh_start: bool = False  # when every checkpoint in run_dir is unreadable: start over instead of failing

    @model_validator(mode="after")
    def _check_stop_at_accuracy(self) -> "TrainSection":
        if self.stop_at_accuracy is not None and not self.eval_every:
            raise ValueError(f"train.stop_at_accuracy={self.stop_at_accuracy} is checked at each eval_every "
                             f"evaluation: set train.eval_every > 0")
        return self

    @property
    def active_loggers(self) -> tuple[str, ...]:
        """Where metrics go besides metrics.jsonl: `loggers` when set, else TensorBoard if `tensorboard`."""
        if self.loggers is not None:
            return tuple(dict.fromkeys(self.loggers))
        return ("tensorboard",) if self.tensorboard else ()


class RewardFunction(_Section):
    # dapo_jax.rewards.REWARDS (integer, dapo_answer, gsm8k, boxed, math_verify, format, synthetic, cot, code,
    # countdown, ...; code and countdown run the response in the sandbox, rewards/sandbox.py), a
    # learned reward model (rewards/reward_model.py): reward_model (outcome), process_reward_model (steps), or
    # your own (rewards/custom.py): module:function, path/to/file.py:function, an http(s):// URL
    name: str
    weight: float = 1.0  # its weight in the combined reward
    # the check's keyword options, the reward model's, or a user function's (form, timeout_s, max_workers,
    # batch_size, threshold, wrong): docs/rewards.md; a NaN or infinite number anywhere in them is refused
    options: dict[str, Any] = Field(default_factory=dict)
    path: str | None = None  # a learned reward model's Hugging Face folder (its weights, config and tokenizer)


def _non_finite(options, prefix: str = "") -> list[tuple[str, float]]:
    """`(dotted key, value)` of every NaN or infinite number in a reward's options (`_Section` refuses
    them in typed fields; options are free-form)."""
    if isinstance(options, dict):
        return [hit for k, v in options.items() for hit in _non_finite(v, f"{prefix}{k}.")]
    if isinstance(options, (list, tuple)):
        return [hit for i, v in enumerate(options) for hit in _non_finite(v, f"{prefix}{i}.")]
    if isinstance(options, float) and not math.isfinite(options):
        return [(prefix.rstrip("."), options)]
    return []


class RewardSection(_Section):
    functions: list[RewardFunction] = Field(default_factory=lambda: [RewardFunction(name="synthetic")])
    right: float | None = None  # None = the objective's reward_correct
    wrong: float | None = None  # None = the objective's reward_wrong
    # a reward that fails on a row (raises; a user function's timeout, NaN, bad result): stop naming the row, or
    # score it wrong and count it in metrics.jsonl's reward_failures/NAME (docs/rewards.md)
    on_error: Literal["raise", "wrong"] = "wrong"


MixtureSource.model_rebuild()  # its `reward` is a RewardSection, defined after it


class DistillSection(_Section):
    """On-policy distillation (objectives/distill.py, docs/stages.md): a frozen teacher scores the student's samples."""

    teacher: str  # a Hugging Face folder with model.path's tokenizer (its size may differ)
    coef: float = Field(default=1.0, gt=0)  # β: the per-token reverse KL's weight in the advantage
    task_weight: float = Field(default=1.0, ge=0)  # w: the task reward's advantage's weight; 0 = distillation alone


class AgentSection(_Section):
    """Multi-turn episodes with tools or an environment (docs/agents.md, dapo_jax/agents): each data row is
    played as G episodes against the environment, and the update trains on the model's ids only."""

    # the environment class: package.module:Name or path/to/file.py:Name (e.g. dapo_jax.agents.examples:CalcEnv)
    env: str
    options: dict[str, Any] = Field(default_factory=dict)  # keyword arguments of the environment's constructor
    max_turns: int = Field(default=4, ge=1)  # model turns per episode
    # T: model and tool (observation) ids after the prompt, the update's response width; rollout.max_new_tokens
    # is then the most ids one turn may draw
    max_episode_tokens: int = Field(default=256, gt=0)
    max_tool_tokens: int = Field(default=64, gt=0)  # ids of one tool message's content; longer ones are cut
    truncation_side: Literal["right", "left"] = "right"  # right keeps a long tool answer's head, left its tail
    step_timeout: float = Field(default=30.0, gt=0)  # seconds for one environment step (its tool calls included)
    # seconds per tool call, for a ToolEnv whose class sets no tool_timeout of its own
    tool_timeout: float = Field(default=10.0, gt=0)
    # KV slots of one row of the multi-turn engine (its prompt and its own episode: each row writes at its own
    # index); None = data.max_prompt_length + max_episode_tokens
    cache_slots: int | None = Field(default=None, gt=0)
    append_width: int = Field(default=32, gt=0)  # observation ids appended to the cache per chunk
    # γ in (0, 1] over the turns with advantage grpo_process: turn k's normalised reward weighs γ^(k − j) in
    # turn j's advantage (the outcome sits on the last turn); 1 = the plain sum (objective process_discount)
    discount: float = Field(default=1.0, gt=0.0, le=1.0)


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
    distill: DistillSection | None = None  # on-policy distillation from a teacher; None = off
    agent: AgentSection | None = None  # multi-turn episodes with tools (docs/agents.md); None = single turns

    @model_validator(mode="before")
    @classmethod
    def _critic_inherits_optim(cls, data):
        """A `critic` section names what differs from `optim`: its other keys are `optim`'s."""
        if isinstance(data, dict) and isinstance(data.get("critic"), dict) and isinstance(data.get("optim"), dict):
            data = {**data, "critic": {**data["optim"], **data["critic"]}}
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
        ]
        known = (*REWARDS, *LEARNED_REWARDS)
        checks += [(f"reward.functions.{i}.name", f.name in known or is_custom_name(f.name),
                    f"unknown reward {f.name!r}; known: {known}, or your own as module:function, "
                    f"path/to/file.py:function or an http(s):// URL") for i, f in enumerate(self.reward.functions)]
        checks += [(f"reward.functions.{i}.options.{key}", False, f"{value} is not a finite number")
                   for i, f in enumerate(self.reward.functions) for key, value in _non_finite(f.options)]
        checks += [(f"reward.functions.{i}.path", (f.path is not None) == (f.name in LEARNED_REWARDS),
                    f"{f.name!r} is a learned reward model: set its path to the model's folder" if f.path is None else
                    f"{f.name!r} is a rule reward: it takes no path") for i, f in enumerate(self.reward.functions)]
        learned = [f.name for f in self.reward.functions if f.name in LEARNED_REWARDS]
        checks.append(("reward.functions", not learned or m.distributed is None or m.distributed.num_processes == 1,
                       f"{learned} are scored on each process's own rows: not in a multi-process run "
                       f"(mesh.distributed) yet"))
        for key, ok, msg in checks:
            if not ok:
                raise _KeyedError(key, msg)
        self._overlong_fits(info.context or {})
        try:
            objective = self.objective.build(max_response_length=self.response_tokens)
            if objective.gfpo:  # GFPO keeps k of the G generated responses: k <= G
                GroupFilter(objective, group_size=r.G)
        except _KeyedError as e:
            raise _KeyedError(f"objective.{e.key}", e.msg) from e
        except (ValueError, TypeError, KeyError, pydantic.ValidationError) as e:
            raise _KeyedError("objective", f"{type(e).__name__}: {e}") from e
        for key in ("reward_correct", "reward_wrong", "reward_weights"):  # the reward's own values: finite
            value = getattr(objective, key)
            values = value if isinstance(value, tuple) else () if value is None else (value,)
            if not all(math.isfinite(v) for v in values):
                raise _KeyedError(f"objective.{key}", f"{value} is not finite")
        o, r = self.optim, self.rollout
        if o.packing and objective.kind == "gdpo":
            raise _KeyedError("optim.packing", "kind='gdpo' is not supported packed (its groups_used metric counts "
                              "the batch's prompts): set optim.packing=false")
        has_prm = any(f.name == "process_reward_model" for f in self.reward.functions)
        if objective.needs_step_rewards and self.reward.functions[0].name not in STEP_REWARDS and not has_prm \
                and self.agent is None:  # an episode's steps are its turns (agents/batch.py)
            raise _KeyedError("reward.functions.0.name", f"advantage={objective.advantage!r} needs step rewards, and "
                              f"{self.reward.functions[0].name!r} has none (step rewards: {sorted(STEP_REWARDS)}, or "
                              f"a process_reward_model)")
        if objective.sums_normalised_rewards:  # the parts are combined on the device (rewards/pipeline.py)
            weights = tuple(float(f.weight) for f in self.reward.functions)
            if objective.overlong_buffer is not None:
                raise _KeyedError("objective.multi_reward", "normalize_then_sum combines the reward functions' own "
                                  "rewards: the soft overlong penalty would be left out; set objective.overlong_buffer=null")
            if objective.reward_weights is not None and tuple(objective.reward_weights) != weights:
                raise _KeyedError("objective.reward_weights", f"{objective.reward_weights} differ from the weights of "
                                  f"reward.functions {weights}: set the weights there only")
        if objective.max_response_length is not None and objective.max_response_length < r.max_new_tokens \
                and self.agent is None:  # an episode's L_max counts its model ids over every turn (_agent_fits)
            raise _KeyedError("objective.max_response_length",
                              f"{objective.max_response_length} < rollout.max_new_tokens={r.max_new_tokens}")
        if self.distill is not None and (objective.uses_critic or objective.kind != "policy_gradient"):
            raise _KeyedError("distill", f"on-policy distillation adds to a policy-gradient objective's token "
                              f"advantages; objective {self.objective.name!r} (kind={objective.kind!r}, advantage="
                              f"{objective.advantage!r}) has none: use dapo, grpo, dr_grpo, ...")
        if objective.supervised and r.temperature != 1.0:
            raise _KeyedError("rollout.temperature", f"{r.temperature}: supervised fine-tuning trains the log-probs "
                              f"of the logits at the rollout temperature; set it to 1 (train.eval_temperature "
                              f"sets the evaluation's)")
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
        if objective.needs_recomputed_old_logp and r.recompute_old_logp is False:
            raise _KeyedError("rollout.recompute_old_logp",
                              f"objective.off_policy_correction={objective.off_policy_correction!r} compares the "
                              f"trainer's log pi_old with the sampler's log mu; with recompute_old_logp=false they "
                              f"are the same array, every weight is 1 and nothing is masked: set it to true or "
                              f"leave it unset (it then follows the correction)")
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
            raise _KeyedError("data.sources", "objective.multi_reward=normalize_then_sum combines each reward "
                              "function's own reward, and a mixture's sources have their own functions: use "
                              "multi_reward=sum, or one source")
        if objective.needs_step_rewards:
            raise _KeyedError("data.sources", f"advantage={objective.advantage!r} needs step rewards: not with a "
                              f"mixture of sources yet")
        return self

    @model_validator(mode="after")
    def _agent_fits(self) -> "RunConfig":
        """A multi-turn run (`agent`): the limits fit together, and what the episode source does not do yet
        is refused by name (the environment itself is imported and tried on the first data row when the run
        starts, before the model loads: training/episode_source.py)."""
        a, r = self.agent, self.rollout
        if a is None:
            return self
        objective = self.objective_config
        named_discount = self.objective.build(max_response_length=self.response_tokens).process_discount
        where, _, name = a.env.rpartition(":")
        slots = self.agent_cache_slots
        checks = [
            ("agent.env", bool(where) and bool(name) and "/" not in name,
             f"{a.env!r}: expected package.module:Name or path/to/file.py:Name"),
            ("rollout.max_new_tokens", r.max_new_tokens <= a.max_episode_tokens,
             f"{r.max_new_tokens} (the most ids one turn may draw) exceeds agent.max_episode_tokens="
             f"{a.max_episode_tokens}, the whole episode's budget"),
            ("agent.tool_timeout", a.tool_timeout < a.step_timeout,
             f"{a.tool_timeout:g} s must be under agent.step_timeout={a.step_timeout:g} s (the step's deadline "
             f"would fire first and end the episode instead of answering)"),
            ("agent.cache_slots", slots > self.data.max_prompt_length,
             f"{slots} slots leave no room after the prompt (data.max_prompt_length={self.data.max_prompt_length})"),
            ("agent", objective.kind == "policy_gradient" and not objective.supervised,
             f"objective {self.objective.name!r} (kind={objective.kind!r}) is not trained on episodes yet: use a "
             f"policy-gradient objective (dapo, grpo, dr_grpo, grpo_process, ppo, ...)"),
            ("agent.discount", a.discount == 1.0 or objective.needs_step_rewards,
             f"{a.discount:g} discounts the turns' rewards: it needs objective advantage grpo_process, not "
             f"{objective.advantage!r} (an outcome estimator reads one reward per episode)"),
            ("agent.discount", a.discount == 1.0 or named_discount in (1.0, a.discount),
             f"{a.discount:g} and objective.process_discount={named_discount:g} both discount the turns: set one "
             f"of them"),
            ("agent", self.distill is None, "on-policy distillation on episodes is not wired yet: remove distill"),
            ("agent", objective.multi_reward != "normalize_then_sum",
             "objective.multi_reward=normalize_then_sum is not wired for episodes yet (an environment's reward has "
             "no per-function parts): use multi_reward=sum"),
            ("agent", not r.continuous, "rollout.continuous: continuous batching of episodes is not wired yet"),
            ("agent", self.data.sources is None, "data.sources: a mixture of sources is not wired for episodes yet"),
            ("agent", self.mesh.distributed is None or self.mesh.distributed.num_processes in (None, 1),
             "mesh.distributed: episodes run in one process for now"),
        ]
        for key, ok, msg in checks:
            if not ok:
                raise _KeyedError(key, msg)
        return self

    @property
    def agent_cache_slots(self) -> int:
        """The multi-turn engine's KV slots per row (`agent.cache_slots`, else prompt + episode: each row writes
        its own ids at its own index, agents/engine.py)."""
        a = self.agent
        if a.cache_slots is not None:
            return a.cache_slots
        return self.data.max_prompt_length + a.max_episode_tokens

    def _overlong_fits(self, context: dict) -> None:
        """The soft overlong band (`overlong_buffer`, L_cache) must fit in the response (L_max, which is
        `rollout.max_new_tokens` unless the objective sets `max_response_length`). The band usually comes
        from a recipe or a run config the user did not write, so the error says which knob to turn and
        which file (or the command line) set the band."""
        try:
            recipe = load_objective(self.objective.name)
        except (ValueError, TypeError, KeyError, FileNotFoundError, pydantic.ValidationError):
            return  # a bad name or recipe: the objective build below names it
        extra = self.objective.overrides
        buffer = extra.get("overlong_buffer", recipe.overlong_buffer)
        length = extra.get("max_response_length", recipe.max_response_length)
        if not isinstance(buffer, int) or isinstance(buffer, bool) or buffer < 1:
            return  # None (off) or a bad value: the objective's own check names it
        budget = "agent.max_episode_tokens" if self.agent is not None else "rollout.max_new_tokens"
        key = "objective.max_response_length" if isinstance(length, int) else budget
        length = length if isinstance(length, int) else self.response_tokens
        if buffer <= length:
            return
        if "objective.overlong_buffer" in context.get("overridden", ()):
            where = "on the command line"
        elif "overlong_buffer" in extra:
            where = f"in {context.get('source', 'the run config')}'s objective section"
        else:
            where = f"by the objective recipe {self.objective.name!r} ({_recipe_file(self.objective.name)})"
        raise _KeyedError(key, f"{length} is shorter than objective.overlong_buffer={buffer} (set {where}), the "
                          f"soft overlong punishment band that must fit in the response: raise {key} above {buffer}, "
                          f"or shrink the band (objective.overlong_buffer={max(1, length // 4)}), or turn it off "
                          f"(objective.overlong_buffer=null)")

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
        """The `critic` section, or `optim`'s values when there is none."""
        return self.critic if self.critic is not None else CriticSection(**self.optim.model_dump())

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


def resolve(cfg: RunConfig) -> RunConfig:
    """`cfg` with the fast paths it leaves unset (`null`) chosen: the one step after validation that fills them,
    called where a run (`train`) and a plan (`make_plan`) start, and shown in the run's config.

    `optim.packing` and `rollout.compaction` left unset become what is exact and faster here: both compute the
    same update and rollout as the plain paths (tests/training/update/test_packed_step.py,
    tests/sampling/test_compaction.py), so they are on wherever they apply (docs/benchmarks.md, "Fast paths by
    default"): packing except for group DPO (its metric counts the padded batch's prompts), compaction without
    continuous batching and when a round's rows halve to at least `rollout.compaction_min_rows`. What a config
    names is kept; a resolved config resolves to itself."""
    r, o = cfg.rollout, cfg.optim
    update = {}
    if o.packing is None:
        update["optim"] = o.model_copy(update={"packing": cfg.objective_config.kind != "gdpo"})
    if r.compaction is None:
        halves = (r.gen_batch * r.G) // 2 >= r.compaction_min_rows
        update["rollout"] = r.model_copy(update={"compaction": not r.continuous and halves})
    return cfg.model_copy(update=update) if update else cfg


def resolved_keys(before: RunConfig, after: RunConfig) -> dict[str, Any]:
    """`{dotted key: value}` of what `resolve` chose (the keys `before` left unset), for the run to print."""
    return {f"{section}.{key}": getattr(getattr(after, section), key)
            for section, key in (("optim", "packing"), ("rollout", "compaction"))
            if getattr(getattr(before, section), key) is None}


def is_resolved(cfg: RunConfig) -> bool:
    """Whether `resolve` has filled every fast path (the programs are built only from a resolved config)."""
    return cfg.optim.packing is not None and cfg.rollout.compaction is not None


def _recipe_file(name: str) -> str:
    path = Path(name) if name.endswith((".yaml", ".yml")) else OBJECTIVES / f"{name}.yaml"
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


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

    `objective=NAME` is the section `{name: NAME}`: that objective's recipe as shipped, the config file's
    objective keys dropped (they were tuned for the file's objective: DAPO's overlong punishment must not
    ride along into a GRPO run). `objective.name=NAME` keeps them, as overrides of NAME's recipe."""
    parsed = []
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as e:
            where = f" (line {e.problem_mark.line + 1}, column {e.problem_mark.column + 1})" if getattr(
                e, "problem_mark", None) else ""
            raise ConfigError(f"override {item!r}: the value is not valid YAML{where}: "
                              f"{getattr(e, 'problem', None) or e} (check its brackets and quotes)") from None
        if key.strip() == "objective" and isinstance(value, str):  # `objective=grpo`: the recipe by name
            value = {"name": value}
        parsed.append((key.strip(), value))
    return parsed


BUILT_IN_TASKS = ("synthetic", "cot", "countdown")  # data sources generated in code; `options` are theirs alone
_PATH_KEYS = (("model", "path"), ("data", "train", "name"), ("data", "eval", "name"))


def _anchor_paths(data: dict, config_dir: Path) -> None:
    """A relative model/data path written in a config file means a path beside that file when one
    exists there (made absolute, so the run dir's copy of the config still finds it); otherwise it
    stays as written and `resolve_path` looks in the working directory, then the repository root."""
    rewards = (data.get("reward") or {}).get("functions") if isinstance(data.get("reward"), dict) else None
    for f in rewards if isinstance(rewards, list) else []:  # a learned reward model's folder
        value = f.get("path") if isinstance(f, dict) else None
        if isinstance(value, str) and not Path(value).expanduser().is_absolute() and (config_dir / value).exists():
            f["path"] = str((config_dir / value).resolve())
        name = f.get("name") if isinstance(f, dict) else None  # a user reward's file: path/to/file.py:function
        file, _, attr = name.rpartition(":") if isinstance(name, str) and ".py:" in name else ("", "", "")
        if file and not Path(file).expanduser().is_absolute() and (config_dir / file).is_file():
            f["name"] = f"{(config_dir / file).resolve()}:{attr}"
    agent = data.get("agent") if isinstance(data.get("agent"), dict) else {}
    env = agent.get("env")  # an environment's file: path/to/file.py:Name
    file, _, attr = env.rpartition(":") if isinstance(env, str) and ".py:" in env else ("", "", "")
    if file and not Path(file).expanduser().is_absolute() and (config_dir / file).is_file():
        agent["env"] = f"{(config_dir / file).resolve()}:{attr}"
    sources = (data.get("data") or {}).get("sources") if isinstance(data.get("data"), dict) else None
    for name in sources if isinstance(sources, dict) else []:  # a mixture's files (data.sources.NAME.train.name)
        node = sources[name].get("train") if isinstance(sources[name], dict) else None
        value = node.get("name") if isinstance(node, dict) else None
        if isinstance(value, str) and value not in BUILT_IN_TASKS and not Path(value).expanduser().is_absolute() \
                and (config_dir / value).exists():
            node["name"] = str((config_dir / value).resolve())
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


def recipes() -> list[str]:
    """The packaged run recipes (`dapo_jax/configs/*.yaml`) by name, sorted."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def did_you_mean(word: str, choices) -> str:
    """` (did you mean 'x'?)` for the closest of `choices`, or '' when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def find_config(name_or_path: str | Path) -> Path:
    """Where a run config is: an existing file (or run dir) as given; else a packaged recipe, named
    (`tiny_dapo`) or by the checkout path it used to have (`configs/tiny_dapo.yaml`), so the commands of
    older docs and scripts work from any directory and any install."""
    path = Path(name_or_path).expanduser()
    if path.exists() or path.is_absolute():
        return path
    parts = path.parts[1:] if path.parts[:1] == ("configs",) else path.parts
    if parts:
        rel = Path(*parts)
        for candidate in (CONFIG_DIR / rel, CONFIG_DIR / f"{rel}.yaml"):
            if candidate.is_file():
                return candidate
    return path


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Reads `path` (None = the embedded default; a recipe name or path: `find_config`), applies dotted
    overrides, validates everything.

    Relative paths in the file are looked up beside the file first (`_anchor_paths`); relative paths
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
    _anchor_paths(data, path.resolve().parent)
    parsed = parse_overrides(overrides)
    for key, value in parsed:
        _set_dotted(data, key, value, str(path))
    _drop_stale_options(data, {key for key, _ in parsed})
    return config_from_dict(data, source=str(path), overridden={key for key, _ in parsed})


def section_model(annotation) -> type[BaseModel] | None:
    """The section class inside a field's annotation (`X`, `X | None`, `list[X]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (found := section_model(arg)) is not None:
            return found
    return None


def _all_keys(model: type[BaseModel] = None, prefix: str = "") -> list[str]:
    """Every dotted key of the config: `optim.lr`, `train.wandb.project`, `reward.functions.name`, ..."""
    out = []
    for name, field in (model or RunConfig).model_fields.items():
        sub = section_model(field.annotation)
        out += _all_keys(sub, f"{prefix}{name}.") if sub is not None else [f"{prefix}{name}"]
    return out


# the names other RL trainers give to this config's keys (TRL's GRPOConfig, verl's actor_rollout_ref.rollout)
PEER_KEYS = {"num_generations": "rollout.G", "rollout.n": "rollout.G", "n_samples": "rollout.G",
             "per_device_train_batch_size": "rollout.train_batch",
             "max_completion_length": "rollout.max_new_tokens", "max_prompt_length": "data.max_prompt_length",
             "response_length": "rollout.max_new_tokens", "beta": "objective.kl_beta", "epsilon": "objective.eps_low",
             "epsilon_high": "objective.eps_high", "clip_ratio_high": "objective.eps_high",
             "clip_ratio_low": "objective.eps_low"}


def _suggest(loc: tuple) -> str:
    """` (did you mean 'optim.lr'?)` for an unknown key at `loc`: a near spelling in its section, the
    initials of a long name (`learning_rate` -> `lr`), or the same key in another section."""
    section: type[BaseModel] | None = RunConfig
    for part in loc[:-1]:
        if isinstance(part, int) or section is None:
            continue
        field = section.model_fields.get(part)
        section = section_model(field.annotation) if field is not None else None
    if section is None:
        return ""
    key, names = str(loc[-1]), list(section.model_fields)
    dotted = ".".join(str(p) for p in loc)
    peer = PEER_KEYS.get(dotted.split(".", 1)[-1]) or PEER_KEYS.get(key)
    if peer is not None and peer != dotted:
        return f" (did you mean {peer!r}? {key!r} is what other trainers call it)"
    prefix = ".".join(str(p) for p in loc[:-1])
    prefix = f"{prefix}." if prefix else ""
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    initials = "".join(w[0] for w in key.split("_") if w)
    close = close or [n for n in names if "_" in key and n == initials]
    if close:
        return f" (did you mean {prefix + close[0]!r}?)"
    elsewhere = [k for k in _all_keys() if k.rsplit(".", 1)[-1] == key]
    return f" (did you mean {elsewhere[0]!r}?)" if elsewhere else ""


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
            if isinstance(ctx, _KeyedError):
                key = ctx.key if key == "<root>" else f"{key}.{ctx.key}" if not ctx.key.startswith(key) else ctx.key
                lines.append(f"{source}: {key}: {ctx.msg}")
                continue
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                lines.append(f"{source}: {key}: unknown key{_suggest(err['loc'])}")
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


def resolve_path(path: str | Path) -> Path:
    """A path as given if it exists (or is absolute), else relative to the repository root."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    candidate = REPO_ROOT / p
    return candidate if candidate.exists() else p
