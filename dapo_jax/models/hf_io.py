"""Hugging Face causal-LM checkpoints in and out: ``config.json`` + safetensors (single file or sharded).

    model = load_pretrained("Qwen2.5-0.5B-Instruct/", mesh=make_mesh(fsdp=-1))
    tokenizer = load_tokenizer("Qwen2.5-0.5B-Instruct/")
    save_pretrained(model, "out/", dtype="bfloat16", tokenizer=tokenizer)   # transformers can load it

Names: HF ``model.layers.3.self_attn.q_proj.weight`` [out, in] <-> our ``layers/3/self_attn/q_proj/kernel``
[in, out] (transposed), the whole table in ``hf_names.py``. Classifier folders (reward models) are read and
written by ``hf_classifier_io.py``.

Safety and memory: tensors are read through ``np.memmap`` at the offsets of the safetensors header
(``safetensors_files.py``: no pickle, no torch, no remote code; bf16 included, which ``safetensors``' numpy
backend cannot return). With a mesh, each parameter is built by ``jax.make_array_from_callback`` from the memmap,
so every device (and every host) reads only its own shard and the full model never sits in host
memory. Unexpected extra tensors are an ERROR by default (``strict=True``): they mean the checkpoint
is not the architecture we build (e.g. an MLP bias), and silently dropping weights gives a wrong
model; ``strict=False`` downgrades them to a warning. Rotary ``inv_freq`` buffers and a tied
``lm_head.weight`` are always ignored.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder
from dapo_jax.models.generation_config import GenerationConfig
from dapo_jax.models.hf_names import ALWAYS_IGNORED, hf_name, is_transposed
from dapo_jax.models.safetensors_files import (SAFETENSORS_FILE, SAFETENSORS_INDEX, CheckpointError, SafetensorsFile,
                                               open_checkpoint, save_safetensors, to_host)
from dapo_jax.models.sharding import check_divisible, partition_spec, path_str

log = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


# --------------------------------------------------------------------------- loading
def load_pretrained(
    path: str | os.PathLike,
    *,
    mesh: Mesh | None = None,
    param_dtype: str | None = None,
    dtype: str | None = None,
    remat: str | None = None,
    attention: str | None = None,
    strict: bool = True,
) -> Decoder:
    """A :class:`Decoder` with the weights of the HF checkpoint directory ``path``.

    Args:
      path: directory with ``config.json`` and ``model.safetensors`` or ``model.safetensors.index.json``.
      mesh: place every parameter directly onto ``NamedSharding(mesh, PARTITION_RULES[param])``;
        ``None`` puts them on the default device.
      param_dtype, dtype, remat, attention: override the config (defaults: float32 parameters and compute,
        whatever the file's ``torch_dtype``, since RL updates want float32 master weights).
      strict: an unexpected extra tensor raises (``True``) or warns (``False``).
    Raises:
      CheckpointError naming the tensor and file (missing, wrong shape, non-float, extra, missing shard);
      ModelConfigError naming the config field.
    """
    root = Path(path)
    overrides = {k: v for k, v in dict(param_dtype=param_dtype, dtype=dtype, remat=remat, attention=attention).items() if v is not None}
    config = ModelConfig.from_pretrained(root, **overrides)
    if mesh is not None:
        check_divisible(config, mesh)
    tensors = open_checkpoint(root)

    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    graphdef, state, rest = nnx.split(abstract, nnx.Param, ...)
    expected = set()
    for path_, var in nnx.to_flat_state(state):
        name = hf_name(path_)
        expected.add(name)
        if name not in tensors:
            raise CheckpointError(f"tensor {name!r} (parameter {path_str(path_)}) is missing from the checkpoint in {root}")
        var.set_value(load_tensor(tensors[name], name, path_, var.get_value(), mesh))

    extra = sorted(
        n for n in tensors
        if n not in expected and not ALWAYS_IGNORED.fullmatch(n)
        and not (n == "lm_head.weight" and config.tie_word_embeddings)
    )
    if extra:
        where = sorted({str(tensors[n].file) for n in extra})
        message = (
            f"{len(extra)} unexpected tensor(s) in {', '.join(where)} that a {config.model_type} model "
            f"of this config does not have: {extra[:8]}{' ...' if len(extra) > 8 else ''}"
        )
        if strict:
            raise CheckpointError(message + " (pass strict=False to ignore them)")
        log.warning(message)
    return nnx.merge(graphdef, state, rest)


def load_tensor(f: SafetensorsFile, name: str, path: tuple, abstract: jax.ShapeDtypeStruct, mesh: Mesh | None):
    """Tensor ``name`` of ``f`` as parameter ``path`` (``abstract``'s shape and dtype): on the default device,
    or sharded over ``mesh`` by its partition rule. CheckpointError naming the tensor and file on a wrong shape."""
    stored = f.array(name)
    host = stored.T if is_transposed(path) else stored
    if host.shape != abstract.shape:
        want = abstract.shape[::-1] if is_transposed(path) else abstract.shape
        raise CheckpointError(
            f"tensor {name!r} in {f.file} has shape {tuple(stored.shape)}, expected {tuple(want)} "
            f"(parameter {path_str(path)})"
        )
    dtype = abstract.dtype
    if mesh is None:
        return jax.device_put(np.asarray(host, dtype=dtype))
    sharding = NamedSharding(mesh, partition_spec(path))
    # Each device's callback reads only its own slice of the memmap.
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: np.asarray(host[idx], dtype=dtype))


def load_tokenizer(path: str | os.PathLike):
    """``transformers.AutoTokenizer`` from ``path`` (never remote code).

    A folder with no vocabulary file is refused: ``transformers`` would otherwise build an empty
    tokenizer from ``config.json`` alone, and every prompt would encode to nothing."""
    from transformers import AutoTokenizer

    root = Path(path)
    if root.is_dir() and not any((root / f).exists() for f in _TOKENIZER_FILES):
        raise CheckpointError(f"no tokenizer in {root} (none of {', '.join(_TOKENIZER_FILES)}): the tokenizer files "
                              f"must sit beside config.json and the weights; copy them from the model's download")
    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot load a tokenizer from {path}: {e} (the tokenizer files, tokenizer.json and "
                              f"tokenizer_config.json, must sit beside config.json and the weights)") from e


def load_model_and_tokenizer(path: str | os.PathLike, **kwargs) -> tuple[Decoder, Any]:
    """``(load_pretrained(path, **kwargs), load_tokenizer(path))``."""
    return load_pretrained(path, **kwargs), load_tokenizer(path)


# --------------------------------------------------------------------------- saving
def _shards(items: list[tuple[str, jax.Array]], nbytes_of, max_shard_bytes: int) -> list[list[tuple[str, jax.Array]]]:
    """Greedy split in order; a tensor bigger than the limit gets a shard of its own (as HF does)."""
    groups, current, size = [], [], 0
    for item in items:
        n = nbytes_of(item[1])
        if current and size + n > max_shard_bytes:
            groups.append(current)
            current, size = [], 0
        current.append(item)
        size += n
    if current:
        groups.append(current)
    return groups


def save_pretrained(
    model: Decoder,
    path: str | os.PathLike,
    *,
    max_shard_bytes: int = 5 * 1024**3,
    dtype: str | None = None,
    tokenizer=None,
    generation_config: GenerationConfig | None = None,
) -> Path:
    """Writes ``config.json``, ``generation_config.json`` and HF-named safetensors that ``transformers``
    (and :func:`load_pretrained`) load.

    Args:
      max_shard_bytes: above this total, tensors are split into ``model-0000k-of-0000n.safetensors``
        files listed by ``model.safetensors.index.json``.
      dtype: the stored dtype (e.g. ``"bfloat16"``); ``None`` keeps each parameter's dtype.
      tokenizer: saved beside the model when given.
      generation_config: the source checkpoint's (:func:`load_generation_config`), so stop tokens and
        sampling defaults survive an export; ``None`` derives one from the model config's special tokens.
    Only one tensor shard file's worth of parameters is on the host at a time. In a multi-host run
    every process must call it (sharded arrays are all-gathered); only process 0 writes.
    """
    root = Path(path)
    config = model.config
    out_dtype = jnp.dtype(dtype) if dtype is not None else None
    params = [(hf_name(p), p, v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))]
    items = [(name, (p, x)) for name, p, x in params]
    itemsize = lambda px: px[1].size * (out_dtype or px[1].dtype).itemsize  # noqa: E731
    groups = _shards(items, itemsize, max_shard_bytes)
    writer = jax.process_index() == 0
    if writer:
        root.mkdir(parents=True, exist_ok=True)
        hf = config.to_hf_dict()
        hf["torch_dtype"] = str(out_dtype or jnp.dtype(config.param_dtype))
        (root / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
        given = generation_config is not None and generation_config.to_dict()  # an absent file loads as empty
        (generation_config if given else GenerationConfig.from_model_config(config)).save(root)
        for stale in [root / SAFETENSORS_FILE, root / SAFETENSORS_INDEX, *root.glob("model-*-of-*.safetensors")]:
            stale.unlink(missing_ok=True)  # a previous save with another sharding would shadow this one

    weight_map, total = {}, 0
    for k, group in enumerate(groups):
        file = SAFETENSORS_FILE if len(groups) == 1 else f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        arrays = {}
        for name, (p, x) in group:
            host = to_host(x)
            host = host.T if is_transposed(p) else host
            arrays[name] = np.ascontiguousarray(host, dtype=out_dtype or host.dtype)
            weight_map[name] = file
            total += arrays[name].nbytes
        if writer:
            save_safetensors(arrays, root / file)
    if writer and len(groups) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (root / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
    if writer and tokenizer is not None:
        tokenizer.save_pretrained(str(root))
    return root


__all__ = [
    "load_model_and_tokenizer",
    "load_pretrained",
    "load_tokenizer",
    "save_pretrained",
]
