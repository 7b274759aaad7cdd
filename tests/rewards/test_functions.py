"""Reward functions: values, registry, format bonus, weighted sum, and batch scoring with errors."""

import numpy as np
import pytest

from dapo_jax.rewards import functions as F


@pytest.mark.parametrize(
    "name, right_response, wrong_response, truth",
    [
        ("dapo_answer", "...\nAnswer: 25", "Answer: 24", "25"),
        ("boxed", "\\boxed{25}", "\\boxed{24}", "25"),
        ("gsm8k", "#### 25", "#### 24", "25"),
        ("integer", "\\boxed{025}", "\\boxed{24}", "25"),
        ("math_verify", "\\boxed{\\frac12}", "\\boxed{\\frac13}", "0.5"),
    ],
)
def test_registry_rewards(name, right_response, wrong_response, truth):
    fn = F.make_reward(name)
    assert fn(right_response, truth) == 1.0 and fn(wrong_response, truth) == -1.0  # DAPO default
    assert fn.score(right_response, truth) == (1.0, True)
    assert F.is_correct(name, right_response, truth) and not F.is_correct(fn, wrong_response, truth)
    zero_one = F.make_reward(name, right=1.0, wrong=0.0)
    assert zero_one(right_response, truth) == 1.0 and zero_one(wrong_response, truth) == 0.0
    assert fn("", truth) == -1.0


def test_registry_errors_name_the_bad_key():
    with pytest.raises(KeyError, match="'nope'"):
        F.make_reward("nope")
    with pytest.raises(TypeError, match="flexibel"):
        F.make_reward("gsm8k", flexibel=False)
    assert set(F.REWARDS) == {"dapo_answer", "boxed", "gsm8k", "integer", "math_verify", "synthetic", "cot", "format",
                              "think_format", "cosine", "language", "code", "countdown"}


def test_synthetic_reward_is_the_whole_response_as_an_integer():
    r = F.make_reward("synthetic", right=1.0, wrong=-1.0)
    assert [r(x, "15") for x in ("15", " 15\n", "015", "14", "15 ", "Answer: 15", "1 5", "")] == [
        1.0, 1.0, 1.0, -1.0, 1.0, -1.0, -1.0, -1.0]
    assert r.answer_key("15") == "15" and r.answer_key("x15") is None


def test_options_reach_the_check():
    strict = F.make_reward("gsm8k", flexible=False)
    assert strict("#### 7", "7") == 1.0 and strict("the answer is 7", "7") == -1.0
    verl_exact = F.make_reward("dapo_answer", numeric=False)
    assert verl_exact("Answer: 025", "25") == -1.0


@pytest.mark.parametrize(
    "response, has_layout",
    [
        ("reasoning...\nAnswer: 25", True),
        ("reasoning...\nAnswer: 25\n\n", True),
        ("Answer: 25", True),
        ("Answer: 25\nand then more text", False),  # not the final line
        ("reasoning...\nAnswer:", False),
        ("the answer is 25", False),
        ("", False),
    ],
)
def test_format_reward(response, has_layout):
    fn = F.make_reward("format", bonus=0.5)
    assert fn(response, "ignored") == (0.5 if has_layout else 0.0)
    assert fn.wrong == 0.0


def test_format_reward_bad_pattern_is_named():
    with pytest.raises(ValueError, match="regex"):
        F.FormatReward(pattern="(")


def test_weighted_sum():
    combo = F.combine({"dapo_answer": 1.0, "format": 2.0})
    # right and formatted: 1*1 + 2*0.5; wrong but formatted: -1 + 1; right answer, no final line.
    assert combo("work\nAnswer: 25", "25") == pytest.approx(2.0)
    assert combo("work\nAnswer: 24", "25") == pytest.approx(0.0)
    assert combo("Answer: 25\ntrailing", "25") == pytest.approx(1.0)
    assert combo.score("work\nAnswer: 24", "25") == (pytest.approx(0.0), False)
    assert combo.is_correct("Answer: 25\ntrailing", "25")  # correctness = the accuracy component
    assert combo.wrong == pytest.approx(-1.0)
    by_name = F.combine({"format": 1.0, "integer": 1.0}, accuracy="integer")
    assert by_name.is_correct("\\boxed{25} then chatter", "25")
    pairs = F.combine([(F.make_reward("boxed"), 0.5), (F.make_reward("integer"), 0.5)])
    assert pairs("\\boxed{25}", "25") == pytest.approx(1.0)
    with pytest.raises(ValueError):
        F.WeightedSum((F.make_reward("boxed"),), (1.0, 2.0))
    with pytest.raises(KeyError, match="acc"):
        F.combine({"boxed": 1.0}, accuracy="acc")


def _exploding(response, truth):
    if "boom" in response:
        raise ValueError("cannot parse")
    return 1.0 if response == truth else 0.0


def test_score_batch_values_match_row_by_row():
    fn = F.make_reward("integer")
    responses = ["\\boxed{1}", "Answer: 2", "\\boxed{9}", ""]
    truths = ["1", "2", "3", "4"]
    for workers in (1, 2):
        out = F.score_batch(fn, responses, truths, max_workers=workers)
        np.testing.assert_array_equal(out.rewards, np.array([1, 1, -1, -1], np.float32))
        np.testing.assert_array_equal(out.correct, [True, True, False, False])
        assert out.rewards.dtype == np.float32 and out.num_errors == 0


def test_score_batch_error_names_the_row_and_response():
    responses = ["a", "b", "boom " + "x" * 500]
    with pytest.raises(RuntimeError, match=r"row 2 .*ValueError: cannot parse.*boom x") as info:
        F.score_batch(_exploding, responses, ["a", "c", "d"])
    assert "[505 chars]" in str(info.value)  # the response is truncated


def test_score_batch_on_error_wrong_counts():
    out = F.score_batch(_exploding, ["a", "boom", "c", "boom!"], ["a", "b", "x", "y"], on_error="wrong")
    np.testing.assert_array_equal(out.rewards, [1.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(out.correct, [True, False, False, False])
    assert out.num_errors == 2 and out.error_rows == (1, 3)
    # A reward function's own wrong value is used; a non-string response is an error row.
    out = F.score_batch(F.make_reward("dapo_answer"), ["Answer: 1", None], ["1", "1"], on_error="wrong")
    np.testing.assert_array_equal(out.rewards, [1.0, -1.0])
    assert out.error_rows == (1,)


def test_score_batch_bad_arguments():
    with pytest.raises(ValueError, match="2 responses but 1 truths"):
        F.score_batch(_exploding, ["a", "b"], ["a"])
    with pytest.raises(ValueError, match="on_error"):
        F.score_batch(_exploding, ["a"], ["a"], on_error="skip")
