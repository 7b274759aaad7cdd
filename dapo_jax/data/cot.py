"""A long chain-of-thought task in miniature: sums of several numbers worked out one line per step.

Rows are ``{"prompt": "a5+b7+c4+d3=", "answer": "19"}``: between ``min_terms`` and ``max_terms``
terms, each of ``min_digits`` to ``max_digits`` digits, labelled ``a``, ``b``, ``c``, ... The
reference solution (:func:`solution`) keeps a running sum, one line per added term (written with
its label), and ends with an ``Answer:`` line::

    a5+b7=12
    12+c4=16
    16+d3=19
    Answer: 19

so a correct response is 18 to 139 characters (= tokens of the character tokenizer, with EOS) with
the default knobs, depending on the problem, and a single slip anywhere in the chain makes the answer
wrong. That is what the embedded ``07+8=`` -> ``15`` task lacks: responses of very different
lengths, where DAPO's token-level loss, clip-higher and overlong shaping act. Why the labels: a line
finds its term by content, the digits that follow its label in the prompt (a copy that a 2-layer
model can learn, an induction head; ``scripts/make_cot_base.py`` drills it), instead of by counting
terms, which a small model learns far later; the chain's length and its arithmetic stay the hard part.

Trace variants (:func:`trace`) mix the warm-up data so that RL has length to move both ways:

============= ==================================================================================
variant       what it writes
============= ==================================================================================
``reference`` the running sum, one line per term (above)
``verbose``   the same, each step line followed by a redundant ``Total: N`` restatement (about
              1.8x longer: long problems overrun a tight ``max_new_tokens``; RL shortens)
``terse``     two terms per line (``a5+b7+c4=16``), about 0.7x as long and harder for a small
              model to get right (RL lengthens)
``slip``      the reference with one arithmetic slip (+-1 or +-10 on one step), carried on
              consistently to a wrong ``Answer:``
============= ==================================================================================

Problems are drawn from ``sha512(f"{seed}:{stream}:{index}")`` (independent of NumPy's and
Python's RNG streams, so they never change across versions). The held-out split is the first
``heldout_size`` distinct problems of stream ``heldout``; the train split the first ``train_size``
distinct problems of stream ``train`` that are not held out. The two splits are disjoint.

The rule check (:func:`is_correct`, the ``cot`` reward) reads the response's LAST non-blank line,
which must be ``Answer: N``: a response cut off before its ``Answer:`` line (truncated at
``max_new_tokens``), or one that keeps writing after it, is wrong.
"""

from __future__ import annotations

import hashlib
import re

SPLITS = ("train", "heldout")
VARIANTS = ("reference", "verbose", "terse", "slip")
LABELS = "abcdefghijklmnopqrstuvwxyz"
MAX_TERMS = 20  # knob limits: a problem's draws must fit in one sha512 digest
MAX_DIGITS = 6
_PROMPT = re.compile(r"[a-z]\d+(?:\+[a-z]\d+)+=")
_ANSWER_LINE = re.compile(r"Answer:[ \t]*(-?\d+)[ \t]*")


# ----------------------------------------------------------------------------- problems
def _check_knobs(min_terms: int, max_terms: int, min_digits: int, max_digits: int) -> None:
    if not 2 <= min_terms <= max_terms <= MAX_TERMS:
        raise ValueError(f"need 2 <= min_terms <= max_terms <= {MAX_TERMS}, "
                         f"got min_terms={min_terms}, max_terms={max_terms}")
    if not 1 <= min_digits <= max_digits <= MAX_DIGITS:
        raise ValueError(f"need 1 <= min_digits <= max_digits <= {MAX_DIGITS}, "
                         f"got min_digits={min_digits}, max_digits={max_digits}")


def draw_terms(seed: int, stream: str, index: int, *, min_terms: int = 2, max_terms: int = 15,
               min_digits: int = 1, max_digits: int = 1) -> list[int]:
    """The terms of problem ``index`` of ``stream``: a pure function of its arguments.

    The number of terms is uniform in ``[min_terms, max_terms]``; each term's digit count uniform
    in ``[min_digits, max_digits]``, then its value uniform among the numbers with that many digits
    (``0``-``9`` for one digit). Draws are successive ``divmod``s of one 512-bit hash.
    """
    _check_knobs(min_terms, max_terms, min_digits, max_digits)
    x = int.from_bytes(hashlib.sha512(f"{seed}:{stream}:{index}".encode()).digest(), "big")
    x, k = divmod(x, max_terms - min_terms + 1)
    terms = []
    for _ in range(min_terms + k):
        x, d = divmod(x, max_digits - min_digits + 1)
        lo = 0 if min_digits + d == 1 else 10 ** (min_digits + d - 1)
        x, v = divmod(x, 10 ** (min_digits + d) - lo)
        terms.append(lo + v)
    return terms


def make_prompt(terms: list[int]) -> str:
    """``[12, 7, 45]`` -> ``"a12+b7+c45="``."""
    return "+".join(f"{LABELS[i]}{t}" for i, t in enumerate(terms)) + "="


