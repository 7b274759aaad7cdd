"""Environments: loading by import path, the pre-flight check's one-line errors, ToolEnv's steps,
and the example calculator."""

import pytest

from dapo_jax.agents.env import AgentConfigError, Env, StepResult, ToolEnv, Turn, load_env, preflight
from dapo_jax.agents.examples import CalcEnv, calc
from dapo_jax.agents.parse import ToolCall


def test_load_env_by_import_path():
    assert load_env("dapo_jax.agents.examples:CalcEnv") is CalcEnv
    for path, message in [("dapo_jax.agents.examples.CalcEnv", "expected 'package.module:Name'"),
                          ("no_such_pkg.envs:Env", "cannot import no_such_pkg.envs"),
                          ("dapo_jax.agents.examples:Nope", "has no callable 'Nope'")]:
        with pytest.raises(AgentConfigError, match=message) as err:
            load_env(path)
        assert "\n" not in str(err.value)


class NoReset(Env):
    def step(self, turn):
        return StepResult([])


class TwoArgReset(Env):
    def reset(self, row, seed):
        return []

    def step(self, turn):
        return StepResult([])


class Untyped(ToolEnv):
    tools = (lambda x: x,)

    def reset(self, row):
        return [{"role": "user", "content": "hi"}]


class BadMessages(Env):
    def reset(self, row):
        return [{"role": "user"}]

    def step(self, turn):
        return StepResult([])


class StepReturnsDict(Env):
    def reset(self, row):
        return [{"role": "user", "content": "hi"}]

    def step(self, turn):
        return {"observations": []}


class ResetRaises(Env):
    def reset(self, row):
        return [{"role": "user", "content": row["question"]}]


@pytest.mark.parametrize("factory, message", [
    (NoReset, "reset\\(\\) on the first data row raised NotImplementedError"),
    (TwoArgReset, "reset must take exactly one argument"),
    (Untyped, "parameter 'x' has no type hint"),
    (BadMessages, "each message must be a dict with str 'role' and 'content'"),
    (StepReturnsDict, "step\\(\\) must return a StepResult, got dict"),
    (ResetRaises, "reset\\(\\) on the first data row raised KeyError: 'question'"),
])
def test_preflight_errors_are_one_line(factory, message):
    with pytest.raises(AgentConfigError, match=message) as err:
        preflight(factory, {"problem": "1+2", "answer": "3"})
    assert "\n" not in str(err.value)


def test_preflight_passes_the_example_and_returns_a_fresh_instance():
    env = preflight(CalcEnv, {"problem": "1+2", "answer": "3"})
    assert isinstance(env, CalcEnv) and not hasattr(env, "answer")


def test_tool_env_steps_and_counts():
    env = CalcEnv()
    assert env.reset({"problem": "123+877", "answer": "1000"}) == [{"role": "user", "content": "123+877="}]
    calls = [ToolCall("calc", {"expression": "123+877"}), ToolCall("calc", {"expression": "import os"}),
             ToolCall("search", {"q": "x"})]
    result = env.step(Turn("...", [], calls, ["the tool call is not JSON"], "tool_call"))
    assert not result.done and result.reward == 0.0
    assert [o["content"] for o in result.observations] == [
        "1000", "Error: ValueError: only digits, spaces, parentheses and + - * are allowed",
        "Error: no tool named 'search'", "Error: the tool call is not JSON"]
    assert result.metrics["tool_calls"] == 3 and result.metrics["tool_error"] == 2
    assert result.metrics["tool_parse_errors"] == 1 and result.metrics["tool_timeout"] == 0
    final = env.step(Turn("so 1000", [], [], [], "eos"))
    assert final.done and final.observations == [] and env.reward() == 1.0
    env.step(Turn("maybe 999", [], [], [], "eos"))
    assert env.reward() == 0.0
    assert env.schemas()[0]["function"]["name"] == "calc"


@pytest.mark.parametrize("expression, value", [("1+2*3", "7"), ("(1+2)*3", "9"), ("-4+10", "6"),
                                               ("123456789+987654321", "1111111110"), ("2*(3-5)", "-4")])
def test_calc_by_hand(expression, value):
    assert calc(expression) == value


@pytest.mark.parametrize("expression", ["1+", "(1+2", "1)", "2**3x", ""])
def test_calc_refuses_malformed_expressions(expression):
    with pytest.raises(ValueError):
        calc(expression)
