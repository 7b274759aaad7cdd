"""The shipped outcome reward model (dapo_jax/assets/cot_rm): transformers reads it and scores as we do,
it is small, and the probe table of its README (what it is blind to) is what it does."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import dapo_jax
from dapo_jax.data import cot
from dapo_jax.rewards.reward_model import make_learned_reward
from tests.conftest import load_script

COT_RM = Path(dapo_jax.__file__).parent / "assets" / "cot_rm"
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not (COT_RM / "config.json").exists(), reason="run scripts/make_cot_rm.py first")


def test_transformers_scores_the_shipped_model_as_the_pipeline_does():
    rm = make_learned_reward("reward_model", COT_RM, {"batch_size": 4}, max_length=48 + 144)
    prompts = ["a1+b2=", "a5+b7+c4+d3=", "a9+b9+c9=", "a2+b2=", "a3+b3+c3+d3+e3="]
    responses = [cot.solution(p) for p in prompts[:3]] + ["a2+b2=5\nAnswer: 5", "a3+b3=6\n6+c3"]
    ours, errors = rm.score_rows(prompts, responses)
    assert errors == {}
    tok = transformers.AutoTokenizer.from_pretrained(COT_RM)
    model = transformers.Qwen2ForSequenceClassification.from_pretrained(COT_RM, dtype=torch.float32).eval()
    texts = [tok.apply_chat_template([{"role": "user", "content": p}, {"role": "assistant", "content": r}],
                                     tokenize=False) for p, r in zip(prompts, responses)]
    assert texts[0] == "a1+b2=\na1+b2=3\nAnswer: 3<|endoftext|>"
    batch = tok(texts, add_special_tokens=False, padding=True, return_tensors="pt")  # left padding, as the tokenizer pads
    with torch.no_grad():
        want = model(**batch).logits[:, 0].numpy()
    np.testing.assert_allclose(ours, want, atol=1e-5, rtol=0)
    assert sum(f.stat().st_size for f in COT_RM.iterdir()) < 500_000


def test_the_readme_probe_table_is_what_the_shipped_model_does():
    script = load_script("make_cot_rm")
    stats = json.loads((COT_RM / "rm_stats.json").read_text())
    rows = cot.cot_rows("heldout", **script.TASK)[:script.HELDOUT_PROBLEMS]
    rm = make_learned_reward("reward_model", COT_RM, {"batch_size": 128}, max_length=48 + 144)
    for name, (prompts, responses, _) in script.probes(rows).items():
        scores, _ = rm.score_rows(prompts, responses)
        want = stats["probes"][name]
        assert float(scores.mean()) == pytest.approx(want["score_mean"], abs=2e-3), name
        assert float((scores > 0).mean()) == pytest.approx(want["scored_right_fraction"], abs=0.011), name
    # what the probes say: a well-formed wrong chain scores like a right one; a cut chain does not
    ref, slip, cut = (stats["probes"][k]["score_mean"] for k in (
        "reference chain (right)", "one slip carried to the answer (wrong)", "cut before the Answer line (wrong)"))
    assert abs(ref - slip) < 0.25 and cut < ref - 1.0
