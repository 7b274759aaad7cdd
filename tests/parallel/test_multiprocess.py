"""Two processes (jax.distributed over localhost, one CPU device each, mesh fsdp=2) train as the
one-process run on two devices does, each reading only its block of every generation batch; only
process 0 writes. Process 1 is SIGKILLed inside the save of checkpoint 3: process 0 names it and
exits 7 (PeerLost, not a save error blamed on the folder), and the resumed pair ends where the
uninterrupted run does. A SIGTERM that reaches only one of them stops both at the same step with
exit 143 (they agree at every step boundary; before, the pair deadlocked), and their resume ends
where the others do. A process killed with SIGKILL mid-step is named by the survivor, which exits 7.

One module-scoped fixture runs everything once: the one-process reference in this process (2 of its
8 fake devices), and meanwhile the two-process run whose process 1 dies in a save, then resumed by
a second pair of processes; then a pair whose process 1 gets SIGTERM and a pair whose process 1 is
SIGKILLed mid-step, side by side, and the resume of the first. The tiny run uses DAPO's dynamic
sampling with up to two generation rounds per step, so the processes must agree on every round.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from dapo_jax.training.config.run import load_config
from dapo_jax.training.loop import load_trained_model, train
from dapo_jax.training.metrics import read_metrics
from tests.training.conftest import make_tiny_model, tiny_overrides

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
EXTRA = {"train.steps": STEPS, "train.checkpoint_every": 1, "data.eval": "null", "mesh.fsdp": 2,
         "train.tensorboard": "true", "train.rollouts_every": 1}
COMPARED = ("reward_mean", "accuracy", "kept_fraction", "gen_rounds", "response_length_mean", "loss", "grad_norm",
            "entropy")
TIMEOUT_S = 1500  # the whole fixture's bound, against a hang (the bug it tests was one)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _launch(model_dir: Path, run_dir: Path, tag: str, kill_1_at: str | None = None, **extra
            ) -> list[tuple[subprocess.Popen, Path, Path]]:
    """Starts the two processes of a run (`tests/parallel/audited_train.py` records what each writes;
    with `kill_1_at`, process 1 SIGKILLs itself at its first write under RUN_DIR/kill_1_at; `extra`:
    overrides besides EXTRA's)."""
    port = _free_port()
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu",
           "JAX_DISABLE_MOST_OPTIMIZATIONS": "0"}  # see `optimised_compiles`
    out = []
    for i in range(2):
        if i == 1 and kill_1_at:
            env = {**env, "AUDITED_TRAIN_SIGKILL_AT": kill_1_at}
        log, record = run_dir.parent / f"{tag}.p{i}.log", run_dir.parent / f"{tag}.p{i}.writes"
        cmd = [sys.executable, "-m", "tests.parallel.audited_train", str(record), str(run_dir), "train", "tiny_dapo",
               *tiny_overrides(model_dir, run_dir, **{**EXTRA, **extra}), f"mesh.distributed.coordinator=localhost:{port}",
               "mesh.distributed.num_processes=2", f"mesh.distributed.process_id={i}"]
        with open(log, "w") as f:
            out.append((subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT), log, record))
    return out


def _tail(procs) -> str:
    return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for _, log, _ in procs)


