"""`dapo-jax`'s commands (dapo_jax/cli/commands.py): train -> eval -> export (loads in transformers, same logits)
-> plot; a packaged recipe named by its name; starvation exits 3."""

import json
from pathlib import Path

import numpy as np
import pytest

from dapo_jax.cli import main
from tests.training.conftest import make_tiny_model


def overrides(model_dir, run_dir):
    return [f"model.path={model_dir}", f"train.run_dir={run_dir}", "data.max_prompt_length=8", "data.eval_size=4",
            "data.train.options={max_operand: 9, heldout_size: 20}", "data.eval.options={max_operand: 9, heldout_size: 20}",
            "objective.overlong_buffer=2", "objective.dynamic_sampling=false", "rollout.G=4", "rollout.train_batch=2",
            "rollout.gen_batch=2", "rollout.max_new_tokens=4", "optim.lr=1e-2", "optim.warmup_steps=0", "optim.num_minibatches=1", "train.steps=1",
            "train.eval_k=2", "train.progress=false", "train.tensorboard=false",
            # A random model is never right; a digit-format bonus gives the groups reward spread to learn from.
            "reward.functions=[{name: synthetic}, {name: format, options: {pattern: '[0-9]', bonus: 1.0}}]"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    model_dir = make_tiny_model(root / "model")
    run_dir = root / "run"
    assert main(["train", "tiny_dapo", *overrides(model_dir, run_dir)]) == 0
    return model_dir, run_dir


def test_train_then_eval_prints_metrics(trained, capsys):
    _, run_dir = trained
    assert (run_dir / "metrics.jsonl").exists() and (run_dir / "checkpoints" / "1").exists()
    capsys.readouterr()
    assert main(["eval", str(run_dir)]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["step"] == 1
    assert {"eval/accuracy", "eval/pass@2", "eval/maj@2", "eval/avg@2"} <= set(out)
    assert 0.0 <= out["eval/pass@2"] <= 1.0


def test_export_loads_in_transformers_with_the_same_logits(trained, tmp_path):
    import torch
    import transformers
    from flax import nnx

    from dapo_jax.models.decoder import positions_from_mask
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.loop import load_trained_model

    _, run_dir = trained
    out = tmp_path / "hf"
    assert main(["export", str(run_dir / "checkpoints" / "1"), str(out)]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = tok("12+7=", add_special_tokens=False, return_tensors="np")["input_ids"]
    with torch.no_grad():
        ref = hf(torch.tensor(ids)).logits.numpy()
    model, _, step = load_trained_model(load_config(run_dir), run_dir)
    assert step == 1
    mask = np.ones_like(ids)
    hidden, _ = model(ids, positions_from_mask(mask), mask)
    np.testing.assert_allclose(np.asarray(model.logits(hidden)), ref, atol=1e-4, rtol=1e-4)
    # The exported weights are the trained ones, not the base model's.
    row = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "grad_norm" in line][0]
    assert row["grad_norm"] > 0 and row["update_applied"] == 1.0
    base = transformers.AutoModelForCausalLM.from_pretrained(trained[0], dtype=torch.float32)
    assert not torch.allclose(base.model.embed_tokens.weight, hf.model.embed_tokens.weight)
    del nnx


def test_plot_command_writes_pngs(trained, capsys):
    _, run_dir = trained
    capsys.readouterr()
    assert main(["plot", str(run_dir)]) == 0
    paths = [Path(p) for p in capsys.readouterr().out.split()]
    assert paths and all(p.suffix == ".png" and p.stat().st_size > 1000 for p in paths)


def test_named_config_resolves_to_configs_dir(tmp_path, capsys, monkeypatch):
    # `dapo-jax train tiny_grpo ...` finds the packaged tiny_grpo.yaml; the bad override fails before any work.
    monkeypatch.chdir(tmp_path)  # anywhere: the recipes ship inside the package
    for name in ("tiny_grpo", "configs/tiny_grpo.yaml"):  # the name, or the path older docs gave
        assert main(["train", name, "optim.lr=-1", f"train.run_dir={tmp_path}"]) == 2
        err = capsys.readouterr().err
        assert "dapo_jax/configs/tiny_grpo.yaml: optim.lr" in err
    assert main(["train", "tiny_gpro"]) == 2
    assert "(did you mean 'tiny_grpo'?)" in capsys.readouterr().err


def test_starvation_exits_3_with_its_message(trained, tmp_path, capsys):
    # Every response "correct" (an always-matching format check): no group has spread, nothing is kept.
    model_dir, _ = trained
    args = overrides(model_dir, tmp_path / "starve") + [
        "objective.dynamic_sampling=true", "rollout.on_starvation=fail", "rollout.max_gen_batches=2",
        "data.eval=null", "reward.functions=[{name: format, options: {pattern: '.*'}}]"]
    assert main(["train", "tiny_dapo", *args]) == 3
    err = capsys.readouterr().err
    assert "kept 0 of the 2 groups" in err and "max_gen_batches=2" in err


def test_eval_data_takes_the_field_keys_and_checks_the_file_before_the_model(trained, tmp_path, capsys):
    """`--prompt-field` / `--answer-field` as training's `data.*.prompt_field` / `answer_field`; a file
    without them, or missing, is one line before the model loads (here a model whose weights are truncated:
    loading it first would name the model instead)."""
    import shutil

    model_dir, run_dir = trained
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"q": {"text": f"{i}+1="}, "a": str(i + 1)}) + "\n" for i in range(4)))
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    capsys.readouterr()
    for args, words in [(["--format", "custom"], "no problem field: name it (data.train.prompt_field / "
                                                 "data.eval.prompt_field in a run config, --prompt-field for"),
                        (["--format", "custom", "--prompt-field", "q.text", "--answer-field", "b"],
                         "row 0 has no answer field 'b'")]:
        assert main(["eval", "--model", str(broken), "--data", str(data), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"dapo-jax: DataError: {data}: ") and words in err[0], err
    missing = tmp_path / "nope.jsonl"
    for extra in (["--format", "custom"], []):  # without --format: the path, not the format it cannot tell
        assert main(["eval", "--model", str(broken), "--data", str(missing), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"dapo-jax: ConfigError: --data {missing}: {missing} does not exist"], err
    assert main(["eval", "--model", str(run_dir), "--data", str(data), "--format", "custom", "--prompt-field",
                 "q.text", "--answer-field", "a", "--k", "1", "--out", str(tmp_path / "out")]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert any(k.endswith("accuracy") for k in out), out
