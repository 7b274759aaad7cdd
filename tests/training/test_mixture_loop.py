"""End to end: a two-source mixture with difficulty filtering trains, logs per-source metrics, resumes
exactly as the uninterrupted run, and starts a new round on new data only when asked (logged)."""

import json
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from dapo_jax.plot import plot_run
from dapo_jax.training.state.checkpoint import Checkpointer
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import load_config
from dapo_jax.training.loop import load_trained_model, train
from dapo_jax.training.metrics import read_metrics

SOURCES = ("{arith: {weight: 0.7, train: {name: synthetic, options: {max_operand: 9, heldout_size: 20}}}, "
           "cot: {weight: 0.3, train: {name: cot, options: {min_terms: 2, max_terms: 2, heldout_size: 10, "
           "train_size: 40}}, reward: {functions: [{name: cot}]}}}")
MIXTURE = {"data.train": "null", "data.sources": SOURCES, "data.difficulty": "{visits: 1, drop: all_wrong}",
           "data.eval": "null", "train.steps": 4}
PER_SOURCE = ("reward_mean", "accuracy", "kept_fraction", "generated_groups", "response_length_right_mean",
              "response_length_wrong_mean")


@pytest.fixture(scope="module")
def config(tiny_model_dir, overrides_for):
    def make(run_dir, **extra):
        overrides = overrides_for(tiny_model_dir, run_dir, **{**MIXTURE, **extra})
        return load_config(None, [o for o in overrides if not o.startswith("data.train.options")])
    return make


@pytest.fixture(scope="module")
def straight(config, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    cfg = config(run_dir)
    train(cfg)
    return cfg, run_dir


def params(cfg, run_dir):
    model, _, step = load_trained_model(cfg, run_dir)
    return step, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def meta(cfg, run_dir):
    from tests.training.test_loop import _abstract

    return Checkpointer(run_dir / "checkpoints").restore_latest(_abstract(cfg)).meta


def test_per_source_metrics_and_the_length_signal_are_logged(straight):
    cfg, run_dir = straight
    rows = [r for r in read_metrics(run_dir) if "grad_norm" in r or "steps_skipped" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert "response_length_right_mean" in r and "response_length_wrong_mean" in r
        assert r["source/arith/generated_groups"] + r.get("source/cot/generated_groups", 0) == r["generated_groups"]
        for key in PER_SOURCE:
            assert f"source/arith/{key}" in r, key
    dropped = [r["difficulty/dropped"] for r in rows]
    assert dropped[-1] > 0 and dropped == sorted(dropped)  # all-wrong prompts leave, one visit each
    assert all(r["difficulty/dropped"] == r["source/arith/dropped"] + r["source/cot/dropped"] for r in rows)
    figures = {p.stem for p in plot_run(run_dir)}
    assert {"source_accuracy", "source_reward", "source_kept_fraction", "length_by_outcome"} <= figures


def test_a_resumed_mixture_run_equals_the_uninterrupted_one(straight, config, tmp_path):
    cfg, run_dir = straight
    split = tmp_path / "split"
    train(config(split, **{"train.steps": 2}))
    resumed_cfg = config(split)  # train.steps 4: resumes from step 2
    train(resumed_cfg)
    (step_a, params_a), (step_b, params_b) = params(resumed_cfg, split), params(cfg, run_dir)
    assert step_a == step_b == 4
    for a, b in zip(params_a, params_b):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    meta_a, meta_b = meta(cfg, split), meta(cfg, run_dir)
    assert meta_a["stream"] == meta_b["stream"] and meta_a["difficulty"] == meta_b["difficulty"]
    assert meta_a["stream"]["drawn"] > 0 and any(meta_a["difficulty"]["history"].values())
    rows_a, rows_b = read_metrics(split), read_metrics(run_dir)
    for key in ("reward_mean", "difficulty/dropped", *(f"source/{s}/{k}" for s in ("arith", "cot") for k in PER_SOURCE)):
        assert [r.get(key) for r in rows_a] == [r.get(key) for r in rows_b], key


def test_a_new_data_section_is_a_new_round_only_when_asked(straight, config, tmp_path):
    cfg, run_dir = straight
    copy = tmp_path / "rounds"
    shutil.copytree(run_dir, copy)
    arith_only = "{arith: {train: {name: synthetic, options: {max_operand: 9, heldout_size: 10}}}}"
    with pytest.raises(ConfigError, match=r"different config \(data.sources.*set data.new_round=true"):
        train(config(copy, **{"data.sources": arith_only, "train.steps": 5}))
    with pytest.raises(ConfigError, match=r"other keys changed too \(rollout.G: 4 -> 8\)"):  # not a data key
        train(config(copy, **{"data.sources": arith_only, "train.steps": 5, "data.new_round": "true",
                              "rollout.G": 8}))
    train(config(copy, **{"data.sources": arith_only, "train.steps": 5, "data.new_round": "true"}))
    rounds = [json.loads(line) for line in (copy / "rounds.jsonl").read_text().splitlines()]
    assert len(rounds) == 1 and rounds[0]["round"] == 1 and rounds[0]["after_step"] == 4
    assert "data.sources.cot.weight" in rounds[0]["changed"]
    assert rounds[0]["changed"]["data.sources.arith.weight"] == [0.7, 1.0]
    assert "cot" in (copy / "config.round-0.yaml").read_text()
    last = read_metrics(copy)[-1]
    assert last["step"] == 5 and last["data_round"] == 1 and "source/cot/accuracy" not in last
    assert "data_round" not in read_metrics(copy)[-2]
    m = meta(config(copy, **{"data.sources": arith_only, "train.steps": 5}), copy)
    assert m["data_round"] == 1 and list(m["stream"]["sources"]) == ["arith"]
    assert m["stream"]["drawn"] <= 16  # one step's prompts on the new data: its stream started afresh
