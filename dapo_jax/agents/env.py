"""Environments: what an episode's turns are played against.

    class Calculator(ToolEnv):                  # named in config as "my_pkg.envs:Calculator"
        tools = (calc,)                         # plain typed functions (agents/tools.py)
        def reset(self, row):                   # the first messages; a function of the row only
            return [{"role": "user", "content": row["problem"]}]

One instance per episode. `reset(row)` must depend on the row alone: the G episodes of a group are
G instances reset on the same row, and the driver checks that they start from the same messages (a
group whose members start apart gives advantages that compare different tasks).

`step(turn)` sees the model's turn (its text, its token ids, the tool calls parsed from it) and
returns the observation messages to append (role "tool" or "user"), the turn's reward (placed at the
turn's last model token) and `done`. `reward()` is the optional outcome reward at the episode's end
(None: the run's reward functions score the final text instead).

`ToolEnv.step` runs the turn's calls at once with `tool_timeout` seconds each and cuts each answer to
`max_tool_chars` characters; a turn without a call (the model answered) ends the episode.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from dapo_jax.agents.parse import ToolCall
from dapo_jax.agents.tools import Tool, ToolError, call_tools


class AgentConfigError(ValueError):
    """A user error in the agent setup (import path, signature, a dry episode): one line, exit 2."""


@dataclass
class Turn:
    """One model turn as the environment sees it."""

    text: str  # the turn's tokens decoded (the tokens themselves are never re-encoded)
    token_ids: list[int]
    calls: list[ToolCall]
    parse_errors: list[str]
    stopped: str  # "tool_call" (stopped at the end marker) or "eos"


@dataclass
class StepResult:
    observations: list[dict]  # messages appended after the turn, e.g. {"role": "tool", "content": "42"}
    reward: float = 0.0  # the turn's reward, at its last model token
    done: bool = False
    metrics: dict[str, float] = field(default_factory=dict)  # counts summed over the run's episodes


class Env:
    """The episode interface. Subclass it, or `ToolEnv` for tool use."""

    tools: tuple[Callable, ...] = ()

    def reset(self, row: dict) -> list[dict]:
        raise NotImplementedError

    def step(self, turn: Turn) -> StepResult:
        raise NotImplementedError

    def reward(self) -> float | None:
        return None


TOOL_STATUSES = ("ok", "error", "timeout", "bad_output", "truncated")


class ToolEnv(Env):
    """An environment whose only actions are calls of its `tools`."""

    tool_timeout: float = 10.0
    max_tool_chars: int = 8192

    def tool_table(self) -> dict[str, Tool]:
        if not hasattr(self, "_tool_table"):
            table = {}
            for fn in self.tools:
                tool = fn if isinstance(fn, Tool) else Tool.from_function(fn)
                table[tool.name] = tool
            self._tool_table = table
        return self._tool_table

    def schemas(self) -> list[dict]:
        """The tools' JSON schemas, for the chat template's `tools=` argument."""
        return [tool.schema for tool in self.tool_table().values()]

    def step(self, turn: Turn) -> StepResult:
        if not turn.calls and not turn.parse_errors:
            return StepResult([], 0.0, done=True)
        table = self.tool_table()
        results = call_tools([(table.get(c.name), c.arguments) for c in turn.calls], timeout=self.tool_timeout,
                             max_chars=self.max_tool_chars, unknown_names=[c.name for c in turn.calls])
        observations = [{"role": "tool", "name": c.name, "content": r.text} for c, r in zip(turn.calls, results)]
        observations += [{"role": "tool", "content": f"Error: {e}"} for e in turn.parse_errors]
        metrics = {"tool_calls": float(len(turn.calls)), "tool_parse_errors": float(len(turn.parse_errors))}
        for status in TOOL_STATUSES[1:]:
            metrics[f"tool_{status}"] = float(sum(r.status == status for r in results))
        return StepResult(observations, 0.0, done=False, metrics=metrics)


def load_env(path: str) -> Callable[..., Env]:
    """`"pkg.module:Name"` or `"path/to/file.py:Name"` -> the class (or factory) it names; `AgentConfigError`
    with one line otherwise."""
    if isinstance(path, str) and ".py:" in path:  # a file, imported as rewards/custom.py imports a user's reward
        from dapo_jax.rewards.custom import CustomRewardError, load_function

        try:
            return load_function(path)
        except CustomRewardError as exc:
            raise AgentConfigError(f"agent.env={exc}") from exc
    if not isinstance(path, str) or path.count(":") != 1:
        raise AgentConfigError(f"agent.env={path!r}: expected 'package.module:Name' or 'path/to/file.py:Name'")
    module_name, attr = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's to fix
        raise AgentConfigError(f"agent.env={path!r}: cannot import {module_name} ({type(exc).__name__}: {exc})") from exc
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise AgentConfigError(f"agent.env={path!r}: {module_name} has no callable {attr!r}")
    return factory


def _check_messages(messages: Any, what: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise AgentConfigError(f"{what} must return a non-empty list of messages, got {type(messages).__name__}")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise AgentConfigError(f"{what}: each message must be a dict with str 'role' and 'content', got {m!r:.80}")


def preflight(factory: Callable[..., Env], row: dict, *, kwargs: dict | None = None, path: str = "agent.env") -> Env:
    """One dry episode before the model loads: build an instance, check its tools' signatures, reset it
    on `row`, step it with an empty answer. Returns the instance; raises `AgentConfigError` (one line)."""
    try:
        env = factory(**(kwargs or {}))
    except Exception as exc:  # noqa: BLE001
        raise AgentConfigError(f"{path}: constructing it failed ({type(exc).__name__}: {exc})") from exc
    for method in ("reset", "step"):
        if not callable(getattr(env, method, None)):
            raise AgentConfigError(f"{path}: the instance has no {method}() method")
    if len(inspect.signature(env.reset).parameters) != 1:
        raise AgentConfigError(f"{path}: reset must take exactly one argument (the data row)")
    if isinstance(env, ToolEnv):
        try:
            env.tool_table()
        except ToolError as exc:
            raise AgentConfigError(f"{path}: {exc}") from exc
    try:
        first = env.reset(dict(row))
    except Exception as exc:  # noqa: BLE001
        raise AgentConfigError(f"{path}: reset() on the first data row raised {type(exc).__name__}: {exc}") from exc
    _check_messages(first, f"{path}: reset()")
    try:
        result = env.step(Turn("", [], [], [], "eos"))
    except Exception as exc:  # noqa: BLE001
        raise AgentConfigError(f"{path}: step() on an empty answer raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(result, StepResult):
        raise AgentConfigError(f"{path}: step() must return a StepResult, got {type(result).__name__}")
    return factory(**(kwargs or {}))
