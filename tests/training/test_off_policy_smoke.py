"""Two steps of the dapo_tis recipe on the embedded tiny job with a bfloat16 sampler and a float32
trainer: π_old is recomputed (the rule follows the precision), the off-policy ratio metrics are logged
and finite, and the sampler really was off-policy (some ratio differs from 1)."""

import math

import pytest

from dapo_jax.training.config.run import load_config
from dapo_jax.training.loop import train
from dapo_jax.training.metrics import read_metrics

KEYS = ("behaviour_ratio_mean", "behaviour_ratio_min", "behaviour_ratio_max", "behaviour_masked_frac",
        "behaviour_capped_frac")


@pytest.mark.slow
def test_two_steps_of_dapo_tis_with_a_bfloat16_sampler(tmp_path):
    cfg = load_config(None, [
        "objective.name=dapo_tis", "rollout.sampler_dtype=bfloat16", f"train.run_dir={tmp_path / 'run'}",
        "train.steps=2", "rollout.G=4", "rollout.train_batch=4", "rollout.gen_batch=8", "rollout.max_gen_batches=2",
        "data.eval_size=16", "optim.num_minibatches=1", "optim.micro_batches=2", "train.eval_k=2",
        "train.checkpoint_every=0", "train.eval_every=0", "train.rollouts_every=0", "train.progress=false",
        "train.tensorboard=false",
    ])
    assert cfg.objective_config.off_policy_correction == "token_tis" and cfg.recompute_old_logp
    train(cfg)
    steps = [r for r in read_metrics(tmp_path / "run") if "grad_norm" in r]
    assert len(steps) == 2
    for r in steps:
        for key in KEYS:
            assert math.isfinite(r[key]), (key, r)
        assert 0.0 < r["behaviour_ratio_min"] <= r["behaviour_ratio_mean"] <= r["behaviour_ratio_max"]
        assert r["behaviour_masked_frac"] == 0.0  # TIS weights, never drops
    # bfloat16 sampling against a float32 recomputation: the ratio is not 1 everywhere
    assert any(r["behaviour_ratio_max"] != 1.0 or r["behaviour_ratio_min"] != 1.0 for r in steps)
