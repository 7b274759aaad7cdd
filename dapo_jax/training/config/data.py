"""The `data` section: where the prompts come from (one source, or a weighted mixture of sources with their
own rewards: docs/mixtures.md), how long they may be, and which are drawn no more (difficulty filtering).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from dapo_jax.training.config.base import KeyedError, Section
from dapo_jax.training.config.reward import RewardSection


class SourceSection(Section):
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


class MixtureSource(Section):
    """One source of a data mixture, `data.sources.NAME` (docs/mixtures.md, data/mixture.py)."""

    train: SourceSection = SourceSection()  # its prompts: any source data.train can name
    weight: float = Field(default=1.0, gt=0)  # sampling proportion: each prompt drawn is this source's w.p. w / Σ w
    reward: RewardSection | None = None  # its reward functions; None = the run's reward section


class DifficultySection(Section):
    """Difficulty filtering (training/difficulty.py): a prompt every response of which was right (or wrong)
    in each of its last `visits` visits is drawn no more."""

    visits: int = Field(default=2, gt=0)  # k: the visits that must all agree
    drop: Literal["all_right", "all_wrong", "both"] = "all_right"  # solved prompts, unsolved ones, or both


class DataSection(Section):
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
            raise KeyedError("sources", "an empty mixture: name at least one source, or remove data.sources")
        for name in self.sources:
            if not name or not all(c.isalnum() or c in "_-" for c in name):
                raise KeyedError(f"sources.{name}", "a source's name is letters, digits, _ and - (it names "
                                 "metrics: source/NAME/accuracy)")
        if self.train != SourceSection():
            raise KeyedError("train", "a mixture reads data.sources: remove data.train or set it to null (or remove "
                             "data.sources)")
        return self
