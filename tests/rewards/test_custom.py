"""User reward functions by import path: the three forms (sync and async), the row's columns, the
failures counted and scored `wrong`, and the one-line refusals of what cannot be called."""

from pathlib import Path

import numpy as np
import pytest

from dapo_jax.rewards import make_reward
from dapo_jax.rewards.custom import CustomRewardError, detect_form, load_function, make_custom_reward
from dapo_jax.rewards.pipeline import RewardPipeline

FILE = Path(__file__).with_name("user_rewards.py")
RESPONSES = ["7", "b", "12 "]
TRUTHS = ["7", "3", "12"]
ROWS = [{"q": "3+4", "level": 1, "bonus": 0.25}, {"q": "1+2", "level": 2, "bonus": 0.0}, {"q": "5+7", "level": 3}]
PROMPTS = ["p:3+4", "p:1+2", "p:5+7"]


def custom(fn: str, **options):
    said = []
    reward = make_custom_reward(f"{FILE}:{fn}", options, wrong=-1.0, say=said.append)
    return reward, said


@pytest.mark.parametrize("fn, form, expected", [
    ("exact", "sample", [1.25, 0.0, 1.0]),  # the row's bonus column comes in **row
    ("exact_narrow", "sample", [1.0, 0.0, 1.0]),
    ("exact_level", "sample", [1.0, 0.0, 3.0]),  # completion= and one named column
    ("exact_async", "sample", [1.0, 0.0, 1.0]),
    ("lengths", "batch", [2.0, 3.0, 6.0]),  # len + level
    ("lengths_async", "batch", [2.0, 3.0, 6.0]),
    ("trl_style", "trl", [16.0, 7.0, 18.0]),  # 10 * right + level + len(prompt)
    ("trl_async", "trl", [1.0, 1.0, 3.0]),
])
def test_each_form_is_detected_and_receives_the_rows(fn, form, expected):
    reward, said = custom(fn)
    assert reward.form == form
    rewards, failed = reward.score_rows(RESPONSES, TRUTHS, rows=ROWS, prompts=PROMPTS)
    assert failed == {} and said == []
    np.testing.assert_allclose(rewards, expected)
    assert rewards.dtype == np.float32


@pytest.mark.parametrize("batch_size", [1, 2, 5])
def test_batches_split_by_batch_size_give_the_same_rewards(batch_size):
    reward, _ = custom("lengths", batch_size=batch_size, max_workers=2)
    np.testing.assert_allclose(reward.score_rows(RESPONSES, TRUTHS, rows=ROWS)[0], [2.0, 3.0, 6.0])


def test_a_module_on_sys_path(monkeypatch):
    monkeypatch.syspath_prepend(str(FILE.parent))
    reward = make_custom_reward("user_rewards:exact_narrow", {}, wrong=0.0)
    assert reward.form == "sample" and reward("7", "7") == 1.0 and reward.is_correct("7", "7")
    assert not reward.is_correct("8", "7")  # correct: reward > threshold (0)


@pytest.mark.parametrize("fn, why", [
    ("raises_on_b", "ZeroDivisionError: b is not allowed"),
    ("nan_on_b", "returned nan (not finite)"),
    ("none_on_b", "returned None"),
])
def test_a_failing_row_is_scored_wrong_counted_and_its_traceback_printed_once(fn, why):
    reward, said = custom(fn)
    rewards, failed = reward.score_rows(["a", "b", "c", "b"], ["1"] * 4)
    assert failed == {1: why, 3: why}
    assert rewards[1] == rewards[3] == -1.0 and rewards[0] == rewards[2] != -1.0
    assert len(said) == 1 and "failed on row 1" in said[0] and "reward_failures/" in said[0]
    if fn == "raises_on_b":
        assert "Traceback" in said[0] and "raise ZeroDivisionError" in said[0]
    reward.score_rows(["b"], ["1"])
    assert len(said) == 1  # later failures are counted, not printed


def test_every_row_of_a_call_that_returns_a_bad_batch_fails():
    for fn, why in (("one_too_many", "returned 4 values for 3 responses"),
                    ("not_a_list", "returned a float, expected a list of 3 numbers")):
        reward, _ = custom(fn)
        rewards, failed = reward.score_rows(RESPONSES, TRUTHS, rows=ROWS)
        assert failed == {0: why, 1: why, 2: why} and rewards.tolist() == [-1.0] * 3
    reward, _ = custom("text_result")
    assert reward.score_rows(["a"], ["1"])[1] == {0: "returned a str ('1.0'), not a number"}


def test_a_stuck_call_times_out_and_the_rest_are_scored():
    reward, said = custom("sleeps_on_b", timeout_s=0.3, max_workers=4)
    rewards, failed = reward.score_rows(["a", "b", "c"], ["1"] * 3)
    assert failed == {1: "timed out after 0.3s"} and rewards.tolist() == [1.0, -1.0, 1.0]
    assert "timed out" in said[0]
    reward, _ = custom("sleeps_async", timeout_s=0.2)  # an async call is cancelled at its timeout
    assert reward.score_rows(["a", "b"], ["1", "1"])[1] == {0: "timed out after 0.2s", 1: "timed out after 0.2s"}


