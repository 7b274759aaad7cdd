"""The `objective` section: a registered objective by name plus field overrides (`{name: dapo, eps_high: 0.3}`),
and the checks that the objective it builds fits the rest of the run (its overlong band fits the response,
its rewards, rollout, mesh and distillation settings agree with it).

The objective is picked by name through `dapo_jax.objectives.registry.load_objective`; nothing else looks
at the name.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pydantic
from pydantic import ConfigDict

from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.objectives.registry import CONFIG_DIR as OBJECTIVES, load_objective
from dapo_jax.rewards.steps import STEP_REWARDS
from dapo_jax.training.config.agent import AgentSection
from dapo_jax.training.config.base import KeyedError, Section, did_you_mean
from dapo_jax.training.config.paths import REPO_ROOT
from dapo_jax.training.config.reward import RewardSection
from dapo_jax.training.config.sections import DistillSection, MeshSection, OptimSection, RolloutSection
from dapo_jax.training.group_filter import GroupFilter


class ObjectiveSection(Section):
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
                raise KeyedError(key, f"unknown objective key{did_you_mean(key, ObjectiveConfig.model_fields)}")
        cfg = load_objective(self.name, **self.overrides)
        if cfg.max_response_length is None and max_response_length is not None:
            cfg = load_objective(self.name, **{**self.overrides, "max_response_length": max_response_length})
        return cfg


def recipe_file(name: str) -> str:
    """The objective recipe's file, relative to the repository when it is inside it (for error messages)."""
    path = Path(name) if name.endswith((".yaml", ".yml")) else OBJECTIVES / f"{name}.yaml"
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def check_overlong_fits(section: ObjectiveSection, *, response_tokens: int, agent_run: bool, context: dict) -> None:
    """The soft overlong band (`overlong_buffer`, L_cache) must fit in the response (L_max, which is
    `rollout.max_new_tokens` unless the objective sets `max_response_length`; `response_tokens`). The band
    usually comes from a recipe or a run config the user did not write, so the error says which knob to turn
    and which file (or the command line, `context["overridden"]`) set the band."""
    try:
        recipe = load_objective(section.name)
    except (ValueError, TypeError, KeyError, FileNotFoundError, pydantic.ValidationError):
        return  # a bad name or recipe: the objective build below names it
    extra = section.overrides
    buffer = extra.get("overlong_buffer", recipe.overlong_buffer)
    length = extra.get("max_response_length", recipe.max_response_length)
    if not isinstance(buffer, int) or isinstance(buffer, bool) or buffer < 1:
        return  # None (off) or a bad value: the objective's own check names it
    budget = "agent.max_episode_tokens" if agent_run else "rollout.max_new_tokens"
    key = "objective.max_response_length" if isinstance(length, int) else budget
    length = length if isinstance(length, int) else response_tokens
    if buffer <= length:
        return
    if "objective.overlong_buffer" in context.get("overridden", ()):
        where = "on the command line"
    elif "overlong_buffer" in extra:
        where = f"in {context.get('source', 'the run config')}'s objective section"
    else:
        where = f"by the objective recipe {section.name!r} ({recipe_file(section.name)})"
    raise KeyedError(key, f"{length} is shorter than objective.overlong_buffer={buffer} (set {where}), the "
                     f"soft overlong punishment band that must fit in the response: raise {key} above {buffer}, "
                     f"or shrink the band (objective.overlong_buffer={max(1, length // 4)}), or turn it off "
                     f"(objective.overlong_buffer=null)")


