"""The reward section's checks against the run, read off hand-built sections: the key each failing
check names, and that a valid section passes them all."""

import math

from dapo_jax.training.config.reward import RewardFunction, RewardSection, non_finite, reward_checks
from dapo_jax.training.config.sections import DistributedSection, MeshSection


def _failing(reward, mesh=MeshSection()):
    return [key for key, ok, _ in reward_checks(reward, mesh) if not ok]


def test_non_finite_finds_every_nan_and_inf_with_its_dotted_key():
    options = {"a": 1.0, "b": {"c": math.inf, "d": [0.5, math.nan, {"e": -math.inf}]}, "f": "nan", "g": True}
    found = non_finite(options)
    assert [k for k, _ in found] == ["b.c", "b.d.1", "b.d.2.e"]  # the string "nan" is not a number
    assert math.isinf(found[0][1]) and math.isnan(found[1][1])
    assert non_finite({}) == [] and non_finite([1.0, 2]) == []


def test_a_valid_reward_section_passes_every_check():
    reward = RewardSection(functions=[RewardFunction(name="integer", options={"x": 1.0}),
                                      RewardFunction(name="my.module:score"),
                                      RewardFunction(name="reward_model", path="rm")])
    assert _failing(reward) == []


def test_each_failing_check_names_its_key():
    assert _failing(RewardSection(functions=[RewardFunction(name="nope")])) == ["reward.functions.0.name"]
    assert _failing(RewardSection(functions=[RewardFunction(name="integer", options={"t": {"u": math.nan}})])) == [
        "reward.functions.0.options.t.u"]
    assert _failing(RewardSection(functions=[RewardFunction(name="integer", path="rm")])) == [
        "reward.functions.0.path"]  # a rule takes no path
    assert _failing(RewardSection(functions=[RewardFunction(name="integer"),
                                             RewardFunction(name="process_reward_model")])) == [
        "reward.functions.1.path"]  # a learned model needs one


def test_a_learned_reward_model_only_in_a_one_process_run():
    reward = RewardSection(functions=[RewardFunction(name="reward_model", path="rm")])
    two = MeshSection(distributed=DistributedSection(num_processes=2))
    one = MeshSection(distributed=DistributedSection(num_processes=1))
    assert _failing(reward, two) == ["reward.functions"] and _failing(reward, one) == []
    assert _failing(RewardSection(), two) == []  # a rule reward runs on each process's rows
