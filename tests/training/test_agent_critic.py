"""Objectives with a critic (PPO; VAPO with its value pre-training) train on episodes (and plan): `dapo-jax train` on the agent recipe with
`objective.name=ppo` (tiny_ppo's objective settings), the Retry environment's two-turn episodes, finite value
losses, and nothing compiles after the first step."""

import numpy as np

from dapo_jax.training.config.run import load_config
from dapo_jax.training.loop import train
from dapo_jax.training.metrics import read_metrics
from dapo_jax.training.plan.memory import make_plan
from tests.training.test_agent_run import overrides


def test_ppo_trains_on_episodes_with_a_finite_value_loss(tmp_path):
    run_dir = tmp_path / "ppo"
    cfg = load_config("tiny_agent_calc", overrides(run_dir, **{
        "objective.name": "ppo", "objective.overlong_buffer": "null", "train.checkpoint_every": 0,
        "train.rollouts_every": 0}))
    assert cfg.objective_config.uses_critic and cfg.objective_config.advantage == "gae"
    train(cfg)
    steps = [r for r in read_metrics(run_dir) if "grad_norm" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in ("critic/value_loss", "critic/loss", "critic/grad_norm", "loss", "agent/turns_mean"):
            assert key in r and np.isfinite(r[key]), key
        assert r["critic/update_applied"] == 1.0
    # the Retry environment answers a wrong first turn: episodes with tool ids between model turns were trained on
    assert any(r["agent/turns_mean"] > 1.0 and r["agent/observation_tokens_mean"] > 0 for r in steps)
    counts = [r["compilations"] for r in steps]
    assert counts == [counts[0]] * len(counts), counts  # nothing compiles after the first step


def test_vapo_pretrains_its_value_model_on_the_initial_policys_episodes(tmp_path):
    run_dir = tmp_path / "vapo"
    cfg = load_config("tiny_agent_calc", overrides(run_dir, **{
        "objective.name": "vapo", "objective.value_pretrain_steps": 2, "objective.overlong_buffer": "null",
        "train.steps": 1, "train.checkpoint_every": 0, "train.rollouts_every": 0}))
    train(cfg)
    rows = read_metrics(run_dir)
    pre = [r for r in rows if "critic/pretrain_steps" in r]
    assert len(pre) == 1 and pre[0]["step"] == 0 and pre[0]["critic/pretrain_steps"] == 2.0
    for key in ("critic/pretrain_value_loss_first", "critic/pretrain_value_loss_last"):
        assert np.isfinite(pre[0][key]) and pre[0][key] > 0, key
    step = [r for r in rows if "grad_norm" in r]
    assert [r["step"] for r in step] == [1] and np.isfinite(step[0]["critic/value_loss"])


def test_plan_of_a_ppo_agent_run_compiles_the_critic_update():
    cfg = load_config("tiny_agent_calc", ["objective.name=ppo", "objective.overlong_buffer=null"])
    wanted = ("prepare", "critic update", "rollout: decode", "update: apply")
    plan = make_plan(cfg, cache=False, only=wanted)  # only these compiled: the rest are the ones tiny_dapo's plan has
    names = {p.name for p in plan.programs}
    assert set(wanted) <= names, sorted(names)
    assert {p.name: p for p in plan.programs}["critic update"].figures.resident_args > 0  # the critic's state
    assert plan.fits
