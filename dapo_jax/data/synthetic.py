"""A synthetic math task with integer answers, small enough for a CPU RL run in minutes.

Rows are ``{"prompt": "12+7=", "answer": "19"}``: additions of two numbers in ``[0, max_operand]`` and
subtractions with a non-negative result. The expected response is the answer's digits then EOS
(``"19"`` + ``<eos>``), a few tokens, so a whole DAPO rollout is cheap.

Why this task: a tiny decoder after a short supervised warm-up gets the units digit right almost
always and the carry/borrow digit right only sometimes, so its errors are near misses (``"12+9="`` ->
``"11"`` instead of ``"21"``) that it also sometimes gets right when sampling. Groups of G responses
then have reward spread, which is what GRPO/DAPO learn from.

The train / held-out split is fixed by ``seed``: every problem of the space is ranked by
``sha256(f"{seed}:{prompt}")`` (independent of NumPy's RNG streams, so it never changes across
versions) and the first ``heldout_size`` ranked problems are held out. The two splits are disjoint.
"""

from __future__ import annotations

import hashlib
import re

SPLITS = ("train", "heldout")
_ANSWER = re.compile(r"-?\d+")


def all_problems(*, max_operand: int = 99, ops: str = "+-", zero_pad: bool = True) -> list[dict[str, str]]:
    """Every problem of the space, in a fixed canonical order (op, a, b).

    ``zero_pad`` writes operands at a fixed width (``"07+12="``) so that each digit sits at a fixed
    offset from ``=``; a tiny model then learns the carry much sooner.
    """
    if max_operand < 1:
        raise ValueError(f"max_operand must be >= 1, got {max_operand}")
    bad = set(ops) - {"+", "-"}
    if bad or not ops:
        raise ValueError(f"ops={ops!r}: expected a non-empty string over '+' and '-'")
    width = len(str(max_operand)) if zero_pad else 1
    rows = []
    for op in dict.fromkeys(ops):  # dedupe, keep order
        for a in range(max_operand + 1):
            for b in range(max_operand + 1):
                if op == "-" and b > a:
                    continue  # non-negative answers only: no sign token to get wrong
                value = a + b if op == "+" else a - b
                rows.append({"prompt": f"{a:0{width}d}{op}{b:0{width}d}=", "answer": str(value)})
    return rows


def synthetic_rows(
    split: str = "train",
    *,
    seed: int = 0,
    max_operand: int = 99,
    ops: str = "+-",
    heldout_size: int = 1000,
    zero_pad: bool = True,
) -> list[dict[str, str]]:
    """The rows of one split, in seed-ranked order (already shuffled; deterministic).

    Args:
      split: ``"train"`` or ``"heldout"``.
      seed: fixes which problems are held out (and the order of both splits).
      max_operand: operands range over ``[0, max_operand]``.
      ops: which operations (``"+"``, ``"-"`` or ``"+-"``).
      heldout_size: number of held-out problems.
      zero_pad: operands at a fixed width (``"07+12="``).
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: expected one of {SPLITS}")
    rows = all_problems(max_operand=max_operand, ops=ops, zero_pad=zero_pad)
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
