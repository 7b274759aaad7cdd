"""Two training steps of the GDPO and process-supervision recipes on the embedded job
(dapo_jax/configs/tiny_dapo.yaml): the reference model and the step rewards reach the update, which trains."""

import math
from pathlib import Path

import pytest

from dapo_jax.rewards import steps as steps_module
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import load_config
from dapo_jax.training.loop import train
from tests.training.conftest import finite_step_rows

REPO = Path(__file__).resolve().parents[2]
SMALL = ["train.steps=2", "train.eval_every=0", "train.checkpoint_every=0", "train.progress=false",
         "train.tensorboard=false", "data.eval=null", "rollout.gen_batch=16", "rollout.train_batch=16"]


def two_steps(tmp_path, *overrides, trains=True):
    cfg = load_config(REPO / "dapo_jax" / "configs" / "tiny_dapo.yaml", [f"train.run_dir={tmp_path / 'run'}", *SMALL, *overrides])
    train(cfg)
    steps = finite_step_rows(tmp_path / "run", ("loss", "grad_norm", "entropy", "reward_mean"), steps=2,
                             having="reward_mean")
    if trains:
        assert any(r["update_applied"] == 1.0 and r["grad_norm"] > 0 for r in steps), "nothing was trained on"
    return cfg, steps


@pytest.mark.slow
def test_gdpo_recipe_trains(tmp_path):
    cfg, steps = two_steps(tmp_path, "objective.name=gdpo")
    assert cfg.objective_config.kind == "gdpo" and cfg.objective_config.needs_reference
    for r in steps:
        assert 0.0 < r["groups_used"] <= 1.0 and 0.0 <= r["preference_accuracy"] <= 1.0
        assert math.isfinite(r["margin_mean"])
        assert "ratio_mean" not in r  # no importance ratio in GDPO


@pytest.mark.slow
def test_grpo_process_recipe_takes_its_advantages_from_the_step_rewards(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="overlong_buffer"):  # tiny_dapo's soft overlong band shapes the outcome
        load_config(REPO / "dapo_jax" / "configs" / "tiny_dapo.yaml", ["objective.name=grpo_process"])
    with pytest.raises(ConfigError, match="step rewards"):
        load_config(REPO / "dapo_jax" / "configs" / "tiny_dapo.yaml", ["objective.name=grpo_process", "objective.overlong_buffer=null",
                                                          "reward.functions=[{name: gsm8k}]"])
    # Steps all rewarded alike have no spread: every advantage must be exactly 0 although the outcome
    # rewards of most groups differ (had the loop fallen back to them, the advantages would not be 0).
    calls = []

    def flat(response, prompt, answer):
        calls.append(response)
        return [(1.0, end) for _, end in steps_module.synthetic_steps(response, prompt, answer)]

    monkeypatch.setitem(steps_module.STEP_REWARDS, "synthetic", flat)
    cfg, steps = two_steps(tmp_path, "objective.name=grpo_process", "objective.overlong_buffer=null", trains=False)
    assert cfg.objective_config.needs_step_rewards and len(calls) == 2 * 16 * cfg.rollout.G
    assert any(r["zero_adv_fraction"] < 1.0 for r in steps)  # the outcome rewards had spread
    for r in steps:
        assert r["advantage_sq_mean"] == 0.0 and r["zero_adv_group_frac"] == 1.0 and r["update_applied"] == 1.0
