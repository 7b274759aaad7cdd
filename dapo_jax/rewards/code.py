"""The ``code`` reward: the response's program run against the row's tests in the sandbox.

    reward = make_reward("code", right=1.0, wrong=0.0)                 # all tests pass, or not
    reward = make_reward("code", right=1.0, wrong=0.0, partial=True)   # the fraction passed
    reward(response, tests)

``tests`` comes from the data row: one Python source, or a list of them (or a string holding such a
list, as JSON or Python's repr: how a list column travels through the string answer). Test ``j`` passes when the program

    <the response's code> + "\\n" + tests[j]

runs to its end in the sandbox (``rewards/sandbox.py``): HumanEval's ``test`` followed by
``check(entry_point)`` is one such source. The response's code is its last fenced block
(````` ```python `````, ````` ```py ````` or a bare ````` ``` `````; an unclosed last fence runs to the end), or the
whole response when it has none.

With ``k`` of ``n`` tests passed the reward is

    r = wrong + (right - wrong) * k / n      (partial=True)
    r = right if k == n else wrong           (partial=False)

and the response counts as correct only when all ``n`` pass. An empty program, an empty test list,
and a test that times out or overflows the output cap all fail; nothing of the response runs in the
calling process.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from dapo_jax.rewards.sandbox import Sandbox, SandboxLimits

__all__ = ["extract_code", "parse_tests", "CodeReward", "make_code_reward"]

_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def extract_code(response: str) -> str:
    """The last fenced code block (python/py/bare) of ``response``, else the whole response."""
    blocks = [m.group(2) for m in _FENCE.finditer(response)]
    return blocks[-1] if blocks else response


def parse_tests(tests: Any) -> list[str]:
    """``tests`` as a list of sources: a list as is; a string holding a list of strings, as JSON or as
    Python's repr (how a list column reaches the answer string: ``str(value)``), parsed as a literal
    (``ast.literal_eval``: data, never run); else the string is the one source.

    Raises ValueError for anything else (a list holding a non-string)."""
    if isinstance(tests, str):
        text = tests.strip()
        if text.startswith("["):
            parsed = None
            for parse in (json.loads, ast.literal_eval):
                try:
                    parsed = parse(text)
                    break
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    continue
            if isinstance(parsed, list) and all(isinstance(t, str) for t in parsed):  # [] = no tests
                return parsed
        return [tests]
    if isinstance(tests, Sequence) and all(isinstance(t, str) for t in tests):
        return list(tests)
    raise ValueError(f"code reward: tests must be a source or a list of sources, got {type(tests).__name__}")


@dataclasses.dataclass(frozen=True)
class CodeReward:
    """The ``code`` rule reward (module docstring). ``sandbox`` runs every program."""

    sandbox: Sandbox
    right: float = 1.0
    wrong: float = -1.0
    partial: bool = False
    name: str = "code"

    @property
    def max_workers(self) -> int:
        return self.sandbox.max_concurrent

    def fraction_passed(self, response: str, tests: Any) -> float:
        """The fraction of ``tests`` that ``response`` passes; raises ValueError when they are not sources."""
        fractions, failed = self.fractions([response], [tests])
        if failed:
            raise ValueError(failed[0])
        return fractions[0]

    def fractions(self, responses: Sequence[str], tests: Sequence[Any]) -> tuple[list[float], dict[int, str]]:
        """``[N]`` fraction of each row's tests passed, and ``{row: why}`` for rows whose tests are not
        sources (fraction 0); every (row, test) program runs concurrently."""
        if len(responses) != len(tests):
            raise ValueError(f"code: {len(responses)} responses but {len(tests)} tests")
        programs, owners, per_row, failed = [], [], [], {}
        for i, (response, row_tests) in enumerate(zip(responses, tests)):
            try:
                row_tests = parse_tests(row_tests)
            except ValueError as e:
                failed[i], row_tests = str(e), []
            per_row.append(row_tests)
            code = extract_code(response)
            if not code.strip():
                continue
            for test in row_tests:
                programs.append(code + "\n" + test)
                owners.append(i)
        passed = np.zeros(len(responses))
        for owner, result in zip(owners, self.sandbox.run_many(programs)):
            passed[owner] += result.passed
        return [float(p / len(t)) if t else 0.0 for p, t in zip(passed, per_row)], failed

    def _reward(self, fraction: float) -> tuple[float, bool]:
        ok = fraction == 1.0
        if self.partial:
            return self.wrong + (self.right - self.wrong) * fraction, ok
        return (self.right if ok else self.wrong), ok

    def score(self, response: str, tests: Any) -> tuple[float, bool]:
        return self._reward(self.fraction_passed(response, tests))

    def score_many(self, responses: Sequence[str], tests: Sequence[Any]):
        """``(rewards [N], correct [N], failed {row: why})`` of a batch, its programs run
        ``sandbox.max_concurrent`` at a time; a failed row (its tests are not sources) scores ``wrong``."""
        fractions, failed = self.fractions(responses, tests)
        scored = [self._reward(f) for f in fractions]
        return [r for r, _ in scored], [ok for _, ok in scored], failed

    def is_correct(self, response: str, tests: Any) -> bool:
        return self.score(response, tests)[1]

    def answer_key(self, response: str) -> str:
        return extract_code(response).strip()

    def __call__(self, response: str, tests: Any) -> float:
        return self.score(response, tests)[0]


def make_code_reward(*, right: float = 1.0, wrong: float = -1.0, partial: bool = False,
                     wall_s: float = 10.0, cpu_s: int = 5, memory_mb: int = 1024, output_bytes: int = 1 << 20,
                     max_concurrent: int | None = None, mode: str = "auto") -> CodeReward:
    """``make_reward("code", ...)``: the reward with its sandbox (started once here, to fail early)."""
    limits = SandboxLimits(wall_s=wall_s, cpu_s=cpu_s, memory_mb=memory_mb, output_bytes=output_bytes)
    return CodeReward(Sandbox(limits, max_concurrent=max_concurrent, mode=mode), right=right, wrong=wrong,
                      partial=partial)
