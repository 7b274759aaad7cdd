"""Answer normalisation (verl / Minerva rules) and exact numeric parsing.

:func:`normalize_final_answer` is verl's ``math_dapo.normalize_final_answer`` (itself from Minerva,
Lewkowycz et al. 2022, appendix D), kept rule for rule so that ``dapo_answer`` rewards match the
DAPO recipe's. Its known quirks are kept on purpose (they are the reference's behaviour): every
``"a "`` / ``"an "`` substring is deleted and units are removed as substrings anywhere.

:func:`parse_number` reads a plain number exactly as a :class:`fractions.Fraction`, so that
``025 == 25 == 25.0`` and ``1,000 == 1000`` compare equal without float rounding.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["normalize_final_answer", "parse_number", "numbers_equal"]

# (before, after) pairs, applied in order (verl math_dapo.SUBSTITUTIONS).
SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    (r"\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)

# Units and decorations deleted wherever they occur (verl math_dapo.REMOVED_EXPRESSIONS).
REMOVED_EXPRESSIONS = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots",
    "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds",
    "meters", "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}",
    "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}",
    r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots",
)


def normalize_final_answer(final_answer: str) -> str:
    """verl's Minerva normalisation of a final answer string.

    Steps: keep what follows the last ``=``; apply :data:`SUBSTITUTIONS` (drops spaces, ``\\$``);
    delete :data:`REMOVED_EXPRESSIONS` (units, ``^\\circ``); keep the first ``$...$`` span; unwrap
    ``\\text{}``, ``\\textbf{}``, ``\\overline{}``, ``\\boxed{}``; expand ``\\frac12`` ->
    ``\\frac{1}{2}`` and ``\\sqrt2`` -> ``\\sqrt{2}``; drop ``$``; remove thousands separators
    from an all-digit answer.
    """
    final_answer = final_answer.split("=")[-1]
    for before, after in SUBSTITUTIONS:
        final_answer = final_answer.replace(before, after)
    for expr in REMOVED_EXPRESSIONS:
        final_answer = final_answer.replace(expr, "")

    final_answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", final_answer)
    final_answer = re.sub(r"(\\text\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", final_answer)
    final_answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", final_answer)

    # Shorthand TeX: \frac12 -> \frac{1}{2}, \sqrt2 -> \sqrt{2}.
    final_answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", final_answer)
    final_answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", final_answer)
    final_answer = final_answer.replace("$", "")

    if final_answer.replace(",", "").isdigit():
        final_answer = final_answer.replace(",", "")
    return final_answer.strip()


# Digits with optional thousands groups, decimals and a bounded exponent (an unbounded one, e.g.
# "1e999999999", would make Fraction build a gigantic integer).
_NUMBER_RE = re.compile(
    r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d*)?(?:[eE][-+]?\d{1,3})?"
)
_MAX_NUMBER_CHARS = 64


def parse_number(text: str | int | float | None) -> Fraction | None:
    """The exact value of a plain number, or ``None`` when ``text`` is not one.

    Accepts ``25``, ``025``, ``+25``, ``-2.50``, ``.5``, ``1,000`` (well-formed thousands groups
    only: ``1,00`` is not a number), ``1e3``, and surrounding ``$`` / ``\\$`` / spaces / a final
    ``.``. Ints and finite floats are accepted as values. Fractions such as ``1/2`` are left to
    the symbolic check.
    """
    if text is None or isinstance(text, bool):
        return None
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        return Fraction(text) if text == text and abs(text) != float("inf") else None
    s = text.strip().replace("\\$", "").replace("$", "").replace("\\!", "").strip()
    s = s.removesuffix(".").strip()
    if not s or len(s) > _MAX_NUMBER_CHARS or not any(c.isdigit() for c in s):
        return None
    if _NUMBER_RE.fullmatch(s) is None:
        return None
    try:
        return Fraction(s.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def numbers_equal(a: str | int | float | None, b: str | int | float | None) -> bool:
    """True when both parse as plain numbers (:func:`parse_number`) with the same exact value."""
    x, y = parse_number(a), parse_number(b)
    return x is not None and y is not None and x == y
