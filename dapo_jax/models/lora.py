"""LoRA adapters (Hu et al., 2021) on a built Decoder's attention and MLP projections, with flax.nnx's LoRA modules.

    add_lora(model, rank=8, alpha=16, targets=("q_proj", "v_proj"), rngs=nnx.Rngs(0))   # in place
    graphdef, adapters, base = nnx.split(model, nnx.LoRAParam, ...)   # adapters: the trained leaves only
    merged = merge_weights(base, adapters, lora_scaling(model))        # a plain Decoder's state
    plain = merged_decoder(model)                                      # a Decoder without adapters (export)
    save_peft_adapter(model, "out/", base_model_name_or_path="Qwen/Qwen2.5-0.5B")   # peft.PeftModel loads it

Each targeted ``nnx.Linear`` becomes a :class:`LoRALinear` (an ``nnx.LoRALinear`` whose kernel and bias
are the very Variables of the Linear it replaces, at the same paths) computing, as PEFT does,

    y = x W + b + (alpha / r) · (x A) B,        A [in, r], B [r, out]: ``nnx.LoRAParam``

B starts at zero, so the adapted model starts equal to the base; A is drawn as PEFT draws it
(Kaiming-uniform with a=√5: U(±1/√in)). No dropout. The adapters live at
``layers/3/self_attn/q_proj/lora/lora_a``; every other leaf keeps its path, so the state of all but
the adapters is exactly a plain Decoder's state: :func:`merge_weights` adds (alpha/r)·A·B to each
targeted kernel and the result loads into a plain Decoder's graphdef (the sampler, the HF export).

PEFT format (:func:`save_peft_adapter`): ``adapter_config.json`` + ``adapter_model.safetensors`` with
``base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`` [r, in] (= A^T) and
``...lora_B.weight`` [out, r] (= B^T): torch Linear weights are [out, in], our kernels [in, out].
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from dapo_jax.models.decoder import Decoder
from dapo_jax.models.hf_names import hf_name
from dapo_jax.models.safetensors_files import save_safetensors, to_host
from dapo_jax.models.sharding import param_shardings

ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
TARGETS = ATTENTION_TARGETS + MLP_TARGETS
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

# PEFT's default A initialiser, kaiming_uniform_(a=sqrt(5)): bound = sqrt(6 / ((1 + 5) * fan_in)) = 1/sqrt(fan_in)
peft_a_init = nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


class LoRALinear(nnx.LoRALinear):
    """``nnx.LoRALinear`` with PEFT's scaling: ``Linear(x) + scaling · lora(x)``, scaling = alpha / r."""

    def __init__(self, *args, scaling: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.scaling = float(scaling)

    def __call__(self, x: jax.Array, out_sharding=None) -> jax.Array:
        y = nnx.Linear.__call__(self, x, out_sharding=out_sharding)
        return y + (self.lora(x) * self.scaling).astype(y.dtype)

    @classmethod
    def from_linear(cls, linear: nnx.Linear, *, rank: int, alpha: float, rngs: nnx.Rngs) -> "LoRALinear":
        """Adapters around `linear`'s own kernel and bias Variables (shared, not copied; nothing of the
        size of the kernel is allocated)."""
        n_in, n_out = linear.in_features, linear.out_features
        shell = nnx.eval_shape(lambda: cls(
            n_in, n_out, lora_rank=rank, scaling=alpha / rank, use_bias=linear.use_bias, dtype=linear.dtype,
            param_dtype=linear.param_dtype, precision=linear.precision, rngs=nnx.Rngs(0)))
        shell.kernel = linear.kernel
        shell.bias = linear.bias
        shell.lora = nnx.LoRA(n_in, rank, n_out, dtype=linear.dtype, param_dtype=linear.param_dtype,
                              a_initializer=peft_a_init, rngs=rngs)
        return shell


def _targets(model: Decoder):
    """(parent module, attribute name) of every projection that can take an adapter."""
    for block in model.layers:
        for name in ATTENTION_TARGETS:
            yield block.self_attn, name
        for name in MLP_TARGETS:
            yield block.mlp, name


def add_lora(model: Decoder, *, rank: int, alpha: float, targets=TARGETS, rngs: nnx.Rngs,
             mesh: Mesh | None = None) -> Decoder:
    """Puts adapters on every layer's `targets` projections IN PLACE (returns `model`); with `mesh`,
    the new adapters are placed by `models.sharding.PARTITION_RULES`."""
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown or not targets:
        raise ValueError(f"LoRA targets {list(targets)}: each must be one of {list(TARGETS)}, at least one")
    if rank <= 0 or alpha <= 0:
        raise ValueError(f"LoRA rank={rank} and alpha={alpha} must be positive")
    for parent, name in _targets(model):
        linear = getattr(parent, name)
        if name in targets:
            if isinstance(linear, LoRALinear):
                raise ValueError(f"{name} already has a LoRA adapter")
            setattr(parent, name, LoRALinear.from_linear(linear, rank=rank, alpha=alpha, rngs=rngs))
    if mesh is not None:
        adapters = nnx.state(model, nnx.LoRAParam)
        nnx.update(model, jax.device_put(adapters, param_shardings(adapters, mesh)))
    return model


def lora_modules(model: nnx.Module) -> list[tuple[tuple, LoRALinear]]:
    """(path, module) of every adapted projection, in model order."""
    return [(path, m) for path, m in nnx.iter_modules(model) if isinstance(m, LoRALinear)]


def lora_scaling(model: nnx.Module) -> float:
    """alpha / r, shared by every adapter of `model`."""
    scalings = {m.scaling for _, m in lora_modules(model)}
    if len(scalings) != 1:
        raise ValueError(f"expected adapters with one scaling, found {sorted(scalings) or 'no adapters'}")
    return scalings.pop()


def _adapter_pairs(adapters: nnx.State) -> dict[tuple, tuple[jax.Array, jax.Array]]:
    """Kernel path -> (A, B) for every adapter in `adapters`."""
    flat = {tuple(p): v.get_value() for p, v in nnx.to_flat_state(adapters)}
    pairs = {}
    for path, a in flat.items():
        if path[-2:] == ("lora", "lora_a"):
            pairs[path[:-2] + ("kernel",)] = (a, flat[path[:-1] + ("lora_b",)])
    return pairs


def merged_kernels(kernels: dict, pairs: dict, scaling: float) -> dict:
    """`{path: W + scaling · A·B}` (in float32, stored back in W's dtype): pure, jittable."""
    return {path: (w.astype(jnp.float32) + scaling * jnp.matmul(pairs[path][0].astype(jnp.float32),
                                                                 pairs[path][1].astype(jnp.float32))).astype(w.dtype)
            for path, w in kernels.items()}


def merge_weights(base: nnx.State, adapters: nnx.State, scaling: float, *, merge_fn=merged_kernels) -> nnx.State:
    """A plain Decoder's state: `base` (every leaf but the adapters) with (alpha/r)·A·B added to each adapted
    kernel. Only the adapted kernels are new arrays (`merge_fn`, e.g. a jitted `merged_kernels`); every other
    leaf is `base`'s own."""
    pairs = _adapter_pairs(adapters)
    flat = [(tuple(p), v) for p, v in nnx.to_flat_state(base)]
    missing = sorted(set(pairs) - {p for p, _ in flat})
    if missing:
        raise ValueError(f"adapters without a base kernel: {['/'.join(map(str, p)) for p in missing[:4]]}")
    new = merge_fn({p: v.get_value() for p, v in flat if p in pairs}, pairs, scaling)
    return nnx.from_flat_state([(p, v.replace(new[p]) if p in new else v) for p, v in flat])


def plain_graphdef(config) -> nnx.GraphDef:
    """The graphdef of a Decoder of `config` without adapters (no weights allocated)."""
    return nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))))[0]


