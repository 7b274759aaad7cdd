"""Hugging Face checkpoints in and out: ``config.json`` + safetensors (single file or sharded).

    model = load_pretrained("Qwen2.5-0.5B-Instruct/", mesh=make_mesh(fsdp=-1))
    tokenizer = load_tokenizer("Qwen2.5-0.5B-Instruct/")
    save_pretrained(model, "out/", dtype="bfloat16", tokenizer=tokenizer)   # transformers can load it

Names: HF ``model.layers.3.self_attn.q_proj.weight`` [out, in] <-> our ``layers/3/self_attn/q_proj/kernel``
[in, out] (transposed); ``model.embed_tokens.weight`` <-> ``embed_tokens/embedding``; norms and biases
keep their shape; ``lm_head.weight`` <-> ``lm_head/kernel`` (absent when embeddings are tied).

Safety and memory: tensors are read through ``np.memmap`` at the offsets of the safetensors header
(no pickle, no torch, no remote code; bf16 included, which ``safetensors``' numpy backend cannot
return). With a mesh, each parameter is built by ``jax.make_array_from_callback`` from the memmap,
so every device (and every host) reads only its own shard and the full model never sits in host
memory. Unexpected extra tensors are an ERROR by default (``strict=True``): they mean the checkpoint
is not the architecture we build (e.g. an MLP bias), and silently dropping weights gives a wrong
model; ``strict=False`` downgrades them to a warning. Rotary ``inv_freq`` buffers and a tied
``lm_head.weight`` are always ignored.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from dapo_jax.models.classifier import Classifier
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder
from dapo_jax.models.generation_config import GenerationConfig
from dapo_jax.models.sharding import check_divisible, partition_spec, path_str

log = logging.getLogger(__name__)

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
_FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64}
_ALWAYS_IGNORED = re.compile(r".*rotary_emb\.inv_freq")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model: names the tensor and the file."""


# --------------------------------------------------------------------------- names
def hf_name(path: tuple) -> str:
    """Our NNX path -> the HF tensor name (``('layers', 0, 'mlp', 'up_proj', 'kernel')`` -> ``model.layers.0.mlp.up_proj.weight``)."""
    *parents, leaf = (str(getattr(p, "key", p)) for p in path)
    leaf = "weight" if leaf in ("kernel", "embedding") else leaf
    prefix = [] if parents[:1] == ["lm_head"] else ["model"]
    return ".".join(prefix + parents + [leaf])


def _is_transposed(path: tuple) -> bool:
    return str(getattr(path[-1], "key", path[-1])) == "kernel"


# --------------------------------------------------------------------------- safetensors reading
class _SafetensorsFile:
    """Header + lazily memory-mapped tensors of one ``.safetensors`` file."""

    def __init__(self, file: Path):
        self.file = file
        try:
            with open(file, "rb") as f:
                (n,) = np.frombuffer(f.read(8), "<u8")
                header = json.loads(f.read(int(n)))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{file} is not a readable safetensors file: {e}") from e
        self.metadata = header.pop("__metadata__", None) or {}
        self.entries: dict[str, dict] = header
        self.data_start = 8 + int(n)
        end = max((int(e["data_offsets"][1]) for e in header.values() if isinstance(e, dict) and "data_offsets" in e),
                  default=0)
        size = file.stat().st_size
        if size < self.data_start + end:
            raise CheckpointError(f"{file} is truncated: {size} bytes, but its header needs {self.data_start + end}")

    def array(self, name: str) -> np.ndarray:
        """A read-only memmap view of tensor ``name`` in its stored dtype."""
        entry = self.entries[name]
        dtype = _FLOAT_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise CheckpointError(
                f"tensor {name!r} in {self.file} has dtype {entry['dtype']}; expected a float dtype "
                f"({', '.join(_FLOAT_DTYPES)})"
            )
        start, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if end - start != math.prod(shape) * np.dtype(dtype).itemsize:
            raise CheckpointError(f"tensor {name!r} in {self.file}: byte size does not match shape {shape}")
        if not shape or math.prod(shape) == 0:
            return np.zeros(shape, dtype)
        return np.memmap(self.file, dtype=dtype, mode="r", offset=self.data_start + start, shape=shape)


