"""Hermes tool calls in the model's text."""

from dapo_jax.agents.parse import ToolCall, parse_tool_calls


def test_calls_in_order_with_string_arguments_decoded():
    text = ('I will add. <tool_call>\n{"name": "calc", "arguments": {"expression": "1+2"}}\n</tool_call>'
            '<tool_call>{"name": "calc", "arguments": "{\\"expression\\": \\"3\\"}"}</tool_call> tail')
    parsed = parse_tool_calls(text)
    assert parsed.calls == [ToolCall("calc", {"expression": "1+2"}), ToolCall("calc", {"expression": "3"})]
    assert parsed.errors == []


def test_broken_blocks_are_errors_and_unclosed_ones_are_ignored():
    parsed = parse_tool_calls('<tool_call>{"name": 3}</tool_call><tool_call>{oops</tool_call><tool_call>{"name":')
    assert parsed.calls == []
    assert parsed.errors[0] == 'the tool call must be a JSON object with a string "name"'
    assert parsed.errors[1].startswith("the tool call is not JSON (Expecting property name")
    assert len(parsed.errors) == 2
    assert parse_tool_calls("no call at all") == ([], [])
