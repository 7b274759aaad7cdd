"""Published `config.json` values of the models a plan may name before anything is downloaded.

    hf = known_shape("/models/Qwen2.5-32B-Instruct")   # matched on the folder's name, or None
    cfg = ModelConfig.from_hf_dict(hf, dtype="bfloat16")

A plan needs shapes only. Each entry copies the fields of the model's `config.json` on the Hugging
Face Hub (`Qwen/Qwen2.5-*`, `Qwen/Qwen3-*`, `meta-llama/Llama-3.*`) that `ModelConfig.from_hf_dict`
reads; base and Instruct models share them (their token ids and context lengths can differ, and no
memory figure depends on those). The parameter counts they give are checked against the published
totals in `tests/training/plan/test_known_shapes.py`.

A name is matched by the longest key that appears in the folder's name once case, `_` and `.`
variants are folded (`Qwen2_5-7B-Instruct`, `qwen2.5-7b`, `Meta-Llama-3.1-8B`), so `qwen2.5-1.5b`
is not taken for `qwen2.5-0.5b` and `llama-3.2-1b` not for `llama-3.2-11b`.
"""

from __future__ import annotations

import re


def _qwen2(hidden, inter, layers, heads, kv, *, vocab=152064, tied=False, eps=1e-6, max_pos=131072):
    return dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=hidden, intermediate_size=inter,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                max_position_embeddings=max_pos, rope_theta=1000000.0, rms_norm_eps=eps, tie_word_embeddings=tied,
                hidden_act="silu", bos_token_id=151643, eos_token_id=151645, torch_dtype="bfloat16")


def _qwen3(hidden, inter, layers, heads, *, tied=False):
    return dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=hidden, intermediate_size=inter,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=8, head_dim=128,
                vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                tie_word_embeddings=tied, attention_bias=False, hidden_act="silu", bos_token_id=151643,
                eos_token_id=151645, torch_dtype="bfloat16")


def _llama(hidden, inter, layers, heads, *, tied=False, head_dim=None, rope_factor=8.0):
    hf = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=hidden, intermediate_size=inter,
              num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=8, vocab_size=128256,
              max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=tied,
              attention_bias=False, mlp_bias=False, hidden_act="silu", bos_token_id=128000, eos_token_id=128001,
              torch_dtype="bfloat16")
    if rope_factor is not None:
        hf["rope_scaling"] = {"rope_type": "llama3", "factor": rope_factor, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    else:
        hf["max_position_embeddings"] = 8192
    if head_dim is not None:
        hf["head_dim"] = head_dim
    return hf


KNOWN_SHAPES: dict[str, dict] = {
    # Qwen2.5 (Qwen/Qwen2.5-{size}): the three smallest tie their embeddings
    "qwen2.5-0.5b": _qwen2(896, 4864, 24, 14, 2, vocab=151936, tied=True, max_pos=32768),
    "qwen2.5-1.5b": _qwen2(1536, 8960, 28, 12, 2, vocab=151936, tied=True),
    "qwen2.5-3b": _qwen2(2048, 11008, 36, 16, 2, vocab=151936, tied=True, max_pos=32768),
    "qwen2.5-7b": _qwen2(3584, 18944, 28, 28, 4),
    "qwen2.5-14b": _qwen2(5120, 13824, 48, 40, 8, eps=1e-5),
    "qwen2.5-32b": _qwen2(5120, 27648, 64, 40, 8, eps=1e-5),
    "qwen2.5-72b": _qwen2(8192, 29568, 80, 64, 8),
    # Qwen3 (Qwen/Qwen3-{size}): head_dim 128, 8 KV heads, q/k RMSNorm, no q/k/v bias
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16, tied=True),
    "qwen3-1.7b": _qwen3(2048, 6144, 28, 16, tied=True),
    "qwen3-4b": _qwen3(2560, 9728, 36, 32, tied=True),
    "qwen3-8b": _qwen3(4096, 12288, 36, 32),
    "qwen3-14b": _qwen3(5120, 17408, 40, 40),
    "qwen3-32b": _qwen3(5120, 25600, 64, 64),
    # Llama 3.x (meta-llama/Llama-3.2-1B, -3.2-3B, -3.1-8B, Meta-Llama-3-8B, -3.1-70B, -3.3-70B, Meta-Llama-3-70B)
    "llama-3.2-1b": _llama(2048, 8192, 16, 32, tied=True, head_dim=64, rope_factor=32.0),
    "llama-3.2-3b": _llama(3072, 8192, 28, 24, tied=True, head_dim=128, rope_factor=32.0),
    "llama-3.1-8b": _llama(4096, 14336, 32, 32),
    "llama-3-8b": _llama(4096, 14336, 32, 32, rope_factor=None),
    "llama-3.1-70b": _llama(8192, 28672, 80, 64),
    "llama-3.3-70b": _llama(8192, 28672, 80, 64),
    "llama-3-70b": _llama(8192, 28672, 80, 64, rope_factor=None),
}


def _fold(name: str) -> str:
    """`Meta-Llama-3.1-8B_Instruct` -> `meta-llama-3.1-8b-instruct`; `Qwen2_5-7B` -> `qwen2.5-7b`."""
    name = name.lower().replace("_", "-")
    return re.sub(r"(qwen\d)-(\d)(?=-)", r"\1.\2", name)


def known_shape(name: str) -> tuple[str, dict] | None:
    """`(key, config.json dict)` of the longest known key in `name` (a path's last part, or any string)
    that ends there or before a non-digit, non-dot character; None when none matches."""
    folded = _fold(str(name).rstrip("/").rsplit("/", 1)[-1])
    best = None
    for key in KNOWN_SHAPES:
        for m in re.finditer(re.escape(key), folded):
            end = m.end()
            if (end == len(folded) or not (folded[end].isdigit() or folded[end] == ".")) and (
                    best is None or len(key) > len(best)):
                best = key
    return (best, dict(KNOWN_SHAPES[best])) if best else None


__all__ = ["KNOWN_SHAPES", "known_shape"]
