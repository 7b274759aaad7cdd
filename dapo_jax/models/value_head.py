"""A value model: the decoder's trunk with a scalar head (one number per position). Knows nothing of RL.

    model = ValueModel(Decoder(config, rngs=nnx.Rngs(0)), rngs=nnx.Rngs(1))   # or load_value_model(path)
    values = model(input_ids, positions, attention_mask)                       # [B, S] float32
    v = response_values(model, prompt_ids, prompt_mask, response_ids, response_mask)   # like the response

The head is `Linear(d, 1)` on the trunk's final-normed hidden states, initialised N(0, 0.02²) with a
zero bias (as a Hugging Face token-classification head is). `response_values` reads the head at the
position that predicts each response token (`S - 1 + t`, the same slice as `models.logprobs`), so
`v[..., t]` scores the prefix before response token `t`.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dapo_jax.models.decoder import Decoder, positions_from_mask
from dapo_jax.models.hf_io import load_pretrained


class ValueModel(nnx.Module):
    """`trunk` (a `Decoder`, its weights used as they are) + a scalar `value_head`."""

    def __init__(self, trunk: Decoder, *, rngs: nnx.Rngs):
        self.trunk = trunk
        self.config = trunk.config
        self.value_head = nnx.Linear(
            trunk.config.hidden_size, 1, use_bias=True, dtype=jnp.float32, param_dtype=jnp.float32,
            kernel_init=nnx.initializers.normal(0.02), bias_init=nnx.initializers.zeros, rngs=rngs,
        )

    def __call__(self, input_ids, positions, attention_mask) -> jax.Array:
        """`[B, S]` ids, positions and mask -> values `[B, S]` float32."""
        hidden, _ = self.trunk(input_ids, positions, attention_mask)
        return self.value_head(hidden.astype(jnp.float32))[..., 0]


def load_value_model(path: str | Path, *, mesh: Mesh | None = None, seed: int = 0, **overrides) -> ValueModel:
    """A `ValueModel` whose trunk holds the decoder weights of the Hugging Face folder `path` (its
    language-model head, if any, is left unused) and whose head is fresh (`seed`). With `mesh`, the
    trunk is sharded by `models.sharding`'s rules and the head replicated. `overrides`: dtype,
    param_dtype, remat, as for `load_pretrained`."""
    model = ValueModel(load_pretrained(path, mesh=mesh, **overrides), rngs=nnx.Rngs(seed))
    if mesh is not None:
        head = nnx.state(model.value_head, nnx.Param)
        nnx.update(model.value_head, jax.device_put(head, NamedSharding(mesh, P())))
    return model


def response_values(model, prompt_ids, prompt_mask, response_ids, response_mask) -> jax.Array:
    """`V_t` for every response token: the head at the position that predicts token `t`.

    Shapes as `models.logprobs.response_logprobs`: prompts `[B, S]` (LEFT-padded) with responses
    `[B, T]` (RIGHT-padded), or prompts `[P, S]` shared by `G` responses each `[P, G, T]`.
    Returns float32 values shaped like `response_ids`, exactly 0 at padded response positions.
    """
    out_shape = response_ids.shape
    if response_ids.ndim == 3:
        p, g, _ = response_ids.shape
        if prompt_ids.ndim == 2:
            prompt_ids, prompt_mask = (jnp.repeat(x, g, axis=0) for x in (prompt_ids, prompt_mask))
        prompt_ids, prompt_mask = (x.reshape(p * g, -1) for x in (prompt_ids, prompt_mask))
        response_ids, response_mask = (x.reshape(p * g, -1) for x in (response_ids, response_mask))
    s, t = prompt_ids.shape[1], response_ids.shape[1]
    real = response_mask.astype(bool)
    ids = jnp.concatenate([prompt_ids, jnp.where(real, response_ids, 0)], axis=1)
    mask = jnp.concatenate([prompt_mask, response_mask], axis=1).astype(jnp.int32)
    values = model(ids, positions_from_mask(mask), mask)[:, s - 1 : s + t - 1]
    return jnp.where(real, values, 0.0).reshape(out_shape)
