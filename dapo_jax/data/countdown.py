"""A Countdown-style task in miniature (TinyZero's miniature of R1-Zero): reach a target with given numbers.

Rows are ``{"prompt": "3,5,7 to 22:", "answer": "22:3,5,7"}``: ``count`` numbers, each in
``[1, max_number]``, and a target the numbers can reach: the value of a random expression that uses
each number exactly once with ``+ - *``, kept when it is an integer in ``[1, max_target]``. A
response is an arithmetic expression such as ``3*5+7``: right when it uses every given number
exactly once (no other numbers), only ``+ - * /`` and parentheses, and its exact (rational) value
equals the target. The rule check runs in the sandbox (``rewards/countdown.py``), never in the
calling process. :func:`solution` is the expression the target was drawn from (one of possibly many).

Problems are drawn from ``sha512(f"{seed}:{stream}:{index}")`` (independent of NumPy's and
Python's RNG streams). The held-out split is the first ``heldout_size`` distinct problems of stream
``heldout``; the train split the first ``train_size`` distinct problems of stream ``train`` that are
not held out (the two are disjoint).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from fractions import Fraction

SPLITS = ("train", "heldout")
OPS = "+-*"  # what the generator draws (the check also accepts "/")
_PROMPT = re.compile(r"(\d+(?:,\d+)+) to (\d+):")
_ANSWER = re.compile(r"(\d+):(\d+(?:,\d+)+)")


def _check_knobs(count: int, max_number: int, max_target: int) -> None:
    if not 2 <= count <= 6:
        raise ValueError(f"need 2 <= count <= 6, got count={count}")
    if not 1 <= max_number <= 999 or max_target < 1:
        raise ValueError(f"need 1 <= max_number <= 999 and max_target >= 1, got {max_number}, {max_target}")


def _draw(seed: int, stream: str, index: int, count: int, max_number: int) -> tuple[list[int], str]:
    """The numbers and a random expression over them (a pure function of the arguments)."""
    x = int.from_bytes(hashlib.sha512(f"{seed}:{stream}:{index}".encode()).digest(), "big")

    def choose(n: int) -> int:  # successive divmods of one 512-bit hash
        nonlocal x
        x, v = divmod(x, n)
        return v

    numbers = [choose(max_number) + 1 for _ in range(count)]
    return numbers, random_expression(numbers, choose)


def random_expression(numbers: list[int], choose: Callable[[int], int]) -> str:
    """An expression using each of ``numbers`` once with ``+ - *``: two random terms are joined by a
    random op until one is left. ``choose(n)`` returns an int in ``[0, n)`` (the randomness)."""
    terms = [str(n) for n in numbers]
    while len(terms) > 1:
        a = terms.pop(choose(len(terms)))
        b = terms.pop(choose(len(terms)))
        op = OPS[choose(len(OPS))]
        right = f"({b})" if (op != "+" and not b.isdigit()) else b  # a-(b+c), a*(b-c)
        left = f"({a})" if (op == "*" and not a.isdigit() and ("+" in a or "-" in a)) else a
        terms.append(f"{left}{op}{right}")
    return terms[0]


def value(expression: str) -> Fraction:
    """The exact value of one of this module's generated expressions (digits, + - *, parentheses).

    Used to draw targets; a recursive-descent parser of trusted text (model output goes to the
    sandboxed check instead)."""
    tokens = re.findall(r"\d+|[-+*/()]", expression)
    pos = 0

    def expr() -> Fraction:
        nonlocal pos
        v = term()
        while pos < len(tokens) and tokens[pos] in "+-":
            op, pos = tokens[pos], pos + 1
            v = v + term() if op == "+" else v - term()
        return v

    def term() -> Fraction:
        nonlocal pos
        v = atom()
        while pos < len(tokens) and tokens[pos] in "*/":
            op, pos = tokens[pos], pos + 1
            v = v * atom() if op == "*" else v / atom()
        return v

    def atom() -> Fraction:
        nonlocal pos
        tok, pos = tokens[pos], pos + 1
        if tok == "(":
            v = expr()
            pos += 1  # ")"
            return v
        return Fraction(int(tok))

    return expr()


def make_prompt(numbers: list[int], target: int) -> str:
    """``[3, 5, 7], 22`` -> ``"3,5,7 to 22:"``."""
    return f"{','.join(map(str, numbers))} to {target}:"


def parse_answer(answer: str) -> tuple[int, list[int]]:
    """``"22:3,5,7"`` -> ``(22, [3, 5, 7])``; raises ValueError on anything else."""
    m = _ANSWER.fullmatch(str(answer).strip())
    if m is None:
        raise ValueError(f"not a countdown answer (expected like '22:3,5,7'): {answer!r}")
    return int(m.group(1)), [int(n) for n in m.group(2).split(",")]


def parse_prompt(prompt: str) -> tuple[int, list[int]]:
    """``"3,5,7 to 22:"`` -> ``(22, [3, 5, 7])``; raises ValueError on anything else."""
    m = _PROMPT.fullmatch(prompt)
    if m is None:
        raise ValueError(f"not a countdown prompt (expected like '3,5,7 to 22:'): {prompt!r}")
    return int(m.group(2)), [int(n) for n in m.group(1).split(",")]


def problem(seed: int, stream: str, index: int, *, count: int = 3, max_number: int = 9,
            max_target: int = 50) -> tuple[list[int], int, str] | None:
    """``(numbers, target, solution)`` of draw ``index``, or None when its value is not a target."""
    _check_knobs(count, max_number, max_target)
    numbers, expression = _draw(seed, stream, index, count, max_number)
    v = value(expression)
    if v.denominator != 1 or not 1 <= v <= max_target:
        return None
    return numbers, int(v), expression


def countdown_rows(split: str = "train", *, seed: int = 0, heldout_size: int = 200, train_size: int = 5000,
                   count: int = 3, max_number: int = 9, max_target: int = 50) -> list[dict[str, str]]:
    """The rows ``[{"prompt", "answer", "solution"}]`` of one split, in draw order (deterministic)."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: expected one of {SPLITS}")
    for name, n in (("heldout_size", heldout_size), ("train_size", train_size)):
        if not isinstance(n, int) or n <= 0:
            raise ValueError(f"{name}={n!r} must be a positive int")
    knobs = dict(count=count, max_number=max_number, max_target=max_target)
    _check_knobs(**knobs)
    heldout = _split(seed, "heldout", heldout_size, set(), knobs)
    rows = heldout if split == "heldout" else _split(seed, "train", train_size, {r["prompt"] for r in heldout}, knobs)
    return rows


def _split(seed: int, stream: str, size: int, exclude: set[str], knobs: dict) -> list[dict[str, str]]:
    out, seen = [], set(exclude)
    budget = 40 * size + 1000  # a knob setting whose space is too small must fail, not spin
    for index in range(budget):
        drawn = problem(seed, stream, index, **knobs)
        if drawn is None:
            continue
        numbers, target, expression = drawn
        prompt = make_prompt(numbers, target)
        if prompt in seen:
            continue
        seen.add(prompt)
        out.append({"prompt": prompt, "answer": f"{target}:{','.join(map(str, numbers))}", "solution": expression})
        if len(out) == size:
            return out
    raise ValueError(f"the problem space of {knobs} is too small for {size} distinct {stream} problems "
                     f"(found {len(out)} in {budget} draws); widen it or ask for fewer")
