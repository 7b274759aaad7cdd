"""A synthetic math task with integer answers, small enough for a CPU RL run in minutes.

Rows are ``{"prompt": "12+7=", "answer": "19"}``: by default a two-digit number (``00``-``99``) plus or
minus a one-digit number, with non-negative results (1,955 problems; 400 held out). The expected
response is the answer's digits then EOS (``"19"`` + ``<eos>``), a few tokens, so a whole DAPO rollout
is cheap.

Why this task: a tiny decoder after a short supervised warm-up gets the units digit right almost
always and the carry/borrow digit right only sometimes, so its errors are near misses (``"12+9="`` ->
``"11"`` instead of ``"21"``). The carry is a 10x10 table over the units digits, which a tiny
model learns abruptly after a few hundred steps; the warm-up stops on that rise, where the
right answer is often the mode but far from certain, so its samples are partly right. Groups of
G responses then have reward spread, which is what GRPO/DAPO learn from.

The train / held-out split is fixed by ``seed``: every problem of the space is ranked by
``sha256(f"{seed}:{prompt}")`` (independent of NumPy's RNG streams, so it never changes across
versions) and the first ``heldout_size`` ranked problems are held out. The two splits are disjoint.
"""

from __future__ import annotations

import hashlib
import re

SPLITS = ("train", "heldout")
_ANSWER = re.compile(r"-?\d+")


def all_problems(*, max_operand: int = 99, max_second: int | None = None, ops: str = "+-",
                 zero_pad: bool = True) -> list[dict[str, str]]:
    """Every problem of the space, in a fixed canonical order (op, a, b).

    ``zero_pad`` writes operands at a fixed width (``"07+12="``) so that each digit sits at a fixed
    offset from ``=``; a tiny model then learns the carry much sooner. The second operand ranges
    over ``[0, max_second]`` (default ``max_operand``).
    """
    max_second = max_operand if max_second is None else max_second
    if max_operand < 1 or not 1 <= max_second <= max_operand:
        raise ValueError(f"need 1 <= max_second <= max_operand, got max_operand={max_operand}, max_second={max_second}")
    bad = set(ops) - {"+", "-"}
    if bad or not ops:
        raise ValueError(f"ops={ops!r}: expected a non-empty string over '+' and '-'")
    width_a = len(str(max_operand)) if zero_pad else 1
    width_b = len(str(max_second)) if zero_pad else 1
    rows = []
    for op in dict.fromkeys(ops):  # dedupe, keep order
        for a in range(max_operand + 1):
            for b in range(max_second + 1):
                if op == "-" and b > a:
                    continue  # non-negative answers only: no sign token to get wrong
                value = a + b if op == "+" else a - b
                rows.append({"prompt": f"{a:0{width_a}d}{op}{b:0{width_b}d}=", "answer": str(value)})
    return rows


def synthetic_rows(
    split: str = "train",
    *,
    seed: int = 0,
    max_operand: int = 99,
    max_second: int | None = 9,
    ops: str = "+-",
    heldout_size: int = 400,
    zero_pad: bool = True,
) -> list[dict[str, str]]:
    """The rows of one split, in seed-ranked order (already shuffled; deterministic).

    Args:
      split: ``"train"`` or ``"heldout"``.
      seed: fixes which problems are held out (and the order of both splits).
      max_operand: the first operand ranges over ``[0, max_operand]``.
      max_second: the second over ``[0, max_second]`` (``None``: up to ``max_operand``).
      ops: which operations (``"+"``, ``"-"`` or ``"+-"``).
      heldout_size: number of held-out problems.
      zero_pad: operands at a fixed width (``"07+12="``).
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: expected one of {SPLITS}")
    rows = all_problems(max_operand=max_operand, max_second=max_second, ops=ops, zero_pad=zero_pad)
    if not 0 < heldout_size < len(rows):
        raise ValueError(f"heldout_size={heldout_size} must be in (0, {len(rows)}) for this problem space")
    rows.sort(key=lambda r: hashlib.sha256(f"{seed}:{r['prompt']}".encode()).digest())
    return rows[:heldout_size] if split == "heldout" else rows[heldout_size:]


def extract_answer(response: str) -> str | None:
    """The integer a response states: the whole stripped response must be one integer, else None."""
    text = response.strip()
    return text if _ANSWER.fullmatch(text) else None


def is_correct(response: str, answer: str) -> bool:
    """Rule check for this task: the response (before EOS, stripped) is exactly the answer's integer."""
    got = extract_answer(response)
    return got is not None and int(got) == int(answer)
