"""Test helpers: tiny random transformers models and copying their weights into our `Decoder`."""

from __future__ import annotations

import numpy as np
from flax import nnx

from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder


def tiny_hf_config(model_type: str = "qwen2", **overrides) -> dict:
    hf = dict(
        model_type=model_type, vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
        rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
    )
    hf.update(overrides)
    return hf


def torch_model(hf: dict, seed: int = 0):
    """A random transformers model in float32 eval mode (weights scaled up so argmax margins are wide)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cls = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config}
    config = cls[hf["model_type"]](**{k: v for k, v in hf.items() if k != "model_type"})
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1:
                p.normal_(0.0, 0.15)
            elif "bias" in [n for n, q in model.named_parameters() if q is p][0]:
                p.normal_(0.0, 0.1)
    return model


def decoder_from_torch(torch_model, hf: dict, **config_overrides) -> Decoder:
    """Our Decoder with the torch model's weights (HF Linear weight [out, in] -> kernel [in, out])."""
    cfg = ModelConfig.from_hf_dict(hf, **config_overrides)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    sd = {k: v.detach().cpu().float().numpy() for k, v in torch_model.state_dict().items()}

    def put(param, array):
        param[...] = np.asarray(array, dtype=param[...].dtype)

    put(model.embed_tokens.embedding, sd["model.embed_tokens.weight"])
    for i, layer in enumerate(model.layers):
        pre = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            lin = getattr(layer.self_attn, name)
            put(lin.kernel, sd[pre + f"self_attn.{name}.weight"].T)
            if getattr(lin, "bias", None) is not None and lin.bias is not None:
                put(lin.bias, sd[pre + f"self_attn.{name}.bias"])
        if cfg.qk_norm:
            put(layer.self_attn.q_norm.weight, sd[pre + "self_attn.q_norm.weight"])
            put(layer.self_attn.k_norm.weight, sd[pre + "self_attn.k_norm.weight"])
        for name in ("gate_proj", "up_proj", "down_proj"):
            put(getattr(layer.mlp, name).kernel, sd[pre + f"mlp.{name}.weight"].T)
        put(layer.input_layernorm.weight, sd[pre + "input_layernorm.weight"])
        put(layer.post_attention_layernorm.weight, sd[pre + "post_attention_layernorm.weight"])
    put(model.norm.weight, sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        put(model.lm_head.kernel, sd["lm_head.weight"].T)
    return model
