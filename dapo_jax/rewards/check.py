"""Correctness checks: ``check(response, ground_truth) -> bool``, one per answer convention.

Each check extracts the response's final answer (``extract.py``), normalises both sides
(``normalize.py``) and compares them. Each has a matching ``*_key(response) -> str | None`` giving
the canonical answer it compared, which is what maj@k votes on (numbers are canonicalised, so
``25``, ``025`` and ``25.0`` are one vote).

Ground truths may be ``str``, ``int`` or ``float`` (AIME 2025 stores ints, AMC23 floats such as
``27.0``, AIME 2024 zero-padded strings such as ``"025"``).
"""

from __future__ import annotations

from dapo_jax.rewards import extract, normalize, symbolic

__all__ = [
    "answer_key",
    "answers_equal",
    "dapo_answer_correct",
    "dapo_answer_key",
    "boxed_correct",
    "boxed_key",
    "gsm8k_correct",
    "gsm8k_key",
    "integer_correct",
    "integer_key",
    "math_verify_correct",
    "math_verify_key",
    "TRUTH_READERS",
]


def answer_key(answer: str | int | float | None) -> str | None:
    """Canonical form of an extracted answer: verl-normalised, and numbers as exact fractions."""
    if answer is None:
        return None
    if not isinstance(answer, str):
        value = normalize.parse_number(answer)
        return None if value is None else str(value)
    text = normalize.normalize_final_answer(answer)
    value = normalize.parse_number(text)
    if value is not None:
        return str(value)  # Fraction: "25", "-5/2"
    return text or None


def answers_equal(pred: str | None, truth: str | int | float, *, numeric: bool = True) -> bool:
    """verl's string equality after :func:`normalize_final_answer`, or (``numeric``) equal
    plain-number values."""
    if pred is None:
        return False
    p = normalize.normalize_final_answer(pred)
    t = normalize.normalize_final_answer(str(truth)) if isinstance(truth, str) else truth
    if isinstance(t, str) and p == t and p:
        return True
    return numeric and normalize.numbers_equal(p, t)


def _truth_text(truth: str | int | float) -> str | int | float:
    """A ground truth given as ``\\boxed{...}`` is unboxed first (verl's ``gt_need_extract``)."""
    if isinstance(truth, str) and "\\boxed" in truth:
        return extract.extract_boxed(truth) or truth
    return truth


# --- DAPO: the last "Answer:" line ------------------------------------------------------------


def _dapo_answer(response: str) -> str | None:
    answer = extract.extract_dapo_answer(response)
    at = extract._answer_line_at(response, extract.DAPO_TAIL_CHARS) if answer is not None else -1
    return extract.latest_answer(response, answer, at)


def dapo_answer_correct(response: str, ground_truth, *, numeric: bool = True) -> bool:
    """DAPO / verl ``math_dapo``: last ``Answer:`` in the last 300 chars (or a later ``<answer>`` tag),
    normalised, compared.

    ``numeric=False`` is verl exactly (string equality, so ``025`` != ``25``); the default also
    accepts equal plain numbers (``025`` == ``25.0``), a strict superset.
    """
    return answers_equal(_dapo_answer(response), _truth_text(ground_truth), numeric=numeric)


def dapo_answer_key(response: str) -> str | None:
    return answer_key(_dapo_answer(response))


# --- \boxed{} ---------------------------------------------------------------------------------


def _boxed_answer(response: str) -> str | None:
    boxed = extract.extract_boxed(response)
    return extract.latest_answer(response, boxed, extract._boxed_start(response)[0] if boxed is not None else -1)


def boxed_correct(response: str, ground_truth, *, numeric: bool = True) -> bool:
    """The last ``\\boxed{}`` of the response (or a later ``<answer>`` tag), normalised as above, against
    the truth."""
    return answers_equal(_boxed_answer(response), _truth_text(ground_truth), numeric=numeric)


def boxed_key(response: str) -> str | None:
    return answer_key(_boxed_answer(response))


# --- GSM8K ------------------------------------------------------------------------------------


