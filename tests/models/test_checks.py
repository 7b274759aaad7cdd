"""Load-time model checks: non-finite weights and a tokenizer that does not fit the embedding."""

import numpy as np
import pytest
from flax import nnx

from dapo_jax.data.char_tokenizer import build_char_tokenizer
from dapo_jax.models.checks import check_finite_weights, check_tokenizer_fits
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder
from dapo_jax.models.safetensors_files import CheckpointError


def tiny(vocab=100, eos=(1,), pad=0):
    cfg = ModelConfig(model_type="qwen2", vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, eos_token_id=eos, pad_token_id=pad)
    return Decoder(cfg, rngs=nnx.Rngs(0))


def test_finite_model_passes():
    check_finite_weights(tiny(), source="m")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_single_non_finite_weight_is_named(bad):
    model = tiny()
    w = model.layers[0].mlp.up_proj.kernel
    w.set_value(w.get_value().at[1, 2].set(bad))
    with pytest.raises(CheckpointError, match=r"m: tensor 'model.layers.0.mlp.up_proj.weight' holds 1 non-finite"):
        check_finite_weights(model, source="m")


def test_tokenizer_must_fit_the_embedding():
    tok = build_char_tokenizer()  # 99 tokens
    check_tokenizer_fits(tiny(vocab=99).config, tok, source="m")
    with pytest.raises(CheckpointError, match="99 tokens but the model's embedding has vocab_size=50"):
        check_tokenizer_fits(tiny(vocab=50).config, tok, source="m")


def test_special_tokens_outside_the_vocabulary():
    tok = build_char_tokenizer()
    with pytest.raises(CheckpointError, match=r"eos_token_id \(config\) = 150 is outside the vocabulary \[0, 100\)"):
        check_tokenizer_fits(tiny(eos=(1, 150)).config, tok, source="m")
    with pytest.raises(CheckpointError, match="pad_token_id"):
        check_tokenizer_fits(tiny(pad=-1).config, tok, source="m")


def test_qwen_tokenizer_on_a_tiny_model(shared):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(shared("tokenizers", "qwen2.5")))
    with pytest.raises(CheckpointError, match="does not belong to this model"):
        check_tokenizer_fits(tiny(vocab=100).config, tok, source="m")