def test_when_every_worker_is_held_by_a_stuck_call_the_rest_fail_at_once():
    reward, _ = custom("sleeps_on_b", timeout_s=0.2, max_workers=1)
    _, failed = reward.score_rows(["b"], ["1"])  # the one worker stays stuck in time.sleep
    assert failed == {0: "timed out after 0.2s"}
    _, failed = reward.score_rows(["a", "a", "a"], ["1"] * 3)
    assert set(failed) == {0, 1, 2} and all("workers are held" in why for why in failed.values())


def test_weighted_with_the_built_ins_in_a_pipeline():
    reward, _ = custom("exact")
    pipe = RewardPipeline([("my", reward, 1.0), ("format", make_reward("format", bonus=0.5), 0.1)], on_error="wrong")
    out = pipe.score(["7", "Answer: 3", "12"], TRUTHS, rows=ROWS, prompts=PROMPTS)
    # exact: 1 + 0.25, 0, 1 (+0); format: 0, 0.5, 0
    np.testing.assert_allclose(out.parts, [[1.25, 0.0], [0.0, 0.5], [1.0, 0.0]])
    np.testing.assert_allclose(out.rewards, [1.25, 0.05, 1.0], rtol=1e-6)
    assert out.correct.tolist() == [True, False, True]  # the first function judges: reward > 0
    assert out.failures == {"my": 0, "format": 0} and out.scored == {"my": 3, "format": 3}
    failing, _ = custom("raises_on_b")
    out = RewardPipeline([("f", failing, 1.0), ("format", make_reward("format"), 1.0)], on_error="wrong").score(
        ["a", "b"], ["1", "1"])
    assert out.failures == {"f": 1, "format": 0} and out.error_rows == (1,) and out.num_errors == 1
    assert out.parts[1].tolist() == [-1.0, 0.0]  # a failed row: every function's wrong value
    with pytest.raises(RuntimeError, match=r"reward 'f' failed on row 1 \(ZeroDivisionError"):
        RewardPipeline([("f", failing, 1.0)], on_error="raise").score(["a", "b"], ["1", "1"])


@pytest.mark.parametrize("name, options, message", [
    ("no_such_module_xyz:fn", {}, "no module 'no_such_module_xyz'"),
    ("missing/file.py:fn", {}, "no such file"),
    (f"{FILE}:absent", {}, "has no attribute 'absent'"),
    (f"{FILE}:NOT_CALLABLE", {}, "NOT_CALLABLE is a int, not a function"),
    (f"{FILE}:unclear", {}, r"cannot tell the form of unclear\(a, b\)"),
    (f"{FILE}:takes_nothing", {"form": "sample"}, r"is called as fn\(response, ground_truth, \*\*row\)"),
    (f"{FILE}:exact", {"form": "sideways"}, "options.form='sideways'"),
    (f"{FILE}:exact", {"timeout": 3}, r"unknown option\(s\) \['timeout'\]"),
    (f"{FILE}:exact", {"timeout_s": 0}, "timeout_s must be > 0"),
    (f"{FILE}:exact", {"max_workers": 0}, "workers must be >= 1"),
    (f"{FILE}:exact", {"batch_size": 0}, "batch_size=0 must be >= 1"),
    ("no_colon", {}, "expected module:function"),
])
def test_what_cannot_be_called_is_refused_in_one_line(name, options, message):
    with pytest.raises(CustomRewardError, match=message) as e:
        make_custom_reward(name, options, wrong=0.0)
    assert "\n" not in str(e.value)


def test_an_import_that_raises_is_named(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("import nothing_of_that_name\n")
    with pytest.raises(CustomRewardError, match="importing .*broken.py raised ModuleNotFoundError"):
        load_function(f"{bad}:fn")
    (tmp_path / "rel.py").write_text("def fn(response, ground_truth):\n    return 1.0\n")
    assert load_function("rel.py:fn", base=tmp_path)("x", "y") == 1.0  # relative to base


def test_the_form_can_be_set_explicitly():
    def score(text, truth):
        return 1.0

    with pytest.raises(CustomRewardError):
        detect_form(score)
    reward = make_custom_reward(f"{FILE}:unclear", {"form": "sample"}, wrong=0.0)
    assert reward.score_rows(["x"], ["y"])[0].tolist() == [0.0]


def test_a_dry_run_failure_is_one_line():
    reward, said = custom("raises_on_b")
    reward.dry_run("a", "1", {}, "p")  # passes
    with pytest.raises(CustomRewardError, match=r"a dry call failed: ZeroDivisionError: b is not allowed"):
        reward.dry_run("b", "1", {}, "p")
    assert said == []  # raised, not printed
