"""Faults met the way users meet them: every one ends in a one-line error and a non-zero exit, before
long work starts where it can be known then, and never in a silent bad model (issue: runs that never
fail silently)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dapo_jax.cli import main
from dapo_jax.training.state.checkpoint import Checkpointer
from dapo_jax.training.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]


def train_rc(overrides, capsys):
    """Runs `dapo-jax train` in-process: (exit code, stderr's last line, stdout)."""
    capsys.readouterr()
    rc = main(["train", "tiny_dapo", *overrides])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("dapo-jax:")]
    return rc, (lines[-1] if lines else ""), out


def assert_nothing_written(run_dir: Path):
    assert not (run_dir / "config.yaml").exists() and not (run_dir / "metrics.jsonl").exists()
    assert not (run_dir / "checkpoints").exists()


# ----------------------------------------------------------------------------- data and rewards, before the model
def gsm8k_overrides(overrides_for, model_dir, run_dir, file):
    return overrides_for(model_dir, run_dir, **{
        "data.train": f"{{name: {file}, format: gsm8k}}", "data.eval": "null",
        "reward.functions": "[{name: gsm8k}]"})


def test_malformed_jsonl_names_file_and_line_before_anything_is_written(tiny_model_dir, tmp_path, overrides_for, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1=", "answer": "#### 2"}\n{"question": "2+2=", "answer": \n')
    run_dir = tmp_path / "run"
    rc, err, _ = train_rc(gsm8k_overrides(overrides_for, tiny_model_dir, run_dir, data), capsys)
    assert rc == 2 and str(data) in err and "line 2" in err
    assert_nothing_written(run_dir)
    # The user fixes the file and reruns the very same command in the same run dir: it runs.
    data.write_text('{"question": "1+1=", "answer": "#### 2"}\n{"question": "2+2=", "answer": "#### 4"}\n')
    rc, err, _ = train_rc(gsm8k_overrides(overrides_for, tiny_model_dir, run_dir, data), capsys)
    assert rc == 0, err
    assert (run_dir / "config.yaml").exists()


def test_a_byte_that_is_not_utf8_is_one_line_at_the_start_and_at_a_resume(tiny_model_dir, tmp_path, overrides_for,
                                                                         capsys):
    """A Latin-1 byte in the .jsonl, in the file the run starts on, or written into it before the resume."""
    good = '{"question": "1+1=", "answer": "#### 2"}\n{"question": "2+2=", "answer": "#### 4"}\n'
    data, run_dir = tmp_path / "train.jsonl", tmp_path / "run"
    data.write_bytes(good.encode() + b'{"question": "caf\xe9", "answer": "#### 1"}\n')
    rc, err, _ = train_rc([*gsm8k_overrides(overrides_for, tiny_model_dir, run_dir, data), "train.steps=1"], capsys)
    assert rc == 2 and err == f"dapo-jax: DataError: {data}: line 3, column 18: byte 0xe9 is not UTF-8 (save the file as UTF-8)"
    assert_nothing_written(run_dir)
    data.write_text(good)
    assert train_rc([*gsm8k_overrides(overrides_for, tiny_model_dir, run_dir, data), "train.steps=1"], capsys)[0] == 0
    data.write_bytes(good.replace("2+2", "2\xa02").encode("latin-1"))  # edited in place between the run and its resume
    rc, err, _ = train_rc([*gsm8k_overrides(overrides_for, tiny_model_dir, run_dir, data), "train.steps=2"], capsys)
    assert rc == 2 and err == f"dapo-jax: DataError: {data}: line 2, column 16: byte 0xa0 is not UTF-8 (save the file as UTF-8)"


def test_empty_jsonl_is_a_one_line_error(tiny_model_dir, tmp_path, overrides_for, capsys):
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    rc, err, _ = train_rc(gsm8k_overrides(overrides_for, tiny_model_dir, tmp_path / "run", data), capsys)
    assert rc == 2 and str(data) in err and "no rows" in err
    assert_nothing_written(tmp_path / "run")


def test_missing_file_and_bad_reward_option_fail_before_the_run_dir(tiny_model_dir, tmp_path, overrides_for, capsys):
    rc, err, _ = train_rc(gsm8k_overrides(overrides_for, tiny_model_dir, tmp_path / "a", tmp_path / "nope.jsonl"), capsys)
    assert rc == 2 and "nope.jsonl" in err
    rc, err, _ = train_rc(overrides_for(tiny_model_dir, tmp_path / "b", **{
        "reward.functions": "[{name: synthetic, options: {no_such_option: 1}}]"}), capsys)
    assert rc == 2 and "reward.functions.0" in err
    for d in ("a", "b"):
        assert_nothing_written(tmp_path / d)


def test_resume_on_changed_data_is_refused_in_one_line_unless_accepted(tiny_model_dir, tmp_path, overrides_for,
                                                                      capsys, monkeypatch):
    """The data file is edited in place keeping its row count, or the relative data path is resumed from
    another working directory: either would silently resume on another prompt stream."""
    rows = [{"question": f"{i}+1=", "answer": f"#### {i + 1}"} for i in range(16)]
    first, second = tmp_path / "a", tmp_path / "b"
    for d in (first, second):
        d.mkdir()
        (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir = tmp_path / "run"

    def args(steps, *extra):
        return [*gsm8k_overrides(overrides_for, model_dir=tiny_model_dir, run_dir=run_dir, file="train.jsonl"),
                f"train.steps={steps}", *extra]

    monkeypatch.chdir(first)
    assert train_rc(args(1), capsys)[0] == 0
    rows[3]["answer"] = "#### 5"  # same number of rows, another answer
    (first / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc, err, _ = train_rc(args(2), capsys)
    assert rc == 2 and f"data.train ({first / 'train.jsonl'}): the data changed" in err and "not in content" in err
    assert [r["step"] for r in read_metrics(run_dir) if "loss" in r] == [1]  # nothing trained on the edited file
    rc, err, out = train_rc(args(2, "data.accept_changed=true"), capsys)
    assert rc == 0, err
    assert "resuming on changed data (data.accept_changed=true): data.train: the same 16 prompts" in out
    monkeypatch.chdir(second)  # the same relative path now names another file
    rc, err, _ = train_rc(args(3), capsys)
    assert rc == 2 and f"read from {first / 'train.jsonl'} when the run started, from {second / 'train.jsonl'} now" in err


def test_infinite_learning_rate_is_refused_by_name(tiny_model_dir, tmp_path, overrides_for, capsys):
    rc, err, _ = train_rc(overrides_for(tiny_model_dir, tmp_path / "run", **{"optim.lr": ".inf"}), capsys)
    assert rc == 2 and "optim.lr" in err


# ----------------------------------------------------------------------------- bad models and tokenizers
def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_model_with_nan_weights_is_refused(tiny_model_dir, tmp_path, overrides_for, capsys):
    from safetensors.numpy import load_file, save_file

    model = copy_model(tiny_model_dir, tmp_path / "model")
    tensors = load_file(model / "model.safetensors")
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].copy()
    tensors[name].flat[3] = np.nan
    save_file(tensors, model / "model.safetensors")
    rc, err, _ = train_rc(overrides_for(model, tmp_path / "run"), capsys)
    assert rc == 2 and name in err and "non-finite" in err
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_truncated_safetensors_names_the_file(tiny_model_dir, tmp_path, overrides_for, capsys):
    model = copy_model(tiny_model_dir, tmp_path / "model")
    f = model / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    rc, err, _ = train_rc(overrides_for(model, tmp_path / "run"), capsys)
    assert rc == 2 and str(f) in err and "truncated" in err


def test_tokenizer_larger_than_the_embedding_is_refused(tiny_model_dir, tmp_path, overrides_for, capsys, shared):
    qwen = shared("tokenizers", "qwen2.5")
    model = copy_model(tiny_model_dir, tmp_path / "model")
    for f in model.iterdir():
        if "token" in f.name or f.name.endswith(".jinja"):
            f.unlink()
    for f in qwen.iterdir():
        shutil.copy(f, model / f.name)
    rc, err, _ = train_rc(overrides_for(model, tmp_path / "run"), capsys)
    assert rc == 2 and "vocab_size=100" in err and "tokenizer" in err
    assert not (tmp_path / "run" / "config.yaml").exists()


# ----------------------------------------------------------------------------- the run dir
def test_run_dir_that_is_a_file(tiny_model_dir, tmp_path, overrides_for, capsys):
    (tmp_path / "run").write_text("not a dir")
    rc, err, _ = train_rc(overrides_for(tiny_model_dir, tmp_path / "run"), capsys)
    assert rc == 2 and "is a file" in err


def test_second_run_into_a_held_run_dir_fails_at_once_naming_the_holder(tiny_model_dir, tmp_path, overrides_for, capsys):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from dapo_jax.training.config.run import load_config; "
         "from dapo_jax.training.state.run_dir import RunDir; rd = RunDir(load_config(None, sys.argv[1:])).__enter__(); "
         "print('held', flush=True); time.sleep(60)", f"train.run_dir={run_dir}"],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        rc, err, _ = train_rc(overrides_for(tiny_model_dir, run_dir), capsys)
        assert rc == 2 and "in use by" in err and f"pid {holder.pid}" in err
        # at once, before the model loads: the refused run wrote nothing beside the holder's lock
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock", ".lock.holder"]
    finally:
        holder.kill()
        holder.wait()
    rc, err, _ = train_rc(overrides_for(tiny_model_dir, run_dir), capsys)  # a killed holder leaves no stale lock
    assert rc == 0, err


# ----------------------------------------------------------------------------- non-finite updates
def test_non_finite_updates_stop_the_run_and_keep_every_checkpoint_finite(tiny_model_dir, tmp_path, overrides_for, capsys):
    run_dir = tmp_path / "run"
    # 1e39 is a finite double (the config accepts it) but +inf in float32: every update overflows.
    rc, err, _ = train_rc(overrides_for(tiny_model_dir, run_dir, **{
        "optim.lr": "1.0e+39", "train.steps": 6, "train.max_nonfinite_steps": 2,
        "objective.dynamic_sampling": "false"}), capsys)
    assert rc == 4 and "2 consecutive steps" in err
    rows = [r for r in read_metrics(run_dir) if "nonfinite_updates" in r]
    assert [r["step"] for r in rows] == [1, 2] and all(r["nonfinite_updates"] > 0 for r in rows)
    ckpt = Checkpointer(run_dir / "checkpoints")
    assert ckpt.all_steps() == [1]  # written before the second bad step; nothing after
    ckpt.close()
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.loop import load_trained_model
    import jax

    model, _, step = load_trained_model(load_config(run_dir / "config.yaml"), run_dir)
    from flax import nnx
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


# ----------------------------------------------------------------------------- checkpoints in the loop
def data_files(d: Path) -> list[Path]:
    """A checkpoint's array-data files (Orbax's OCDBT `d/` chunks). Which of them a restore reads
    depends on how the async writes were merged, so the faults below damage each of them."""
    return [p for p in d.rglob("*") if p.is_file() and p.parent.name == "d"]


def flip_bytes(f: Path, n: int = 64) -> None:
    data = bytearray(f.read_bytes())
    mid = len(data) // 2
    for i in range(mid, min(mid + n, len(data))):
        data[i] ^= 0xFF
    f.write_bytes(bytes(data))


def test_flipped_newest_checkpoint_is_set_aside_redone_and_saved_again(tiny_model_dir, tmp_path, overrides_for, capsys):
    run_dir = tmp_path / "run"
    args = overrides_for(tiny_model_dir, run_dir, **{"train.steps": 2})
    assert train_rc(args, capsys)[0] == 0
    for f in data_files(run_dir / "checkpoints" / "2"):
        flip_bytes(f)
    with pytest.warns(RuntimeWarning, match="2"):
        rc, err, out = train_rc(args, capsys)
    assert rc == 0, err
    assert "resumed from step 1" in out
    ckpt = Checkpointer(run_dir / "checkpoints")
    assert max(ckpt.all_steps()) == 2  # the redone step is saved again: the newest is good
    ckpt.close()
    capsys.readouterr()
    assert main(["eval", str(run_dir)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["step"] == 2


def test_no_readable_checkpoint_stops_unless_fresh_start(tiny_model_dir, tmp_path, overrides_for, capsys):
    run_dir = tmp_path / "run"
    args = overrides_for(tiny_model_dir, run_dir, **{"train.steps": 1})
    assert train_rc(args, capsys)[0] == 0
    for step_dir in (run_dir / "checkpoints").iterdir():
        if step_dir.name.isdigit():
            for f in data_files(step_dir):
                flip_bytes(f)
    with pytest.warns(RuntimeWarning):
        rc, err, _ = train_rc(args, capsys)
    assert rc == 2 and "fresh_start" in err
    rc, err, out = train_rc([*args, "train.fresh_start=true"], capsys)
    assert rc == 0, err
    assert "starting over from step 0" in out
    assert [r["step"] for r in read_metrics(run_dir)] == [0, 1]


def test_resume_says_where_it_resumed(tiny_model_dir, tmp_path, overrides_for, capsys):
    run_dir = tmp_path / "run"
    assert train_rc(overrides_for(tiny_model_dir, run_dir, **{"train.steps": 1}), capsys)[0] == 0
    rc, err, out = train_rc(overrides_for(tiny_model_dir, run_dir, **{"train.steps": 2}), capsys)
    assert rc == 0 and "resumed from step 1" in out


def test_a_torn_or_missing_metrics_file_loses_no_row_after_the_resume(tiny_model_dir, tmp_path, overrides_for, capsys):
    """Power lost while the last row was written (the file cut in the middle of its last line), then
    metrics.jsonl deleted: the resumed run's rows all land on lines of their own, and each case is warned of."""
    run_dir = tmp_path / "run"
    assert train_rc(overrides_for(tiny_model_dir, run_dir, **{"train.steps": 1}), capsys)[0] == 0
    metrics = run_dir / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes()[:-20])
    with pytest.warns(RuntimeWarning, match="torn line"):
        rc, err, _ = train_rc(overrides_for(tiny_model_dir, run_dir, **{"train.steps": 2}), capsys)
    assert rc == 0, err
    assert all(json.loads(line) for line in metrics.read_text().splitlines())  # every line a whole row
    assert 2 in [r["step"] for r in read_metrics(run_dir) if "loss" in r]
    assert len(list(run_dir.glob("metrics.jsonl.torn-*"))) == 1
    metrics.unlink()
    with pytest.warns(RuntimeWarning, match="missing although the run resumes from step 2"):
        rc, err, _ = train_rc(overrides_for(tiny_model_dir, run_dir, **{"train.steps": 3}), capsys)
    assert rc == 0, err
    assert [r["step"] for r in read_metrics(run_dir) if "loss" in r] == [3]


def test_zero_steps_evaluates_once(tiny_model_dir, tmp_path, overrides_for, capsys):
    run_dir = tmp_path / "run"
    assert train_rc(overrides_for(tiny_model_dir, run_dir, **{"train.steps": 0}), capsys)[0] == 0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0]


# ----------------------------------------------------------------------------- a checkpoints folder that stops taking writes
def can_mount() -> bool:
    """Whether this machine lets an unprivileged process make a user + mount namespace (`unshare -rm`)."""
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@pytest.mark.parametrize("mode, cause", [("readonly", "the file system is read-only [EROFS]"),
                                         ("full", "no space left on the device")])
def test_a_checkpoints_folder_that_fails_stops_the_run_at_the_next_step_in_one_line(
        tiny_model_dir, tmp_path, overrides_for, mode, cause):
    """After checkpoint 6, the checkpoints folder is remounted read-only, or the small device it is on is
    filled by another writer (`tests/training/save_faults.py`; an OSError injected at Python's file
    system calls where no mount can be made). Step 12's async save fails: the run stops at the first
    step boundary after the failure surfaces (a busy machine may take a step or two to fail the
    background save), not at the next save (step 18), with one line and exit 6, and checkpoint 6 loads."""
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.loop import load_trained_model

    run_dir, keep = tmp_path / "run", tmp_path / "kept"
    ckpt_dir = run_dir / "checkpoints"
    how = "mount" if can_mount() else "inject"
    args = overrides_for(tiny_model_dir, run_dir, **{"train.steps": 18, "train.checkpoint_every": 6, "data.eval": "null"})
    cmd = [sys.executable, "-m", "tests.training.save_faults", mode, how, str(ckpt_dir), str(keep), "train", "tiny_dapo",
           *args]
    proc = subprocess.run(["unshare", "-rm", *cmd] if how == "mount" else cmd, cwd=REPO, capture_output=True, text=True,
                          timeout=400)  # a bound against a hang (the bug: it never exited), not a speed check
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("dapo-jax:")]
    assert proc.returncode == 6, proc.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"could not save step 12 in {ckpt_dir}: {cause}" in lines[0] and f"{ckpt_dir}/6, intact" in lines[0]
    assert 13 <= max(r["step"] for r in read_metrics(run_dir)) < 18
    kept = keep if how == "mount" and mode == "full" else ckpt_dir  # a tmpfs goes with its namespace
    _, _, step = load_trained_model(load_config(run_dir / "config.yaml"), kept)
    assert step == 6


