"""The R1-Zero recipe (configs/qwen2.5-0.5b-gsm8k-r1-zero.yaml): its prompts and rewards on real GSM8K rows
with Qwen2.5's tokenizer, and one training step of it on a tiny model (both need ../shared)."""

import json

import numpy as np
import pytest

from dapo_jax.training.config.run import load_config
from dapo_jax.training.metrics import read_metrics
from dapo_jax.training.run_data import make_data

RECIPE = "qwen2.5-0.5b-gsm8k-r1-zero"


def test_prompts_and_rewards_on_gsm8k(shared):
    from transformers import AutoTokenizer

    gsm8k = shared("data", "gsm8k", "test.jsonl")
    tok = AutoTokenizer.from_pretrained(shared("tokenizers", "qwen2.5"))
    cfg = load_config(RECIPE, [f"data.train.name={gsm8k}", f"data.eval.name={gsm8k}", "data.train.limit=16",
                               "data.eval.limit=4"])
    stream, _, scorer = make_data(cfg, tok, cfg.objective_config)
    first = stream.examples[0]
    row = json.loads(gsm8k.read_text().splitlines()[first.index])
    assert first.text.startswith("A conversation between User and Assistant.")
    assert first.text.endswith(f"User: {row['question']}. Assistant:")
    truth = row["answer"].rsplit("####", 1)[1].strip().replace(",", "")
    assert first.answer == truth
    responses = [f" <think>some steps</think> <answer>{truth}</answer>",  # right, R1's layout: 1 + 0.5
                 f" <think>some steps</think> <answer>{int(truth) + 1}</answer>",  # wrong, the layout: 0.5
                 f" <think>some steps</think> so it is {truth}",  # a stray number is not read; no layout: 0
                 f"<answer>{truth}</answer>"]  # right without thinking: 1
    out = scorer.score(responses, [truth] * 4, prompts=[first.text] * 4, rows=[first.row] * 4)
    np.testing.assert_allclose(out.rewards, [1.5, 0.5, 0.0, 1.0])
    assert out.correct.tolist() == [True, False, False, True]


@pytest.mark.slow  # the R1-Zero prompt is ~600 characters: the one-token-a-character model's longest test prompt
def test_one_training_step_on_a_tiny_model(shared, tmp_path):
    from flax import nnx

    from dapo_jax.cli import main
    from dapo_jax.data.char_tokenizer import build_char_tokenizer, save_char_tokenizer
    from dapo_jax.models.config import ModelConfig
    from dapo_jax.models.decoder import Decoder
    from dapo_jax.models.hf_io import save_pretrained

    gsm8k = shared("data", "gsm8k", "test.jsonl")
    tok = build_char_tokenizer()  # one token a character: the R1-Zero prompt is ~600 of them
    model_cfg = ModelConfig(model_type="qwen2", vocab_size=100, hidden_size=16, intermediate_size=32,
                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                            tie_word_embeddings=True, attention_bias=True, eos_token_id=(tok.eos_token_id,),
                            pad_token_id=tok.pad_token_id,
                            max_position_embeddings=1024)
    save_pretrained(Decoder(model_cfg, rngs=nnx.Rngs(0)), tmp_path / "model")
    save_char_tokenizer(tmp_path / "model")
    rc = main(["train", RECIPE, f"model.path={tmp_path / 'model'}", "model.dtype=float32", "model.remat=none",
               f"data.train.name={gsm8k}", "data.train.limit=8", "data.eval=null", "data.max_prompt_length=1000",
               "rollout.G=2", "rollout.train_batch=2", "rollout.gen_batch=2", "rollout.max_new_tokens=8",
               "optim.num_minibatches=1", "optim.micro_batches=1", "train.steps=1", "train.progress=false",
               "train.tensorboard=false", f"train.run_dir={tmp_path / 'run'}"])
    assert rc == 0
    (row,) = [r for r in read_metrics(tmp_path / "run") if r["step"] == 1]
    assert row["reward_failures/gsm8k"] == 0 and row["reward_unreadable/gsm8k"] == 0
    assert "reward/think_format" in row and np.isfinite(row["reward_mean"])
