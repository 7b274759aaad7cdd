"""Our parameter paths <-> Hugging Face tensor names.

HF ``model.layers.3.self_attn.q_proj.weight`` [out, in] <-> our ``layers/3/self_attn/q_proj/kernel``
[in, out] (transposed); ``model.embed_tokens.weight`` <-> ``embed_tokens/embedding``; norms and biases
keep their shape; ``lm_head.weight`` <-> ``lm_head/kernel`` (absent when embeddings are tied). A classifier's
score head has a table of its own (``HEAD_NAMES``). Rotary ``inv_freq`` buffers are never loaded.
"""

from __future__ import annotations

import re

ALWAYS_IGNORED = re.compile(r".*rotary_emb\.inv_freq")


def hf_name(path: tuple) -> str:
    """Our NNX path -> the HF tensor name (``('layers', 0, 'mlp', 'up_proj', 'kernel')`` -> ``model.layers.0.mlp.up_proj.weight``)."""
    *parents, leaf = (str(getattr(p, "key", p)) for p in path)
    leaf = "weight" if leaf in ("kernel", "embedding") else leaf
    prefix = [] if parents[:1] == ["lm_head"] else ["model"]
    return ".".join(prefix + parents + [leaf])


def is_transposed(path: tuple) -> bool:
    """A kernel is stored [out, in] by Hugging Face, [in, out] by us."""
    return str(getattr(path[-1], "key", path[-1])) == "kernel"


# Our head parameter -> the HF tensor: `score` of *ForSequenceClassification / *ForTokenClassification,
# `score.0` / `score.2` of the Qwen2.5-Math-PRM layout (an nn.Sequential: Linear, ReLU, Linear).
HEAD_NAMES = {"score/kernel": "score.weight", "score/bias": "score.bias",
              "score/hidden/kernel": "score.0.weight", "score/hidden/bias": "score.0.bias",
              "score/out/kernel": "score.2.weight", "score/out/bias": "score.2.bias"}
