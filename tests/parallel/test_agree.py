"""A start-up check that fails ends every process of a multi-process run alike (`parallel/agree.py`).

The real cases: a two-process run (jax.distributed over localhost, as in test_multiprocess.py) started
into a run dir whose lock this test process holds. Process 0 finds the lock taken; before, it exited 2
alone, process 1 went on into the first collective and blamed process 0 as lost (exit 7), and process 0
aborted from C++ in JAX's shutdown barrier (a stack dump, about 105 s later). Now both say the run dir
is in use, in one line each, and exit 2 at once, having written nothing but the lock file's open. And
a pair started with `train.loggers: [wandb]` where wandb cannot be imported: both exit 2 before the
model loads (before, process 0 alone found it, after the model had loaded, and process 1 hung).
"""

import json
import os
import subprocess
import sys
import time


from dapo_jax.parallel.agree import agree
from dapo_jax.training.config.run import load_config
from dapo_jax.training.state.run_dir import RunDir
from tests.parallel.test_multiprocess import REPO, _free_port, _launch, _tail, _wait
from tests.training.conftest import make_tiny_model

HANG_GUARD_S = 240  # a bound against a hang, not a timing: the bug ended in an abort after ~105 s


def _run_pair(module: str, last_args: list[str]) -> tuple[list[subprocess.Popen], list[tuple[str, str]]]:
    """Runs `python -m MODULE COORDINATOR PROCESS_ID ARG` as processes 0 and 1 of a jax.distributed pair
    (ARG = `last_args[i]`, one CPU device each) to their end: the processes and their (stdout, stderr)."""
    coordinator = f"localhost:{_free_port()}"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
    procs = [subprocess.Popen([sys.executable, "-m", module, coordinator, str(i), arg], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, arg in enumerate(last_args)]
    try:
        return procs, [p.communicate(timeout=HANG_GUARD_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_in_one_process_agree_returns_its_own_error_without_a_store():
    assert agree("a check", None, timeout_s=1) == {}
    assert agree("a check", "x: bad", timeout_s=1) == {0: "x: bad"}


def test_two_processes_agree_on_every_error_and_name_the_one_that_never_came():
    """Both fine: nothing found. Process 1's error: both processes return it, in a second call of the
    same name (calls are numbered, so it does not read the first call's verdicts). A process that never
    makes the call: the other raises PeerLost naming it once the timeout (3 s) has passed."""
    calls = [[["check", None], ["check", None], ["late", None]],  # process 0
             [["check", None], ["check", "data.train: x.jsonl: missing"]]]  # process 1 never reaches "late"
    procs, outs = _run_pair("tests.parallel.agree_pair", [json.dumps(c) for c in calls])
    assert [p.returncode for p in procs] == [0, 0], outs
    got = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    found = {"1": "data.train: x.jsonl: missing"}
    assert got[1] == [{}, found], outs
    assert got[0][:2] == [{}, found], outs
    assert got[0][2].startswith("PeerLost: process(es) [1] of the run's 2 did not reach late within 3 s"), got[0]


def _refused(procs, line: str, wrote_at_most: set[str]) -> None:
    """Both processes exited 2 with one `dapo-jax:` line each, starting `line` (process 1's may add
    who found it), without a traceback or a C++ abort, having written at most `wrote_at_most` under the
    run dir."""
    assert [p.returncode for p, _, _ in procs] == [2, 2], _tail(procs)
    for i, (_, log, record) in enumerate(procs):
        text = log.read_text()
        lines = [x for x in text.splitlines() if x.startswith("dapo-jax:")]
        assert len(lines) == 1 and lines[0].startswith(line), (i, _tail(procs))
        for crash in ("Traceback", "Check failure stack trace", "Terminating process", "PeerLost", "Fatal"):
            assert crash not in text, (crash, _tail(procs))
        wrote = {x.split()[1] for x in record.read_text().splitlines()} if record.exists() else set()
        assert wrote <= wrote_at_most, (i, sorted(wrote))


def test_a_run_dir_in_use_stops_both_processes_with_its_line_and_exit_2(tmp_path):
    model_dir = make_tiny_model(tmp_path / "model")
    run_dir = tmp_path / "held" / "run"
    held = RunDir(load_config(None, [f"train.run_dir={run_dir}"])).__enter__()  # this process holds the lock
    try:
        procs = _launch(model_dir, run_dir, "held")
        _wait(procs, time.time() + HANG_GUARD_S)
    finally:
        held.__exit__()
    # refused before anything was written (the lock is taken before the model loads): at most the
    # run dir itself and the lock file's open on process 0
    _refused(procs, f"dapo-jax: ConfigError: train.run_dir: {run_dir} is in use by pid {os.getpid()} ", {".", ".lock"})
    lines = [[x for x in log.read_text().splitlines() if x.startswith("dapo-jax:")][0] for _, log, _ in procs]
    assert "process 0 found it" not in lines[0] and "process 0 found it" in lines[1], lines


def test_a_missing_logger_package_stops_both_processes_before_anything_loads(tmp_path, monkeypatch):
    """`train.loggers: [wandb]` without wandb installed (a `wandb` package that fails to import, first
    on the path): only process 0 builds the loggers, after the model has loaded, so the check runs on
    every process before that (before: process 0 exited 2 there while process 1 waited in a collective)."""
    hidden = tmp_path / "no_wandb" / "wandb"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('wandb hidden by the test')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hidden.parent), os.environ.get("PYTHONPATH")])))
    run_dir = tmp_path / "wandb" / "run"
    run_dir.parent.mkdir()
    procs = _launch(make_tiny_model(tmp_path / "model"), run_dir, "wandb", **{"train.loggers": "[wandb]"})
    _wait(procs, time.time() + HANG_GUARD_S)
    _refused(procs, "dapo-jax: ConfigError: train.loggers: wandb is listed but the package is not installed", set())


def test_a_peer_killed_while_this_process_waits_outside_a_collective_is_named_by_the_watch():
    """kill -9 of process 1 while process 0 waits where no error comes (a barrier of the coordination
    service, as a checkpoint save does): the watch thread names process 1 and ends process 0 with exit 7
    and one PeerLost line once process 1's counter has stood still `lost_s` (2 s), not JAX's heartbeat
    abort from C++ (100 s; seen in a save before)."""
    procs, outs = _run_pair("tests.parallel.watch_pair", ["2", "2"])
    assert procs[1].returncode == -9, outs
    assert procs[0].returncode == 7, outs
    out, err = outs[0]
    assert "waiting" in out and "the barrier returned" not in out, outs
    lines = [x for x in err.splitlines() if x.startswith("dapo-jax:")]
    assert len(lines) == 1 and lines[0].startswith("dapo-jax: PeerLost: process(es) [1] of the run's 2 stopped "
                                                   "answering"), err[-2000:]
    assert "Check failure stack trace" not in err and "Terminating process" not in err, err[-2000:]