def parse_prompt(prompt: str) -> list[int]:
    """``"a12+b7+c45="`` -> ``[12, 7, 45]``; raises ValueError on anything else."""
    parts = prompt[:-1].split("+")
    if not _PROMPT.fullmatch(prompt) or "".join(p[0] for p in parts) != LABELS[:len(parts)]:
        raise ValueError(f"not a cot prompt (expected like 'a12+b7+c45='): {prompt!r}")
    return [int(p[1:]) for p in parts]


def _split_prompts(split: str, *, seed: int, size: int, exclude: set[str], knobs: dict) -> list[str]:
    """The first ``size`` distinct prompts of stream ``split`` not in ``exclude``."""
    out: list[str] = []
    seen = set(exclude)
    budget = 20 * size + 1000  # a knob setting whose space is too small must fail, not spin
    for index in range(budget):
        prompt = make_prompt(draw_terms(seed, split, index, **knobs))
        if prompt not in seen:
            seen.add(prompt)
            out.append(prompt)
            if len(out) == size:
                return out
    raise ValueError(f"the problem space of {knobs} is too small for {size} distinct {split} problems "
                     f"(found {len(out)} in {budget} draws); widen the terms/digits ranges or ask for fewer")


def cot_rows(
    split: str = "train",
    *,
    seed: int = 0,
    heldout_size: int = 400,
    train_size: int = 20000,
    min_terms: int = 2,
    max_terms: int = 15,
    min_digits: int = 1,
    max_digits: int = 1,
) -> list[dict[str, str]]:
    """The rows ``[{"prompt", "answer"}]`` of one split, in draw order (deterministic, shuffled).

    Args:
      split: ``"train"`` or ``"heldout"``.
      seed: fixes both splits.
      heldout_size: number of held-out problems (never in the train split).
      train_size: number of train problems.
      min_terms, max_terms: how many numbers a problem adds (2 to 16).
      min_digits, max_digits: how many digits each number has (1 to 6).
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: expected one of {SPLITS}")
    for name, n in (("heldout_size", heldout_size), ("train_size", train_size)):
        if not isinstance(n, int) or n <= 0:
            raise ValueError(f"{name}={n!r} must be a positive int")
    knobs = dict(min_terms=min_terms, max_terms=max_terms, min_digits=min_digits, max_digits=max_digits)
    _check_knobs(**knobs)
    heldout = _split_prompts("heldout", seed=seed, size=heldout_size, exclude=set(), knobs=knobs)
    prompts = heldout if split == "heldout" else _split_prompts(
        "train", seed=seed, size=train_size, exclude=set(heldout), knobs=knobs)
    return [{"prompt": p, "answer": str(sum(parse_prompt(p)))} for p in prompts]


# ----------------------------------------------------------------------------- traces
def _slip(prompt: str, seed: int, steps: int, totals: list[int]) -> tuple[int, int]:
    """(step index, delta) of the slip: a fixed function of (seed, prompt), never a no-op."""
    x = int.from_bytes(hashlib.sha256(f"slip:{seed}:{prompt}".encode()).digest(), "big")
    x, step = divmod(x, steps)
    deltas = [d for d in (1, -1, 10, -10) if totals[step] + d >= 0]
    return step, deltas[x % len(deltas)]


def trace(prompt: str, variant: str = "reference", *, seed: int = 0) -> str:
    """A worked solution of ``prompt`` in one of ``VARIANTS`` (no EOS; see the module table).

    ``seed`` only matters for ``slip``: it picks which step goes wrong and by how much.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r}: expected one of {VARIANTS}")
    terms = parse_prompt(prompt)
    per_line = 2 if variant == "terse" else 1
    starts = range(1, len(terms), per_line)
    groups = [terms[i:i + per_line] for i in starts]
    labelled = [[f"{LABELS[i + j]}{t}" for j, t in enumerate(g)] for i, g in zip(starts, groups)]
    totals, acc = [], terms[0]
    for group in groups:
        acc += sum(group)
        totals.append(acc)
    if variant == "slip":
        step, delta = _slip(prompt, seed, len(groups), totals)
        totals = totals[:step] + [t + delta for t in totals[step:]]
    lines, acc = [], f"a{terms[0]}"  # the first line copies the first term with its label
    for group, total in zip(labelled, totals):
        lines.append("+".join([acc, *group]) + f"={total}")
        if variant == "verbose":
            lines.append(f"Total: {total}")
        acc = str(total)
    lines.append(f"Answer: {acc}")
    return "\n".join(lines)


def solution(prompt: str) -> str:
    """The reference trace of ``prompt`` (a correct response, EOS not included)."""
    return trace(prompt, "reference")


# ----------------------------------------------------------------------------- the rule check
def extract_answer(response: str) -> str | None:
    """The integer of the response's last non-blank line when it is ``Answer: N``, else None."""
    last = response.rstrip().rsplit("\n", 1)[-1].strip()
    match = _ANSWER_LINE.fullmatch(last)
    return str(int(match.group(1))) if match else None  # canonical: maj@k votes "067" with "67"


def is_correct(response: str, answer: str | int) -> bool:
    """The last non-blank line is ``Answer: N`` with ``N`` equal to the answer as an integer."""
    got = extract_answer(response)
    return got is not None and int(got) == int(answer)
