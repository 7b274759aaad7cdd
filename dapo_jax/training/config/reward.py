"""The `reward` section: which reward functions score a response, with what weights and options, and
what a failing one does (docs/rewards.md); and the checks of those functions against the run.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field

from dapo_jax.rewards import REWARDS
from dapo_jax.rewards.custom import is_custom_name
from dapo_jax.rewards.reward_model import LEARNED_REWARDS
from dapo_jax.training.config.base import Section
from dapo_jax.training.config.sections import MeshSection


class RewardFunction(Section):
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


class RewardSection(Section):
    functions: list[RewardFunction] = Field(default_factory=lambda: [RewardFunction(name="synthetic")])
    right: float | None = None  # None = the objective's reward_correct
    wrong: float | None = None  # None = the objective's reward_wrong
    # a reward that fails on a row (raises; a user function's timeout, NaN, bad result): stop naming the row, or
    # score it wrong and count it in metrics.jsonl's reward_failures/NAME (docs/rewards.md)
    on_error: Literal["raise", "wrong"] = "wrong"


def non_finite(options, prefix: str = "") -> list[tuple[str, float]]:
    """`(dotted key, value)` of every NaN or infinite number in a reward's options (`Section` refuses
    them in typed fields; options are free-form)."""
    if isinstance(options, dict):
        return [hit for k, v in options.items() for hit in non_finite(v, f"{prefix}{k}.")]
    if isinstance(options, (list, tuple)):
        return [hit for i, v in enumerate(options) for hit in non_finite(v, f"{prefix}{i}.")]
    if isinstance(options, float) and not math.isfinite(options):
        return [(prefix.rstrip("."), options)]
    return []


def reward_checks(reward: RewardSection, mesh: MeshSection) -> list[tuple[str, bool, str]]:
    """`(dotted key, ok, message)` for each reward function: a known name, finite options, a path exactly
    when it is a learned reward model, and learned models only in a one-process run."""
    known = (*REWARDS, *LEARNED_REWARDS)
    checks = [(f"reward.functions.{i}.name", f.name in known or is_custom_name(f.name),
               f"unknown reward {f.name!r}; known: {known}, or your own as module:function, "
               f"path/to/file.py:function or an http(s):// URL") for i, f in enumerate(reward.functions)]
    checks += [(f"reward.functions.{i}.options.{key}", False, f"{value} is not a finite number")
               for i, f in enumerate(reward.functions) for key, value in non_finite(f.options)]
    checks += [(f"reward.functions.{i}.path", (f.path is not None) == (f.name in LEARNED_REWARDS),
                f"{f.name!r} is a learned reward model: set its path to the model's folder" if f.path is None else
                f"{f.name!r} is a rule reward: it takes no path") for i, f in enumerate(reward.functions)]
    learned = [f.name for f in reward.functions if f.name in LEARNED_REWARDS]
    checks.append(("reward.functions", not learned or mesh.distributed is None or mesh.distributed.num_processes == 1,
                   f"{learned} are scored on each process's own rows: not in a multi-process run "
                   f"(mesh.distributed) yet"))
    return checks
