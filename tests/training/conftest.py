"""A tiny HF-format model + character tokenizer for the trainer's tests, and a tiny run config."""

from pathlib import Path

import pytest



def make_tiny_model(path: Path, seed: int = 0) -> Path:
    from flax import nnx

    from dapo_jax.data.char_tokenizer import build_char_tokenizer, save_char_tokenizer
    from dapo_jax.models.config import ModelConfig
    from dapo_jax.models.decoder import Decoder
    from dapo_jax.models.hf_io import save_pretrained

    tok = build_char_tokenizer()
    # vocab 100 > len(tok) = 99 so that a tensor axis of 2 divides it.
    cfg = ModelConfig(model_type="qwen2", vocab_size=100, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                      tie_word_embeddings=True, attention_bias=True, eos_token_id=(tok.eos_token_id,), pad_token_id=tok.pad_token_id,
                      max_position_embeddings=64)
    save_pretrained(Decoder(cfg, rngs=nnx.Rngs(seed)), path)
    save_char_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny_model"))


def tiny_overrides(model_dir: Path, run_dir: Path, **extra) -> list[str]:
    """A seconds-long run: random tiny model, synthetic task, GRPO-style objective without a reference."""
    base = {
        "model.path": str(model_dir),
        "data.max_prompt_length": 8,
        "data.eval_size": 8,
        "data.train.options": "{max_operand: 9, heldout_size: 20}",
        "data.eval.options": "{max_operand: 9, heldout_size: 20}",
        "objective.name": "dapo",
        "objective.overlong_buffer": 2,
        "objective.dynamic_sampling_metric": "reward",  # length penalties give reward spread
        "rollout.G": 4,
        "rollout.train_batch": 8,
        "rollout.gen_batch": 8,
        "rollout.max_gen_batches": 2,
        "rollout.on_starvation": "train_on_kept",
        "rollout.max_new_tokens": 4,
        "optim.lr": 1e-3,
        "optim.weight_decay": 0.0,
        "optim.warmup_steps": 0,
        "train.steps": 2,
        "train.eval_k": 2,
        "train.checkpoint_every": 1,
        "train.progress": "false",
        "train.tensorboard": "false",
        "train.run_dir": str(run_dir),
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


@pytest.fixture(scope="session")
def overrides_for():
    """`overrides_for(model_dir, run_dir, **extra)` -> the tiny run's dotted overrides."""
    return tiny_overrides


def finite_step_rows(run_dir: Path, keys, *, steps: int, having: str = "grad_norm") -> list[dict]:
    """The run's metrics rows that have `having`: `steps` of them, each with finite `keys`."""
    import math

    from dapo_jax.training.metrics import read_metrics

    rows = [r for r in read_metrics(run_dir) if having in r]
    assert len(rows) == steps
    for r in rows:
        for key in keys:
            assert math.isfinite(r[key]), (key, r)
    return rows
