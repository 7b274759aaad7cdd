"""verl's normalisation rule by rule, and exact number parsing."""

from fractions import Fraction

import pytest

from dapo_jax.rewards.normalize import normalize_final_answer, numbers_equal, parse_number


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("x = 25", "25"),  # what follows the last "="
        ("a = b = 7", "7"),
        ("$25$", "25"),  # dollars dropped
        ("\\$18", "18"),
        ("1,000", "1000"),  # thousands separators of an all-digit answer
        ("1,-2", "1,-2"),  # ...but kept inside a list that is not all digits
        ("25.", "25."),  # verl only strips ".$": kept, and compared numerically instead
        ("25.$", "25"),
        ("\\boxed{25}", "25"),
        ("\\text{Evelyn}", "Evelyn"),
        ("\\textbf{7}", "7"),
        ("\\overline{3}", "3"),
        ("90^\\circ", "90"),
        ("90^{\\circ}", "90"),
        ("12 inches", "12"),
        ("5 \\text{ cm}", "5"),
        ("\\frac12", "\\frac{1}{2}"),  # shorthand TeX
        ("\\sqrt2", "\\sqrt{2}"),
        ("3\\sqrt{13}", "3\\sqrt{13}"),
        ("  7 ", "7"),
        ("1,\\!000", "1000"),
    ],
)
def test_normalize_final_answer(raw, expected):
    assert normalize_final_answer(raw) == expected


def test_normalize_keeps_verls_quirks():
    # Documented reference behaviour: every "a " is deleted, units as substrings anywhere.
    assert normalize_final_answer("a b") == "b"
    assert normalize_final_answer("3 points") == "3"
    assert normalize_final_answer("1,2") == "12"  # an all-digit list loses its commas


@pytest.mark.parametrize(
    "text, expected",
    [
        ("25", Fraction(25)),
        ("025", Fraction(25)),
        ("25.0", Fraction(25)),
        ("+25", Fraction(25)),
        ("-2.50", Fraction(-5, 2)),
        (".5", Fraction(1, 2)),
        ("1,000", Fraction(1000)),
        ("1,000,000.5", Fraction(2000001, 2)),
        ("1e3", Fraction(1000)),
        ("$25$", Fraction(25)),
        ("25.", Fraction(25)),
        (25, Fraction(25)),
        (27.0, Fraction(27)),
        ("1,00", None),  # malformed thousands groups
        ("1/2", None),  # left to the symbolic check
        ("1e99999", None),  # bounded exponent: no gigantic integer
        ("abc", None),
        ("", None),
        ("-", None),
        (".", None),
        (None, None),
        (True, None),
        (float("nan"), None),
        (float("inf"), None),
    ],
)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


@pytest.mark.parametrize("a, b", [("025", "25"), ("25", "25.0"), ("1,000", "1000"), ("25", 25), ("0.5", ".5")])
def test_numbers_equal(a, b):
    assert numbers_equal(a, b) and numbers_equal(b, a)


@pytest.mark.parametrize("a, b", [("24", "25"), ("0.33", "1/3"), ("", "0"), (None, "1"), ("25", "25.0001")])
def test_numbers_not_equal(a, b):
    assert not numbers_equal(a, b)
