"""Tools from typed functions: schemas, argument checks, and results that are always bounded text."""

import asyncio
import time
from typing import Literal, Optional

import pytest

from dapo_jax.agents.tools import Tool, ToolError, ToolResult, as_text, call_tools


def calc(expression: str, precision: int = 0) -> str:
    """Evaluates an arithmetic expression.

    Args:
      expression: digits and + - *, e.g. "12+30".
        Spaces are ignored.
      precision: unused.
    """
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - test tool


async def fetch(key: str, mode: Literal["a", "b"] = "a", limit: Optional[float] = None) -> dict:
    """Looks a key up."""
    await asyncio.sleep(0)
    return {"key": key, "mode": mode}


def test_schema_from_the_signature_and_docstring():
    schema = Tool.from_function(calc).schema
    assert schema == {"type": "function", "function": {
        "name": "calc", "description": "Evaluates an arithmetic expression.",
        "parameters": {"type": "object", "required": ["expression"], "properties": {
            "expression": {"type": "string", "description": 'digits and + - *, e.g. "12+30". Spaces are ignored.'},
            "precision": {"type": "integer", "description": "unused."}}}}}
    props = Tool.from_function(fetch).schema["function"]["parameters"]["properties"]
    assert props == {"key": {"type": "string"}, "mode": {"enum": ["a", "b"]}, "limit": {"type": "number"}}


def test_functions_that_cannot_be_tools():
    def untyped(x):
        return x

    def starred(*args: int):
        return args

    def odd(x: set):
        return x

    with pytest.raises(ToolError, match="parameter 'x' has no type hint"):
        Tool.from_function(untyped)
    with pytest.raises(ToolError, match=r"\*args"):
        Tool.from_function(starred)
    with pytest.raises(ToolError, match="no JSON schema type"):
        Tool.from_function(odd)


def test_argument_checks():
    tool = Tool.from_function(calc)
    assert tool.check_arguments({"expression": "1+2"}) is None
    assert "missing argument(s) expression" in tool.check_arguments({})
    assert "unknown argument(s) x" in tool.check_arguments({"expression": "1", "x": 2})
    assert "does not match" in tool.check_arguments({"expression": 12})
    assert "does not match" in tool.check_arguments({"expression": "1", "precision": True})  # a bool is no int
    assert "JSON object" in tool.check_arguments(["1+2"])


def test_as_text():
    assert as_text("x") == "x" and as_text(3) == "3" and as_text({"a": [1, None]}) == '{"a": [1, null]}'
    assert as_text(object()) is None and as_text(b"bytes") is None and as_text(float("nan")) is None


def test_every_failure_is_a_result_never_an_exception():
    def hang() -> str:
        """Never returns."""
        time.sleep(3600)

    def huge() -> str:
        """A megabyte."""
        return "x" * 1_000_000

    def garbage() -> str:
        """Not text."""
        return object()

    def boom() -> str:
        """Raises."""
        raise ZeroDivisionError("no")

    tools = {f.__name__: Tool.from_function(f) for f in (calc, hang, huge, garbage, boom, fetch)}
    calls = [(tools["calc"], {"expression": "2*21"}), (tools["hang"], {}), (tools["huge"], {}), (tools["garbage"], {}),
             (tools["boom"], {}), (tools["calc"], {"expr": "1"}), (None, {}), (tools["fetch"], {"key": "k"})]
    out = call_tools(calls, timeout=0.5, max_chars=100, unknown_names=[""] * 6 + ["search", ""])
    assert out[0] == ToolResult("42", "ok")
    assert out[1].status == "timeout"
    assert out[2].status == "truncated" and out[2].text == "x" * 100 + " [truncated]"
    assert out[3] == ToolResult("Error: the tool returned a object, not text or JSON", "bad_output")
    assert out[4] == ToolResult("Error: ZeroDivisionError: no", "error")
    assert out[5].status == "error" and "unknown argument(s) expr" in out[5].text
    assert out[6] == ToolResult("Error: no tool named 'search'", "error")
    assert out[7] == ToolResult('{"key": "k", "mode": "a"}', "ok")
