"""Yeo et al.'s cosine length reward against hand-computed values."""

import math

import pytest

from dapo_jax.data.char_tokenizer import build_char_tokenizer
from dapo_jax.rewards import make_reward
from dapo_jax.rewards.length import cosine_interpolation

BOX7 = "\\boxed{7}"  # 9 characters


def test_cosine_interpolation_ends_and_middle():
    assert cosine_interpolation(0, 10, 1.0, 2.0) == 2.0  # eta_max at t = 0
    assert cosine_interpolation(10, 10, 1.0, 2.0) == pytest.approx(1.0)  # eta_min at t = T
    assert cosine_interpolation(5, 10, 1.0, 2.0) == pytest.approx(1.5)  # cos(pi/2) = 0: halfway


def test_right_wrong_and_exceeded_by_hand():
    reward = make_reward("cosine", check="boxed", max_length=12, unit="chars")
    c = math.cos(9 * math.pi / 12)  # -sqrt(2)/2
    # right: r_L^c + (r_0^c - r_L^c)/2 (1 + cos) = 1 + 0.5 (1 - 0.70711) = 1.14645
    assert reward(BOX7, "7") == pytest.approx(1.0 + 0.5 * (1 + c)) == pytest.approx(1.1464466)
    # wrong: r_L^w + (r_0^w - r_L^w)/2 (1 + cos) = 0 - 5 (1 - 0.70711) = -1.46447
    assert reward(BOX7, "8") == pytest.approx(-5.0 * (1 + c)) == pytest.approx(-1.4644661)
    assert reward(BOX7 + "   ", "7") == -10.0  # 12 chars = L_max: r_exceed, right or not
    assert reward.score(BOX7, "7") == (pytest.approx(1.1464466), True) and not reward.is_correct(BOX7, "8")
    assert reward.answer_key(BOX7) == "7" and reward.wrong == -10.0


def test_shorter_right_is_better_and_longer_wrong_is_less_bad():
    reward = make_reward("cosine", check="boxed", max_length=40, unit="chars")
    right = [reward(" " * n + BOX7, "7") for n in range(0, 30, 5)]
    wrong = [reward(" " * n + BOX7, "8") for n in range(0, 30, 5)]
    assert right == sorted(right, reverse=True) and wrong == sorted(wrong)
    assert all(1.0 <= r <= 2.0 for r in right) and all(-10.0 <= w <= 0.0 for w in wrong)


def test_own_values_and_tokens():
    reward = make_reward("cosine", check="boxed", max_length=18, unit="chars", r0_correct=1.0, rL_correct=0.5,
                         r0_wrong=-1.0, rL_wrong=-0.5, r_exceed=-2.0)
    assert reward(BOX7, "7") == pytest.approx(0.75) and reward(BOX7, "8") == pytest.approx(-0.75)  # t = T/2
    by_tokens = make_reward("cosine", check="boxed", max_length=18, tokenizer=build_char_tokenizer())
    assert by_tokens(BOX7, "7") == pytest.approx(1.5)  # one token a character; the defaults at t = T/2: 1 + 0.5


@pytest.mark.parametrize("options, message", [
    ({"check": "boxed"}, "set options.max_length"),
    ({"check": "boxed", "max_length": 8}, "needs its tokenizer"),
    ({"check": "boxed", "max_length": 8, "unit": "words"}, "unit='words'"),
    ({"check": "boxed", "max_length": 0, "unit": "chars"}, "positive integer"),
    ({"check": "boxd", "max_length": 8, "unit": "chars"}, "unknown reward 'boxd'"),
    ({"max_length": 8, "unit": "chars", "r_exced": 1.0}, r"unknown option\(s\) \['r_exced'\]"),
])
def test_refusals(options, message):
    with pytest.raises((ValueError, TypeError, KeyError), match=message):
        make_reward("cosine", **options)
