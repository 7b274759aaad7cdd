"""Hugging Face classifier folders in and out: a :class:`~dapo_jax.models.classifier.Classifier` (the decoder as
its trunk, a score head) from and to ``*ForSequenceClassification`` / ``*ForTokenClassification`` checkpoints,
and the Qwen2.5-Math-PRM head layout.

    head, num_labels, bias = classifier_head_layout("rm/")     # from the safetensors header alone
    model = load_classifier("rm/", mesh=mesh)
    save_classifier(model, "out/", task="sequence")            # transformers can load it
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from dapo_jax.models.classifier import Classifier
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder
from dapo_jax.models.hf_io import load_tensor
from dapo_jax.models.hf_names import ALWAYS_IGNORED, HEAD_NAMES, hf_name
from dapo_jax.models.safetensors_files import SAFETENSORS_FILE, CheckpointError, open_checkpoint, save_safetensors, to_host
from dapo_jax.models.sharding import check_divisible, path_str

log = logging.getLogger(__name__)


def classifier_head_layout(path: str | os.PathLike) -> tuple[str, int, bool]:
    """``(head, num_labels, bias)`` of the score head stored in the checkpoint folder ``path``, read
    from the safetensors header alone (no weights are read): ``head`` is ``"linear"`` (``score.weight``)
    or ``"mlp"`` (``score.0`` / ``score.2``). Raises CheckpointError, one line naming the folder, when
    it holds no score head (a causal LM, say)."""
    root = Path(path)
    tensors = open_checkpoint(root)
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
    tensors = open_checkpoint(root)
    abstract = nnx.eval_shape(lambda: Classifier(Decoder(config, rngs=nnx.Rngs(0)), num_labels=num_labels,
                                                 head=head, bias=bias, rngs=nnx.Rngs(0)))
    graphdef, state, rest = nnx.split(abstract, nnx.Param, ...)
    expected = set()
    for path_, var in nnx.to_flat_state(state):
        keys = tuple(str(getattr(p, "key", p)) for p in path_)
        # trunk parameters are named and placed as the decoder's (path below `trunk/`); the head by its table
        local = keys[1:] if keys[0] == "trunk" else keys
        name = hf_name(local) if keys[0] == "trunk" else HEAD_NAMES[path_str(keys)]
        expected.add(name)
        if name not in tensors:
            raise CheckpointError(f"tensor {name!r} (parameter {path_str(keys)}) is missing from the checkpoint in {root}")
        var.set_value(load_tensor(tensors[name], name, local, var.get_value(), mesh))
    extra = sorted(n for n in tensors if n not in expected and not ALWAYS_IGNORED.fullmatch(n) and n != "lm_head.weight")
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
        name = hf_name(keys[1:]) if keys[0] == "trunk" else HEAD_NAMES[key]
        host = to_host(x)
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
