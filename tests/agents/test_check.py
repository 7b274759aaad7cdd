"""The pre-flight command: exit 0 with a line, or exit 2 with one line naming the problem."""

import json
import subprocess
import sys

import pytest

from dapo_jax.agents.check import main


@pytest.fixture
def rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"problem": "1+2", "answer": "3"}) + "\n")
    return path


def test_ok(rows, capsys):
    assert main(["dapo_jax.agents.examples:CalcEnv", str(rows)]) == 0
    assert capsys.readouterr().out.startswith("ok: dapo_jax.agents.examples:CalcEnv ran one dry episode")


@pytest.mark.parametrize("args, message", [
    (["dapo_jax.agents.examples:Nope", "{rows}"], "has no callable 'Nope'"),
    (["dapo_jax.agents.examples:CalcEnv", "{missing}"], "no such data file"),
    (["dapo_jax.agents.examples:CalcEnv", "{bad}"], ":2: not JSON"),
    (["dapo_jax.agents.examples:CalcEnv", "{rows}", "--kwargs", "[1]"], "--kwargs must be a JSON object"),
    (["dapo_jax.agents.examples:CalcEnv", "{rows}", "--kwargs", "{{\"x\": 1}}"], "constructing it failed (TypeError"),
    (["dapo_jax.agents.examples:CalcEnv", "{empty}"], "KeyError: 'answer'"),
])
def test_user_errors_are_one_line_and_exit_2(rows, tmp_path, capsys, args, message):
    (tmp_path / "bad.jsonl").write_text('\n{oops\n')  # line 1 blank, line 2 broken
    (tmp_path / "empty.jsonl").write_text('\n{"problem": "1"}\n')  # a row without "answer"
    paths = {"rows": rows, "missing": tmp_path / "none.jsonl", "bad": tmp_path / "bad.jsonl",
             "empty": tmp_path / "empty.jsonl"}
    assert main([a.format(**paths) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_as_a_command(rows):
    done = subprocess.run([sys.executable, "-m", "dapo_jax.agents.check", "no.such:Env", str(rows)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ") and "cannot import no.such" in done.stderr
    assert done.stderr.count("\n") == 1
