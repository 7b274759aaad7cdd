"""The bundled base models' makers (scripts/make_{tiny,cot,countdown}_base.py) at a tiny scale: each warms
its model up through `dapo-jax sft` (no training loop of its own), stops early at train.stop_at_accuracy,
and ships a loadable model, so the scripts cannot rot while the shipped assets stay as they are."""

import json

import numpy as np
import pytest
import yaml

from dapo_jax.models.hf_io import load_pretrained
from dapo_jax.training.metrics import read_metrics
from tests.conftest import load_script


@pytest.mark.slow
@pytest.mark.parametrize("name", ["make_tiny_base", "make_cot_base", "make_countdown_base"])
def test_a_maker_warms_up_through_dapo_jax_sft_and_stops_at_the_target(name, tmp_path):
    import jax
    from flax import nnx

    script = load_script(name)
    assert not hasattr(script, "supervised_step")  # the old loop of its own is gone
    out, work = tmp_path / "out", tmp_path / "work"
    # target 0: the first evaluation (step 2) reaches it, so the run stops there and not at --max-steps 6
    script.main(["--out", str(out), "--work", str(work), "--max-steps", "6", "--eval-every", "2",
                 "--eval-size", "8", "--train-size", "64", "--target", "0"])
    config = yaml.safe_load((work / "warmup.yaml").read_text())
    assert config["objective"] == {"name": "sft"} and config["train"]["stop_at_accuracy"] == 0
    rows = read_metrics(work / "run")
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 2]
    stats = json.loads((out / "warmup_stats.json").read_text())
    assert stats["steps"] == 2 and 0.0 <= stats["greedy_accuracy"] <= 1.0
    assert stats["loss"] == [r["loss"] for r in rows if "loss" in r][-1]
    for f in ("config.json", "model.safetensors", "README.md", "tokenizer.json"):
        assert (out / f).exists(), f
    shipped, initial = load_pretrained(out), load_pretrained(work / "init")
    a = [np.asarray(x) for x in jax.tree.leaves(nnx.state(shipped, nnx.Param))]
    b = [np.asarray(x) for x in jax.tree.leaves(nnx.state(initial, nnx.Param))]
    assert any(not np.array_equal(x, y) for x, y in zip(a, b)), "the shipped model is the untrained one"