def _wait(procs, deadline: float) -> None:
    try:
        for p, _, _ in procs:
            p.wait(timeout=max(deadline - time.time(), 1))
    except subprocess.TimeoutExpired:
        pytest.fail(f"the two-process run did not finish within its bound\n{_tail(procs)}")
    finally:
        for p, _, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def optimised_compiles():
    """These runs compile as a user's do, not as the rest of the suite does (tests/conftest.py leaves out LLVM's
    optimisation): with it left out, process 0 of the pair whose process 1 dies in a save was once (1 run in 2)
    aborted by the coordination service's check ("stopped sending heartbeats", a C++ check failure) before it
    named its peer with exit 7. Until that is understood, this module keeps the timings it was written against."""
    previous = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    yield
    jax.config.update("jax_disable_most_optimizations", previous)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, optimised_compiles):
    root = tmp_path_factory.mktemp("multiprocess")
    model_dir = make_tiny_model(root / "model")
    deadline = time.time() + TIMEOUT_S
    two = root / "two" / "run"
    two.parent.mkdir()
    first = _launch(model_dir, two, "first", kill_1_at="checkpoints/3.orbax-checkpoint-tmp")  # dies saving 3
    one = root / "one" / "run"
    cfg = load_config(None, tiny_overrides(model_dir, one, **EXTRA))
    train(cfg)  # the reference: one process, the same 2-device mesh
    _wait(first, deadline)
    saved_first = sorted(int(d.name) for d in (two / "checkpoints").iterdir() if d.name.isdigit())
    resumed = _launch(model_dir, two, "resumed")
    _wait(resumed, deadline)
    assert [p.returncode for p, _, _ in resumed] == [0, 0], _tail(resumed)
    log = resumed[0][1].read_text()
    resumed_from = [int(line.split("resumed from step ")[1].split()[0]) for line in log.splitlines()
                    if "resumed from step " in line]
    assert resumed_from, log[-2000:]

    # SIGTERM to process 1 only, once checkpoint 1 is on disk; meanwhile SIGKILL process 1 of another pair
    term, peer = root / "term" / "run", root / "peer" / "run"
    term.parent.mkdir(), peer.parent.mkdir()
    termed, killed = _launch(model_dir, term, "termed"), _launch(model_dir, peer, "killed")
    signalled = {}

    def signal_process_1(procs, run_dir, sig, name):
        while time.time() < deadline and all(p.poll() is None for p, _, _ in procs):
            if (run_dir / "checkpoints" / "1").is_dir():
                procs[1][0].send_signal(sig)
                signalled[name] = time.time()
                return
            time.sleep(0.02)

    threads = [threading.Thread(target=signal_process_1, args=(termed, term, signal.SIGTERM, "term")),
               threading.Thread(target=signal_process_1, args=(killed, peer, signal.SIGKILL, "kill"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _wait(termed + killed, min(deadline, time.time() + 300))  # after the signal: a bound against the deadlock
    term_resumed = _launch(model_dir, term, "term_resumed")
    _wait(term_resumed, deadline)
    return {"cfg": cfg, "one": one, "two": two, "first": first, "saved_first": saved_first, "resumed": resumed, "resumed_from": resumed_from[0],
            "term": term, "termed": termed, "term_resumed": term_resumed, "killed": killed, "signalled": signalled}


def _rows(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if "grad_norm" in r]


def test_a_process_killed_during_a_save_is_named_by_the_survivor_not_blamed_on_the_folder(runs):
    """kill -9 of process 1 inside the save of checkpoint 3 (Orbax's save runs collectives with it):
    process 0 exits 7 with one PeerLost line naming process 1 (before: exit 6, `CheckpointSaveError:
    ... Gloo AllGather failed: ... Connection reset by peer ... Fix the folder and rerun`)."""
    (p0, log0, _), (p1, _, record1) = runs["first"]
    assert p1.returncode == -signal.SIGKILL, _tail(runs["first"])
    assert record1.read_text().splitlines()[-1].split()[1].startswith("checkpoints/3.orbax-checkpoint-tmp")
    assert p0.returncode == 7, _tail(runs["first"])
    lines = [line for line in log0.read_text().splitlines() if line.startswith("dapo-jax:")]
    assert len(lines) == 1 and "PeerLost: process(es) [1] of the run's 2 stopped answering" in lines[0], lines
    assert "Fix the folder" not in lines[0] and "Check failure stack trace" not in log0.read_text()
    assert runs["saved_first"] == [1, 2]  # checkpoint 3, the save it died in, never completed (keep 2)


def test_two_processes_train_as_one_and_resume_after_sigkill_where_it_would_have_been(runs):
    one, two = _rows(runs["one"]), _rows(runs["two"])
    assert [r["step"] for r in one] == [r["step"] for r in two] == list(range(1, STEPS + 1))
    for key in COMPARED:
        np.testing.assert_allclose([r[key] for r in two], [r[key] for r in one], rtol=1e-5, atol=1e-7, err_msg=key)
    # dynamic sampling ran a second round in some step: both processes agreed on it (no deadlock)
    assert max(r["gen_rounds"] for r in two) == 2
    assert runs["resumed_from"] == 2  # the last checkpoint complete before the save process 1 died in
    # the final weights: the two-process checkpoint, restored in this one process, equals the reference's
    step_a, params_a = _params(runs["cfg"], runs["one"])
    step_b, params_b = _params(runs["cfg"], runs["two"])
    assert step_a == step_b == STEPS
    for a, b in zip(params_a, params_b):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_sigterm_to_one_process_stops_both_at_the_same_step_and_the_resume_ends_where_the_others_do(runs):
    """Preemption notices reach hosts at different moments: process 1 alone gets SIGTERM. Both save the
    same step and exit 143 (before: process 1 went to save while process 0 started the next step, and
    their collectives deadlocked until SIGKILL). The resumed pair ends with the same weights and
    metrics as the pair killed and resumed above, and as the one-process reference."""
    assert "term" in runs["signalled"], _tail(runs["termed"])
    assert [p.returncode for p, _, _ in runs["termed"]] == [143, 143], _tail(runs["termed"])
    logs = [log.read_text() for _, log, _ in runs["termed"]]
    steps = [int(log.split("SIGTERM at step ")[1].split()[0]) for log in logs]
    assert steps[0] == steps[1] and "reached process(es) [1] of 2" in logs[0], _tail(runs["termed"])
    assert [p.returncode for p, _, _ in runs["term_resumed"]] == [0, 0], _tail(runs["term_resumed"])
    assert f"resumed from step {steps[0]}" in runs["term_resumed"][0][1].read_text()  # the step both saved
    term, two = _rows(runs["term"]), _rows(runs["two"])
    assert [r["step"] for r in term] == [r["step"] for r in two] == list(range(1, STEPS + 1))
    for key in COMPARED:
        assert [r[key] for r in term] == [r[key] for r in two], key  # both resumed from checkpoints: bit-exact
    _, params_term = _params(runs["cfg"], runs["term"])
    _, params_two = _params(runs["cfg"], runs["two"])
    for a, b in zip(params_term, params_two):
        np.testing.assert_array_equal(a, b)


def test_a_killed_process_is_named_by_the_survivor_which_exits_at_once(runs):
    """kill -9 of process 1: process 0 says in one line that process 1 is gone and exits 7, instead of a
    traceback naming no process and a C++ abort (exit 134) after the 100 s heartbeat timeout."""
    assert "kill" in runs["signalled"], _tail(runs["killed"])
    (p0, log0, _), (p1, _, _) = runs["killed"]
    assert p1.returncode == -signal.SIGKILL
    assert p0.returncode == 7, _tail(runs["killed"])
    lines = [line for line in log0.read_text().splitlines() if line.startswith("dapo-jax:")]
    assert len(lines) == 1 and "PeerLost: process(es) [1] of the run's 2 stopped answering" in lines[0], lines
    assert "Check failure stack trace" not in log0.read_text()


def _params(cfg, run_dir: Path):
    model, _, step = load_trained_model(cfg, run_dir)
    return step, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def test_only_process_0_writes_outside_the_checkpoints(runs):
    for launch in ("first", "resumed"):
        p0, p1 = (record.read_text().splitlines() if record.exists() else [] for _, _, record in runs[launch])
        wrote = {line.split()[1].split("/")[0] for line in p0}
        assert {"metrics.jsonl", "rollouts", "tensorboard"} <= wrote, (launch, sorted(wrote))
        if launch == "first":
            assert any(w.startswith("config.yaml") for w in wrote), sorted(wrote)  # via a .tmp and a rename
        # process 1 takes part in the checkpoints (Orbax: every process saves its shards) and nothing else
        others = [line for line in p1 if line.split()[1] not in (".", "checkpoints")
                  and not line.split()[1].startswith("checkpoints/")]
        assert others == [], (launch, others)
    # one metrics row per step and launch (process 1 appended none): the steps up to the checkpoint
    # resumed from were written once, the ones redone after it at most twice
    steps = [json.loads(line)["step"] for line in (runs["two"] / "metrics.jsonl").read_text().splitlines()]
    assert all(steps.count(s) == 1 for s in range(1, runs["resumed_from"] + 1)), steps
    assert all(steps.count(s) in (1, 2) for s in range(runs["resumed_from"] + 1, STEPS + 1)), steps
