"""R1's language-consistency reward against hand-counted words."""

import pytest

from dapo_jax.rewards import make_reward
from dapo_jax.rewards.language import language_share, words


def test_words_are_letter_runs_and_single_ideographs():
    assert words("The answer is 数学, x=3+4; café!") == ["The", "answer", "is", "数", "学", "x", "café"]
    assert words("3 + 4 = 7 \\frac{1}{2}") == ["frac"]


@pytest.mark.parametrize("text, language, share", [
    ("The answer is 数学", "en", 3 / 5),  # The, answer, is | 数, 学
    ("The answer is 数学", "zh", 2 / 5),
    ("Привет world", "en", 1 / 2),
    ("Привет world", "ru", 1 / 2),
    ("café crème", "en", 1.0),  # Latin letters with accents are Latin
    ("ひらがな と 漢字", "ja", 1.0),  # kana and ideographs
    ("ひらがな と 漢字", "zh", 2 / 7),  # 7 single-character words, 2 of them ideographs
])
def test_language_share(text, language, share):
    assert language_share(text, language) == pytest.approx(share)


def test_the_reward_reads_the_chain_of_thought_only():
    reward = make_reward("language", language="en")
    assert reward("<think>I think 数学 helps</think><answer>数学</answer>") == pytest.approx(3 / 5)
    assert reward("<think>all english here</think><answer>数学</answer>") == 1.0
    assert reward.is_correct("<think>all english</think>") and not reward.is_correct("<think>数</think>")
    assert reward("no tags at all, 数") == pytest.approx(4 / 5)  # the whole response: no, tags, at, all | 数
    assert reward("<think>cut off mid 数") == pytest.approx(3 / 4)  # an unclosed thought: the rest
    assert reward("<think>1 + 2 = 3</think>") == 0.0 and make_reward("language", empty=1.0)("<think>3</think>") == 1.0
    with pytest.raises(ValueError, match="known"):
        make_reward("language", language="xx")
