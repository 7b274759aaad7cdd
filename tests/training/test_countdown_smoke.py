"""A few DAPO steps on the Countdown task from the shipped countdown_base: every scored batch goes
through the sandbox (one process each), the checker always finishes, and the run's metrics are finite."""

import math
from pathlib import Path

import pytest

import dapo_jax
from dapo_jax.rewards import sandbox
from dapo_jax.training.config.run import load_config
from dapo_jax.training.loop import train
from dapo_jax.training.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]
BASE = Path(dapo_jax.__file__).parent / "assets" / "countdown_base"


@pytest.mark.slow
@pytest.mark.skipif(not (BASE / "config.json").exists(), reason="run scripts/make_countdown_base.py first")
def test_a_few_dapo_steps_on_countdown_score_in_the_sandbox(tmp_path, monkeypatch):
    try:
        sandbox.Sandbox()
    except sandbox.SandboxUnavailable as e:
        pytest.skip(str(e))
    results = []
    run = sandbox.Sandbox.run
    monkeypatch.setattr(sandbox.Sandbox, "run", lambda self, source: results.append(run(self, source)) or results[-1])
    cfg = load_config(REPO / "dapo_jax" / "configs" / "countdown_dapo.yaml", [
        f"train.run_dir={tmp_path / 'run'}", "train.steps=2", "train.eval_every=0", "train.eval_k=2",
        "train.checkpoint_every=0", "train.progress=false", "train.tensorboard=false", "data.eval_size=16",
        "reward.on_error=raise",  # a checker failure would stop the run here, naming the row
    ])
    train(cfg)
    rows = read_metrics(tmp_path / "run")
    steps = [r for r in rows if "reward_mean" in r]
    assert len(steps) == 2 and [r["step"] for r in rows if "eval/accuracy" in r] == [0, 2]
    for r in steps:
        for key in ("reward_mean", "accuracy", "entropy", "grad_norm"):
            assert math.isfinite(r[key]), (key, r)
        assert -2.0 <= r["reward_mean"] <= 1.0
    assert results and all(r.passed for r in results)
    # one process per scored batch: far fewer than the responses scored (2 steps x >= 16 prompts x G 8)
    assert len(results) < sum(r["generated_groups"] for r in steps) * cfg.rollout.G
