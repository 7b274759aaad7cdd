"""The `countdown` reward: hand-checked expressions, one sandboxed process per batch, clear failures."""

import pytest

from dapo_jax.rewards import make_reward, score_batch
from dapo_jax.rewards.countdown import extract_expression
from dapo_jax.rewards.sandbox import SandboxResult, SandboxUnavailable


@pytest.fixture(scope="module")
def reward():
    try:
        return make_reward("countdown", right=1.0, wrong=-1.0)
    except SandboxUnavailable as e:
        pytest.skip(f"no sandbox on this machine: {e}")


# (response, ground truth "target:numbers", right?), each worked out by hand
CASES = [
    ("3*5+7", "22:3,5,7", True),
    ("7+3*5", "22:3,5,7", True),  # precedence: 7 + 15
    (" 7 + 5 * 3 \n", "22:3,5,7", True),  # spaces and a trailing newline
    ("<answer>5*3+7</answer>", "22:3,5,7", True),  # R1's layout
    ("(3+5)*7", "22:3,5,7", False),  # 56
    ("3*5+7+3", "25:3,5,7", False),  # 3 used twice
    ("3*5", "15:3,5,7", False),  # 7 unused
    ("3*5+7-1", "21:3,5,7", False),  # a number that was not given
    ("8-3", "5:8,3,1", False),  # 1 unused
    ("8/(3-1)*1", "4:8,3,1", False),  # 1 used twice
    ("8/(3-1)", "4:8,3,1", True),  # exact division
    ("9/2*2", "9:9,2,2", True),  # 9/2 stays rational: (9/2)*2 = 9, no float rounding
    ("7/(5-5)", "7:7,5,5", False),  # division by zero
    ("-3+5+7", "9:3,5,7", False),  # unary minus is not allowed
    ("3**5+7", "250:3,5,7", False),
    ("__import__('os').system('true')", "22:3,5,7", False),
    ("3.0*5+7", "22:3,5,7", False),
    ("3*5+7)", "22:3,5,7", False),  # a syntax error
    ("", "22:3,5,7", False),
    ("(" * 50 + "3*5+7" + ")" * 50, "22:3,5,7", False),  # over max_chars (100)
    ("((3*5))+(7)", "22:3,5,7", True),
]


def test_hand_checked_cases_in_one_batch(reward):
    rewards, correct, failed = reward.score_many([c[0] for c in CASES], [c[1] for c in CASES])
    assert correct == [c[2] for c in CASES] and failed == {}
    assert rewards == [1.0 if c[2] else -1.0 for c in CASES]


def test_one_row_at_a_time_agrees(reward):
    for response, truth, ok in CASES[:4] + CASES[11:14]:
        assert reward.score(response, truth) == ((1.0, True) if ok else (-1.0, False))
        assert reward(response, truth) == (1.0 if ok else -1.0)


def test_a_batch_is_one_sandboxed_process(reward, monkeypatch):
    calls = []
    run = reward.sandbox.run
    monkeypatch.setattr(reward.sandbox, "run", lambda source: calls.append(source) or run(source))
    out = score_batch(reward, ["3*5+7", "3+5+7", "7*5-3"], ["22:3,5,7", "15:3,5,7", "32:3,5,7"])
    assert out.rewards.tolist() == [1.0, 1.0, 1.0] and len(calls) == 1
    assert "__import__" not in calls[0]  # the responses travel as a JSON string, the checker is fixed


def test_responses_are_data_not_code(reward):
    tricky = '", 1, 1]]); print("[1]"); ROWS = ("'  # tries to break out of the JSON literal
    assert reward.score_many([tricky, "3*5+7"], ["22:3,5,7", "22:3,5,7"])[1] == [False, True]


def test_a_checker_that_does_not_finish_is_an_error_not_a_verdict(reward, monkeypatch):
    monkeypatch.setattr(reward.sandbox, "run", lambda source: SandboxResult("timeout", None, "", "", 20.0, "bwrap"))
    rewards, correct, failed = reward.score_many(["3*5+7", "1"], ["22:3,5,7", "1:1,1"])
    assert (rewards, correct) == ([-1.0, -1.0], [False, False])
    assert sorted(failed) == [0, 1] and "countdown checker timeout" in failed[0]
    out = score_batch(reward, ["3*5+7", "1"], ["22:3,5,7", "1:1,1"], on_error="wrong")
    assert out.rewards.tolist() == [-1.0, -1.0] and out.error_rows == (0, 1)  # counted, never scored right
    with pytest.raises(RuntimeError, match="row 0 .countdown checker timeout"):
        score_batch(reward, ["3*5+7", "1"], ["22:3,5,7", "1:1,1"], on_error="raise")
    with pytest.raises(ValueError, match="checker timeout"):
        reward.score("3*5+7", "22:3,5,7")


def test_a_sandbox_that_cannot_start_fails_the_batch_not_the_run(reward, monkeypatch):
    def broken(source):
        raise OSError("Too many open files")

    monkeypatch.setattr(reward.sandbox, "run", broken)
    out = score_batch(reward, ["3*5+7", "3*5+7"], ["22:3,5,7", "22:3,5,7"], on_error="wrong")
    assert out.rewards.tolist() == [-1.0, -1.0] and out.correct.tolist() == [False, False]
    assert out.error_rows == (0, 1)
    with pytest.raises(RuntimeError, match="row 0 .OSError: Too many open files"):
        score_batch(reward, ["3*5+7"], ["22:3,5,7"], on_error="raise")


def test_a_malformed_ground_truth_fails_its_row_only(reward):
    out = score_batch(reward, ["3*5+7", "3*5+7"], ["22:3,5,7", "twenty-two"], on_error="wrong")
    assert out.rewards.tolist() == [1.0, -1.0] and out.error_rows == (1,)
    with pytest.raises(RuntimeError, match="row 1 .not a countdown answer"):
        score_batch(reward, ["3*5+7", "3*5+7"], ["22:3,5,7", "twenty-two"], on_error="raise")


def test_extract_expression():
    assert extract_expression("  1+2 \n") == "1+2"
    assert extract_expression("<think>hmm</think><answer>1</answer> <answer> 2+3 </answer>") == "2+3"


def test_bad_option_is_refused():
    with pytest.raises(ValueError, match="max_chars"):
        make_reward("countdown", max_chars=0)
    with pytest.raises(TypeError):
        make_reward("countdown", timeout_s=3)
