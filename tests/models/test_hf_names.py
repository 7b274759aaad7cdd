"""Our parameter paths <-> Hugging Face tensor names (dapo_jax/models/hf_names.py), by hand, and against the
names transformers itself gives the same architecture's parameters."""

import numpy as np
import torch
import transformers
from flax import nnx

from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder
from dapo_jax.models.hf_names import ALWAYS_IGNORED, HEAD_NAMES, hf_name, is_transposed


def test_hand_cases():
    assert hf_name(("layers", 3, "self_attn", "q_proj", "kernel")) == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name(("layers", 0, "self_attn", "q_proj", "bias")) == "model.layers.0.self_attn.q_proj.bias"
    assert hf_name(("embed_tokens", "embedding")) == "model.embed_tokens.weight"
    assert hf_name(("layers", 1, "input_layernorm", "weight")) == "model.layers.1.input_layernorm.weight"
    assert hf_name(("lm_head", "kernel")) == "lm_head.weight"
    assert is_transposed(("layers", 3, "mlp", "up_proj", "kernel"))
    assert not is_transposed(("embed_tokens", "embedding")) and not is_transposed(("layers", 0, "q_proj", "bias"))
    assert ALWAYS_IGNORED.fullmatch("model.layers.7.self_attn.rotary_emb.inv_freq")
    assert not ALWAYS_IGNORED.fullmatch("model.layers.7.self_attn.q_proj.weight")
    assert set(HEAD_NAMES.values()) == {"score.weight", "score.bias", "score.0.weight", "score.0.bias",
                                        "score.2.weight", "score.2.bias"}


def test_every_parameter_is_named_as_transformers_names_it_with_its_shape(tmp_path):
    """A tiny untied Qwen2 from transformers: its state dict's names, and each kernel's [out, in] shape,
    are exactly ours mapped by hf_name (kernels transposed)."""
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(tmp_path)
    theirs = {k: tuple(v.shape) for k, v in transformers.Qwen2ForCausalLM.from_pretrained(tmp_path).state_dict().items()
              if not ALWAYS_IGNORED.fullmatch(k)}
    ours = nnx.eval_shape(lambda: Decoder(ModelConfig.from_pretrained(tmp_path), rngs=nnx.Rngs(0)))
    mapped = {}
    for path, var in nnx.to_flat_state(nnx.state(ours, nnx.Param)):
        shape = tuple(np.shape(var.get_value()))
        mapped[hf_name(path)] = shape[::-1] if is_transposed(path) else shape
    assert mapped == theirs
