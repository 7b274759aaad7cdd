"""Where each decoder parameter lives on the ``("data", "fsdp", "tensor")`` mesh: one table.

Megatron-style tensor parallelism inside a layer (column-parallel q/k/v, gate/up; row-parallel o,
down) with every weight's other dimension split over ``fsdp`` (ZeRO-3). Parameters are replicated
over ``data``. The rules are regexes over the NNX path joined with ``/`` (``layers/3/mlp/up_proj/kernel``);
the first full match wins and a parameter with no rule is an error (a new parameter must be placed
deliberately, not silently replicated).

    mesh = make_mesh(fsdp=2, tensor=4)
    check_divisible(model.config, mesh)        # clear error before any transfer
    shard_model(model, mesh)                   # in place: every param now on its NamedSharding
    batch = constrain_batch(batch, mesh)       # inside jit: leading dim over ("data", "fsdp")
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dapo_jax.models.config import ModelConfig
from dapo_jax.parallel.mesh import BATCH_AXES, MeshError

# Kernels are [in, out] (HF Linear weights transposed); the embedding is [V, d]; lm_head is [d, V].
PARTITION_RULES: tuple[tuple[str, P], ...] = (
    (r"embed_tokens/embedding", P("tensor", "fsdp")),
    (r"layers/\d+/self_attn/(q|k|v)_proj/kernel", P("fsdp", "tensor")),
    (r"layers/\d+/self_attn/(q|k|v)_proj/bias", P("tensor")),
    (r"layers/\d+/self_attn/o_proj/kernel", P("tensor", "fsdp")),
    (r"layers/\d+/mlp/(gate|up)_proj/kernel", P("fsdp", "tensor")),
    (r"layers/\d+/mlp/down_proj/kernel", P("tensor", "fsdp")),
    (r"(layers/\d+/(input_layernorm|post_attention_layernorm|self_attn/(q_norm|k_norm))|norm)/weight", P()),
    (r"lm_head/kernel", P("fsdp", "tensor")),
    # LoRA adapters (models/lora.py): A [in, r] split like its kernel's input dim, B [r, out] like its output
    (r"layers/\d+/(self_attn/(q|k|v)_proj|mlp/(gate|up)_proj)/lora/lora_a", P("fsdp", None)),
    (r"layers/\d+/(self_attn/(q|k|v)_proj|mlp/(gate|up)_proj)/lora/lora_b", P(None, "tensor")),
    (r"layers/\d+/(self_attn/o_proj|mlp/down_proj)/lora/lora_a", P("tensor", None)),
    (r"layers/\d+/(self_attn/o_proj|mlp/down_proj)/lora/lora_b", P(None, "fsdp")),
    # classifier heads (models/classifier.py; the trunk below `trunk/` takes the rules above): kernels
    # [d, L] / [d, d] split over fsdp on d, like the hidden states they read; 1-2 labels are never split
    (r"score/kernel", P("fsdp", None)),
    (r"score/(hidden|out)/kernel", P("fsdp", None)),
    (r"score/((hidden|out)/)?bias", P()),
)
_COMPILED = tuple((re.compile(pattern), spec) for pattern, spec in PARTITION_RULES)


def path_str(path: Sequence[Any]) -> str:
    """``('layers', 0, 'mlp', 'up_proj', 'kernel')`` -> ``'layers/0/mlp/up_proj/kernel'``."""
    return "/".join(str(getattr(p, "key", p)) for p in path)


def partition_spec(path: Sequence[Any] | str) -> P:
    """The PartitionSpec of one parameter; ``KeyError`` naming the path when no rule matches."""
    name = path if isinstance(path, str) else path_str(path)
    for pattern, spec in _COMPILED:
        if pattern.fullmatch(name):
            return spec
    raise KeyError(f"no sharding rule in dapo_jax.models.sharding.PARTITION_RULES matches parameter {name!r}")


def _params(model_or_state) -> nnx.State:
    if isinstance(model_or_state, nnx.Module):
        return nnx.state(model_or_state, nnx.Param)
    return model_or_state


def param_partition_specs(model_or_state) -> nnx.State:
    """An ``nnx.State`` shaped like ``nnx.state(model, nnx.Param)`` holding each parameter's PartitionSpec."""
    return nnx.map_state(lambda path, _: partition_spec(path), _params(model_or_state))


def param_shardings(model_or_state, mesh: Mesh) -> nnx.State:
    """Like :func:`param_partition_specs` with ``NamedSharding(mesh, spec)`` leaves (for jit in/out_shardings)."""
    return nnx.map_state(lambda path, _: NamedSharding(mesh, partition_spec(path)), _params(model_or_state))


def check_divisible(config: ModelConfig, mesh: Mesh) -> None:
    """Raises :class:`MeshError` naming the model dimension and the mesh axis that does not divide it.

    Tensor parallelism splits whole heads, so both ``num_attention_heads`` and
    ``num_key_value_heads`` must be multiples of the ``tensor`` axis (for GQA models with few KV
    heads, use a smaller ``tensor`` and a larger ``fsdp``).
    """
    sizes = {axis: mesh.shape.get(axis, 1) for axis in ("fsdp", "tensor")}
    needs = (
        ("num_attention_heads", config.num_attention_heads, "tensor"),
        ("num_key_value_heads", config.num_key_value_heads, "tensor"),
        ("vocab_size", config.vocab_size, "tensor"),
        ("intermediate_size", config.intermediate_size, "tensor"),
        ("hidden_size", config.hidden_size, "fsdp"),
        ("intermediate_size", config.intermediate_size, "fsdp"),
        ("num_attention_heads * head_dim", config.num_attention_heads * config.head_dim, "fsdp"),
    )
    for name, dim, axis in needs:
        if dim % sizes[axis]:
            raise MeshError(
                f"{name}={dim} is not divisible by mesh axis {axis!r} of size {sizes[axis]} "
                f"(mesh {dict(mesh.shape)}); pick a mesh whose {axis!r} size divides it"
            )


def shard_model(model: nnx.Module, mesh: Mesh) -> nnx.Module:
    """Moves every parameter onto its ``NamedSharding`` IN PLACE (the same ``model`` object is returned).

    Checks divisibility first, so a bad mesh fails before any transfer.
    """
    if hasattr(model, "config"):
        check_divisible(model.config, mesh)
    params = nnx.state(model, nnx.Param)
    shardings = param_shardings(params, mesh)
    nnx.update(model, jax.device_put(params, shardings))
    return model


def constrain_batch(tree, mesh: Mesh | None = None):
    """Inside ``jit``: pins every array's leading dimension to ``("data", "fsdp")``, the rest replicated.

    With ``mesh=None`` the ambient mesh of ``jax.set_mesh`` is used.
    """
    spec = P(BATCH_AXES)
    sharding = spec if mesh is None else NamedSharding(mesh, spec)
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding), tree)
