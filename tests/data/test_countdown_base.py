"""The shipped Countdown base model: built with the knobs of scripts/make_countdown_base.py, which the
countdown recipe agrees with; small; and as (partially) accurate as its warmup_stats.json says."""

import json
from pathlib import Path

import numpy as np
import pytest

import dapo_jax
from dapo_jax.data import countdown
from tests.conftest import load_script

BASE = Path(dapo_jax.__file__).parent / "assets" / "countdown_base"
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not (BASE / "config.json").exists(),
                                reason=f"{BASE} not built yet: run scripts/make_countdown_base.py")


@pytest.fixture(scope="module")
def script():
    return load_script("make_countdown_base")


def test_config_matches_the_script_knobs(script):
    cfg = json.loads((BASE / "config.json").read_text())
    assert cfg["model_type"] == "qwen2"
    for key, value in script.MODEL.items():
        assert cfg[key] == value, key
    assert cfg["max_position_embeddings"] >= script.PROMPT_LEN + script.MAX_NEW_TOKENS
    assert sum(f.stat().st_size for f in BASE.iterdir()) < 2e6
    readme = (BASE / "README.md").read_text()
    assert "make_countdown_base.py" in readme and str(script.TASK) in readme


def test_recipe_agrees_with_the_base(script):
    from dapo_jax.training.config.run import load_config

    cfg = load_config(REPO / "dapo_jax" / "configs" / "countdown_dapo.yaml")
    task = {k: v for k, v in script.TASK.items() if k != "seed"}
    assert cfg.model.path == "dapo_jax/assets/countdown_base" and cfg.data.seed == script.TASK["seed"]
    for source in (cfg.data.train, cfg.data.eval):
        assert source.name == "countdown" and source.options == task
    assert cfg.data.max_prompt_length == script.PROMPT_LEN
    assert cfg.rollout.max_new_tokens == script.MAX_NEW_TOKENS
    assert [f.name for f in cfg.reward.functions] == ["countdown"]
    rows = countdown.countdown_rows("train", **task) + countdown.countdown_rows("heldout", **task)
    assert max(len(r["prompt"]) for r in rows) <= script.PROMPT_LEN
    assert max(len(r["solution"]) for r in rows) < script.MAX_NEW_TOKENS


def test_greedy_accuracy_is_partial_as_recorded(script):
    """Greedy held-out accuracy, re-decoded here and judged by the sandboxed reward, matches the record;
    the recorded sampled accuracy is low enough to leave RL room."""
    import jax
    from flax import nnx

    from dapo_jax.models.hf_io import load_pretrained, load_tokenizer
    from dapo_jax.rewards import make_reward
    from dapo_jax.rewards.sandbox import SandboxUnavailable
    from dapo_jax.sampling import SamplingConfig, make_generate

    try:
        reward = make_reward("countdown", right=1.0, wrong=0.0)
    except SandboxUnavailable as e:
        pytest.skip(str(e))
    stats = json.loads((BASE / "warmup_stats.json").read_text())
    assert 0.05 <= stats["sampled_accuracy"] <= 0.3 and stats["greedy_accuracy"] < 0.6
    tok = load_tokenizer(BASE)
    rows = countdown.countdown_rows("heldout", **{k: v for k, v in script.TASK.items() if k != "train_size"})
    rows = rows[:script.EVAL_SIZE]
    pads = [[tok.pad_token_id] * (script.PROMPT_LEN - len(r["prompt"])) for r in rows]
    ids = np.array([p + tok.encode(r["prompt"], add_special_tokens=False) for p, r in zip(pads, rows)], np.int32)
    mask = (np.arange(script.PROMPT_LEN)[None] >= np.array([len(p) for p in pads])[:, None]).astype(np.int32)
    graphdef, state = nnx.split(load_pretrained(BASE))
    config = SamplingConfig(max_new_tokens=script.MAX_NEW_TOKENS, temperature=0.0,
                            eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id)
    out = make_generate(graphdef, config, 1)(state, ids, mask, jax.random.key(0))
    resp, rmask = np.asarray(out.response_ids[:, 0]), np.asarray(out.response_mask[:, 0])
    texts = tok.batch_decode([r[m.astype(bool)].tolist() for r, m in zip(resp, rmask)], skip_special_tokens=True)
    greedy = np.mean(reward.score_many(texts, [r["answer"] for r in rows])[1])
    assert abs(greedy - stats["greedy_accuracy"]) < 0.03, (greedy, stats)
