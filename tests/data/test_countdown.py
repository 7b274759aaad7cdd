"""The Countdown task's rows: deterministic, disjoint splits, every target reached by its solution."""

import re
from collections import Counter
from fractions import Fraction

import pytest

from dapo_jax.data import countdown
from dapo_jax.data.countdown import countdown_rows, make_prompt, parse_answer, parse_prompt, random_expression, value

KNOBS = dict(heldout_size=50, train_size=300)


@pytest.mark.parametrize("expression, expected", [
    ("2*1*3", 6), ("(7-2)*2", 10), ("2+6-3", 5), ("1-2-3", -4), ("2*3+4*5", 26), ("8/(3-1)", 4),
    ("7-(2+3)", 2), ("2*(3+4)*5", 70), ("9/2", Fraction(9, 2)),
])
def test_value_hand_computed(expression, expected):
    assert value(expression) == expected


def test_rows_are_deterministic_and_seeded():
    assert countdown_rows("train", **KNOBS) == countdown_rows("train", **KNOBS)
    assert countdown_rows("train", seed=1, **KNOBS) != countdown_rows("train", **KNOBS)


def test_splits_are_disjoint_and_sized():
    train, heldout = countdown_rows("train", **KNOBS), countdown_rows("heldout", **KNOBS)
    assert len(train) == 300 and len(heldout) == 50
    prompts = [r["prompt"] for r in train + heldout]
    assert len(set(prompts)) == len(prompts)
    # a bigger train split keeps the smaller one as its prefix (draw order)
    assert countdown_rows("train", heldout_size=50, train_size=400)[:300] == train


def _reference_value(solution: str) -> Fraction:
    """An independent evaluation of a generated (trusted) solution: Python's own arithmetic on Fractions."""
    assert re.fullmatch(r"[0-9+\-*()]+", solution)
    return eval(re.sub(r"(\d+)", r"Fraction(\1)", solution), {"Fraction": Fraction})


def test_every_row_is_solved_by_its_solution_with_each_number_once():
    for row in countdown_rows("train", **KNOBS) + countdown_rows("heldout", **KNOBS):
        target, numbers = parse_answer(row["answer"])
        assert parse_prompt(row["prompt"]) == (target, numbers)
        assert len(numbers) == 3 and all(1 <= n <= 9 for n in numbers) and 1 <= target <= 50
        assert _reference_value(row["solution"]) == target
        assert Counter(map(int, re.findall(r"\d+", row["solution"]))) == Counter(numbers)


def test_random_expression_joins_the_picked_terms():
    # terms [4, 5, 6]: pop index 1 (5), pop index 0 (4), op 2 ("*") -> [6, "5*4"];
    # pop 0 (6), pop 0 ("5*4"), op 1 ("-") -> "6-(5*4)" (a compound right operand of "-" is parenthesised)
    picks = iter([1, 0, 2, 0, 0, 1])
    assert random_expression([4, 5, 6], lambda n: next(picks)) == "6-(5*4)"
    picks = iter([0, 0, 0, 1, 0, 2])  # "4+5" -> [6, "4+5"]; pop 1, pop 0, "*": a compound left operand too
    assert random_expression([4, 5, 6], lambda n: next(picks)) == "(4+5)*6"


def test_prompt_and_answer_formats():
    assert make_prompt([3, 5, 7], 22) == "3,5,7 to 22:"
    assert parse_prompt("3,5,7 to 22:") == (22, [3, 5, 7])
    assert parse_answer(" 22:3,5,7 ") == (22, [3, 5, 7])
    with pytest.raises(ValueError, match="countdown prompt"):
        parse_prompt("3 5 7 to 22")
    with pytest.raises(ValueError, match="countdown answer"):
        parse_answer("22")


def test_bad_knobs_name_themselves():
    with pytest.raises(ValueError, match="count"):
        countdown_rows("train", count=1)
    with pytest.raises(ValueError, match="split"):
        countdown_rows("validation")
    with pytest.raises(ValueError, match="too small"):
        countdown_rows("train", count=2, max_number=2, max_target=4, heldout_size=2, train_size=50)
    assert countdown.SPLITS == ("train", "heldout")


def test_a_config_source_named_countdown_loads_its_rows():
    from dapo_jax.training.config.data import SourceSection
    from dapo_jax.training.sources import load_source

    source = SourceSection(name="countdown", split="heldout", options=dict(KNOBS))
    problems = load_source(source)
    rows = countdown_rows("heldout", **KNOBS)
    assert [(p.problem, p.answer) for p in problems] == [(r["prompt"], r["answer"]) for r in rows]
