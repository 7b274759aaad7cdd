"""End to end: a tiny run writes metrics and checkpoints, resumes exactly (even after SIGKILL),
compiles nothing after its first step, and gives the same result on a 2x2x2 mesh as on one device."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from dapo_jax.training.state.checkpoint import Checkpointer
from dapo_jax.training.config.run import load_config
from dapo_jax.training.loop import load_trained_model, train
from dapo_jax.training.metrics import read_metrics


REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(overrides_for):
    def go(model_dir, run_dir, **extra):
        cfg = load_config(None, overrides_for(model_dir, run_dir, **extra))
        return cfg, train(cfg)
    return go


def params_of(cfg, run_dir):
    model, _, step = load_trained_model(cfg, run_dir)
    return step, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.fixture(scope="module")
def base_run(tiny_model_dir, tmp_path_factory, run):
    run_dir = tmp_path_factory.mktemp("base") / "run"
    cfg, final = run(tiny_model_dir, run_dir)
    return cfg, run_dir, final


def test_run_writes_metrics_config_and_checkpoints(base_run):
    cfg, run_dir, final = base_run
    assert (run_dir / "config.yaml").exists()
    assert Checkpointer(run_dir / "checkpoints").all_steps() == [1, 2]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2]
    train_rows = rows[1:]
    for key in ("reward_mean", "reward_std", "accuracy", "kept_fraction", "all_correct_fraction",
                "all_wrong_fraction", "gen_rounds", "response_length_mean", "response_length_max",
                "truncated_fraction", "entropy", "clip_frac_low", "clip_frac_high", "grad_norm",
                "learning_rate", "rollout_tokens_per_s", "update_tokens_per_s", "step_time_s", "compilations"):
        assert all(key in r for r in train_rows), key
    for key in ("eval/accuracy", "eval/pass@2", "eval/maj@2", "eval/avg@2"):
        assert key in rows[0] and key in rows[2]
    assert any(r["trained_groups"] > 0 and r["grad_norm"] > 0 for r in train_rows), "nothing was trained on"
    # Dynamic sampling: never a zero-spread (all-zero advantage) group among the trained ones, and the
    # batch is exactly train_batch (kept groups, then mask-0 padding under on_starvation=train_on_kept).
    for r in train_rows:
        assert r["zero_adv_group_frac"] == 0.0
        assert r["trained_groups"] == min(cfg.rollout.train_batch, r["kept_fraction"] * r["generated_groups"])
    assert final["step"] == 2 and "eval/accuracy" in final


def test_no_compilation_after_the_first_step(base_run):
    _, run_dir, _ = base_run
    lines = [r for r in map(__import__("json").loads, (run_dir / "metrics.jsonl").read_text().splitlines())]
    train_rows = [r for r in lines if "grad_norm" in r]
    counts = [r["compilations"] for r in train_rows]
    assert counts[0] > 0 and counts == [counts[0]] * len(counts), counts


def test_rerun_resumes_from_the_newest_checkpoint(base_run, tmp_path, overrides_for):
    cfg, run_dir, _ = base_run
    copy = tmp_path / "resumed"
    shutil.copytree(run_dir, copy)
    cfg3 = load_config(None, overrides_for(cfg.model.path, copy, **{"train.steps": 3, "data.eval": "null"}))
    with pytest.raises(Exception, match="different config"):
        train(load_config(None, overrides_for(cfg.model.path, copy, **{"rollout.G": 8})))
    train(cfg3)
    steps = [r["step"] for r in read_metrics(copy) if "grad_norm" in r]
    assert steps == [1, 2, 3]
    assert Checkpointer(copy / "checkpoints").all_steps() == [2, 3]


def test_sigkill_mid_run_then_resume_matches_uninterrupted(tiny_model_dir, tmp_path, run, overrides_for):
    extra = {"train.steps": 5, "data.eval": "null"}
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "dapo_jax.cli", "train", "tiny_dapo", *overrides_for(tiny_model_dir, killed, **extra)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 240
    try:
        while not (killed / "checkpoints" / "2").exists():
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.time() < deadline, "the run never wrote checkpoint 2"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)  # mid step 3
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    resumed_cfg, _ = run(tiny_model_dir, killed, **extra)
    straight = tmp_path / "straight"
    straight_cfg, _ = run(tiny_model_dir, straight, **extra)

    step_a, params_a = params_of(resumed_cfg, killed)
    step_b, params_b = params_of(straight_cfg, straight)
    assert step_a == step_b == 5
    for a, b in zip(params_a, params_b):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    # Same prompts consumed: same stream position, and the same per-step rewards and lengths.
    def meta(d):
        return Checkpointer(d / "checkpoints").restore_latest(_abstract(straight_cfg)).meta
    assert meta(killed)["stream"] == meta(straight)["stream"]
    rows_a, rows_b = read_metrics(killed), read_metrics(straight)
    for key in ("reward_mean", "response_length_mean", "kept_fraction"):
        assert [r[key] for r in rows_a] == [r[key] for r in rows_b], key


def _abstract(cfg):
    from dapo_jax.training.loop import build_mesh, load_model, load_tokenizer
    from dapo_jax.training.update.train_step import init_train_state, make_optimizer

    mesh = build_mesh(cfg)
    with jax.set_mesh(mesh):
        model = load_model(cfg, mesh, load_tokenizer(cfg))
        params = nnx.state(model)
        tx, _ = make_optimizer(cfg.optim)
        return jax.eval_shape(lambda p: init_train_state(p, tx), params)._replace(params=params)


def test_mesh_2x2x2_matches_one_device(base_run, tmp_path, run):
    cfg, run_dir, _ = base_run
    sharded = tmp_path / "mesh"
    mesh_cfg, _ = run(cfg.model.path, sharded, **{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2})
    step_a, params_a = params_of(cfg, run_dir)
    step_b, params_b = params_of(mesh_cfg, sharded)
    assert step_a == step_b == 2
    # Same sampled tokens (rewards per step), params equal up to float32 reduction-order noise.
    assert [r["reward_mean"] for r in read_metrics(run_dir)[1:]] == [r["reward_mean"] for r in read_metrics(sharded)[1:]]
    for a, b in zip(params_a, params_b):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    base = [np.asarray(x) for x in jax.tree.leaves(_abstract(cfg).params)]  # training did move the params
    assert max(float(np.abs(a - b).max()) for a, b in zip(params_a, base)) > 1e-4
