"""The agent section's checks against the run, read off hand-built sections: the key each failing check
names, and that a valid multi-turn setting passes them all."""

import pytest

from dapo_jax.objectives.registry import load_objective
from dapo_jax.training.config.agent import AgentSection, agent_checks
from dapo_jax.training.config.data import DataSection, MixtureSource
from dapo_jax.training.config.sections import DistillSection, DistributedSection, MeshSection, RolloutSection

GRPO = load_objective("grpo")


def _failing(agent=AgentSection(env="pkg.mod:Env"), *, objective=GRPO, named_discount=1.0, slots=None,
             rollout=RolloutSection(max_new_tokens=16), data=DataSection(max_prompt_length=64), mesh=MeshSection(),
             distill=None):
    slots = slots if slots is not None else data.max_prompt_length + agent.max_episode_tokens
    return [key for key, ok, _ in agent_checks(agent, objective=objective, objective_name=objective.name,
                                               named_discount=named_discount, slots=slots, rollout=rollout,
                                               data=data, mesh=mesh, distill=distill) if not ok]


def test_a_valid_multi_turn_setting_passes_every_check():
    assert _failing() == []
    assert _failing(AgentSection(env="envs/calc.py:CalcEnv", discount=0.9),
                    objective=load_objective("grpo_process", overlong_buffer=None)) == []


@pytest.mark.parametrize("change, key", [
    (dict(agent=AgentSection(env="pkg.mod")), "agent.env"),  # no :Name
    (dict(agent=AgentSection(env="pkg/mod:a/b")), "agent.env"),
    (dict(rollout=RolloutSection(max_new_tokens=512)), "rollout.max_new_tokens"),  # one turn over the episode
    (dict(agent=AgentSection(env="a:B", tool_timeout=30.0)), "agent.tool_timeout"),  # not under the step's 30 s
    (dict(slots=64), "agent.cache_slots"),  # no room after the 64-token prompt
    (dict(objective=load_objective("sft")), "agent"),
    (dict(agent=AgentSection(env="a:B", discount=0.5)), "agent.discount"),  # an outcome estimator
    (dict(distill=DistillSection(teacher="t")), "agent"),
    (dict(rollout=RolloutSection(max_new_tokens=16, continuous=True)), "agent"),
    (dict(data=DataSection(sources={"a": MixtureSource()})), "agent"),
    (dict(mesh=MeshSection(distributed=DistributedSection(num_processes=2))), "agent"),
])
def test_each_failing_check_names_its_key(change, key):
    assert _failing(**change) == [key]


def test_two_discounts_of_the_turns_are_refused_unless_they_agree():
    process = load_objective("grpo_process", overlong_buffer=None)
    agent = AgentSection(env="a:B", discount=0.5)
    assert _failing(agent, objective=process, named_discount=0.7) == ["agent.discount"]
    assert _failing(agent, objective=process, named_discount=0.5) == []
    assert _failing(agent, objective=process, named_discount=1.0) == []
