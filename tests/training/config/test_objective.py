"""The objective section: its overrides, the recipe file an error quotes, the overlong band that must fit in
the response (and who set it), and the objective's checks against the rest of the run, on hand-built sections."""

import pytest

from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.training.config.agent import AgentSection
from dapo_jax.training.config.base import KeyedError
from dapo_jax.training.config.objective import ObjectiveSection, check_objective, check_overlong_fits, recipe_file
from dapo_jax.training.config.paths import REPO_ROOT
from dapo_jax.training.config.reward import RewardFunction, RewardSection
from dapo_jax.training.config.sections import (DistillSection, DistributedSection, MeshSection, OptimSection,
                                               RolloutSection)

INTEGER = RewardSection(functions=[RewardFunction(name="integer")])  # an outcome reward: no steps


def _check(section, *, response_tokens=64, rollout=RolloutSection(max_new_tokens=64), optim=OptimSection(),
           reward=RewardSection(), mesh=MeshSection(), distill=None, agent=None, context=None):
    return check_objective(section, response_tokens=response_tokens, rollout=rollout, optim=optim, reward=reward,
                           mesh=mesh, distill=distill, agent=agent, context=context or {})


def test_the_section_is_a_name_plus_overrides_and_builds_that_recipe():
    section = ObjectiveSection(name="grpo", eps_high=0.3)
    assert section.overrides == {"eps_high": 0.3}
    built = section.build(max_response_length=99)
    assert isinstance(built, ObjectiveConfig) and built.eps_high == 0.3 and built.max_response_length == 99
    with pytest.raises(KeyedError, match="^eps_hgh: unknown objective key \\(did you mean 'eps_high'\\?\\)$"):
        ObjectiveSection(name="grpo", eps_hgh=0.3).build()


def test_recipe_file_is_the_recipe_inside_the_repository_or_the_path_as_given(tmp_path):
    assert recipe_file("dapo") == "dapo_jax/configs/objectives/dapo.yaml"
    assert recipe_file(str(REPO_ROOT / "x.yaml")) == "x.yaml"
    assert recipe_file(str(tmp_path / "mine.yaml")) == str(tmp_path / "mine.yaml")


def test_an_overlong_band_wider_than_the_response_names_the_knob_and_who_set_it():
    def error(section, response_tokens, agent_run=False, context=None):
        with pytest.raises(KeyedError) as info:
            check_overlong_fits(section, response_tokens=response_tokens, agent_run=agent_run, context=context or {})
        return info.value

    e = error(ObjectiveSection(name="dapo"), 64)  # the recipe's 4096-token band
    assert e.key == "rollout.max_new_tokens"
    assert e.msg.startswith("64 is shorter than objective.overlong_buffer=4096 (set by the objective recipe 'dapo' "
                            "(dapo_jax/configs/objectives/dapo.yaml))")
    assert "objective.overlong_buffer=16" in e.msg  # a band a quarter of the response
    e = error(ObjectiveSection(name="dapo", overlong_buffer=10), 8, agent_run=True,
              context={"source": "run.yaml", "overridden": set()})
    assert e.key == "agent.max_episode_tokens" and "(set in run.yaml's objective section)" in e.msg
    e = error(ObjectiveSection(name="dapo", overlong_buffer=10, max_response_length=8), 512,
              context={"overridden": {"objective.overlong_buffer"}})
    assert e.key == "objective.max_response_length" and "(set on the command line)" in e.msg
    check_overlong_fits(ObjectiveSection(name="dapo", overlong_buffer=64), response_tokens=64, agent_run=False,
                        context={})  # the band may fill the response
    check_overlong_fits(ObjectiveSection(name="grpo"), response_tokens=1, agent_run=False, context={})  # no band
    check_overlong_fits(ObjectiveSection(name="nope"), response_tokens=1, agent_run=False, context={})  # named later


def test_check_objective_returns_the_built_objective():
    built = _check(ObjectiveSection(name="grpo"), response_tokens=48, rollout=RolloutSection(max_new_tokens=48))
    assert built == ObjectiveSection(name="grpo").build(max_response_length=48)


@pytest.mark.parametrize("section, change, key", [
    (ObjectiveSection(name="nope"), {}, "objective"),
    (ObjectiveSection(name="grpo", eps_hgh=1), {}, "objective.eps_hgh"),
    (ObjectiveSection(name="grpo", reward_correct=float("inf")), {}, "objective.reward_correct"),
    (ObjectiveSection(name="gfpo", overlong_buffer=None), {"rollout": RolloutSection(max_new_tokens=64, G=2)},
     "objective"),  # keeps k = 4 of G = 2
    (ObjectiveSection(name="gdpo", overlong_buffer=None), {"optim": OptimSection(packing=True)}, "optim.packing"),
    (ObjectiveSection(name="grpo_process", overlong_buffer=None), {"reward": INTEGER}, "reward.functions.0.name"),
    (ObjectiveSection(name="grpo", multi_reward="normalize_then_sum", overlong_buffer=4), {},
     "objective.multi_reward"),
    (ObjectiveSection(name="grpo", multi_reward="normalize_then_sum", reward_weights=[2.0]), {},
     "objective.reward_weights"),
    (ObjectiveSection(name="grpo", max_response_length=32), {}, "objective.max_response_length"),
    (ObjectiveSection(name="ppo"), {"distill": DistillSection(teacher="t")}, "distill"),
    (ObjectiveSection(name="sft"), {"rollout": RolloutSection(max_new_tokens=64, temperature=0.7)},
     "rollout.temperature"),
    (ObjectiveSection(name="grpo"), {"rollout": RolloutSection(max_new_tokens=64, overlap=True)}, "rollout.overlap"),
    (ObjectiveSection(name="dapo_tis", overlong_buffer=None),
     {"rollout": RolloutSection(max_new_tokens=64, overlap=True),
      "mesh": MeshSection(distributed=DistributedSection(num_processes=2))}, "rollout.overlap"),
    (ObjectiveSection(name="grpo"), {"rollout": RolloutSection(max_new_tokens=64, continuous=True),
                                     "mesh": MeshSection(distributed=DistributedSection(num_processes=2))},
     "rollout.continuous"),
    (ObjectiveSection(name="dapo_tis", overlong_buffer=None),
     {"rollout": RolloutSection(max_new_tokens=64, recompute_old_logp=False)}, "rollout.recompute_old_logp"),
])
def test_each_misfit_names_its_key(section, change, key):
    with pytest.raises(KeyedError) as info:
        _check(section, **change)
    assert info.value.key == key


def test_what_an_episode_or_a_process_reward_changes():
    # A process-supervised objective reads an episode's turns, or a process reward model's steps:
    _check(ObjectiveSection(name="grpo_process", overlong_buffer=None), reward=INTEGER, agent=AgentSection(env="a:B"))
    prm = RewardSection(functions=[RewardFunction(name="integer"),
                                   RewardFunction(name="process_reward_model", path="prm")])
    _check(ObjectiveSection(name="grpo_process", overlong_buffer=None), reward=prm)
    # An episode's L_max counts its model ids over every turn: a shorter max_response_length is fine there.
    _check(ObjectiveSection(name="grpo", max_response_length=32), agent=AgentSection(env="a:B"))