def check_objective(section: ObjectiveSection, *, response_tokens: int, rollout: RolloutSection, optim: OptimSection,
                    reward: RewardSection, mesh: MeshSection, distill: DistillSection | None,
                    agent: AgentSection | None, context: dict) -> ObjectiveConfig:
    """The objective `section` builds, checked against the rest of the run; raises `KeyedError` naming the
    first key that does not fit. `response_tokens`: T, the update's response width (`RunConfig.response_tokens`);
    `context`: the validation context (`source`, `overridden`) the overlong error quotes."""
    r, o, m = rollout, optim, mesh
    check_overlong_fits(section, response_tokens=response_tokens, agent_run=agent is not None, context=context)
    try:
        objective = section.build(max_response_length=response_tokens)
        if objective.gfpo:  # GFPO keeps k of the G generated responses: k <= G
            GroupFilter(objective, group_size=r.G)
    except KeyedError as e:
        raise KeyedError(f"objective.{e.key}", e.msg) from e
    except (ValueError, TypeError, KeyError, pydantic.ValidationError) as e:
        raise KeyedError("objective", f"{type(e).__name__}: {e}") from e
    for key in ("reward_correct", "reward_wrong", "reward_weights"):  # the reward's own values: finite
        value = getattr(objective, key)
        values = value if isinstance(value, tuple) else () if value is None else (value,)
        if not all(math.isfinite(v) for v in values):
            raise KeyedError(f"objective.{key}", f"{value} is not finite")
    if o.packing and objective.kind == "gdpo":
        raise KeyedError("optim.packing", "kind='gdpo' is not supported packed (its groups_used metric counts "
                         "the batch's prompts): set optim.packing=false")
    has_prm = any(f.name == "process_reward_model" for f in reward.functions)
    if objective.needs_step_rewards and reward.functions[0].name not in STEP_REWARDS and not has_prm \
            and agent is None:  # an episode's steps are its turns (agents/batch.py)
        raise KeyedError("reward.functions.0.name", f"advantage={objective.advantage!r} needs step rewards, and "
                         f"{reward.functions[0].name!r} has none (step rewards: {sorted(STEP_REWARDS)}, or "
                         f"a process_reward_model)")
    if objective.sums_normalised_rewards:  # the parts are combined on the device (rewards/pipeline.py)
        weights = tuple(float(f.weight) for f in reward.functions)
        if objective.overlong_buffer is not None:
            raise KeyedError("objective.multi_reward", "normalize_then_sum combines the reward functions' own "
                             "rewards: the soft overlong penalty would be left out; set objective.overlong_buffer=null")
        if objective.reward_weights is not None and tuple(objective.reward_weights) != weights:
            raise KeyedError("objective.reward_weights", f"{objective.reward_weights} differ from the weights of "
                             f"reward.functions {weights}: set the weights there only")
    if objective.max_response_length is not None and objective.max_response_length < r.max_new_tokens \
            and agent is None:  # an episode's L_max counts its model ids over every turn (agent.py)
        raise KeyedError("objective.max_response_length",
                         f"{objective.max_response_length} < rollout.max_new_tokens={r.max_new_tokens}")
    if distill is not None and (objective.uses_critic or objective.kind != "policy_gradient"):
        raise KeyedError("distill", f"on-policy distillation adds to a policy-gradient objective's token "
                         f"advantages; objective {section.name!r} (kind={objective.kind!r}, advantage="
                         f"{objective.advantage!r}) has none: use dapo, grpo, dr_grpo, ...")
    if objective.supervised and r.temperature != 1.0:
        raise KeyedError("rollout.temperature", f"{r.temperature}: supervised fine-tuning trains the log-probs "
                         f"of the logits at the rollout temperature; set it to 1 (train.eval_temperature "
                         f"sets the evaluation's)")
    if r.overlap and objective.off_policy_correction is None:
        raise KeyedError("rollout.overlap", f"overlapped rollouts are one update stale and objective "
                         f"{section.name!r} has no off-policy correction for them: use "
                         f"objective.name=dapo_tis or set objective.off_policy_correction (token_tis, "
                         f"seq_tis, token_mask, seq_mask)")
    if r.overlap and m.distributed is not None and m.distributed.num_processes != 1:
        raise KeyedError("rollout.overlap", "not in a multi-process run (mesh.distributed): the rollout thread "
                         "and the update would launch collectives in an order that may differ between processes")
    if r.continuous and m.distributed is not None and m.distributed.num_processes != 1:
        raise KeyedError("rollout.continuous", "not in a multi-process run (mesh.distributed): each process's "
                         "host would decide its own refills, from its own finished groups")
    if objective.needs_recomputed_old_logp and r.recompute_old_logp is False:
        raise KeyedError("rollout.recompute_old_logp",
                         f"objective.off_policy_correction={objective.off_policy_correction!r} compares the "
                         f"trainer's log pi_old with the sampler's log mu; with recompute_old_logp=false they "
                         f"are the same array, every weight is 1 and nothing is masked: set it to true or "
                         f"leave it unset (it then follows the correction)")
    return objective
