"""Loggers: train.loggers picks TensorBoard and/or W&B (train.tensorboard still works alone); W&B gets
the same finite scalars at the same steps, resumes its run, runs offline; only process 0 logs."""

import json
import sys
import types

import pytest

from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import load_config
from dapo_jax.training.loggers import TensorBoardLogger, WandbLogger, make_loggers
from dapo_jax.training.metrics import MetricsWriter


def test_loggers_key_and_the_older_tensorboard_switch():
    assert load_config(None).train.active_loggers == ("tensorboard",)
    assert load_config(None, ["train.tensorboard=false"]).train.active_loggers == ()
    assert load_config(None, ["train.loggers=[wandb]"]).train.active_loggers == ("wandb",)
    both = load_config(None, ["train.loggers=[tensorboard, wandb]", "train.wandb.mode=offline"]).train
    assert both.active_loggers == ("tensorboard", "wandb") and both.wandb.mode == "offline"
    with pytest.raises(ConfigError, match="train.loggers"):
        load_config(None, ["train.loggers=[mlflow]"])


def test_changing_loggers_does_not_block_a_resume(tmp_path):
    from dapo_jax.training.state.run_dir import RunDir

    first = load_config(None, [f"train.run_dir={tmp_path}"])
    RunDir(first).save_config()
    RunDir(load_config(None, [f"train.run_dir={tmp_path}", "train.loggers=[wandb]", "train.wandb.project=x",
                              "train.rollouts_every=3"])).check_same_config()


@pytest.fixture
def fake_wandb(monkeypatch):
    """A stand-in `wandb` module recording what the logger does with it."""
    calls = {"init": [], "log": [], "finish": 0}

    class Run:
        def log(self, data, step):
            calls["log"].append((step, dict(data)))

        def finish(self):
            calls["finish"] += 1

    def init(**kw):
        calls["init"].append(kw)
        return Run()

    mod = types.SimpleNamespace(init=init)
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return calls


def test_wandb_gets_the_rows_scalars_and_resumes_its_run(tmp_path, fake_wandb):
    cfg = load_config(None, [f"train.run_dir={tmp_path}", "train.loggers=[tensorboard, wandb]",
                             "train.wandb.tags=[a]", "train.wandb.mode=offline"])
    loggers = make_loggers(cfg, tmp_path)
    assert [type(x) for x in loggers] == [TensorBoardLogger, WandbLogger]
    w = MetricsWriter(tmp_path, loggers=loggers)
    w.write(3, {"reward_mean": 0.5, "flag": True, "nan": float("nan"), "name": "x"})
    w.close()
    init = fake_wandb["init"][0]
    run_id = init["id"]
    assert len(run_id) == 12 and init["resume"] == "allow" and init["mode"] == "offline"
    assert init["name"] == tmp_path.name and init["tags"] == ["a"] and init["config"]["train"]["steps"] == cfg.train.steps
    assert fake_wandb["log"] == [(3, {"reward_mean": 0.5})] and fake_wandb["finish"] == 1
    assert (tmp_path / "wandb_run_id").read_text().strip() == run_id
    fake_wandb["init"].clear()
    make_loggers(cfg, tmp_path)  # a resumed run continues the same W&B run
    assert fake_wandb["init"][0]["id"] == run_id
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["reward_mean"] == 0.5


def test_missing_wandb_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    cfg = load_config(None, ["train.loggers=[wandb]"])
    with pytest.raises(ConfigError, match=r"\.\[wandb\]"):
        make_loggers(cfg, tmp_path)


def test_disabled_writer_builds_no_logger(tmp_path, fake_wandb):
    MetricsWriter(tmp_path / "x", loggers=[], enabled=False).write(1, {"a": 1.0})
    assert not fake_wandb["init"] and not (tmp_path / "x").exists()


def test_real_wandb_offline_needs_no_network(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is an optional extra: pip install -e '.[wandb]'")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = load_config(None, [f"train.run_dir={tmp_path}", "train.loggers=[wandb]"])
    w = MetricsWriter(tmp_path, loggers=make_loggers(cfg, tmp_path))
    w.write(1, {"reward_mean": 0.25})
    w.write(2, {"reward_mean": 0.5})
    w.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))
