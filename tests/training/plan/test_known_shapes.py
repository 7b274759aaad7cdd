"""Published model shapes (training/plan/known_shapes.py): the parameter counts they give are the model cards'."""

import math

import pytest

from dapo_jax.training.plan.known_shapes import KNOWN_SHAPES, known_shape

# Model cards on the Hugging Face Hub: "Number of Parameters" and "(Non-Embedding)", in billions, as printed.
# The cards round loosely (Qwen2.5-32B's says 32.5B and 31.0B for a config.json that gives 32.76B and 31.21B;
# the Hub's file listing says 32.8B), so a count must be within 1% of its card (or its rounding): a wrong layer
# count or width is off by more.
CARDS = {
    "qwen2.5-0.5b": ("0.49", "0.36"), "qwen2.5-1.5b": ("1.54", "1.31"), "qwen2.5-3b": ("3.09", "2.77"),
    "qwen2.5-7b": ("7.61", "6.53"), "qwen2.5-14b": ("14.7", "13.1"), "qwen2.5-32b": ("32.5", "31.0"),
    "qwen2.5-72b": ("72.7", "70.0"),
    "qwen3-0.6b": ("0.6", "0.44"), "qwen3-1.7b": ("1.7", "1.4"), "qwen3-4b": ("4.0", "3.6"),
    "qwen3-8b": ("8.2", "6.95"), "qwen3-14b": ("14.8", "13.2"), "qwen3-32b": ("32.8", "31.2"),
    # Meta's cards round to the billion (1B, 3B, 8B, 70B); the safetensors totals on the Hub:
    "llama-3.2-1b": ("1.24", None), "llama-3.2-3b": ("3.21", None), "llama-3.1-8b": ("8.03", None),
    "llama-3-8b": ("8.03", None), "llama-3.1-70b": ("70.6", None), "llama-3.3-70b": ("70.6", None),
    "llama-3-70b": ("70.6", None),
}


def count(hf: dict) -> tuple[int, int]:
    """(all parameters, all but the embedding and LM head) of a config.json, written out from the architecture."""
    d, i, v, layers = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"], hf["num_hidden_layers"]
    h, kv = hf["num_attention_heads"], hf["num_key_value_heads"]
    hd = hf.get("head_dim", d // h)
    per_layer = d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * i + 2 * d
    if hf["model_type"] == "qwen2":
        per_layer += h * hd + 2 * kv * hd  # q, k, v biases
    if hf["model_type"] == "qwen3":
        per_layer += 2 * hd  # q_norm, k_norm
    body = layers * per_layer + d
    return body + v * d * (1 if hf["tie_word_embeddings"] else 2), body


def matches(value: int, printed: str) -> bool:
    """`value` (parameters) within 1% of the card's figure (billions), or within its last printed digit's rounding."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(value / 1e9 - float(printed)) <= max(0.01 * float(printed), 0.5 * 10 ** -decimals)


@pytest.mark.parametrize("name", sorted(KNOWN_SHAPES))
def test_counts_are_the_model_cards(name):
    total, body = count(KNOWN_SHAPES[name])
    card_total, card_body = CARDS[name]
    assert matches(total, card_total), (name, total)
    if card_body is not None:
        assert matches(body, card_body), (name, body)


def test_the_decoder_builds_the_count_written_out():
    """The model the plan builds from a shape holds exactly the parameters counted above (two families)."""
    import jax
    from flax import nnx

    from dapo_jax.models.config import ModelConfig
    from dapo_jax.models.decoder import Decoder

    for name in ("qwen3-0.6b", "llama-3.2-1b"):
        cfg = ModelConfig.from_hf_dict(KNOWN_SHAPES[name])
        params = nnx.state(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))), nnx.Param)
        assert sum(math.prod(x.shape) for x in jax.tree.leaves(params)) == count(KNOWN_SHAPES[name])[0]


@pytest.mark.parametrize("path, key", [
    ("/models/Qwen2.5-32B", "qwen2.5-32b"), ("Qwen2.5-32B-Instruct", "qwen2.5-32b"),
    ("/m/Qwen2.5-1.5B-Instruct/", "qwen2.5-1.5b"), ("qwen2_5-7b-instruct", "qwen2.5-7b"),
    ("Qwen2.5-Math-7B", None),  # another model family's shape: not guessed
    ("Qwen3-0.6B-Base", "qwen3-0.6b"), ("Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("Meta-Llama-3-70B", "llama-3-70b"), ("Llama-3.2-1B", "llama-3.2-1b"), ("Llama-3.2-11B-Vision", None),
    ("models/tiny", None),
])
def test_names_match_the_longest_known_key(path, key):
    found = known_shape(path)
    assert (found[0] if found else None) == key