def merged_decoder(model: Decoder) -> Decoder:
    """A new plain Decoder whose targeted kernels are W + (alpha/r)·A·B (`model` itself when it has no adapters)."""
    if not lora_modules(model):
        return model
    _, adapters, base = nnx.split(model, nnx.LoRAParam, ...)
    return nnx.merge(plain_graphdef(model.config), merge_weights(base, adapters, lora_scaling(model)))


def peft_config(model: Decoder, *, base_model_name_or_path: str) -> dict:
    """The `adapter_config.json` of `model`'s adapters (a LoRA `peft.LoraConfig`)."""
    modules = lora_modules(model)
    if not modules:
        raise ValueError("the model has no LoRA adapters to export")
    ranks = {m.lora.lora_a.shape[1] for _, m in modules}
    if len(ranks) != 1:
        raise ValueError(f"adapters of several ranks {sorted(ranks)} cannot be written as one PEFT adapter")
    rank = ranks.pop()
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model_name_or_path,
        "r": rank, "lora_alpha": _number(lora_scaling(model) * rank), "lora_dropout": 0.0,
        "target_modules": sorted({str(path[-1]) for path, _ in modules}), "bias": "none",
        "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "init_lora_weights": True,
        "inference_mode": True, "modules_to_save": None, "layers_to_transform": None, "revision": None,
    }


def _number(x: float) -> int | float:
    x = round(x, 9)
    return int(x) if x == int(x) else x


def peft_tensors(adapters: nnx.State, dtype=None) -> dict[str, np.ndarray]:
    """PEFT's tensor names -> host arrays: lora_A.weight = A^T [r, in], lora_B.weight = B^T [out, r]."""
    out = {}
    for path, (a, b) in _adapter_pairs(adapters).items():
        stem = "base_model.model." + hf_name(path).removesuffix(".weight")  # model.layers.N.self_attn.q_proj
        for which, x in (("lora_A", a), ("lora_B", b)):
            host = to_host(x).T
            out[f"{stem}.{which}.weight"] = np.ascontiguousarray(host, dtype=dtype or host.dtype)
    return out


def save_peft_adapter(model: Decoder, path: str | os.PathLike, *, base_model_name_or_path: str,
                      dtype: str | None = None) -> Path:
    """Writes `model`'s adapters as a PEFT LoRA adapter directory:
    `peft.PeftModel.from_pretrained(<the base transformers model>, path)` adds them to the base.
    In a multi-host run every process must call it; only process 0 writes."""
    config = peft_config(model, base_model_name_or_path=base_model_name_or_path)
    tensors = peft_tensors(nnx.state(model, nnx.LoRAParam), None if dtype is None else jnp.dtype(dtype))
    root = Path(path)
    if jax.process_index() == 0:
        root.mkdir(parents=True, exist_ok=True)
        (root / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        save_safetensors(tensors, root / ADAPTER_WEIGHTS)
    return root


__all__ = [
    "ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "TARGETS", "LoRALinear", "add_lora", "lora_modules", "lora_scaling",
    "merge_weights", "merged_decoder", "merged_kernels", "peft_config", "peft_tensors", "plain_graphdef",
    "save_peft_adapter",
]
