"""`dapo-jax eval`: a run's last checkpoint reproduces the run's final evaluation exactly (same key,
batching and settings); a Hugging Face base model on --data files writes a table, results and samples."""

import json
from pathlib import Path

import pytest

from dapo_jax.cli import main
from dapo_jax.eval_command.run import EvalFlags, resolve_target, run_eval
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.paths import REPO_ROOT

TINY_BASE = REPO_ROOT / "dapo_jax" / "assets" / "tiny_base"


@pytest.fixture(scope="module")
def tiny_run(tiny_dapo_run):
    return tiny_dapo_run


def test_eval_of_the_last_checkpoint_reproduces_the_final_eval_exactly(tiny_run, capsys):
    run_dir, final = tiny_run
    capsys.readouterr()
    assert main(["eval", "--model", str(run_dir)]) == 0
    out = capsys.readouterr().out
    flat = json.loads(out.strip().splitlines()[-1])
    assert flat["step"] == 2 and 0 < final["eval/accuracy"] < 1
    for key in ("eval/accuracy", "eval/avg@2", "eval/pass@2", "eval/maj@2", "eval/problems"):
        assert flat[key] == final[key], key
    assert "reproduced exactly" in out
    results = json.loads((run_dir / "eval" / "step_2.json").read_text())
    assert results["training_eval"] == {"step": 2, "accuracy": final["eval/accuracy"], "differs": [],
                                        "reproduced": True}
    samples = [json.loads(line) for line in Path(results["samples"]["eval"]).read_text().splitlines()]
    assert len(samples) == 24 and all(len(s["responses"]) == 2 for s in samples)
    acc = sum(r["correct"] for s in samples for r in s["responses"]) / 48
    assert acc == pytest.approx(final["eval/accuracy"])


def test_checkpoint_0_is_the_base_model_and_other_settings_are_named(tiny_run):
    from dapo_jax.eval_command.run import _compare_with_training

    run_dir, _ = tiny_run
    first = next(json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    base = run_eval(resolve_target(run_dir, checkpoint=0), [])
    assert base["step"] == 0 and base["results"]["eval"]["accuracy"] == first["eval/accuracy"]
    assert base["training_eval"]["reproduced"]
    settings = {**base["settings"], "temperature": 0.5}
    cmp = _compare_with_training(resolve_target(run_dir, checkpoint=0), 0, base["results"], settings,
                                 EvalFlags(temperature=0.5, limit=8))
    assert cmp["differs"] == ["temperature 0.5 (run: 1.0)", "limit 8 (run: data.eval_size=24)"]
    assert not cmp["reproduced"]


def test_base_model_on_two_data_files(tmp_path, capsys):
    gsm = tmp_path / "gsm8k" / "test.jsonl"
    gsm.parent.mkdir()
    gsm.write_text("\n".join(json.dumps({"question": f"{a}+{b}=", "answer": f"so #### {a + b}"})
                             for a in range(10, 22) for b in range(2)))
    amc = tmp_path / "amc.jsonl"
    amc.write_text("\n".join(json.dumps({"problem": f"{a}-1=", "answer": float(a - 1)}) for a in range(20, 26)))
    out = tmp_path / "res" / "results.json"
    capsys.readouterr()
    assert main(["eval", "--model", str(TINY_BASE), "--data", str(gsm), f"mine={amc}", "--k", "2",
                 "--max-new-tokens", "6", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gsm8k" in printed and "mine" in printed and "avg@2" in printed
    results = json.loads(out.read_text())
    assert results["step"] == 0 and results["run_dir"] is None and results["training_eval"] is None
    g, m = results["results"]["gsm8k"], results["results"]["mine"]
    assert g["problems"] == 24 and g["format"] == "gsm8k" and g["reward"] == ["gsm8k"]
    assert m["problems"] == 6 and m["format"] == "amc" and m["reward"] == ["math_verify"]
    assert g["accuracy"] > 0  # the embedded model adds: the gsm8k reward finds its numbers
    assert g["template"] == "chat" and g["max_prompt_length"] == 8  # longest prompt, a multiple of 8
    rec = json.loads((out.parent / "results.gsm8k.samples.jsonl").read_text().splitlines()[0])
    assert rec["prompt"] == "10+0=" and rec["answer"] == "10" and len(rec["responses"]) == 2
    assert set(rec["responses"][0]) == {"text", "reward", "correct", "extracted", "length", "truncated"}


def test_base_model_takes_its_generation_config_defaults(tmp_path):
    import shutil

    model = tmp_path / "m"
    shutil.copytree(TINY_BASE, model)
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [1], "temperature": 0.6,
                                                              "top_p": 0.9, "top_k": 20}))
    with pytest.raises(ConfigError, match="pass --data"):  # a base model has no eval set of its own
        run_eval(resolve_target(model), [], EvalFlags(k=1))
    from dapo_jax.eval_command.run import settings_for
    from dapo_jax.models import load_generation_config

    s = settings_for(resolve_target(model), EvalFlags(top_k=5), load_generation_config(model))
    assert (s["temperature"], s["top_p"], s["top_k"], s["max_new_tokens"]) == (0.6, 0.9, 5, 1024)


