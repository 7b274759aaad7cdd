"""A chain of stages (training/stages.py): each stage an ordinary run from the previous stage's exported
weights, the rft stage's kept set sampled from the previous model, metrics carried with the stage, a rerun
resuming inside the unfinished stage exactly, and every stage checked before anything runs."""

import json
import shutil

import jax
import numpy as np
import pytest
import yaml
from flax import nnx

from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import load_config
from dapo_jax.training.metrics import read_metrics
from dapo_jax.training.stages import load_stages, run_stages

QUIET = ["train.progress=false", "train.tensorboard=false", "data.eval=null", "train.rollouts_every=0"]
SFT = ["model.path=dapo_jax/assets/tiny_base", "data.max_prompt_length=8", "rollout.max_new_tokens=6",
       "rollout.train_batch=4", "reward.functions=[{name: synthetic}]", "train.checkpoint_every=1", *QUIET]
RL = ["rollout.G=4", "rollout.train_batch=4", "rollout.gen_batch=8", "rollout.max_gen_batches=1",
      "optim.num_minibatches=1", "train.checkpoint_every=1", *QUIET]


def write_stages(tmp_path, stages) -> str:
    path = tmp_path / "stages.yaml"
    path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"), "stages": stages}))
    return str(path)


def chain(tmp_path):
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "response": str(a + b)}) + "\n"
                            for a in range(6) for b in range(4)))
    return write_stages(tmp_path, [
        {"name": "cold", "recipe": "cot_sft", "overrides": [*SFT, f"data.train.name={data}", "data.train.options={}",
                                                            "train.steps=2"]},
        {"name": "rl", "recipe": "tiny_dapo", "overrides": [*RL, "train.steps=1"]},
        {"name": "rft", "recipe": "cot_sft", "overrides": [*SFT, "train.steps=2"],
         "rft": {"prompts": {"name": "synthetic", "split": "train", "options": {"max_operand": 99, "ops": "+-",
                                                                                  "heldout_size": 400}},
                 "k": 4, "per_prompt": 1, "limit": 16}},
    ])


def params(where):
    from dapo_jax.models.hf_io import load_pretrained

    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(load_pretrained(where), nnx.Param))]


def test_chain_runs_each_stage_from_the_last_and_resumes(tmp_path):
    plans = load_stages(chain(tmp_path))
    run_stages(plans)
    for prev, p in zip(plans, plans[1:]):  # each stage ran from the previous one's final weights
        assert load_config(p.dir / "config.yaml").model.path == str(prev.export)
    for p in plans:
        assert (p.export / "config.json").exists() and (p.export / "tokenizer.json").exists()
    kept = [json.loads(line) for line in plans[2].kept.read_text().splitlines()]
    assert kept and all(set(r) == {"prompt", "response", "answer", "index", "reward"} for r in kept)

    rows = read_metrics(plans[0].dir.parent)
    trained = [r for r in rows if "grad_norm" in r]
    assert [(r["stage"], r["stage_step"], r["step"]) for r in trained] == [
        ("cold", 1, 1), ("cold", 2, 2), ("rl", 1, 3), ("rft", 1, 4), ("rft", 2, 5)]
    assert all(r["stage_index"] == [p.stage.name for p in plans].index(r["stage"]) for r in rows)

    # stopped inside the last stage after its step 1: a rerun skips the done stages and resumes it exactly
    last = plans[-1]
    final = params(last.export)
    shutil.rmtree(last.export)
    shutil.rmtree(last.dir / "checkpoints" / "2")
    metrics = last.dir / "metrics.jsonl"
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines() if json.loads(line)["step"] <= 1))
    run_stages(load_stages(chain(tmp_path)))
    for a, b in zip(params(last.export), final):
        np.testing.assert_array_equal(a, b)
    assert [r["step"] for r in read_metrics(plans[0].dir.parent) if "grad_norm" in r] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("stages, match", [
    ([{"name": "a", "recipe": "tiny_dapo", "overrides": ["rollout.G=1"]}], r"stages.0 \(a\): .*rollout.G"),
    ([{"name": "a", "recipe": "tiny_dapo"}, {"name": "a", "recipe": "tiny_dapo"}], "repeat"),
    ([{"name": "a", "recipe": "tiny_dapo", "colour": 1}], "stages.0.colour"),
    ([{"name": "a", "recipe": "cot_sft", "rft": {"prompts": {"name": "cot"}}}], "the first stage has none"),
    ([{"name": "a", "recipe": "tiny_dapo"}, {"name": "b", "recipe": "tiny_dapo", "rft": {"prompts": {"name": "cot"}}}],
     r"stages.1 \(b\): rft .* must be sft"),
    ([{"name": "a", "recipe": "tiny_dapo", "overrides": ["distill.teacher=stage:z"]}], "no earlier stage is named 'z'"),
])
def test_every_stage_is_checked_before_anything_runs(tmp_path, stages, match):
    with pytest.raises(ConfigError, match=match):
        load_stages(write_stages(tmp_path, stages))
    assert not (tmp_path / "run").exists()


def test_a_teacher_can_be_an_earlier_stage(tmp_path):
    plans = load_stages(write_stages(tmp_path, [
        {"name": "rl", "recipe": "tiny_dapo"},
        {"name": "student", "recipe": "tiny_dapo", "overrides": ["distill.teacher=stage:rl"]}]))
    assert plans[1].cfg.distill.teacher == str(plans[0].export) == plans[1].cfg.model.path


def test_plan_plans_every_stage(tmp_path, capsys):
    from dapo_jax.cli import main

    path = write_stages(tmp_path, [{"name": "cold", "recipe": "cot_sft", "overrides": SFT},
                                   {"name": "rl", "recipe": "tiny_dapo", "overrides": RL}])
    out = tmp_path / "plan.json"
    assert main(["plan", path, "--quiet", "--only", "prepare", "--json", str(out)]) == 0  # one small program each
    text = capsys.readouterr().out
    assert "stages.0 (cold)" in text and "stages.1 (rl)" in text
    plans = json.loads(out.read_text())
    assert sorted(plans) == ["cold", "rl"] and all(p["fits"] for p in plans.values())
    assert not (tmp_path / "run").exists()  # planning runs nothing
