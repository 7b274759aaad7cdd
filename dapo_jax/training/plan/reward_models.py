"""A run's learned reward models as the memory plan sees them (`dapo-jax plan`), without reading a weight.

    for rm in reward_model_shapes(cfg, mesh):
        resident = rm.param_bytes                                  # per device: the frozen weights' shards
        compiled = rm.score_fn.lower(rm.params, *rm.inputs).compile()
        temporaries = compiled.memory_analysis().temp_size_in_bytes  # one scoring call's activations

Each entry is built exactly as the run builds it (`training.sources.make_scorer`, then
`rewards.reward_model.LearnedReward.abstract`): parameters in `model.dtype`, placed by
`models.sharding`'s rules (the trunk's decoder rules, the `score/...` head rules), one device call's
`[batch_size, max_length]` inputs over the batch shards, and the same jitted program. The reward
models stay resident for the whole run (they score every rollout and every evaluation), beside the
policy, its optimizer state and the reference; their program runs between generation and the update,
so its temporaries do not add to the update's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from dapo_jax.rewards.reward_model import LearnedReward
from dapo_jax.training.plan.compile import shard_bytes
from dapo_jax.training.sources import make_scorer

__all__ = ["RewardModelPlan", "reward_model_shapes"]


class RewardModelPlan(NamedTuple):
    index: int  # its position in reward.functions
    name: str  # reward_model | process_reward_model
    path: Path
    params: Any  # nnx.State of jax.ShapeDtypeStruct, each with its NamedSharding
    inputs: tuple  # (ids, mask) ShapeDtypeStruct [rows, max_length] int32, batch-sharded
    score_fn: Any  # the jitted scoring program
    param_bytes: int  # bytes of the parameters on the most loaded device


def reward_model_shapes(cfg, mesh) -> list[RewardModelPlan]:
    """Every learned reward of the run config `cfg` on `mesh` (empty when it has none); raises the
    run's own `DataError` (one line naming `reward.functions.N`) for a folder that cannot be one."""
    scorer = make_scorer(cfg.reward, cfg.objective_config,
                         max_length=cfg.data.max_prompt_length + cfg.rollout.max_new_tokens)
    plans = []
    for i, (name, fn, _) in enumerate(scorer.functions):
        if not isinstance(fn, LearnedReward):
            continue
        params, inputs, score_fn = fn.abstract(mesh, dtype=cfg.model.dtype)
        plans.append(RewardModelPlan(i, name, fn.path, params, inputs, score_fn, shard_bytes(params)))
    return plans
