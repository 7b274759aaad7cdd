"""`dapo-jax train` on a recipe with an `agent:` section: episodes through the run's own loop, metrics,
rollout log, `dapo-jax show`, evaluation, and a resume mid-run that ends bit for bit where the
uninterrupted run ends."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from dapo_jax.show import show_rollouts
from dapo_jax.training.state.checkpoint import Checkpointer
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.resolve import resolve
from dapo_jax.training.config.run import load_config
from dapo_jax.training.loop import load_trained_model, train
from dapo_jax.training.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]
ENVS = REPO / "tests" / "training" / "agent_envs.py"


def overrides(run_dir, **extra):
    base = {"agent.env": "tests.training.agent_envs:Retry", "rollout.G": 2, "rollout.train_batch": 4,
            "rollout.gen_batch": 4, "rollout.max_gen_batches": 2, "optim.num_minibatches": 1, "train.steps": 2,
            "data.eval_size": 4, "train.eval_k": 2, "train.eval_every": 0, "train.checkpoint_every": 1,
            "train.rollouts_every": 1, "train.progress": "false", "train.tensorboard": "false",
            "train.run_dir": str(run_dir)}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def params_of(cfg, run_dir):
    model, _, step = load_trained_model(cfg, run_dir)
    return step, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("agent") / "run"
    cfg = load_config("tiny_agent_calc", overrides(run_dir))
    return cfg, run_dir, train(cfg)


def test_episodes_train_through_the_loop_with_agent_metrics(agent_run):
    cfg, run_dir, final = agent_run
    assert resolve(cfg).optim.packing  # the packed update, tool ids packed as context
    rows = read_metrics(run_dir)
    steps = [r for r in rows if "grad_norm" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        for key in ("agent/turns_mean", "agent/tool_call_rate", "agent/tool_calls", "agent/status_done",
                    "agent/observation_tokens_mean", "agent/model_tokens_mean", "loss", "kept_fraction"):
            assert key in r and np.isfinite(r[key]), key
        assert 0.0 <= r["agent/tool_call_rate"] <= 1.0
    # the Retry environment answers a wrong first turn: some episodes have two turns and observation ids
    assert any(r["agent/turns_mean"] > 1.0 and r["agent/observation_tokens_mean"] > 0 for r in steps)
    assert any(r["trained_groups"] > 0 and r["grad_norm"] > 0 for r in steps)
    assert Checkpointer(run_dir / "checkpoints").all_steps() == [1, 2]
    # the in-run evaluation plays episodes too
    for key in ("eval/accuracy", "eval/tool_call_rate", "eval/turns_mean"):
        assert key in rows[0] and key in final
    counts = [r["compilations"] for r in steps]
    assert counts == [counts[0]] * len(counts), counts  # nothing compiles after the first step


def test_rollout_log_and_show_print_episodes_turn_by_turn(agent_run):
    _, run_dir, _ = agent_run
    groups = [json.loads(line) for line in (run_dir / "rollouts" / "1.jsonl").read_text().splitlines()]
    episodes = [r["episode"] for g in groups for r in g["responses"]]
    assert all(e["turns"][0]["role"] == "model" for e in episodes)
    two = [e for e in episodes if len([t for t in e["turns"] if t["role"] == "model"]) == 2]
    assert two, "no logged episode with a tool turn"
    assert two[0]["turns"][1] == {"role": "tool", "name": "check", "text": "no,"}
    out = io.StringIO()
    show_rollouts(run_dir, 1, file=out, plain=True)
    text = out.getvalue()
    assert "turn 1 model (reward 0)" in text and "turn 1 tool check: no," in text and "turn 2 model" in text
    assert "outcome reward" in text


def test_resume_mid_run_equals_the_uninterrupted_run_bit_for_bit(agent_run, tmp_path):
    cfg, straight, _ = agent_run
    resumed = tmp_path / "resumed"
    train(load_config("tiny_agent_calc", overrides(resumed, **{"train.steps": 1})))
    cfg2 = load_config("tiny_agent_calc", overrides(resumed))
    train(cfg2)  # resumes from checkpoint 1
    step_a, params_a = params_of(cfg2, resumed)
    step_b, params_b = params_of(cfg, straight)
    assert step_a == step_b == 2
    for a, b in zip(params_a, params_b):
        np.testing.assert_array_equal(a, b)
    rows_a = [r for r in read_metrics(resumed) if "grad_norm" in r]
    rows_b = [r for r in read_metrics(straight) if "grad_norm" in r]
    for key in ("reward_mean", "agent/turns_mean", "agent/model_tokens_mean", "loss"):
        assert [r[key] for r in rows_a] == [r[key] for r in rows_b], key


def test_the_unpacked_update_trains_the_same_first_step(agent_run, tmp_path):
    """Step 1 plays the same episodes with the same parameters; packed (the fixture's run) and unpacked updates
    of them agree to float tolerance."""
    _, straight, _ = agent_run
    run_dir = tmp_path / "unpacked"
    train(load_config("tiny_agent_calc", overrides(run_dir, **{"train.steps": 1, "optim.packing": "false"})))
    a = [r for r in read_metrics(run_dir) if "grad_norm" in r][0]
    b = [r for r in read_metrics(straight) if "grad_norm" in r][0]
    assert a["reward_mean"] == b["reward_mean"] and a["agent/model_tokens_mean"] == b["agent/model_tokens_mean"]
    assert a["update_tokens"] == b["update_tokens"]
    for key in ("loss", "grad_norm", "entropy"):
        np.testing.assert_allclose(a[key], b[key], rtol=1e-4, atol=1e-6, err_msg=key)


def test_a_bad_environment_is_one_line_before_the_model_loads(tmp_path):
    run_dir = tmp_path / "bad"
    cfg = load_config("tiny_agent_calc", overrides(run_dir, **{"agent.env": f"{ENVS}:BadReset"}))
    with pytest.raises(ConfigError, match=r"agent.env .*reset\(\) on the first data row raised KeyError") as e:
        train(cfg)
    assert "\n" not in str(e.value)
    assert not (run_dir / "config.yaml").exists()  # nothing of the run started
    with pytest.raises(ConfigError, match="agent.env.*no such file"):
        train(load_config("tiny_agent_calc", overrides(run_dir, **{"agent.env": f"{tmp_path}/none.py:X"})))


def test_shipped_recipe_runs_from_the_command_line(tmp_path):
    run_dir = tmp_path / "calc"
    cmd = [sys.executable, "-m", "dapo_jax.cli", "train", "tiny_agent_calc", "train.steps=1", "data.eval_size=4",
           "train.eval_k=1", "rollout.gen_batch=4", "rollout.train_batch=4", f"train.run_dir={run_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, env=os.environ.copy(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = json.loads(proc.stdout.strip().splitlines()[-1])
    assert final["step"] == 1 and "eval/tool_call_rate" in final
    assert "agent/tool_call_rate" in read_metrics(run_dir)[1]


def test_eval_command_plays_episodes_of_an_agent_run(agent_run, tmp_path):
    """`dapo-jax eval RUN_DIR` of an agent run: episodes, as the run's own evaluation plays them, so the
    run's eval/accuracy at its last step is reproduced; the tool-call rate is reported."""
    from dapo_jax.eval_command.report import print_report, write_report
    from dapo_jax.eval_command.run import resolve_target, run_eval

    _, run_dir, final = agent_run
    report = run_eval(resolve_target(str(run_dir)), [])
    res = report["results"]["eval"]
    assert report["step"] == 2 and res["accuracy"] == final["eval/accuracy"]
    assert res["tool_call_rate"] == final["eval/tool_call_rate"] and res["problems"] == 4
    assert report["training_eval"]["reproduced"]
    out = io.StringIO()
    print_report(report, file=out, plain=True)
    assert "tool-call rate" in out.getvalue()
    samples = write_report(report, tmp_path / "r.json")[1].read_text().splitlines()
    assert json.loads(samples[0])["episodes"][0]["turns"][0]["role"] == "model"
