"""R1's layout: the `<answer>` tag read by every answer extractor and check, and the `think_format` reward."""

import pytest

from dapo_jax.rewards import check, extract, make_reward

R1 = "<think>2+2 is 4</think><answer>4</answer>"


@pytest.mark.parametrize("response, expected", [
    (R1, "4"),
    ("<think>x</think>\n<answer>\n  \\boxed{\\frac{1}{2}}\n</answer>", "\\frac{1}{2}"),  # a box inside is unboxed
    ("<answer>3</answer> then <answer>5</answer>", "5"),  # the last one
    ("<answer>3</answer><answer>5", "3"),  # an unclosed tag (truncated) is no answer
    ("<answer>  </answer>", None),
    ("no tags", None),
])
def test_extract_answer_tag(response, expected):
    assert extract.extract_answer_tag(response) == expected


@pytest.mark.parametrize("response, expected", [
    (R1, "4"),
    ("\\boxed{3} <answer>5</answer>", "5"),  # the tag comes later
    ("<answer>5</answer> Answer: 7", "7"),  # the Answer: line comes later
    ("<answer>\\boxed{5}</answer>", "5"),
    ("Answer: 3 <answer>\\boxed{5}</answer>", "5"),
])
def test_the_final_answer_is_whichever_comes_last(response, expected):
    assert extract.extract_final_answer(response) == expected


@pytest.mark.parametrize("name", ["dapo_answer", "boxed", "gsm8k", "integer", "math_verify"])
def test_every_check_reads_the_tag(name):
    reward = make_reward(name, right=1.0, wrong=0.0)
    assert reward(R1, "4") == 1.0 and reward(R1, "5") == 0.0
    assert reward.answer_key(R1) == "4"


def test_gsm8k_strict_reads_the_tag_but_not_a_stray_number():
    assert check.gsm8k_correct("<answer>The total is 1,234.</answer>", "1234", flexible=False)
    assert not check.gsm8k_correct("the total is 1234", "1234", flexible=False)
    assert check.gsm8k_correct("<answer>9</answer> #### 12", "12")  # #### after the tag wins


@pytest.mark.parametrize("response, ok", [
    (R1, True),
    ("  <think>\nline 1\nline 2\n</think>\n\n<answer> 4 </answer>\n", True),
    ("<think></think><answer>4</answer>", True),  # an empty thought is still the layout
    ("<answer>4</answer>", False),  # no thinking
    ("<think>a</think>", False),  # no answer
    ("<think>a</think><answer> </answer>", False),  # an empty answer
    ("<think>a</think><answer>4</answer> and more", False),  # text after the answer
    ("preamble <think>a</think><answer>4</answer>", False),  # text before the thought
    ("<think>a<think>b</think><answer>4</answer>", False),  # nested tags
    ("<think>a</think><answer>4</answer><answer>5</answer>", False),  # two answers
    ("<answer>4</answer><think>a</think>", False),  # the wrong order
])
def test_think_format(response, ok):
    reward = make_reward("think_format")
    assert reward(response) == (1.0 if ok else 0.0)
    assert reward.is_correct(response) is ok
    assert make_reward("think_format", bonus=0.5, missing=-1.0)(response) == (0.5 if ok else -1.0)


def test_think_format_on_a_long_cut_response():
    # a response cut inside its answer: no match, and found in linear time (a backtracking pattern would hang)
    assert make_reward("think_format")("<think>x</think><answer>" + "a " * 100_000) == 0.0
