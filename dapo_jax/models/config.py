"""Frozen, typed decoder config built from (and written back to) a Hugging Face ``config.json``.

One config covers the three supported families:

| family | HF ``model_type`` | q/k/v bias | q/k RMSNorm | RoPE scaling |
|---|---|---|---|---|
| Qwen2 / Qwen2.5 | ``qwen2`` | yes | no | none |
| Qwen3 | ``qwen3`` | ``attention_bias`` (False) | yes | none |
| Llama 3 / 3.1 / 3.2 | ``llama`` | ``attention_bias`` (False) | no | optional ``llama3`` |
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
}
DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "dots_saveable")
# models/attention.py: "auto" picks per backend and sequence length (attention.resolve)
ATTENTION_IMPLEMENTATIONS = ("auto", "reference", "blockwise", "splash", "gpu_flash")


class ModelConfigError(ValueError):
    """A Hugging Face config that this project cannot build a model from."""


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3's frequency-dependent RoPE scaling (HF ``rope_type: llama3``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Everything the decoder needs; immutable and validated at construction."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    # dtype policy: parameters stored in `param_dtype`, matmuls in `dtype`; norms,
    # softmax and log-softmax always accumulate in float32.
    param_dtype: str = "float32"
    dtype: str = "float32"
    remat: str = "none"
    attention: str = "auto"  # the cache-free attention (models/attention.py); not part of config.json

    def __post_init__(self):
        if self.model_type not in ARCHITECTURES:
            raise ModelConfigError(
                f"model_type={self.model_type!r} is not supported; expected one of {sorted(ARCHITECTURES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ModelConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ModelConfigError(f"head_dim={self.head_dim} must be even for RoPE")
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in DTYPES:
                raise ModelConfigError(f"{name}={getattr(self, name)!r} must be one of {DTYPES}")
        if self.remat not in REMAT_POLICIES:
            raise ModelConfigError(f"remat={self.remat!r} must be one of {REMAT_POLICIES}")
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ModelConfigError(f"attention={self.attention!r} must be one of {ATTENTION_IMPLEMENTATIONS}")

    @property
    def num_query_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ HF I/O
    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], **overrides) -> "ModelConfig":
        """Builds the config from a parsed HF ``config.json``; names the bad field on error."""
        model_type = hf.get("model_type")
        if model_type not in ARCHITECTURES:
            archs = hf.get("architectures")
            raise ModelConfigError(
                f"unsupported architecture model_type={model_type!r} (architectures={archs}); "
                f"supported: {sorted(ARCHITECTURES)}"
            )

        def need(key):
            if key not in hf or hf[key] is None:
                raise ModelConfigError(f"config.json is missing the required field {key!r}")
            return hf[key]

        hidden, heads = need("hidden_size"), need("num_attention_heads")
        head_dim = hf.get("head_dim") or hidden // heads
        if model_type != "qwen3" and hf.get("head_dim") is None and hidden % heads:
            raise ModelConfigError(
                f"hidden_size={hidden} is not divisible by num_attention_heads={heads} and no head_dim is given"
            )
        eos = hf.get("eos_token_id")
        eos = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
        kwargs = dict(
            model_type=model_type,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_hidden_layers=need("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(_rope_theta(hf)),
            rope_scaling=_rope_scaling(hf),
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=True if model_type == "qwen2" else bool(hf.get("attention_bias", False)),
            qk_norm=model_type == "qwen3",
            bos_token_id=hf.get("bos_token_id"),
            eos_token_id=eos,
            pad_token_id=hf.get("pad_token_id"),
        )
        if model_type == "llama" and hf.get("mlp_bias"):
            raise ModelConfigError("mlp_bias=True is not supported for llama")
        if hf.get("hidden_act", "silu") != "silu":
            raise ModelConfigError(f"hidden_act={hf.get('hidden_act')!r} is not supported (only 'silu')")
        kwargs.update(overrides)
        return cls(**kwargs)

    @classmethod
    def from_pretrained(cls, path: str | Path, **overrides) -> "ModelConfig":
        file = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
        if not file.exists():
            raise FileNotFoundError(f"no config.json at {file}")
        try:
            hf = json.loads(file.read_text())
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"{file} is not valid JSON: {e}") from e
        try:
            return cls.from_hf_dict(hf, **overrides)
        except ModelConfigError as e:
            raise ModelConfigError(f"{file}: {e}") from e

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` that ``transformers`` builds the same model from."""
        hf: dict[str, Any] = {
            "architectures": [ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "torch_dtype": self.param_dtype,
            "use_cache": True,
        }
        if self.rope_scaling is not None:
            hf["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(self.rope_scaling)}
        if self.bos_token_id is not None:
            hf["bos_token_id"] = self.bos_token_id
        if self.eos_token_id:
            hf["eos_token_id"] = self.eos_token_id[0] if len(self.eos_token_id) == 1 else list(self.eos_token_id)
        if self.pad_token_id is not None:
            hf["pad_token_id"] = self.pad_token_id
        return hf


def _rope_theta(hf: dict) -> float:
    if "rope_theta" in hf:
        return hf["rope_theta"]
    params = hf.get("rope_parameters") or {}
    return params.get("rope_theta", 10000.0)


def _rope_scaling(hf: dict) -> RopeScaling | None:
    scaling = hf.get("rope_scaling") or hf.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise ModelConfigError(f"rope_scaling type {kind!r} is not supported (only 'llama3')")
    try:
        return RopeScaling(
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise ModelConfigError(f"rope_scaling of type llama3 is missing the field {e.args[0]!r}") from e
