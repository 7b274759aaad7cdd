"""The `cot` reward: +1 for a trace whose last line states the right answer, -1 for a slip, an
unfinished (truncated) or a still-rambling response; and how it relates to `dapo_answer`."""

import pytest

from dapo_jax.data import cot
from dapo_jax.rewards import REWARDS, make_reward, score_batch

ROWS = cot.cot_rows("heldout")[:100]


def test_registered_with_dapo_values():
    assert "cot" in REWARDS
    reward = make_reward("cot")
    assert (reward.right, reward.wrong) == (1.0, -1.0)
    with pytest.raises(TypeError, match="unknown option"):
        make_reward("cot", numeric=False)


def test_right_wrong_and_truncated_traces():
    reward = make_reward("cot")
    for i, row in enumerate(ROWS):
        right = cot.solution(row["prompt"])
        assert reward(right, row["answer"]) == 1.0
        assert reward(cot.trace(row["prompt"], "verbose"), row["answer"]) == 1.0
        assert reward(cot.trace(row["prompt"], "terse"), row["answer"]) == 1.0
        assert reward(cot.trace(row["prompt"], "slip", seed=i), row["answer"]) == -1.0
        cut = right[: right.rindex("\n")]  # truncated before its Answer line
        assert reward(cut, row["answer"]) == -1.0
        assert reward(right[: len(right) // 2], row["answer"]) == -1.0
        assert reward(right + "\nb:1+1=2", row["answer"]) == -1.0  # did not stop at its answer
    assert reward("", "5") == -1.0


def test_score_batch_and_answer_keys():
    reward = make_reward("cot", right=1.0, wrong=0.0)
    texts = [cot.solution(r["prompt"]) for r in ROWS[:4]] + ["a1+b2=3"]
    truths = [r["answer"] for r in ROWS[:4]] + ["3"]
    out = score_batch(reward, texts, truths)
    assert out.rewards.tolist() == [1.0] * 4 + [0.0]
    assert out.correct.tolist() == [True] * 4 + [False]
    assert reward.answer_key("a1+b2=3\nAnswer: 03") == "3" and reward.answer_key("a1+b2=3") is None


def test_agrees_with_dapo_answer_on_traces_but_is_stricter():
    """`dapo_answer` (last `Answer:` in the last 300 characters) gives the same verdict on every trace
    variant; `cot` differs where the response goes on after its Answer line."""
    ours, dapo = make_reward("cot"), make_reward("dapo_answer")
    for i, row in enumerate(ROWS):
        for variant in cot.VARIANTS:
            text = cot.trace(row["prompt"], variant, seed=i)
            assert ours(text, row["answer"]) == dapo(text, row["answer"])
    text = "a3+b4=7\nAnswer: 7\n7+c1=8"
    assert dapo(text, "7") == 1.0 and ours(text, "7") == -1.0
