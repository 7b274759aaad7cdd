"""What `dapo-jax eval --data` names: a file (or folder) of problems, its format, prompt template and reward.

    spec = parse_data("../shared/data/gsm8k/test.jsonl")          # name gsm8k, format gsm8k, reward gsm8k
    spec = parse_data("aime24=data/aime2024/test.jsonl", template="dapo_chat")
    spec = parse_data("mine=data/q.jsonl", format="custom")         # custom: problem/answer fields below

The format (how a row maps to a problem and an answer, `dapo_jax.data.datasets.FORMATS`) comes from
`--format`, else from the name or the path (`gsm8k`, `math500`/`math-500`, `aime`, `amc`,
`dapo_math`); the reward that judges a response is the one that fits the format's answers:

| format | answers | reward |
|---|---|---|
| gsm8k | a number after `####` | `gsm8k` (the response's `#### N`, else its last number) |
| math500 | LaTeX | `math_verify` (symbolic) |
| aime | an integer | `integer` |
| amc | a number | `math_verify` |
| dapo_math | an integer | `dapo_answer` (the `Answer:` line DAPO's prompt asks for) |
| synthetic | digits | `synthetic` |
| custom | anything | `math_verify` |
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dapo_jax.data.datasets import FORMATS
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.data import SourceSection
from dapo_jax.training.config.paths import resolve_path
from dapo_jax.training.config.reward import RewardFunction, RewardSection

FORMAT_REWARDS = {"gsm8k": "gsm8k", "math500": "math_verify", "aime": "integer", "amc": "math_verify",
                  "dapo_math": "dapo_answer", "synthetic": "synthetic", "custom": "math_verify"}
# Substrings of a data set's name or path that tell its format, most specific first.
_HINTS = (("dapo_math", "dapo_math"), ("dapo-math", "dapo_math"), ("gsm8k", "gsm8k"), ("math500", "math500"),
          ("math-500", "math500"), ("math_500", "math500"), ("aime", "aime"), ("amc", "amc"),
          ("synthetic", "synthetic"))
_GENERIC_STEMS = {"test", "train", "validation", "valid", "dev", "eval", "data", "heldout"}


@dataclasses.dataclass(frozen=True)
class EvalSet:
    """One data set to evaluate on: a name for the table and the result keys, and how to read and judge it."""

    name: str
    source: SourceSection
    reward: RewardSection
    limit: int | None = None  # the first `limit` problems; None = all
    own: bool = False  # the run's own evaluation set: read with the run's prompt length, as training does


def infer_format(*texts: str) -> str | None:
    """The format a data set's name or path suggests, or None."""
    for text in texts:
        low = text.lower()
        for hint, fmt in _HINTS:
            if hint in low:
                return fmt
    return None


def check_exists(arg: str) -> None:
    """Raises `ConfigError` when `--data [NAME=]PATH` names a file or folder (not a built-in task or a hub
    name, as training's sources tell them) that does not exist: before its format is guessed from the name."""
    path = arg.partition("=")[2] if "=" in arg else arg
    local = Path(path).suffix in (".jsonl", ".json", ".parquet", ".csv") or path.startswith((".", "/", "~"))
    if local and not resolve_path(path).exists():
        raise ConfigError(f"--data {arg}: {path} does not exist")


def default_name(path: str) -> str:
    """`data/gsm8k/test.jsonl` -> `gsm8k`; `aime2024.jsonl` -> `aime2024`."""
    p = Path(path)
    stem = p.name.split(".")[0] if p.suffix else p.name
    return p.parent.name if stem.lower() in _GENERIC_STEMS and p.parent.name else stem


def parse_data(arg: str, *, format: str | None = None, template: str = "raw", reward: str | None = None,
               limit: int | None = None, prompt_field: str | None = None,
               answer_field: str | None = None) -> EvalSet:
    """`[NAME=]PATH` -> an `EvalSet`; raises `ConfigError` saying what to pass when the format is unknown."""
    name, _, path = arg.partition("=") if "=" in arg else ("", "", arg)
    name = name or default_name(path)
    fmt = format or infer_format(name, path)
    if fmt is None:
        raise ConfigError(f"--data {arg}: cannot tell the data set's format from its name or path; pass --format "
                          f"(one of {sorted(FORMATS)})")
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt}: unknown; known: {sorted(FORMATS)}")
    reward_name = reward or FORMAT_REWARDS.get(fmt, "math_verify")
    split = "heldout" if path == "synthetic" else "test"
    source = SourceSection(name=path, split=split, format=fmt, template=template, prompt_field=prompt_field,
                           answer_field=answer_field)
    return EvalSet(name=name, source=source, limit=limit,
                   reward=RewardSection(functions=[RewardFunction(name=reward_name)], on_error="wrong"))


__all__ = ["EvalSet", "FORMAT_REWARDS", "check_exists", "default_name", "infer_format", "parse_data"]