def _gsm8k_answer(response: str, flexible: bool) -> str | None:
    """``#### N``; else, when an ``<answer>`` tag comes after the last ``####``, the number in the tag;
    else (``flexible``) the last number of the response."""
    answer = extract.extract_gsm8k(response)
    latest = extract.latest_answer(response, answer, response.rfind("####") if answer is not None else -1)
    if latest is not answer:  # the <answer> tag's text: its number
        answer = extract.extract_gsm8k(latest) or extract.extract_last_number(latest)
    if answer is None and flexible:
        answer = extract.extract_last_number(response)
    return answer


def gsm8k_correct(response: str, ground_truth, *, flexible: bool = True) -> bool:
    """GSM8K: the ``#### N`` answer (``flexible``: else the last number), compared as a number.

    ``ground_truth`` may be the bare number or GSM8K's whole ``answer`` field (ending ``#### N``).
    """
    truth = ground_truth
    if isinstance(truth, str) and "####" in truth:
        truth = extract.extract_gsm8k(truth)
    return normalize.numbers_equal(_gsm8k_answer(response, flexible), truth)


def gsm8k_key(response: str, *, flexible: bool = True) -> str | None:
    return answer_key(_gsm8k_answer(response, flexible))


# --- integers (AIME) --------------------------------------------------------------------------


_final_answer = extract.extract_final_answer


def _as_integer(answer) -> int | None:
    if answer is None:
        return None
    value = normalize.parse_number(
        normalize.normalize_final_answer(answer) if isinstance(answer, str) else answer
    )
    return int(value) if value is not None and value.denominator == 1 else None


def integer_correct(response: str, ground_truth) -> bool:
    """AIME-style: the final answer (the later of ``\\boxed{}`` / ``Answer:``) equals the integer.

    ``\\boxed{025}``, ``Answer: 25`` and ``25.0`` all equal ``"025"``; a non-integer on either
    side is wrong.
    """
    pred = _as_integer(_final_answer(response))
    truth = _as_integer(_truth_text(ground_truth))
    return pred is not None and truth is not None and pred == truth


def integer_key(response: str) -> str | None:
    value = _as_integer(_final_answer(response))
    return None if value is None else str(value)


# --- symbolic (math-verify) -------------------------------------------------------------------


def math_verify_correct(
    response: str,
    ground_truth,
    *,
    timeout_s: float = symbolic.DEFAULT_TIMEOUT_S,
    max_chars: int = symbolic.DEFAULT_MAX_CHARS,
) -> bool:
    """Normalised string/number equality of the final answer first (fast), then math-verify.

    The final answer is the later of the last ``\\boxed{}`` and the ``Answer:`` line. The
    symbolic check (``\\frac12`` == ``0.5``, ``\\dfrac{1}{2}`` == ``\\frac{1}{2}``) runs on that
    answer when there is one, else on the response's tail, bounded by ``timeout_s`` and
    ``max_chars`` (see :mod:`dapo_jax.rewards.symbolic`).
    """
    truth = _truth_text(ground_truth)
    answer = _final_answer(response)
    if answers_equal(answer, truth):
        return True
    target = f"\\boxed{{{answer}}}" if answer is not None else response
    return symbolic.math_verify_equal(target, str(truth), timeout_s=timeout_s, max_chars=max_chars)


def math_verify_key(response: str) -> str | None:
    return answer_key(_final_answer(response))


# --- ground truths each check can read ------------------------------------------------------
# A row whose truth its check cannot read ("n/a" where a number is expected) is wrong whatever the
# response: the pipeline counts such rows per function (`reward_unreadable/NAME`).


def _integer_truth(truth) -> bool:
    try:
        int(str(truth).strip())
    except ValueError:
        return False
    return True


def _gsm8k_truth(truth) -> bool:
    if isinstance(truth, str) and "####" in truth:
        truth = extract.extract_gsm8k(truth)
    return normalize.parse_number(truth) is not None


TRUTH_READERS = {
    "dapo_answer": lambda t: answer_key(_truth_text(t)) is not None,
    "boxed": lambda t: answer_key(_truth_text(t)) is not None,
    "gsm8k": _gsm8k_truth,
    "integer": lambda t: _as_integer(_truth_text(t)) is not None,
    "math_verify": lambda t: answer_key(_truth_text(t)) is not None,
    "synthetic": _integer_truth,
    "cot": _integer_truth,
}
