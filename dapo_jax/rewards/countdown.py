"""The ``countdown`` reward: the response's expression reaches the target, checked in the sandbox.

    reward = make_reward("countdown", right=1.0, wrong=0.0)
    reward("3*5+7", "22:3,5,7")          # 1.0 (ground truth: "target:numbers", data/countdown.py)

The expression is the response stripped (or what an ``<answer>...</answer>`` holds, R1's layout).
It is right when it parses as Python arithmetic made of non-negative integer literals, ``+ - * /``
and parentheses only (no unary signs, names, calls or other operators), at most ``max_chars``
characters, using every given number exactly once and no other (a multiset match), and its exact
rational value (``fractions.Fraction``; a division by zero is wrong) equals the target.

The check is a strictly parsed AST walk, and even so it runs in the sandbox (``rewards/sandbox.py``),
never in the calling process: ``score_many`` sends a whole batch to ONE sandboxed process (the
checker's source with the batch as a JSON string literal: the responses are data, never code) and
reads one verdict per row back from its stdout.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence

from dapo_jax.data.countdown import parse_answer
from dapo_jax.rewards.sandbox import Sandbox, SandboxLimits

__all__ = ["CHECKER", "CountdownReward", "extract_expression", "make_countdown_reward"]

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

# Runs inside the sandbox: `ROWS` (a JSON list of [expression, target, numbers]) is prepended by
# `CountdownReward._program`; prints a JSON list of 0/1 verdicts.
CHECKER = r"""
import ast, json
from fractions import Fraction
OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
       ast.Div: lambda a, b: a / b}
def evaluate(node, used):
    if isinstance(node, ast.Expression):
        return evaluate(node.body, used)
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](evaluate(node.left, used), evaluate(node.right, used))
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
        used.append(node.value)
        return Fraction(node.value)
    raise ValueError(f"not allowed: {type(node).__name__}")
def verdict(expression, target, numbers, max_chars):
    if not expression or len(expression) > max_chars or not set(expression) <= set("0123456789+-*/() "):
        return 0
    try:
        used = []
        v = evaluate(ast.parse(expression, mode="eval"), used)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return 0
    return int(sorted(used) == sorted(numbers) and v == target)
print(json.dumps([verdict(e, t, n, m) for e, t, n, m in json.loads(ROWS)]))
"""


def extract_expression(response: str) -> str:
    """The text of the last ``<answer>...</answer>``, else the whole response, stripped."""
    tags = _ANSWER_TAG.findall(response)
    return (tags[-1] if tags else response).strip()


@dataclasses.dataclass(frozen=True)
class CountdownReward:
    """``right`` when the expression reaches the target (module docstring), else ``wrong``."""

    sandbox: Sandbox
    right: float = 1.0
    wrong: float = -1.0
    max_chars: int = 100
    name: str = "countdown"

    def _program(self, expressions: Sequence[str], problems: Sequence[tuple[int, list[int]]]) -> str:
        rows = [[e, target, numbers, self.max_chars] for e, (target, numbers) in zip(expressions, problems)]
        return f"ROWS = {json.dumps(json.dumps(rows))}\n{CHECKER}"

    def verdicts(self, responses: Sequence[str], answers: Sequence[str]) -> tuple[list[bool], dict[int, str]]:
        """``([N] whether each response is right, {row: why} for rows that could not be judged)``, from
        one sandboxed process: a malformed ground truth fails its row; a checker that does not finish
        (its limits) or prints no verdicts fails every row."""
        if len(responses) != len(answers):
            raise ValueError(f"countdown: {len(responses)} responses but {len(answers)} answers")
        ok, failed, rows, problems = [False] * len(responses), {}, [], []
        for i, answer in enumerate(answers):
            try:
                problems.append(parse_answer(answer))
                rows.append(i)
            except ValueError as e:
                failed[i] = str(e)
        if not rows:
            return ok, failed
        result = self.sandbox.run(self._program([extract_expression(responses[i]) for i in rows], problems))
        try:
            out = json.loads(result.stdout) if result.passed else None
        except ValueError:
            out = None
        if not isinstance(out, list) or len(out) != len(rows):
            why = f"countdown checker {result.status} (exit {result.returncode}): {result.stderr.strip()[-300:]}"
            return ok, {**failed, **dict.fromkeys(rows, why)}
        for i, v in zip(rows, out):
            ok[i] = bool(v)
        return ok, failed

    def score_many(self, responses: Sequence[str], answers: Sequence[str]):
        """``(rewards [N], correct [N], failed {row: why})``; a failed row scores ``wrong``."""
        ok, failed = self.verdicts(responses, answers)
        return [self.right if v else self.wrong for v in ok], ok, failed

    def score(self, response: str, answer: str) -> tuple[float, bool]:
        """One row; raises ValueError when it cannot be judged (a bad ground truth, a checker that did not finish)."""
        (ok,), failed = self.verdicts([response], [answer])
        if failed:
            raise ValueError(failed[0])
        return (self.right if ok else self.wrong), ok

    def is_correct(self, response: str, answer: str) -> bool:
        return self.score(response, answer)[1]

    def answer_key(self, response: str) -> str:
        return extract_expression(response)

    def __call__(self, response: str, answer: str) -> float:
        return self.score(response, answer)[0]


def make_countdown_reward(*, right: float = 1.0, wrong: float = -1.0, max_chars: int = 100,
                          wall_s: float = 20.0, mode: str = "auto") -> CountdownReward:
    """``make_reward("countdown", ...)``: the reward with its sandbox (started once here, to fail early)."""
    if max_chars < 1:
        raise ValueError(f"countdown: max_chars must be >= 1, got {max_chars}")
    return CountdownReward(Sandbox(SandboxLimits(wall_s=wall_s, cpu_s=max(1, int(wall_s))), max_concurrent=2,
                                   mode=mode), right=right, wrong=wrong, max_chars=max_chars)
