"""Supervised fine-tuning in the RL step: the data's responses stand in for the sampled ones.

    stream = supervised_stream(cfg, tokenizer)           # data.train as (prompt, response) examples
    source = SupervisedSource(cfg, stream, policy)       # in the loop's place of the Actor
    groups, stats, carry = source.collect(step, params, carry)   # train_batch examples, G = 1

`dapo-jax sft RECIPE` (or `train` on a recipe whose objective has kind "sft") runs the same
`train()` and `rl_step` as RL: the step takes its batch from `collect`, and the same `Learner` runs
the same packed, padding-free update on it (objectives/supervised.py's NLL as the objective), with the
same mesh, LoRA, checkpoints, resume (the stream's position is in every checkpoint), metrics,
held-out evaluation (sampled and scored by the run's reward) and export. Nothing here is a loop.

Each example is one group of one response: prompts `[P, S]` left-padded to data.max_prompt_length,
responses `[P, 1, T]` right-padded to rollout.max_new_tokens, the mask 1 on the response's tokens
(stop token included).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np

from dapo_jax.data import cot
from dapo_jax.data.datasets import DataError, load_rows
from dapo_jax.data.supervised import SupervisedStream, supervised_examples
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.generation_config import load_generation_config, stop_token_ids
from dapo_jax.training.config.paths import resolve_path
from dapo_jax.training.config.run import RunConfig
from dapo_jax.training.rollout import Groups
from dapo_jax.training.sources import source_path

BUILT_IN = ("cot",)  # built-in tasks with worked traces to fine-tune on (data/cot.py)


def supervised_rows(source, *, seed: int) -> tuple[list[dict], str]:
    """`(rows, format)` of a supervised source: a file, folder or hub name (read by `datasets.load_rows`),
    or the chain-of-thought task with its traces (`name: cot`, option `variant`: reference / verbose /
    terse / slip, default reference; its other options are the task's)."""
    if source.name in BUILT_IN:
        options = dict(source.options)
        variant = options.pop("variant", "reference")
        split = "heldout" if source.split in ("test", "heldout") else source.split
        try:
            rows = cot.cot_rows(split, seed=seed, **options)
            rows = [{"prompt": r["prompt"], "response": cot.trace(r["prompt"], variant, seed=i)}
                    for i, r in enumerate(rows)]
        except (TypeError, ValueError) as e:
            raise DataError(f"data.train ({source.name!r}, options={source.options}): {e}") from e
        return rows[: source.limit] if source.limit else rows, "sft"
    if source.options:
        raise DataError(f"data.train.options={source.options}: options are settings of the built-in tasks {BUILT_IN}, "
                        f"not of a file")
    path = resolve_path(source.name)
    if source.name.endswith((".jsonl", ".json", ".parquet", ".csv")) and not path.exists():
        raise DataError(f"data.train.name: no such file {source.name}")
    rows = load_rows(path if path.exists() else source.name, split=source.split)
    return rows[: source.limit] if source.limit else rows, source.format


def supervised_stream(cfg: RunConfig, tokenizer) -> SupervisedStream:
    """data.train as a resumable stream of supervised examples, checked row by row before any model loads
    (`DataError` naming the file, row and field)."""
    src, path = cfg.data.train, resolve_path(cfg.model.path)
    rows, fmt = supervised_rows(src, seed=cfg.data.seed)
    stops = stop_token_ids(ModelConfig.from_pretrained(path), load_generation_config(path), tokenizer)
    where = f"data.train ({src.name})"
    examples, skipped = supervised_examples(
        rows, tokenizer, format=fmt, template=src.template, stop_ids=stops, prompt_field=src.prompt_field,
        response_field=src.answer_field, max_prompt_length=cfg.data.max_prompt_length,
        max_response_length=cfg.rollout.max_new_tokens, source=where)
    if not examples:
        raise DataError(f"{where}: every one of its {sum(skipped.values())} examples is longer than "
                        f"data.max_prompt_length={cfg.data.max_prompt_length} (prompt) or rollout.max_new_tokens="
                        f"{cfg.rollout.max_new_tokens} (response, stop token included)")
    if skipped["response"]:
        warnings.warn(f"{where}: {skipped['response']} of {len(examples) + sum(skipped.values())} responses are longer "
                      f"than rollout.max_new_tokens={cfg.rollout.max_new_tokens} tokens (stop token included) and are "
                      f"left out", RuntimeWarning, stacklevel=2)
    file = source_path(src)
    identity = {"key": "data.train", "name": src.name, "path": str(file) if file is not None else None}
    # the order of the examples: data.order_seed where set (an experiment's seeds vary it alone), as RL's prompts
    order = cfg.data.seed if cfg.data.order_seed is None else cfg.data.order_seed
    return SupervisedStream(examples, tokenizer, max_prompt_length=cfg.data.max_prompt_length, seed=order,
                            skipped=skipped, source=identity)


def supervised_groups(stream: SupervisedStream, examples, *, response_length: int) -> Groups:
    """`len(examples)` groups of one response each: the examples' prompts and responses, mask on the responses."""
    prompts = stream.pad(examples)  # [P, S] left-padded to the one bucket, data.max_prompt_length
    p, t = len(examples), response_length
    ids = np.full((p, 1, t), stream.pad_id, np.int32)
    mask = np.zeros((p, 1, t), np.float32)
    for i, e in enumerate(examples):
        ids[i, 0, : len(e.response_ids)] = e.response_ids
        mask[i, 0, : len(e.response_ids)] = 1.0
    lengths = mask.sum(-1).astype(np.int32)
    zeros = np.zeros((p, 1), np.float32)
    return Groups(prompts.input_ids, prompts.attention_mask, ids, mask, np.zeros((p, 1, t), np.float32), zeros,
                  np.zeros((p, 1), bool), lengths, np.zeros((p, 1), bool), np.ones(p, bool), np.zeros(p, np.int32))


@dataclasses.dataclass(frozen=True)
class SupervisedSource:
    """The step's batch from the data (the loop's `Actor` when the objective is supervised)."""

    cfg: RunConfig
    stream: SupervisedStream
    policy: Any  # training.update.lora.PolicyWeights (for the compile-ahead's sampler shapes)

    def collect(self, step: int, params, carry) -> tuple[Groups, dict, None]:
        """The next `rollout.train_batch` examples of the stream (its position advances; resumable)."""
        del step, params, carry
        epoch = self.stream.epoch + self.stream.index / len(self.stream)
        groups = supervised_groups(self.stream, self.stream.next_examples(self.cfg.rollout.train_batch),
                                   response_length=self.cfg.rollout.max_new_tokens)
        lengths = groups.lengths.astype(np.float64)
        return groups, {"sft/epoch": epoch, "response_length_mean": float(lengths.mean()),
                        "response_length_max": float(lengths.max()), "sft/tokens": float(lengths.sum())}, None

    def precompile(self, sampler, programs) -> None:
        """Nothing is sampled during a supervised step (the evaluation's sampler compiles when it first runs)."""


__all__ = ["SupervisedSource", "supervised_groups", "supervised_rows", "supervised_stream"]