def test_target_errors(tmp_path, tiny_run):
    run_dir, _ = tiny_run
    with pytest.raises(ConfigError, match="not a run directory"):
        resolve_target(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no checkpoint 7 .*there are \[2\]"):
        resolve_target(run_dir, checkpoint=7)
    with pytest.raises(ConfigError, match="Hugging Face model, not a run dir"):
        resolve_target(TINY_BASE, checkpoint=3)
    assert resolve_target(run_dir / "checkpoints" / "2").checkpoint == run_dir / "checkpoints" / "2"
    assert main(["eval"]) == 2  # neither a positional target nor --model


def test_a_config_override_after_data_files_is_an_override(capsys):
    # `--data a.jsonl model.dtype=...`: argparse's greedy list takes the override; eval gives it back
    assert main(["eval", "--model", str(TINY_BASE), "--data", "x/gsm8k.jsonl", "model.dtype=float8"]) == 2
    assert "model.dtype" in capsys.readouterr().err


# ----------------------------------------------------------------------------- a training run rotating its checkpoints
@pytest.fixture(scope="module")
def rotating_run(tmp_path_factory):
    """A run with checkpoints 1 and 2 (keep 2), as a training run leaves them between two saves."""
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.loop import train

    run_dir = tmp_path_factory.mktemp("rotating") / "run"
    train(load_config(None, [f"train.run_dir={run_dir}", "train.steps=2", "rollout.G=4", "rollout.train_batch=4",
                             "rollout.gen_batch=8", "data.eval_size=8", "train.eval_k=2", "train.checkpoint_every=1",
                             "train.keep_checkpoints=2", "train.progress=false", "train.tensorboard=false"]))
    return run_dir


def copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_eval_of_the_newest_takes_the_next_newest_when_rotation_deleted_it_before_the_read(rotating_run, tmp_path,
                                                                                          capsys):
    run_dir = copy_run(rotating_run, tmp_path / "run")
    target = resolve_target(run_dir)  # the newest: step 2 ...
    assert target.checkpoint == run_dir / "checkpoints" / "2" and target.newest
    import shutil

    shutil.rmtree(run_dir / "checkpoints" / "2")  # ... deleted by the training run's rotation before it is read
    capsys.readouterr()
    report = run_eval(target, [])
    assert report["step"] == 1 and report["model"] == f"{run_dir} (step 1)"
    assert f"{run_dir / 'checkpoints' / '2'} was deleted while it was being read" in capsys.readouterr().err


def test_eval_of_the_newest_takes_the_next_newest_when_rotation_deleted_it_during_the_read(rotating_run, tmp_path,
                                                                                         monkeypatch, capsys):
    """The files go away while Orbax reads them (the training run's rotation deletes the folder)."""
    import shutil

    from dapo_jax.training.state.checkpoint import Checkpointer

    run_dir = copy_run(rotating_run, tmp_path / "run")
    restore = Checkpointer.restore

    def rotated_mid_read(self, step, *a, **k):
        if step == 2:
            shutil.rmtree(self.directory / "2")
        return restore(self, step, *a, **k)

    monkeypatch.setattr(Checkpointer, "restore", rotated_mid_read)
    capsys.readouterr()
    assert main(["eval", str(run_dir)]) == 0
    captured = capsys.readouterr()
    assert "was deleted while it was being read" in captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["step"] == 1


def test_an_explicit_checkpoint_that_disappears_is_an_error_not_a_substitute(rotating_run, tmp_path, capsys):
    import shutil

    run_dir = copy_run(rotating_run, tmp_path / "run")
    target = resolve_target(run_dir, checkpoint=2)
    assert not target.newest
    shutil.rmtree(run_dir / "checkpoints" / "2")
    with pytest.raises(FileNotFoundError):
        run_eval(target, [])
