"""The sections of a run config that stand on their own: the model, the rollout, the optimizer (and the
critic's, and LoRA's), the mesh, the training loop's schedule and logging, and on-policy distillation.

Each is a frozen pydantic model that refuses unknown keys (`base.Section`); a field's comment is its
entry in docs/configuration.md (`reference.py`). Checks that read several sections together live in
`run.RunConfig`'s validators.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from dapo_jax.training.config.base import KeyedError, Section


class ModelSection(Section):
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



class RolloutSection(Section):
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
    # (down to compaction_min_rows); same rollout. Each halving is one more decode loop to compile: a run of a
    # few dozen steps starts sooner with false (docs/benchmarks.md, "Where the first step goes").
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


class OptimSection(Section):
    lr: float = Field(default=1e-6, gt=0)  # AdamW learning rate (after warm-up)
    warmup_steps: int = Field(default=0, ge=0)  # linear warm-up from 0
    schedule: Literal["constant", "cosine"] = "constant"  # after warm-up; cosine decays to min_lr_ratio * lr
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)  # the cosine schedule's floor
    weight_decay: float = Field(default=0.1, ge=0)  # AdamW's decoupled weight decay
    b1: float = Field(default=0.9, ge=0, lt=1)  # Adam's first-moment decay
    b2: float = Field(default=0.999, ge=0, lt=1)  # Adam's second-moment decay
    eps: float = Field(default=1e-8, gt=0)  # Adam's epsilon
    grad_clip: float | None = Field(default=1.0, gt=0)  # global gradient-norm clip; null = off
    num_minibatches: int = Field(default=1, gt=0)  # optimizer updates per rollout batch (per epoch)
    # passes over each rollout batch (PPO's epochs), num_minibatches updates each, the same mini-batches in the
    # same order; the policy's only (a critic makes one). The step's metrics combine the passes (step.epoch_metrics)
    epochs: int = Field(default=1, gt=0)
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


class LoRASection(Section):
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
            raise KeyedError("targets", f"{self.targets} names a projection twice")
        return self


class CriticSection(OptimSection):
    """The critic's own optimizer, learning rate and update split, read only when the objective has a
    critic (`advantage: gae`: PPO, VAPO); `path`: the Hugging Face folder whose decoder weights start
    its trunk (None = model.path, the policy's initial weights). No `critic` section = `optim`'s values;
    a partial one takes `optim`'s values for the keys it does not name."""

    path: str | None = None  # the trunk's starting weights; None = model.path


class DistributedSection(Section):
    coordinator: str | None = None  # host:port of process 0; all None = read from the cluster's environment
    num_processes: int | None = Field(default=None, gt=0)  # processes in the run (hosts)
    process_id: int | None = Field(default=None, ge=0)  # this process's index
    # how long a process waits for every process of the run to start and join; then one line and exit 7
    start_timeout_s: float = Field(default=300.0, gt=0)


class MeshSection(Section):
    data: int = Field(default=1, gt=0)  # devices that hold replicas (batch split over data x fsdp)
    fsdp: int = Field(default=1, gt=0)  # devices the parameters are sharded over (ZeRO-3)
    tensor: int = Field(default=1, gt=0)  # tensor parallelism (Megatron-style); heads and vocab must divide
    distributed: DistributedSection | None = None


class WandbSection(Section):
    """Weights & Biases settings, used when `train.loggers` lists `wandb` (see dapo_jax.training.loggers)."""

    project: str = "dapo-jax"  # the W&B project
    entity: str | None = None  # the W&B team or user; None = the account's default
    name: str | None = None  # None = the run dir's name
    group: str | None = None  # W&B's run group (seeds of one setting, ...)
    tags: list[str] = Field(default_factory=list)  # W&B's run tags
    mode: Literal["online", "offline", "disabled"] | None = None  # None = WANDB_MODE from the environment, else online


class TrainSection(Section):
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


class DistillSection(Section):
    """On-policy distillation (objectives/distill.py, docs/stages.md): a frozen teacher scores the student's samples."""

    teacher: str  # a Hugging Face folder with model.path's tokenizer (its size may differ)
    coef: float = Field(default=1.0, gt=0)  # β: the per-token reverse KL's weight in the advantage
    task_weight: float = Field(default=1.0, ge=0)  # w: the task reward's advantage's weight; 0 = distillation alone

