"""Tool calls in the model's text: the Hermes format Qwen2.5 is trained on.

    <tool_call>
    {"name": "calc", "arguments": {"expression": "12+30"}}
    </tool_call>

The sampler stops a turn at the end marker (`TOOL_CALL_END`), so a turn holds at most one complete
call when it stopped there; a turn that ended on EOS may hold several. A block whose body is not a
JSON object with a string `name` and an object `arguments` is a parse error: the episode driver
tells the model so in a tool message and counts it (`agent/tool_parse_errors`).
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)


class ToolCall(NamedTuple):
    name: str
    arguments: Any  # a dict when well formed


class ParsedTurn(NamedTuple):
    calls: list[ToolCall]
    errors: list[str]  # one line per block that is not a valid call


def parse_tool_calls(text: str) -> ParsedTurn:
    """Every complete `<tool_call>...</tool_call>` block of `text`, in order."""
    calls, errors = [], []
    for match in _BLOCK.finditer(text):
        body = match[1].strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"the tool call is not JSON ({exc.msg} at character {exc.pos})")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            errors.append('the tool call must be a JSON object with a string "name"')
            continue
        arguments = obj.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        calls.append(ToolCall(obj["name"], arguments))
    return ParsedTurn(calls, errors)
