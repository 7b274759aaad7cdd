"""A tool-use environment to copy from: sums with a `calc` tool.

    agent.env: dapo_jax.agents.examples:CalcEnv        # rows {"problem": "123456+654321", "answer": "777777"}

The model may call `calc` with an expression of digits and `+ - *`; the episode's outcome reward is
1 when the last integer of its final answer equals the row's `answer`, else 0.
"""

from __future__ import annotations

import re

from dapo_jax.agents.env import ToolEnv

_EXPRESSION = re.compile(r"[0-9+\-* ()]{1,200}")


def calc(expression: str) -> str:
    """Evaluates an integer arithmetic expression.

    Args:
      expression: digits, spaces, parentheses and + - *, e.g. "123456+654321".
    """
    if not _EXPRESSION.fullmatch(expression):
        raise ValueError("only digits, spaces, parentheses and + - * are allowed")
    return str(_evaluate(expression.replace(" ", "")))


def _evaluate(text: str) -> int:
    """A small recursive-descent evaluator (no `eval`): sum of products of signed atoms."""
    pos = 0

    def atom() -> int:
        nonlocal pos
        if pos < len(text) and text[pos] in "+-":
            sign = -1 if text[pos] == "-" else 1
            pos += 1
            return sign * atom()
        if pos < len(text) and text[pos] == "(":
            pos += 1
            value = expr()
            if pos >= len(text) or text[pos] != ")":
                raise ValueError("unbalanced parentheses")
            pos += 1
            return value
        match = re.match(r"\d+", text[pos:])
        if not match:
            raise ValueError(f"expected a number at position {pos}")
        pos += match.end()
        return int(match[0])

    def term() -> int:
        nonlocal pos
        value = atom()
        while pos < len(text) and text[pos] == "*":
            pos += 1
            value *= atom()
        return value

    def expr() -> int:
        nonlocal pos
        value = term()
        while pos < len(text) and text[pos] in "+-":
            op = text[pos]
            pos += 1
            value = value + term() if op == "+" else value - term()
        return value

    value = expr()
    if pos != len(text):
        raise ValueError(f"unexpected {text[pos]!r} at position {pos}")
    return value


class CalcEnv(ToolEnv):
    """One sum per episode; the tool is `calc`; the outcome is the final answer's correctness."""

    tools = (calc,)
    tool_timeout = 2.0
    max_tool_chars = 64

    def reset(self, row: dict) -> list[dict]:
        self.answer = str(row["answer"])
        self.final = ""
        return [{"role": "user", "content": f"{row['problem']}="}]

    def step(self, turn):
        result = super().step(turn)
        if result.done:
            self.final = turn.text
        return result

    def reward(self) -> float:
        numbers = re.findall(r"-?\d+", self.final)
        return float(bool(numbers) and numbers[-1] == self.answer)
