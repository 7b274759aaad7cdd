"""The `agent` section: multi-turn episodes with tools or an environment (docs/agents.md, dapo_jax/agents),
and the checks that a run's limits and settings fit episodes.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.training.config.base import Section
from dapo_jax.training.config.data import DataSection
from dapo_jax.training.config.sections import DistillSection, MeshSection, RolloutSection


class AgentSection(Section):
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


def agent_checks(agent: AgentSection, *, objective: ObjectiveConfig, objective_name: str, named_discount: float,
                 slots: int, rollout: RolloutSection, data: DataSection, mesh: MeshSection,
                 distill: DistillSection | None) -> list[tuple[str, bool, str]]:
    """`(dotted key, ok, message)` for a multi-turn run: the limits fit together, and what the episode source
    does not do yet is refused by name (the environment itself is imported and tried on the first data row
    when the run starts, before the model loads: training/episode_source.py).

    `objective`: the run's resolved objective; `named_discount`: the process_discount the objective section
    names (before `agent.discount` replaces it); `slots`: the engine's KV slots per row."""
    a, r = agent, rollout
    where, _, name = a.env.rpartition(":")
    return [
        ("agent.env", bool(where) and bool(name) and "/" not in name,
         f"{a.env!r}: expected package.module:Name or path/to/file.py:Name"),
        ("rollout.max_new_tokens", r.max_new_tokens <= a.max_episode_tokens,
         f"{r.max_new_tokens} (the most ids one turn may draw) exceeds agent.max_episode_tokens="
         f"{a.max_episode_tokens}, the whole episode's budget"),
        ("agent.tool_timeout", a.tool_timeout < a.step_timeout,
         f"{a.tool_timeout:g} s must be under agent.step_timeout={a.step_timeout:g} s (the step's deadline "
         f"would fire first and end the episode instead of answering)"),
        ("agent.cache_slots", slots > data.max_prompt_length,
         f"{slots} slots leave no room after the prompt (data.max_prompt_length={data.max_prompt_length})"),
        ("agent", objective.kind == "policy_gradient" and not objective.supervised,
         f"objective {objective_name!r} (kind={objective.kind!r}) is not trained on episodes yet: use a "
         f"policy-gradient objective (dapo, grpo, dr_grpo, grpo_process, ppo, ...)"),
        ("agent.discount", a.discount == 1.0 or objective.needs_step_rewards,
         f"{a.discount:g} discounts the turns' rewards: it needs objective advantage grpo_process, not "
         f"{objective.advantage!r} (an outcome estimator reads one reward per episode)"),
        ("agent.discount", a.discount == 1.0 or named_discount in (1.0, a.discount),
         f"{a.discount:g} and objective.process_discount={named_discount:g} both discount the turns: set one "
         f"of them"),
        ("agent", distill is None, "on-policy distillation on episodes is not wired yet: remove distill"),
        ("agent", objective.multi_reward != "normalize_then_sum",
         "objective.multi_reward=normalize_then_sum is not wired for episodes yet (an environment's reward has "
         "no per-function parts): use multi_reward=sum"),
        ("agent", not r.continuous, "rollout.continuous: continuous batching of episodes is not wired yet"),
        ("agent", data.sources is None, "data.sources: a mixture of sources is not wired for episodes yet"),
        ("agent", mesh.distributed is None or mesh.distributed.num_processes in (None, 1),
         "mesh.distributed: episodes run in one process for now"),
    ]