# ----------------------------------------------------------------------------- starvation and dropped prompts
def test_starved_step_is_skipped_counted_and_reported(tiny_model_dir, tmp_path, overrides_for, capsys):
    run_dir = tmp_path / "run"
    # A random model is never right: with correctness as the filter metric every group is all-wrong.
    args = overrides_for(tiny_model_dir, run_dir, **{"objective.dynamic_sampling_metric": "correct",
                                                     "train.steps": 2, "data.max_prompt_length": 5,
                                                     # unpadded operands: "7+3=" fits in 5 tokens, "17+13=" does not
                                                     "data.train.options": "{max_operand: 19, max_second: 19, zero_pad: false, heldout_size: 20}"})
    with pytest.warns(RuntimeWarning) as record:
        rc, err, out = train_rc(args, capsys)
    assert rc == 0, err
    messages = " ".join(str(w.message) for w in record)
    assert "update is skipped" in messages and "longer than data.max_prompt_length=5" in messages
    rows = [r for r in read_metrics(run_dir) if "steps_skipped" in r and "gen_rounds" in r]
    assert [r["steps_skipped"] for r in rows] == [1, 2]
    assert all(r["prompts_dropped_too_long"] > 0 for r in rows)
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps_skipped"] == 2 and summary["prompts_dropped_too_long"] > 0
    assert "grad_norm" not in rows[0]  # no update was spent on padding


