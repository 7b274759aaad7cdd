"""A few DAPO steps on the chain-of-thought task from the shipped cot_base: the run completes with
finite metrics, trains on something, and records truncated responses (what overlong shaping acts on)."""

import math
from pathlib import Path

import pytest

import dapo_jax
from dapo_jax.training.config.run import load_config
from dapo_jax.training.loop import train
from dapo_jax.training.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]
COT = Path(dapo_jax.__file__).parent / "assets" / "cot_base"


@pytest.mark.slow
@pytest.mark.skipif(not (COT / "config.json").exists(), reason="run scripts/make_cot_base.py first")
def test_a_few_dapo_steps_on_the_cot_task(tmp_path):
    # max_new_tokens 96 (< the longest traces) so that truncation surely happens in 3 steps
    cfg = load_config(REPO / "dapo_jax" / "configs" / "cot_dapo.yaml", [
        f"train.run_dir={tmp_path / 'run'}", "train.steps=3", "train.eval_every=0", "train.eval_k=2",
        "train.checkpoint_every=0", "train.progress=false", "train.tensorboard=false", "data.eval_size=16",
        "rollout.gen_batch=8", "rollout.train_batch=8", "rollout.max_gen_batches=2", "rollout.max_new_tokens=96",
    ])
    assert cfg.objective_config.overlong_buffer == 16 and cfg.objective_config.max_response_length == 96
    train(cfg)
    rows = read_metrics(tmp_path / "run")
    evals = [r for r in rows if "eval/accuracy" in r]
    steps = [r for r in rows if "reward_mean" in r]
    assert [r["step"] for r in evals] == [0, 3] and len(steps) == 3
    assert all(0.0 <= r["eval/accuracy"] <= 1.0 for r in evals)
    for r in steps:
        for key in ("reward_mean", "accuracy", "entropy", "grad_norm", "response_length_mean", "truncated_fraction"):
            assert math.isfinite(r[key]), (key, r)
    assert any(r["trained_groups"] > 0 and r["grad_norm"] > 0 for r in steps), "nothing was trained on"
    assert sum(r["truncated_fraction"] for r in steps) > 0, "no truncated response recorded"
    assert max(r["response_length_max"] for r in steps) == 96
    # a +1/-1 reward minus the soft overlong penalty (at most 1): never below -2
    assert all(-2.0 <= r["reward_mean"] <= 1.0 for r in steps)
