"""The shipped chain-of-thought base model: built with the knobs of scripts/make_cot_base.py, which
the cot configs agree with; loads with load_pretrained and AutoTokenizer, matches transformers, and
is as (partially) accurate as its warmup_stats.json says (skipped until the script has run)."""

import json
from pathlib import Path

import numpy as np
import pytest

import dapo_jax
from dapo_jax.data import cot
from tests.conftest import load_script
from tests.data.base_model_parity import assert_loads_and_matches_transformers

COT = Path(dapo_jax.__file__).parent / "assets" / "cot_base"
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not (COT / "config.json").exists(),
                                reason=f"{COT} not built yet: run scripts/make_cot_base.py")


@pytest.fixture(scope="module")
def script():
    """scripts/make_cot_base.py as a module (its knobs are module constants)."""
    return load_script("make_cot_base")


def test_config_matches_the_script_knobs(script):
    cfg = json.loads((COT / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["Qwen2ForCausalLM"]
    for key, value in script.MODEL.items():
        assert cfg[key] == value, key
    assert cfg["max_position_embeddings"] >= script.PROMPT_LEN + script.MAX_NEW_TOKENS
    assert sum(f.stat().st_size for f in COT.iterdir()) < 4e6
    readme = (COT / "README.md").read_text()
    assert "make_cot_base.py" in readme and str(script.TASK) in readme


@pytest.mark.parametrize("name", ["cot_dapo", "cot_grpo", "cot_dr_grpo"])
def test_configs_agree_with_the_base(script, name):
    """Same task and split seed as the warm-up (held-out problems unseen), prompts fit, and the
    token budget is the one the base's figures were measured with."""
    from dapo_jax.training.config.run import load_config

    cfg = load_config(REPO / "dapo_jax" / "configs" / f"{name}.yaml")
    task = {k: v for k, v in script.TASK.items() if k not in ("seed", "train_size")}
    assert cfg.model.path == "dapo_jax/assets/cot_base"
    assert cfg.data.seed == script.TASK["seed"]
    for source in (cfg.data.train, cfg.data.eval):
        assert source.name == "cot" and {**task, **source.options} == task
    assert cfg.data.max_prompt_length == script.PROMPT_LEN
    assert cfg.rollout.max_new_tokens == script.MAX_NEW_TOKENS
    assert [f.name for f in cfg.reward.functions] == ["cot"]
    assert cfg.train.run_dir == f"runs/{name}"
    longest = max(len(r["prompt"]) for r in cot.cot_rows("train", **task) + cot.cot_rows("heldout", **task))
    assert longest <= script.PROMPT_LEN


def test_loads_and_matches_transformers():
    from dapo_jax.data.char_tokenizer import build_char_tokenizer

    prompt = "a12+b7+c45+d3="
    text = prompt + cot.solution(prompt)
    ids = assert_loads_and_matches_transformers(COT, text)  # a whole worked trace
    assert ids == build_char_tokenizer().encode(text, add_special_tokens=False) and len(ids) == len(text)


def test_auto_tokenizer_encodes_traces_exactly():
    """transformers 5 loads the folder as Qwen2Tokenizer (its config.json says qwen2); its encode used to
    drop the newlines and spaces of the traces (data/char_tokenizer.py says why it no longer does)."""
    from transformers import AutoTokenizer

    from dapo_jax.data.char_tokenizer import build_char_tokenizer

    text = cot.solution("a12+b7+c45+d3=")
    ours = build_char_tokenizer().encode(text, add_special_tokens=False)
    assert AutoTokenizer.from_pretrained(COT).encode(text, add_special_tokens=False) == ours


def test_accuracy_is_partial_as_recorded(script):
    """Greedy held-out accuracy, re-decoded here with the project's sampler, matches the recorded one;
    the recorded sampled accuracy is in the band that leaves RL room."""
    import jax
    from flax import nnx

    from dapo_jax.models.hf_io import load_pretrained, load_tokenizer
    from dapo_jax.sampling import SamplingConfig, make_generate

    stats = json.loads((COT / "warmup_stats.json").read_text())
    assert 0.15 <= stats["sampled_accuracy"] <= 0.45 and stats["greedy_accuracy"] < 0.9
    tok = load_tokenizer(COT)
    rows = cot.cot_rows("heldout", **{k: v for k, v in script.TASK.items() if k != "train_size"})
    rows = rows[:script.EVAL_SIZE]
    pads = [[tok.pad_token_id] * (script.PROMPT_LEN - len(r["prompt"])) for r in rows]
    ids = np.array([p + tok.encode(r["prompt"], add_special_tokens=False) for p, r in zip(pads, rows)], np.int32)
    mask = (np.arange(script.PROMPT_LEN)[None] >= np.array([len(p) for p in pads])[:, None]).astype(np.int32)
    graphdef, state = nnx.split(load_pretrained(COT))
    config = SamplingConfig(max_new_tokens=script.MAX_NEW_TOKENS, temperature=0.0,
                            eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id)
    out = make_generate(graphdef, config, 1)(state, ids, mask, jax.random.key(0))
    resp, rmask = np.asarray(out.response_ids[:, 0]), np.asarray(out.response_mask[:, 0])
    texts = tok.batch_decode([r[m.astype(bool)].tolist() for r, m in zip(resp, rmask)], skip_special_tokens=True)
    greedy = np.mean([cot.is_correct(t, r["answer"]) for t, r in zip(texts, rows)])
    assert abs(greedy - stats["greedy_accuracy"]) < 0.03, (greedy, stats)
