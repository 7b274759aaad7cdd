"""The learned-reward recipes train: cot_grpo_rm (GRPO on the shipped outcome RM) for 3 steps, and a
tiny run that combines a rule and a reward model by normalise-then-sum and one with process-RM steps."""

import math
from pathlib import Path

import pytest

import dapo_jax
from dapo_jax.training.config.paths import CONFIG_DIR
from dapo_jax.training.config.run import load_config
from dapo_jax.training.loop import train
from dapo_jax.training.metrics import read_metrics
from tests.rewards.conftest import SEPARATOR, make_rm
from tests.training.conftest import tiny_overrides

COT_RM = Path(dapo_jax.__file__).parent / "assets" / "cot_rm"


@pytest.mark.slow
@pytest.mark.skipif(not (COT_RM / "config.json").exists(), reason="run scripts/make_cot_rm.py first")
def test_cot_grpo_rm_trains_three_steps_on_the_shipped_reward_model(tmp_path):
    cfg = load_config(CONFIG_DIR / "cot_grpo_rm.yaml", [
        f"train.run_dir={tmp_path / 'run'}", "train.steps=3", "train.eval_every=0", "train.eval_k=2",
        "train.checkpoint_every=0", "train.progress=false", "train.tensorboard=false", "data.eval_size=8",
        "rollout.gen_batch=8", "rollout.train_batch=8", "rollout.G=4"])  # 32 responses a step: spread enough
    assert [f.name for f in cfg.reward.functions] == ["cot", "reward_model"]
    train(cfg)
    rows = read_metrics(tmp_path / "run")
    steps = [r for r in rows if "reward_mean" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    assert len(steps) == 3 and [r["step"] for r in evals] == [0, 3]
    for r in steps:
        # the reward trained on is the RM's logit alone (the rule has weight 0); the rule still judges accuracy
        assert r["reward_mean"] == pytest.approx(r["reward/reward_model"], abs=1e-5)
        assert r["accuracy"] == pytest.approx(r["reward/cot"], abs=1e-6)
        assert math.isfinite(r["grad_norm"]) and r["reward_std"] > 0
    assert all(math.isfinite(r["eval/reward/reward_model"]) for r in evals)
    assert steps[0]["compilations"] == steps[-1]["compilations"]  # the RM's program compiled once, before step 2


def test_normalize_then_sum_and_process_rm_steps_in_a_tiny_run(tiny_model_dir, tmp_path):
    orm = make_rm(tmp_path / "orm", "sequence")
    prm = make_rm(tmp_path / "prm", "token", seed=1)
    rule_and_rm = (f"reward.functions=[{{name: synthetic, weight: 1.0}}, "
                   f"{{name: reward_model, path: {orm}, weight: 0.5}}]")
    cfg = load_config(None, tiny_overrides(tiny_model_dir, tmp_path / "sum", **{
        "objective.multi_reward": "normalize_then_sum", "objective.overlong_buffer": "null"}) + [rule_and_rm])
    train(cfg)
    rows = [r for r in read_metrics(tmp_path / "sum") if "reward_mean" in r]
    assert rows and all(math.isfinite(r["reward/reward_model"]) and math.isfinite(r["loss"]) for r in rows)
    assert any(r["grad_norm"] > 0 for r in rows)

    steps = (f"reward.functions=[{{name: synthetic, weight: 1.0}}, {{name: process_reward_model, path: {prm}, "
             f"weight: 0.0, options: {{separator: '{SEPARATOR}'}}}}]")
    cfg = load_config(None, tiny_overrides(tiny_model_dir, tmp_path / "prm_run", **{
        "objective.name": "grpo_process", "objective.kl_beta": 0.0, "objective.overlong_buffer": "null"}) + [steps])
    assert cfg.objective_config.needs_step_rewards
    train(cfg)
    rows = [r for r in read_metrics(tmp_path / "prm_run") if "reward_mean" in r]
    assert rows and all(0.0 <= r["reward/process_reward_model"] <= 1.0 for r in rows)
    assert any(r["grad_norm"] > 0 for r in rows)
