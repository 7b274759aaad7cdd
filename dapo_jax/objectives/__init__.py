"""The GRPO-family objectives as pure functions of padded [P prompts, G responses, T tokens] arrays.

Entry points (see loss.py): `objective_terms`, `compute_advantages`, `shape_rewards`,
`dynamic_sampling_keep`; configs: `ObjectiveConfig`, `load_objective`.
"""

from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.objectives.diagnostics import combine_metrics, finalize_metrics
from dapo_jax.objectives.loss import (
    compute_advantages,
    dynamic_sampling_keep,
    objective_loss,
    objective_terms,
    shape_rewards,
    token_kl,
)
from dapo_jax.objectives.registry import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    available_objectives,
    load_objective,
)

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "ObjectiveConfig",
    "available_objectives",
    "combine_metrics",
    "compute_advantages",
    "dynamic_sampling_keep",
    "finalize_metrics",
    "load_objective",
    "objective_loss",
    "objective_terms",
    "shape_rewards",
    "token_kl",
]