def test_a_run_whose_first_steps_keep_nothing_says_why_once(tiny_model_dir, tmp_path, overrides_for, capsys):
    run_dir = tmp_path / "run"
    # a random model is never right: with correctness as the filter metric every group is all-wrong
    args = overrides_for(tiny_model_dir, run_dir, **{"objective.dynamic_sampling_metric": "correct",
                                                     "train.steps": 2, "data.eval": "null"})
    with pytest.warns(RuntimeWarning) as record:
        rc, err, _ = train_rc(args, capsys)
    assert rc == 0, err
    why = [str(w.message) for w in record if "kept no group:" in str(w.message)]
    assert len(why) == 1, why
    assert why[0].startswith("step 1 kept no group: in 2 generation round(s) per step every response was wrong "
                             "(accuracy 0.00)")
    assert "rollout.max_gen_batches=2" in why[0] and f"dapo-jax show {run_dir}" in why[0]
    rows = [r for r in read_metrics(run_dir) if "gen_rounds" in r]
    assert [r["steps_skipped"] for r in rows] == [1, 2] and all(r["entropy_generated"] > 0 for r in rows)


# ----------------------------------------------------------------------------- preemption and Ctrl-C
def start_run(tiny_model_dir, run_dir, overrides_for, **env):
    """`dapo-jax train tiny_dapo` for 400 steps in a subprocess; returns (process, its environment)."""
    args = overrides_for(tiny_model_dir, run_dir, **{"train.steps": 400, "train.checkpoint_every": 0})
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    proc = subprocess.Popen([sys.executable, "-c", DEFAULT_SIGHUP, "train", "tiny_dapo", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, env


# `dapo-jax ...` with SIGHUP's default action, as a shell in a terminal starts it, even when the tests run under
# nohup (an ignored SIGHUP is inherited, and the run then rightly keeps ignoring it)
DEFAULT_SIGHUP = ("import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
                  "os.execv(sys.executable, [sys.executable, '-m', 'dapo_jax.cli', *sys.argv[1:]])")


def wait_for_steps(proc, run_dir, rows: int = 4, timeout: float = 240) -> None:
    """Returns once `metrics.jsonl` has `rows` rows (step 0's eval and three steps), or the run ended."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= rows:
            break
        time.sleep(0.2)


def stop_mid_run(sig, tiny_model_dir, run_dir, overrides_for):
    """Sends `sig` once three steps are logged; returns (exit code, stderr, the newest checkpoint, env)."""
    proc, env = start_run(tiny_model_dir, run_dir, overrides_for)
    wait_for_steps(proc, run_dir)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    ckpt = Checkpointer(run_dir / "checkpoints")
    saved = max(ckpt.all_steps(), default=None)
    ckpt.close()
    return proc.returncode, err, saved, env


def assert_resumes(tiny_model_dir, run_dir, overrides_for, saved, capsys):
    """The user reruns the command: it resumes from the signalled process's checkpoint. In-process, as the
    other resume tests here run (what is checked is the checkpoint and run dir the killed process left, not
    a second process start: that saves a process's imports and tracing, ~20 s a test on a loaded CI)."""
    again = overrides_for(tiny_model_dir, run_dir, **{"train.steps": saved + 1, "train.checkpoint_every": 0})
    rc, err, out = train_rc(again, capsys)
    assert rc == 0, err
    assert f"resumed from step {saved}" in out


def stop_before_the_first_step(sig, tiny_model_dir, run_dir, overrides_for):
    """Sends `sig` as soon as the run has started (its config written): (exit code, stderr)."""
    proc, _ = start_run(tiny_model_dir, run_dir, overrides_for, DAPO_JAX_COMPILATION_CACHE="off")  # a long compile
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None and not (run_dir / "config.yaml").exists():
        time.sleep(0.02)  # the run really starts (its config is written), then compiles eval@0 and step 1
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)  # a bound against a hang, not a speed check
    return proc.returncode, err


def assert_nothing_trained(run_dir):
    rows = read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    assert not [r for r in rows if r["step"] >= 1]  # it did not go on to train step 1
    assert not any(p.name.isdigit() for p in (run_dir / "checkpoints").glob("*"))


def test_sigterm_saves_a_checkpoint_and_the_next_run_resumes(tiny_model_dir, tmp_path, overrides_for, capsys):
    run_dir = tmp_path / "run"
    code, err, saved, _ = stop_mid_run(signal.SIGTERM, tiny_model_dir, run_dir, overrides_for)
    assert code == 143, err[-2000:]
    assert "SIGTERM at step" in err
    assert saved >= 3
    rows = read_metrics(run_dir)
    assert max(r["step"] for r in rows) == saved  # the checkpoint is of the last logged step
    assert_resumes(tiny_model_dir, run_dir, overrides_for, saved, capsys)


def test_ctrl_c_saves_like_sigterm_exits_130_in_one_line_and_the_next_run_resumes(tiny_model_dir, tmp_path,
                                                                                   overrides_for, capsys):
    """A real SIGINT (what Ctrl-C sends) to `dapo-jax train`: the step finishes, a checkpoint is saved, one
    line and exit 130, no KeyboardInterrupt traceback; rerunning resumes."""
    run_dir = tmp_path / "run"
    code, err, saved, _ = stop_mid_run(signal.SIGINT, tiny_model_dir, run_dir, overrides_for)
    assert code == 130, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    said = [line for line in err.splitlines() if line.startswith("dapo-jax:")]
    assert len(said) == 1, said
    assert said[0].startswith(f"dapo-jax: Interrupted: Ctrl-C (SIGINT) at step {saved}: checkpoint saved in ")
    assert said[0].endswith("checkpoints; rerun the same command to resume")
    assert max(r["step"] for r in read_metrics(run_dir)) == saved  # the checkpoint is of the last logged step
    assert_resumes(tiny_model_dir, run_dir, overrides_for, saved, capsys)


def test_sigterm_before_the_first_step_exits_at_once_with_nothing_to_save(tiny_model_dir, tmp_path, overrides_for):
    """A SIGTERM while the run still compiles (the scheduler's grace period is often 30 s): nothing to save
    yet, so the process ends at once, saying so, instead of after eval@0, the compile and step 1."""
    run_dir = tmp_path / "run"
    code, err = stop_before_the_first_step(signal.SIGTERM, tiny_model_dir, run_dir, overrides_for)
    assert code == 143, err[-2000:]
    assert "SIGTERM before the first step completed: nothing to save" in err
    assert_nothing_trained(run_dir)


def test_ctrl_c_before_the_first_step_exits_130_at_once_with_one_line(tiny_model_dir, tmp_path, overrides_for):
    run_dir = tmp_path / "run"
    code, err = stop_before_the_first_step(signal.SIGINT, tiny_model_dir, run_dir, overrides_for)
    assert code == 130, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    said = [line for line in err.splitlines() if line.startswith("dapo-jax:")]
    assert said == ["dapo-jax: Interrupted: Ctrl-C (SIGINT) before the first step completed: nothing to save, exiting "
                    "now (exit 130); rerun the same command to start or resume"]
    assert_nothing_trained(run_dir)


def test_ctrl_c_while_the_run_loads_is_one_line_and_130(tmp_path):
    """Before the run's signal handlers are in place (reading the config, loading data): Python's
    KeyboardInterrupt, caught by the CLI."""
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever the parent ignores\n"
            "import dapo_jax.cli as cli\n"
            "import dapo_jax.cli.commands as commands\n"
            "def slow(*a, **k):  # the config takes long to read\n"
            "    print('ready', flush=True); time.sleep(120)\n"
            "commands.load_config = slow\n"
            "sys.exit(cli.main(['train', 'tiny_dapo']))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["dapo-jax: Interrupted: Ctrl-C: stopped without saving; rerun the same command "
                                        "to start or resume (from the last checkpoint)"]


def test_a_mesh_that_leaves_devices_idle_says_so(capsys):
    import jax

    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.loop import build_mesh

    n = len(jax.devices())
    if n < 4:
        pytest.skip("needs the test suite's 8 virtual CPU devices")
    mesh = build_mesh(load_config(None, ["mesh.data=3", "rollout.train_batch=6", "rollout.gen_batch=6",
                                         "optim.num_minibatches=1"]))
    assert mesh.devices.size == 3
    assert f"uses 3 of the {n} visible devices" in capsys.readouterr().out


# ----------------------------------------------------------------------------- SIGHUP, and signals while starting
def test_sighup_saves_like_sigterm_in_one_line(tiny_model_dir, tmp_path, overrides_for):
    run_dir = tmp_path / "run"
    code, err, saved, _ = stop_mid_run(signal.SIGHUP, tiny_model_dir, run_dir, overrides_for)
    assert code == 143, err[-2000:]
    said = [line for line in err.splitlines() if line.startswith("dapo-jax:")]
    assert said == [f"dapo-jax: Preempted: SIGHUP (the terminal closed) at step {saved}: checkpoint saved in "
                    f"{run_dir / 'checkpoints'}; rerun the same command to resume"], said
    assert max(r["step"] for r in read_metrics(run_dir)) == saved


def test_closing_the_runs_terminal_saves_and_the_next_run_resumes(tiny_model_dir, tmp_path, overrides_for, capsys):
    """The run's terminal is a pseudo-terminal it controls; closing it (the terminal window, an ssh session)
    makes the kernel send SIGHUP, and every later write to it fails: the run saves the step and exits 143."""
    import pty
    import threading

    run_dir = tmp_path / "run"
    args = overrides_for(tiny_model_dir, run_dir, **{"train.steps": 400, "train.checkpoint_every": 0,
                                                    "train.progress": "true"})
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    controlled = ("import fcntl, os, signal, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "  # its terminal
                  "signal.signal(signal.SIGHUP, signal.SIG_DFL); "
                  "os.execv(sys.executable, [sys.executable, '-m', 'dapo_jax.cli', *sys.argv[1:]])")
    proc = subprocess.Popen([sys.executable, "-c", controlled, "train", "tiny_dapo", *args], cwd=REPO, env=env,
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    reader = threading.Thread(target=lambda: _drain(master), daemon=True)  # a terminal that shows what it gets
    reader.start()
    wait_for_steps(proc, run_dir)
    os.close(master)  # the terminal closes
    assert proc.wait(timeout=120) == 143
    ckpt = Checkpointer(run_dir / "checkpoints")
    saved = max(ckpt.all_steps(), default=None)
    ckpt.close()
    assert saved is not None and saved >= 3 and max(r["step"] for r in read_metrics(run_dir)) == saved
    assert_resumes(tiny_model_dir, run_dir, overrides_for, saved, capsys)


def _drain(fd):
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass


def _catches(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler for `sig` (its SigCgt mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (sig - 1) & 1)


@pytest.mark.parametrize("sig, words", [(signal.SIGTERM, "SIGTERM"), (signal.SIGHUP, "SIGHUP (the terminal closed)")])
def test_a_signal_while_the_data_loads_is_one_line_and_143(tmp_path, tiny_model_dir, overrides_for, sig, words):
    """The training file is a named pipe nobody writes yet (a stalled network mount): the run blocks while
    loading its data, before its own handlers are in place. The signal ends it with one line, nothing written."""
    fifo = tmp_path / "train.jsonl"
    os.mkfifo(fifo)
    run_dir = tmp_path / "run"
    args = gsm8k_overrides(overrides_for, tiny_model_dir, run_dir, fifo)
    proc = subprocess.Popen([sys.executable, "-c", DEFAULT_SIGHUP, "train", "tiny_dapo", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not _blocked_opening_a_fifo(proc.pid):
        time.sleep(0.1)  # until it is blocked opening the pipe
    assert _blocked_opening_a_fifo(proc.pid), "the run never blocked opening the pipe"
    assert _catches(proc.pid, sig)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-2000:]
    assert err.strip().splitlines() == [f"dapo-jax: Preempted: {words} while starting (imports, config, data): nothing "
                                        f"to save, exiting now (exit 143); rerun the same command to start or resume"]
    assert_nothing_written(run_dir)


# where the kernel parks an open() of a named pipe until a writer comes: fifo_open (older kernels),
# wait_for_partner (6.x); openat is syscall 257 on x86_64 and 56 on aarch64 and riscv64
FIFO_WAITS = {"fifo_open", "wait_for_partner"}
OPENAT = {"x86_64": 257, "aarch64": 56, "riscv64": 56}.get(os.uname().machine)


def _blocked_opening_a_fifo(pid: int) -> bool:
    """Whether process `pid`'s main thread waits in the kernel to open a named pipe: its wait channel is the
    pipe's, or (where wchan reads 0) it sleeps inside openat. Reading /proc changes nothing for the process."""
    try:
        if Path(f"/proc/{pid}/wchan").read_text().strip() in FIFO_WAITS:
            return True
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        call = Path(f"/proc/{pid}/syscall").read_text().split()
        return state == "S" and bool(call) and call[0] == str(OPENAT)
    except OSError:
        return False


# ----------------------------------------------------------------------------- a run dir on a full file system
FULL_RUN_DIR = """
import subprocess, sys, time
from pathlib import Path
from tests.training.save_faults import _fill
run, rows = Path(sys.argv[1]), int(sys.argv[2])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(run)], check=True)
if rows == 0:
    _fill(run)
proc = subprocess.Popen([sys.executable, "-m", "dapo_jax.cli", *sys.argv[3:]], stderr=subprocess.PIPE, text=True)
metrics = run / "metrics.jsonl"
while rows and proc.poll() is None and not (metrics.exists() and len(metrics.read_text().splitlines()) >= rows):
    time.sleep(0.05)
if rows:
    _fill(run)
err = proc.communicate()[1]
sys.stderr.write(err)
sys.exit(proc.returncode)
"""


def in_a_full_run_dir(run_dir, rows, args):
    """`dapo-jax train` into a run dir that is a 4 MiB tmpfs (a user and mount namespace: `unshare -rm`),
    filled up before the run (rows=0) or once metrics.jsonl has `rows` lines: (exit code, dapo-jax lines)."""
    run_dir.mkdir()
    done = subprocess.run(["unshare", "-rm", sys.executable, "-c", FULL_RUN_DIR, str(run_dir), str(rows), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    return done.returncode, [ln for ln in done.stderr.splitlines() if ln.startswith("dapo-jax:")], done.stderr


def _namespaces() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(["unshare", "-rm", "true"]).returncode == 0


@pytest.mark.skipif(not _namespaces(), reason="needs `unshare -rm` (user and mount namespaces) to mount a small tmpfs")
def test_a_full_disk_under_the_lock_or_metrics_is_one_line(tiny_model_dir, tmp_path, overrides_for):
    full = tmp_path / "full"
    rc, lines, err = in_a_full_run_dir(full, 0, ["train", "tiny_dapo", *overrides_for(tiny_model_dir, full)])
    assert rc == 2 and "Traceback" not in err, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"dapo-jax: ConfigError: train.run_dir: cannot write {full}'s lock (")
    assert lines[0].endswith("): no space left on the device (or no free inodes: `df -i`)")
    mid = tmp_path / "mid"
    args = overrides_for(tiny_model_dir, mid, **{"train.steps": 400, "train.checkpoint_every": 0})
    rc, lines, err = in_a_full_run_dir(mid, 3, ["train", "tiny_dapo", *args])
    assert rc == 6 and "Traceback" not in err, err[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"dapo-jax: RunDirWriteError: cannot write {mid / 'metrics.jsonl'} "
                                                   f"at step "), lines
    assert "no space left on the device" in lines[0]
