"""Load-time checks of a model and its tokenizer: fail before training, not at accuracy 0 hours later.

    check_finite_weights(model, source=path)          # NaN/inf in any parameter
    check_tokenizer_fits(model.config, tokenizer, source=path)

Both raise `CheckpointError` naming the checkpoint and the offending tensor or token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dapo_jax.models.hf_names import hf_name
from dapo_jax.models.safetensors_files import CheckpointError


def check_finite_weights(model, *, source: str = "<model>") -> None:
    """Raises when any parameter holds NaN or ±inf (one fused reduction per tensor, on its shards)."""
    flat = [(path, var.get_value()) for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))]
    flags = jax.jit(lambda xs: [jnp.all(jnp.isfinite(x)) for x in xs])([x for _, x in flat])
    for (path, x), ok in zip(flat, flags):
        if not bool(ok):
            bad = int(np.sum(~np.isfinite(np.asarray(jax.device_get(x), np.float32))))
            raise CheckpointError(f"{source}: tensor {hf_name(path)!r} holds {bad} non-finite values "
                                  f"(NaN/inf) of {x.size}: the checkpoint is damaged")


def check_tokenizer_fits(config, tokenizer, *, source: str = "<model>", generation=None) -> None:
    """The tokenizer's ids must all index the embedding; EOS/PAD ids (of config.json, of
    `generation` = generation_config.json when given, of the tokenizer) must be inside the vocabulary.

    A tokenizer bigger than the embedding (the Qwen2.5 tokenizer beside a 99-token model) would
    gather out-of-range rows, which XLA clamps silently: training then goes nowhere."""
    vocab = int(config.vocab_size)
    n = len(tokenizer)
    if n > vocab:
        raise CheckpointError(f"{source}: the tokenizer has {n} tokens but the model's embedding has "
                              f"vocab_size={vocab}: this tokenizer does not belong to this model")
    special = {"eos_token_id (config)": list(config.eos_token_id),
               "pad_token_id (config)": [config.pad_token_id],
               "tokenizer eos_token_id": [tokenizer.eos_token_id],
               "tokenizer pad_token_id": [tokenizer.pad_token_id]}
    if generation is not None:
        special["eos_token_id (generation_config.json)"] = list(generation.eos_token_id)
        special["pad_token_id (generation_config.json)"] = [generation.pad_token_id]
    for name, ids in special.items():
        for i in ids:
            if i is not None and not 0 <= int(i) < vocab:
                raise CheckpointError(f"{source}: {name} = {i} is outside the vocabulary [0, {vocab})")
