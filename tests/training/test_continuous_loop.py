"""The loop with continuous batching (`rollout.continuous`): dynamic sampling judges the groups as they
finish, `refill` at a time, within the same prompt budget; nothing compiles after the first step; a
run stopped after its checkpoint and resumed ends with the parameters of an uninterrupted run."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import load_config
from dapo_jax.training.loop import load_trained_model, train
from dapo_jax.training.metrics import read_metrics

CONTINUOUS = {"rollout.continuous": "true", "rollout.continuous_refill": 2, "rollout.max_new_tokens": 6,
              "data.eval": "null"}


def params_of(cfg, run_dir):
    model, _, step = load_trained_model(cfg, run_dir)
    return step, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.mark.slow
def test_continuous_rollouts_train_resume_and_compile_once(tiny_model_dir, tmp_path, overrides_for):
    straight = tmp_path / "straight"
    cfg = load_config(None, overrides_for(tiny_model_dir, straight, **CONTINUOUS, **{"train.steps": 3}))
    train(cfg)
    rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "grad_norm" in r]
    assert len(steps) == 3
    r = cfg.rollout
    for row in steps:
        # chunks of continuous_refill groups, within max_gen_batches x gen_batch prompts
        assert row["generated_groups"] == 2 * row["gen_rounds"] <= r.max_gen_batches * r.gen_batch
        assert row["zero_adv_group_frac"] == 0.0  # dynamic sampling still drops zero-spread groups
        assert 0 <= row["stream_dropped_tokens"] <= r.gen_batch * r.G * r.max_new_tokens  # at most every row's
        assert row["trained_groups"] == min(r.train_batch, round(row["kept_fraction"] * row["generated_groups"]))
    assert any(row["trained_groups"] > 0 and row["grad_norm"] > 0 for row in steps), "nothing was trained on"
    counts = [row["compilations"] for row in steps]
    assert counts == [counts[0]] * 3, counts

    # 2 steps, then a rerun to 3 (resumes from checkpoint 2): the same parameters and metrics
    resumed = tmp_path / "resumed"
    train(load_config(None, overrides_for(tiny_model_dir, resumed, **CONTINUOUS, **{"train.steps": 2})))
    cfg3 = load_config(None, overrides_for(tiny_model_dir, resumed, **CONTINUOUS, **{"train.steps": 3}))
    train(cfg3)
    (step_a, params_a), (step_b, params_b) = params_of(cfg3, resumed), params_of(cfg, straight)
    assert step_a == step_b == 3
    for a, b in zip(params_a, params_b):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    for key in ("reward_mean", "response_length_mean", "generated_groups"):
        assert [x[key] for x in read_metrics(resumed) if "grad_norm" in x] == [x[key] for x in steps], key


@pytest.mark.slow
def test_capped_admissions_train_and_compile_once(tiny_model_dir, tmp_path, overrides_for):
    run = tmp_path / "capped"
    cfg = load_config(None, overrides_for(tiny_model_dir, run, **CONTINUOUS, **{"rollout.continuous_cap": "true"}))
    train(cfg)
    steps = [r for r in read_metrics(run) if "grad_norm" in r]
    assert len(steps) == 2 and all(r["generated_groups"] == 2 * r["gen_rounds"] for r in steps)
    assert all(r["trained_groups"] == min(8, round(r["kept_fraction"] * r["generated_groups"])) for r in steps)
    assert steps[0]["compilations"] == steps[1]["compilations"]


def test_continuous_settings_are_checked_before_the_run(tiny_model_dir, tmp_path, overrides_for):
    def load(**extra):
        extra = {"rollout.continuous": "true", **extra}
        return load_config(None, overrides_for(tiny_model_dir, tmp_path / "run", **extra))

    with pytest.raises(ConfigError, match="rollout.continuous_refill"):
        load(**{"rollout.continuous_refill": 3})  # does not divide gen_batch = 8
    with pytest.raises(ConfigError, match="rollout.continuous.*alternatives"):
        load(**{"rollout.compaction": "true"})
    with pytest.raises(ConfigError, match="rollout.continuous.*max_new_tokens >= 2"):
        load(**{"rollout.max_new_tokens": 1})
    with pytest.raises(ConfigError, match="rollout.continuous_cap"):
        load_config(None, overrides_for(tiny_model_dir, tmp_path / "run", **{"rollout.continuous_cap": "true"}))
    with pytest.raises(ConfigError, match="rollout.continuous.*multi-process"):
        load(**{"mesh.distributed": "{coordinator: 'localhost:1234', num_processes: 2, process_id: 0}"})
    assert not (tmp_path / "run").exists()
