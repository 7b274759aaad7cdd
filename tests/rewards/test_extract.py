"""Answer extraction: hand-written cases for each rule, and the no-answer cases."""

import pytest

from dapo_jax.rewards import extract as ex


@pytest.mark.parametrize(
    "response, expected",
    [
        ("Step 1 ... so x = 5.\nAnswer: 25", "25"),
        ("answer: 25", "25"),  # case-insensitive, as verl
        ("ANSWER :  $25$  \n", "$25$"),
        ("Answer: 24\nwait, no.\nAnswer: 25\n", "25"),  # the last match
        ("Answer:\n25", "25"),  # \s* crosses the newline (verl's regex)
        ("Answer: \\frac{1}{2}", "\\frac{1}{2}"),
        ("no answer here", None),
        ("", None),
        ("Answer:", None),
        ("Answer:   ", None),
    ],
)
def test_extract_dapo_answer(response, expected):
    assert ex.extract_dapo_answer(response) == expected


def test_extract_dapo_answer_only_reads_the_last_300_characters():
    early = "Answer: 25\n" + "x" * 300
    assert ex.extract_dapo_answer(early) is None
    late = "y" * 1000 + "Answer: 25"
    assert ex.extract_dapo_answer(late) == "25"
    assert ex.extract_dapo_answer(early, tail_chars=0) == "25"  # 0: whole response


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{25}.", "25"),
        ("\\boxed{1} then \\boxed{2}", "2"),  # last box
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("$\\boxed 5$", "5"),
        ("\\fbox{7}", "7"),
        ("\\boxed{}", None),
        ("\\boxed{25", None),  # truncated response: unbalanced
        ("no box", None),
        ("\\boxed", None),
    ],
)
def test_extract_boxed(text, expected):
    assert ex.extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She pays 3 + 4 = <<3+4=7>>7.\n#### 7", "7"),
        ("#### 1,000", "1000"),
        ("#### -3.5", "-3.5"),
        ("#### $18", "18"),
        ("#### 5\n#### 6", "6"),
        ("the answer is 7", None),
        ("#### ", None),
    ],
)
def test_extract_gsm8k(text, expected):
    assert ex.extract_gsm8k(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("I have 3 apples and 1,250 pears", "1250"),
        ("it costs -2.5 dollars.", "-2.5"),
        ("x is .5", ".5"),
        ("none", None),
    ],
)
def test_extract_last_number(text, expected):
    assert ex.extract_last_number(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\boxed{26} hmm, actually\nAnswer: 25", "25"),
        ("Answer: 26 ... no: \\boxed{25}", "25"),
        ("\\boxed{25}", "25"),
        ("Answer: 25", "25"),
        ("nothing", None),
    ],
)
def test_extract_final_answer_takes_the_later_one(text, expected):
    assert ex.extract_final_answer(text) == expected