def _open_checkpoint(root: Path) -> dict[str, _SafetensorsFile]:
    """Tensor name -> the file that holds it, for a single or sharded checkpoint."""
    index = root / SAFETENSORS_INDEX
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{index} is not a valid safetensors index (needs 'weight_map'): {e}") from e
        files: dict[str, _SafetensorsFile] = {}
        located = {}
        for name, shard in weight_map.items():
            if shard not in files:
                if not (root / shard).exists():
                    raise CheckpointError(f"shard file {root / shard} (holding tensor {name!r}) listed in {index} is missing")
                files[shard] = _SafetensorsFile(root / shard)
            if name not in files[shard].entries:
                raise CheckpointError(f"tensor {name!r} is listed in {index} but absent from {root / shard}")
            located[name] = files[shard]
        return located
    single = root / SAFETENSORS_FILE
    if not single.exists():
        raise CheckpointError(f"no {SAFETENSORS_FILE} or {SAFETENSORS_INDEX} in {root}")
    f = _SafetensorsFile(single)
    return {name: f for name in f.entries}


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
    tensors = _open_checkpoint(root)

    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    graphdef, state, rest = nnx.split(abstract, nnx.Param, ...)
    expected = set()
    for path_, var in nnx.to_flat_state(state):
        name = hf_name(path_)
        expected.add(name)
        if name not in tensors:
            raise CheckpointError(f"tensor {name!r} (parameter {path_str(path_)}) is missing from the checkpoint in {root}")
        var.set_value(_load_tensor(tensors[name], name, path_, var.get_value(), mesh))

    extra = sorted(
        n for n in tensors
        if n not in expected and not _ALWAYS_IGNORED.fullmatch(n)
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


def _load_tensor(f: _SafetensorsFile, name: str, path: tuple, abstract: jax.ShapeDtypeStruct, mesh: Mesh | None):
    stored = f.array(name)
    host = stored.T if _is_transposed(path) else stored
    if host.shape != abstract.shape:
        want = abstract.shape[::-1] if _is_transposed(path) else abstract.shape
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
def save_safetensors(arrays: dict[str, np.ndarray], file: Path) -> None:
    """`safetensors.numpy.save_file`, then the mode any other written file gets (0644 under the usual umask):
    the library creates the file 0600, which another user (a serving job, a colleague) cannot read."""
    from safetensors.numpy import save_file

    save_file(arrays, file, metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(file, 0o666 & ~umask)


def _to_host(x: jax.Array) -> np.ndarray:
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


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
            host = _to_host(x)
            host = host.T if _is_transposed(p) else host
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


# --------------------------------------------------------------------------- classifiers (score heads)
# Our head parameter -> the HF tensor: `score` of *ForSequenceClassification / *ForTokenClassification,
# `score.0` / `score.2` of the Qwen2.5-Math-PRM layout (an nn.Sequential: Linear, ReLU, Linear).
_HEAD_NAMES = {"score/kernel": "score.weight", "score/bias": "score.bias",
               "score/hidden/kernel": "score.0.weight", "score/hidden/bias": "score.0.bias",
               "score/out/kernel": "score.2.weight", "score/out/bias": "score.2.bias"}


def classifier_head_layout(path: str | os.PathLike) -> tuple[str, int, bool]:
    """``(head, num_labels, bias)`` of the score head stored in the checkpoint folder ``path``, read
    from the safetensors header alone (no weights are read): ``head`` is ``"linear"`` (``score.weight``)
    or ``"mlp"`` (``score.0`` / ``score.2``). Raises CheckpointError, one line naming the folder, when
    it holds no score head (a causal LM, say)."""
    root = Path(path)
    tensors = _open_checkpoint(root)
    if "score.weight" in tensors:
        head, out = "linear", "score.weight"
    elif "score.0.weight" in tensors and "score.2.weight" in tensors:
        head, out = "mlp", "score.2.weight"
    else:
        try:
            archs = json.loads((root / "config.json").read_text()).get("architectures")
        except (OSError, ValueError):
            archs = None
        raise CheckpointError(f"{root} has no score head (no 'score.weight', nor 'score.0.weight' + 'score.2.weight'): "
                              f"a reward model must be a Hugging Face *ForSequenceClassification or "
                              f"*ForTokenClassification checkpoint, this one is {archs}")
    shape = tensors[out].entries[out]["shape"]
    if len(shape) != 2:
        raise CheckpointError(f"tensor {out!r} in {tensors[out].file} has shape {tuple(shape)}, expected [num_labels, hidden]")
    bias = "score.bias" in tensors if head == "linear" else True
    return head, int(shape[0]), bias


def load_classifier(
    path: str | os.PathLike,
    *,
    mesh: Mesh | None = None,
    param_dtype: str | None = None,
    dtype: str | None = None,
    attention: str | None = None,
    strict: bool = True,
):
    """A :class:`~dapo_jax.models.classifier.Classifier` with the weights of the HF classifier folder
    ``path`` (``*ForSequenceClassification``, ``*ForTokenClassification``, or the Qwen2.5-Math-PRM head
    layout): ``model.*`` tensors into the trunk, ``score.*`` into the head (see ``classifier_head_layout``).

    Loaded like :func:`load_pretrained` (memmapped, each device reading its own shard, sharded by
    ``models.sharding``'s rules: the trunk's below ``trunk/``, the head's ``score/...``); a causal-LM
    checkpoint, or one whose ``config.json`` lists another number of labels than its head has, is
    refused with one line naming the folder.
    """
    root = Path(path)
    head, num_labels, bias = classifier_head_layout(root)
    hf = json.loads((root / "config.json").read_text()) if (root / "config.json").exists() else {}
    labels = hf.get("id2label")
    if isinstance(labels, dict) and len(labels) != num_labels:
        raise CheckpointError(f"{root}: config.json lists {len(labels)} labels (id2label) but the score head has "
                              f"{num_labels} outputs")
    overrides = {k: v for k, v in dict(param_dtype=param_dtype, dtype=dtype, attention=attention).items() if v is not None}
    # a classifier has no language-model head: build the trunk without one (tied = no lm_head parameter)
    config = ModelConfig.from_pretrained(root, tie_word_embeddings=True, **overrides)
    if mesh is not None:
        check_divisible(config, mesh)
    tensors = _open_checkpoint(root)
    abstract = nnx.eval_shape(lambda: Classifier(Decoder(config, rngs=nnx.Rngs(0)), num_labels=num_labels,
                                                 head=head, bias=bias, rngs=nnx.Rngs(0)))
    graphdef, state, rest = nnx.split(abstract, nnx.Param, ...)
    expected = set()
    for path_, var in nnx.to_flat_state(state):
        keys = tuple(str(getattr(p, "key", p)) for p in path_)
        # trunk parameters are named and placed as the decoder's (path below `trunk/`); the head by its table
        local = keys[1:] if keys[0] == "trunk" else keys
        name = hf_name(local) if keys[0] == "trunk" else _HEAD_NAMES[path_str(keys)]
        expected.add(name)
        if name not in tensors:
            raise CheckpointError(f"tensor {name!r} (parameter {path_str(keys)}) is missing from the checkpoint in {root}")
        var.set_value(_load_tensor(tensors[name], name, local, var.get_value(), mesh))
    extra = sorted(n for n in tensors if n not in expected and not _ALWAYS_IGNORED.fullmatch(n) and n != "lm_head.weight")
    if extra:
        message = (f"{len(extra)} unexpected tensor(s) in {root} that a {config.model_type} classifier with a "
                   f"{head} head does not have: {extra[:8]}{' ...' if len(extra) > 8 else ''}")
        if strict:
            raise CheckpointError(message + " (pass strict=False to ignore them)")
        log.warning(message)
    return nnx.merge(graphdef, state, rest)


def save_classifier(model, path: str | os.PathLike, *, task: str = "sequence", dtype: str | None = None,
                    tokenizer=None) -> Path:
    """Writes a :class:`~dapo_jax.models.classifier.Classifier` as a Hugging Face classifier folder that
    ``transformers`` loads (``task="sequence"``: ``*ForSequenceClassification``; ``"token"``:
    ``*ForTokenClassification``; a linear head only) and :func:`load_classifier` reads back: ``config.json``
    (the architecture, ``num_labels``, ``id2label``) and one ``model.safetensors``; the tokenizer beside
    them when given. ``dtype``: the stored dtype (``None`` keeps each parameter's)."""
    if task not in ("sequence", "token"):
        raise ValueError(f"task must be 'sequence' or 'token', got {task!r}")
    if model.head != "linear":
        raise ValueError(f"only a linear score head has a transformers class; this one is {model.head!r}")
    root = Path(path)
    out_dtype = jnp.dtype(dtype) if dtype is not None else None
    by_name = {path_str(p): (p, v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    arrays = {}
    for key, (p, x) in by_name.items():
        keys = key.split("/")
        name = hf_name(keys[1:]) if keys[0] == "trunk" else _HEAD_NAMES[key]
        host = _to_host(x)
        host = host.T if keys[-1] == "kernel" else host
        arrays[name] = np.ascontiguousarray(host, dtype=out_dtype or host.dtype)
    hf = model.config.to_hf_dict()
    hf["architectures"] = [hf["architectures"][0].replace("ForCausalLM", "ForSequenceClassification" if task ==
                                                          "sequence" else "ForTokenClassification")]
    hf["num_labels"] = model.num_labels
    hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(model.num_labels)}
    hf["label2id"] = {f"LABEL_{i}": i for i in range(model.num_labels)}
    if task == "token":
        hf["token_classification_bias"] = "score.bias" in arrays
    hf["torch_dtype"] = str(out_dtype or jnp.dtype(model.config.param_dtype))
    if jax.process_index() == 0:
        root.mkdir(parents=True, exist_ok=True)
        (root / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
        save_safetensors(arrays, root / SAFETENSORS_FILE)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(root))
    return root


def checkpoint_tensor_names(path: str | os.PathLike) -> list[str]:
    """The tensor names stored in a checkpoint directory (for inspection and tests)."""
    return sorted(_open_checkpoint(Path(path)))


__all__ = [
    "CheckpointError",
    "checkpoint_tensor_names",
    "classifier_head_layout",
    "hf_name",
    "load_classifier",
    "load_model_and_tokenizer",
    "load_pretrained",
    "load_tokenizer",
    "save_classifier",
    "save_pretrained",
]
