"""Shared pieces of the agent tests: a chain decoder, a random decoder, an id-level renderer."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from dapo_jax.agents.render import DeltaRenderer
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder


def chain_decoder(vocab: int = 32, margin: float = 50.0) -> Decoder:
    """A real Decoder whose next token is `(last token + 1) mod V` with a 50-nat margin (as in
    tests/sampling/test_sampler.py): every layer weight 0, a one-hot embedding, a shifted head."""
    cfg = ModelConfig(model_type="qwen2", vocab_size=vocab, hidden_size=vocab, intermediate_size=4,
                      num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, head_dim=2,
                      attention_bias=False)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    for path, param in nnx.iter_graph(model):
        if isinstance(param, nnx.Param) and "layers" in path and "layernorm" not in "/".join(map(str, path)):
            param[...] = jnp.zeros_like(param[...])
    model.embed_tokens.embedding[...] = jnp.eye(vocab)
    model.lm_head.kernel[...] = jnp.roll(jnp.eye(vocab), 1, axis=1) * margin / np.sqrt(vocab)
    return model


def random_decoder(vocab: int = 24, seed: int = 0) -> Decoder:
    """A small float32 decoder with random weights (every attention path matters)."""
    cfg = ModelConfig(model_type="qwen2", vocab_size=vocab, hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      attention_bias=True, tie_word_embeddings=False)
    model = Decoder(cfg, rngs=nnx.Rngs(seed))
    for path, param in nnx.iter_graph(model):  # larger weights: a peaked, input-dependent distribution
        if isinstance(param, nnx.Param) and "layernorm" not in "/".join(map(str, path)) and "norm" != path[-2]:
            param[...] = param[...] * 8.0
    return model


def id_renderer() -> DeltaRenderer:
    """A template that concatenates contents, whose 'text' is ids written as `chr(ord('A') + id)`."""
    render = lambda messages, gen: "".join(m["content"] for m in messages) + ("" if not gen else "")
    encode = lambda text: [ord(c) - ord("A") for c in text]
    decode = lambda ids: "".join(chr(ord("A") + int(i)) for i in ids)
    return DeltaRenderer(render, encode, decode)


def text(ids) -> str:
    return "".join(chr(ord("A") + int(i)) for i in ids)
