"""The synthetic task: deterministic, seed-fixed disjoint splits, exact answers, a strict checker."""

import pytest

from dapo_jax.data import synthetic


def test_rows_are_deterministic_and_answers_exact():
    a = synthetic.synthetic_rows("train", seed=3)
    b = synthetic.synthetic_rows("train", seed=3)
    assert a == b
    assert len(a) == 1955 - 400
    for row in a[:500]:
        x, op, y = row["prompt"][:2], row["prompt"][2], row["prompt"][3:4]
        assert row["prompt"][4:] == "="
        expected = int(x) + int(y) if op == "+" else int(x) - int(y)
        assert row["answer"] == str(expected) and expected >= 0


def test_default_space_is_two_digits_plus_minus_one_digit():
    rows = synthetic.synthetic_rows("train") + synthetic.synthetic_rows("heldout")
    # 100*10 additions + (100*10 - 45) non-negative subtractions (a < b only when a <= 8)
    assert len({r["prompt"] for r in rows}) == len(rows) == 1000 + 955
    assert {"prompt": "12+9=", "answer": "21"} in rows and {"prompt": "03-7=", "answer": "-4"} not in rows


def test_splits_are_disjoint_cover_the_space_and_depend_on_seed():
    train = synthetic.synthetic_rows("train", seed=0, heldout_size=1000, max_second=None)
    held = synthetic.synthetic_rows("heldout", seed=0, heldout_size=1000, max_second=None)
    assert len(held) == 1000
    prompts_train = {r["prompt"] for r in train}
    prompts_held = {r["prompt"] for r in held}
    assert not prompts_train & prompts_held
    # 100*100 additions + 100*101/2 non-negative subtractions
    assert len(prompts_train) + len(prompts_held) == 10000 + 5050 == len(train) + len(held)
    other = {r["prompt"] for r in synthetic.synthetic_rows("heldout", seed=1, heldout_size=1000, max_second=None)}
    assert other != prompts_held


def test_small_space_by_hand():
    rows = synthetic.all_problems(max_operand=2, ops="-", zero_pad=False)
    assert rows == [{"prompt": "0-0=", "answer": "0"}, {"prompt": "1-0=", "answer": "1"},
                    {"prompt": "1-1=", "answer": "0"}, {"prompt": "2-0=", "answer": "2"},
                    {"prompt": "2-1=", "answer": "1"}, {"prompt": "2-2=", "answer": "0"}]
    assert synthetic.all_problems(max_operand=12, ops="+")[13] == {"prompt": "01+00=", "answer": "1"}


def test_is_correct_is_strict():
    assert synthetic.is_correct("19", "19")
    assert synthetic.is_correct(" 19\n", "19")
    assert synthetic.is_correct("019", "19")
    assert not synthetic.is_correct("18", "19")
    assert not synthetic.is_correct("19 19", "19")
    assert not synthetic.is_correct("1 9", "19")
    assert not synthetic.is_correct("", "19")
    assert not synthetic.is_correct("Answer: 19", "19")


@pytest.mark.parametrize("kwargs, word", [
    (dict(split="test"), "split"), (dict(ops="*"), "ops"), (dict(heldout_size=0), "heldout_size"),
    (dict(max_operand=0), "max_operand"), (dict(max_second=100), "max_second"),
])
def test_bad_arguments_are_named(kwargs, word):
    with pytest.raises(ValueError, match=word):
        synthetic.synthetic_rows(**kwargs)
