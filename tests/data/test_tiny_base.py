"""The shipped tiny base model: loads with load_pretrained and AutoTokenizer, is Qwen2, matches transformers,
and is as (partially) accurate as its README says (skipped until scripts/make_tiny_base.py has run)."""

import json
from pathlib import Path

import numpy as np
import pytest

import dapo_jax
from dapo_jax.data import synthetic

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
    import jax.numpy as jnp
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_jax.models.decoder import positions_from_mask
    from dapo_jax.models.hf_io import load_pretrained

    tok = AutoTokenizer.from_pretrained(TINY)
    model = load_pretrained(TINY)
    assert model.config.model_type == "qwen2" and model.config.vocab_size == len(tok)
    assert model.config.eos_token_id == (tok.eos_token_id,) and model.config.pad_token_id == tok.pad_token_id
    text = "37+5=42"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    x = jnp.asarray([ids], jnp.int32)
    mask = jnp.ones_like(x)
    ours = np.asarray(model.logits(model(x, positions_from_mask(mask), mask)[0]))
    ref = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = ref(torch.tensor([ids])).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)


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
