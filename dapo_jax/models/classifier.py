"""A classifier: the decoder's trunk with a `score` head, as Hugging Face's `*ForSequenceClassification`
and `*ForTokenClassification` build it (and the two-layer head of the Qwen2.5-Math-PRM release). Knows
nothing of RL: it maps tokens to per-position label logits.

    model = load_classifier(path, mesh=mesh, dtype="float32")               # models.hf_classifier_io
    logits = model(input_ids, positions, attention_mask)                    # [B, S, L] float32
    pooled = sequence_logits(logits, input_ids, attention_mask, pad_token_id=model.config.pad_token_id)  # [B, L]

Heads (`head`):

- `linear`: `logits = h·W (+ b)`, W `[d, L]`. Sequence classifiers have no bias (HF's `score` is
  `Linear(d, L, bias=False)`); token classifiers have one (`token_classification_bias`, default True).
- `mlp`: `logits = relu(h·W₁ + b₁)·W₂ + b₂`, W₁ `[d, d]`, W₂ `[d, L]`: the layout of the
  Qwen2.5-Math-PRM checkpoints (`score.0`, `score.2`), whose own code is remote code; this module
  builds the same arithmetic without it.

The head runs in float32 on the trunk's final-normed hidden states (a `[B, S, d] x [d, L]` product:
nothing next to the trunk). Dropout is an identity at inference, as in `model.eval()`.

`sequence_logits` pools as transformers does: the logits at the RIGHTMOST token that is not the pad
token id (`argmax(arange(S) * (ids != pad))`), so left and right padding give the same score; with no
pad token id, the last real position of `attention_mask`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from dapo_jax.models.decoder import Decoder
from dapo_jax.models.sharding import partition_spec

HEADS = ("linear", "mlp")


def _head_linear(n_in: int, n_out: int, bias: bool, param_dtype, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(n_in, n_out, use_bias=bias, dtype=jnp.float32, param_dtype=param_dtype,
                      kernel_init=nnx.initializers.normal(0.02), bias_init=nnx.initializers.zeros, rngs=rngs)


class MLPScore(nnx.Module):
    """`relu(h·W₁ + b₁)·W₂ + b₂` (the Qwen2.5-Math-PRM head: `score.0`, ReLU, `score.2`)."""

    def __init__(self, hidden_size: int, num_labels: int, *, param_dtype, rngs: nnx.Rngs):
        self.hidden = _head_linear(hidden_size, hidden_size, True, param_dtype, rngs)
        self.out = _head_linear(hidden_size, num_labels, True, param_dtype, rngs)

    def __call__(self, h):
        return self.out(jax.nn.relu(self.hidden(h)))


class Classifier(nnx.Module):
    """`trunk` (a `Decoder`; its language-model head, if any, unused) + a `score` head with `num_labels` outputs."""

    def __init__(self, trunk: Decoder, *, num_labels: int, head: str = "linear", bias: bool = False,
                 rngs: nnx.Rngs):
        if head not in HEADS:
            raise ValueError(f"head={head!r}: expected one of {HEADS}")
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        self.trunk = trunk
        self.config = trunk.config
        self.num_labels = num_labels
        self.head = head
        pdt = jnp.dtype(trunk.config.param_dtype)
        d = trunk.config.hidden_size
        self.score = (_head_linear(d, num_labels, bias, pdt, rngs) if head == "linear"
                      else MLPScore(d, num_labels, param_dtype=pdt, rngs=rngs))

    def __call__(self, input_ids, positions, attention_mask) -> jax.Array:
        """`[B, S]` ids, positions and mask -> label logits `[B, S, num_labels]` float32."""
        hidden, _ = self.trunk(input_ids, positions, attention_mask)
        return self.score(hidden.astype(jnp.float32))


def last_token_index(input_ids, attention_mask, pad_token_id: int | None) -> jax.Array:
    """`[B]` index of the token a sequence classifier is read at (transformers' rule, module docstring)."""
    s = input_ids.shape[-1]
    if pad_token_id is None:
        real = attention_mask.astype(jnp.int32)
    else:
        real = (input_ids != pad_token_id).astype(jnp.int32)
    return jnp.argmax(jnp.arange(s, dtype=jnp.int32) * real, axis=-1)


def sequence_logits(logits, input_ids, attention_mask, *, pad_token_id: int | None) -> jax.Array:
    """`[B, S, L]` per-position logits -> `[B, L]` at `last_token_index`."""
    idx = last_token_index(input_ids, attention_mask, pad_token_id)
    return jnp.take_along_axis(logits, idx[:, None, None], axis=1)[:, 0]


def classifier_partition_spec(path) -> "jax.sharding.PartitionSpec":
    """A classifier parameter's PartitionSpec: the trunk's by `models.sharding`'s decoder rules (the
    path below `trunk/`), the head's by its own rules there (`score/...`)."""
    keys = [str(getattr(p, "key", p)) for p in path]
    return partition_spec(keys[1:] if keys[:1] == ["trunk"] else keys)


def classifier_shardings(model_or_state, mesh: Mesh) -> nnx.State:
    """`NamedSharding` of every parameter, shaped like `nnx.state(model, nnx.Param)`."""
    state = nnx.state(model_or_state, nnx.Param) if isinstance(model_or_state, nnx.Module) else model_or_state
    return nnx.map_state(lambda path, _: NamedSharding(mesh, classifier_partition_spec(path)), state)


__all__ = ["HEADS", "Classifier", "MLPScore", "classifier_partition_spec", "classifier_shardings",
           "last_token_index", "sequence_logits"]
