"""The shipped tiny base model: loads with load_pretrained and AutoTokenizer, is Qwen2, matches transformers,
and is as (partially) accurate as its README says (skipped until scripts/make_tiny_base.py has run)."""

import json
from pathlib import Path

import numpy as np
import pytest

import dapo_jax
from dapo_jax.data import synthetic
from tests.data.base_model_parity import assert_loads_and_matches_transformers

TINY = Path(dapo_jax.__file__).parent / "assets" / "tiny_base"
pytestmark = pytest.mark.skipif(not (TINY / "config.json").exists(),
                                reason=f"{TINY} not built yet: run scripts/make_tiny_base.py")


def test_config_is_small_tied_qwen2():
    cfg = json.loads((TINY / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["tie_word_embeddings"] is True
    assert sum(f.stat().st_size for f in TINY.iterdir()) < 4e6
    assert (TINY / "README.md").exists()


def test_loads_and_matches_transformers():
    assert len(assert_loads_and_matches_transformers(TINY, "37+5=42")) == 7  # one token per character


def test_accuracy_is_partial_as_recorded():
    """Greedy held-out accuracy, decoded independently with the transformers model, matches the recorded one."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stats = json.loads((TINY / "warmup_stats.json").read_text())
    assert 0.25 <= stats["sampled_accuracy"] <= 0.6 and stats["greedy_accuracy"] < 0.95
    tok = AutoTokenizer.from_pretrained(TINY)
    ref = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    rows = synthetic.synthetic_rows("heldout")
    # every default prompt has the same length (zero-padded operands): no padding needed
    prompts = torch.tensor([tok.encode(r["prompt"], add_special_tokens=False) for r in rows])
    ids = prompts
    with torch.no_grad():
        for _ in range(4):
            nxt = ref(ids).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
    texts = [tok.decode(seq[prompts.shape[1]:].tolist()).split(tok.eos_token)[0] for seq in ids]
    greedy = np.mean([synthetic.is_correct(t, r["answer"]) for t, r in zip(texts, rows)])
    assert abs(greedy - stats["greedy_accuracy"]) < 0.03, (greedy, stats)
