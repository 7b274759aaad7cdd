"""Tools as plain typed Python functions: a JSON schema from the signature, calls that are checked,
contained and bounded.

    def calc(expression: str) -> str:
        '''Evaluates an arithmetic expression.

        Args:
          expression: digits, + - * and parentheses, e.g. "123+456".
        '''

    tool = Tool.from_function(calc)         # raises ToolError when a parameter has no type hint
    tool.schema                             # {"type": "function", "function": {"name", "description", "parameters"}}
    results = call_tools([(tool, {"expression": "1+2"}), ...], timeout=5.0, max_chars=4096)

A result is always text for the model plus a status: "ok"; "error" (the tool raised, the arguments
did not fit the signature, or no tool has that name); "timeout"; "bad_output" (the value is not text
or JSON). Text longer than `max_chars` is cut (marked "truncated") before anything tokenizes it, so a
1 MB answer costs a slice, not a tokenizer pass over a megabyte. The caller (the episode driver)
counts each status as a metric.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

from dapo_jax.agents.contain import run_contained


class ToolError(ValueError):
    """A function that cannot be a tool (no type hint, an unsupported type): raised at load time."""


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


def _json_type(hint, where: str) -> dict:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return _json_type(args[0], where)
        return {"anyOf": [_json_type(a, where) for a in args]}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(hint))}
    base = origin or hint
    if base in (list, tuple):
        items = typing.get_args(hint)
        return {"type": "array", **({"items": _json_type(items[0], where)} if items else {})}
    if base in _JSON_TYPES:
        return {"type": _JSON_TYPES[base]}
    raise ToolError(f"{where}: type {hint!r} has no JSON schema type (use str, int, float, bool, list, dict)")


def _arg_docs(doc: str) -> dict[str, str]:
    """A Google-style docstring's `Args:` entries, `name: text`."""
    match = re.search(r"^\s*Args:\s*\n(?P<body>(?:[ \t]+.*\n?|\s*\n)+)", doc, re.MULTILINE)
    if not match:
        return {}
    out, current = {}, None
    for line in match["body"].splitlines():
        entry = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line)
        if entry and (current is None or len(line) - len(line.lstrip()) <= out[current][1]):
            current = entry[1]
            out[current] = [entry[2], len(line) - len(line.lstrip())]
        elif current and line.strip():
            out[current][0] += " " + line.strip()
    return {name: text for name, (text, _) in out.items()}


def _matches(value, schema: dict) -> bool:
    if "anyOf" in schema:
        return any(_matches(value, s) for s in schema["anyOf"])
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema["type"]
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    python = {"string": str, "boolean": bool, "array": list, "object": dict}[kind]
    return isinstance(value, python)


@dataclass(frozen=True)
class Tool:
    """One callable tool: its function (sync or async) and the schema the model is shown."""

    name: str
    fn: Callable
    schema: dict

    @classmethod
    def from_function(cls, fn: Callable, *, name: str | None = None) -> "Tool":
        if not callable(fn):
            raise ToolError(f"tool {fn!r} is not callable")
        name = name or fn.__name__
        doc = inspect.getdoc(fn) or ""
        try:
            hints = typing.get_type_hints(fn)
        except Exception as exc:  # noqa: BLE001 - an unresolvable annotation
            raise ToolError(f"tool {name}: its type hints do not resolve ({exc})") from exc
        properties, required = {}, []
        arg_docs = _arg_docs(doc)
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolError(f"tool {name}: *args/**kwargs ({param.name}) have no schema")
            if param.name not in hints:
                raise ToolError(f"tool {name}: parameter {param.name!r} has no type hint")
            prop = _json_type(hints[param.name], f"tool {name}, parameter {param.name!r}")
            if param.name in arg_docs:
                prop["description"] = arg_docs[param.name]
            properties[param.name] = prop
            if param.default is param.empty:
                required.append(param.name)
        description = doc.split("\n\n")[0].strip()
        schema = {"type": "function", "function": {
            "name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        }}
        return cls(name, fn, schema)

    def check_arguments(self, arguments) -> str | None:
        """Why `arguments` do not fit the signature (one line), or None when they do."""
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {type(arguments).__name__}"
        params = self.schema["function"]["parameters"]
        unknown = sorted(set(arguments) - set(params["properties"]))
        if unknown:
            return f"unknown argument(s) {', '.join(unknown)} for {self.name}"
        missing = [p for p in params["required"] if p not in arguments]
        if missing:
            return f"missing argument(s) {', '.join(missing)} for {self.name}"
        for key, value in arguments.items():
            if not _matches(value, params["properties"][key]):
                return f"argument {key}={value!r:.40} does not match {params['properties'][key]}"
        return None


class ToolResult(NamedTuple):
    """A tool call's text for the model and its status: ok, error, timeout, bad_output, truncated."""

    text: str
    status: str


def as_text(value: Any) -> str | None:
    """A tool's return value as text: a str as is, JSON values serialised; None for anything else."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, (bool, int, float, list, dict)):
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):
            return None
    return None


def call_tools(calls: list[tuple[Tool | None, Any]], *, timeout: float, max_chars: int,
               unknown_names: list[str] | None = None) -> list[ToolResult]:
    """Runs every `(tool, arguments)` at once (see `contain.run_contained`) and returns its result.

    A `None` tool is a call to a name no tool has (`unknown_names[i]` says which, for the message)."""
    results: list[ToolResult | None] = [None] * len(calls)
    runnable = []
    for i, (tool, arguments) in enumerate(calls):
        if tool is None:
            name = unknown_names[i] if unknown_names else "?"
            results[i] = ToolResult(f"Error: no tool named {name!r}", "error")
            continue
        problem = tool.check_arguments(arguments)
        if problem:
            results[i] = ToolResult(f"Error: {problem}", "error")
        else:
            runnable.append(i)
    outcomes = run_contained([(calls[i][0].fn, (), calls[i][1]) for i in runnable], timeout=timeout) if runnable else []
    for i, outcome in zip(runnable, outcomes):
        if outcome.status != "ok":
            results[i] = ToolResult(f"Error: {outcome.error}", outcome.status)
            continue
        text = as_text(outcome.value)
        if text is None:
            results[i] = ToolResult(f"Error: the tool returned a {type(outcome.value).__name__}, not text or JSON",
                                    "bad_output")
        elif len(text) > max_chars:
            results[i] = ToolResult(text[:max_chars] + " [truncated]", "truncated")
        else:
            results[i] = ToolResult(text, "ok")
    return results
