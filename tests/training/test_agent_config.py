"""The `agent:` section: its keys, one-line errors naming them, and what an agent run chooses for itself."""

import warnings

import pytest

from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.resolve import resolve
from dapo_jax.training.config.run import load_config


def cfg(*overrides):
    return load_config("tiny_agent_calc", list(overrides))


def test_the_recipe_resolves_the_episode_budget_and_engine_sizes():
    c = cfg()
    assert c.agent.env == "dapo_jax.agents.examples:CalcEnv"
    assert c.response_tokens == c.agent.max_episode_tokens == 24  # the update's response width
    assert c.objective_config.max_response_length == 24  # L_max of the overlong shaping, in model ids
    assert c.agent_cache_slots == 8 + 24  # prompt + episode: each row writes at its own index
    assert cfg("agent.cache_slots=100").agent_cache_slots == 100
    assert resolve(c).optim.packing  # episodes pack like single turns (tool ids as context)
    assert load_config("tiny_dapo").response_tokens == load_config("tiny_dapo").rollout.max_new_tokens


@pytest.mark.parametrize("override, key", [
    ("agent.env=no_colon", "agent.env"),
    ("agent.env=pkg:a/b", "agent.env"),
    ("rollout.max_new_tokens=32", "rollout.max_new_tokens"),
    ("agent.tool_timeout=30", "agent.tool_timeout"),
    ("agent.cache_slots=8", "agent.cache_slots"),
    ("agent.max_turns=0", "agent.max_turns"),
    ("agent.discount=0", "agent.discount"),
    ("agent.discount=1.5", "agent.discount"),
    ("agent.discount=0.9", "agent.discount"),  # the recipe's outcome estimator reads no turns
    ("agent.truncation_side=middle", "agent.truncation_side"),
    ("agent.max_tool_token=3", "agent.max_tool_token"),
    ("rollout.continuous=true", "agent"),
])
def test_errors_are_one_line_naming_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        cfg(override)
    msg = str(e.value)
    assert "\n" not in msg and f": {key}:" in msg, msg


def test_unknown_agent_key_suggests_the_near_one():
    with pytest.raises(ConfigError, match=r"agent.max_tool_token: unknown key \(did you mean 'agent.max_tool_tokens'"):
        cfg("agent.max_tool_token=3")


def test_agent_runs_choose_the_packed_update_unless_told_otherwise():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert resolve(cfg()).optim.packing is True
        assert resolve(cfg("optim.packing=false")).optim.packing is False
    assert not [w for w in seen if "optim.packing" in str(w.message)]


def test_process_supervision_reads_turn_rewards_without_a_step_reward_function():
    c = cfg("objective.name=grpo_process", "objective.overlong_buffer=null")
    assert c.objective_config.needs_step_rewards
    with pytest.raises(ConfigError, match="reward.functions.0.name"):  # a single-turn run still needs one
        load_config("tiny_dapo", ["objective.name=grpo_process", "objective.overlong_buffer=null",
                                  "reward.functions=[{name: integer}]"])


def test_the_discount_reaches_process_supervision():
    assert cfg().agent.discount == 1.0 and cfg().objective_config.process_discount == 1.0  # the plain sum
    c = cfg("objective.name=grpo_process", "objective.overlong_buffer=null", "agent.discount=0.9")
    assert c.objective_config.process_discount == 0.9
    with pytest.raises(ConfigError, match=r"agent.discount: 0.9 and objective.process_discount=0.5"):
        cfg("objective.name=grpo_process", "objective.overlong_buffer=null", "agent.discount=0.9",
            "objective.process_discount=0.5")
