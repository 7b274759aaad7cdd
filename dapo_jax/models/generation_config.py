"""``generation_config.json``: the stop tokens and sampling defaults a checkpoint ships beside ``config.json``.

    gen = load_generation_config("Qwen2.5-0.5B-Instruct/")    # empty GenerationConfig when the file is absent
    gen.eos_token_id                                           # (151645, 151643): <|im_end|>, <|endoftext|>
    stop_token_ids(model.config, gen, tokenizer)               # what the sampler stops on
    gen.save("out/")                                           # written back, unknown keys included

Why it matters: chat models list their end-of-turn token only here. Qwen2.5-Instruct's
``config.json`` says ``eos_token_id: 151645`` but its chat turns may also end with ``<|endoftext|>``
(151643), which only ``generation_config.json`` names; a sampler that ignores the file keeps going
after the answer, to ``max_new_tokens``, and the overlong penalty then punishes a right answer.

The sampling defaults (``temperature``, ``top_p``, ``top_k``, ``do_sample``, ``max_new_tokens``)
are what the model's authors recommend for *evaluation*; training never reads them (RL rollouts
sample at ``rollout.temperature``, the temperature the trainer's log-probs are taken at).
``dapo-jax eval`` of a base model uses them when no flag says otherwise. Keys this project does not
use (``repetition_penalty``, ...) are kept and written back unchanged, never applied.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Mapping

from dapo_jax.models.config import ModelConfigError

GENERATION_CONFIG_FILE = "generation_config.json"
_FIELDS = ("eos_token_id", "pad_token_id", "bos_token_id", "temperature", "top_p", "top_k", "do_sample",
           "max_new_tokens")


class GenerationConfigError(ModelConfigError):
    """A ``generation_config.json`` this project cannot read; names the file and the field."""


def _ids(value: Any, field: str) -> tuple[int, ...]:
    """HF writes ``eos_token_id`` as an int or a list of ints (or null)."""
    if value is None:
        return ()
    items = value if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
        raise GenerationConfigError(f"{field} must be a token id or a list of token ids >= 0, got {value!r}")
    return tuple(items)


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """The fields of ``generation_config.json`` this project uses; ``None`` = not given."""

    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    do_sample: bool | None = None
    max_new_tokens: int | None = None
    # every other key, written back as read (never applied here)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "GenerationConfig":
        def number(key, kind):
            v = d.get(key)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
                raise GenerationConfigError(f"{key} must be a {kind.__name__}, got {v!r}")
            return kind(v)

        single = {k: _ids(d.get(k), k) for k in ("pad_token_id", "bos_token_id")}
        do_sample = d.get("do_sample")
        if do_sample is not None and not isinstance(do_sample, bool):
            raise GenerationConfigError(f"do_sample must be true or false, got {do_sample!r}")
        return cls(
            eos_token_id=_ids(d.get("eos_token_id"), "eos_token_id"),
            pad_token_id=single["pad_token_id"][0] if single["pad_token_id"] else None,
            bos_token_id=single["bos_token_id"][0] if single["bos_token_id"] else None,
            temperature=number("temperature", float), top_p=number("top_p", float), top_k=number("top_k", int),
            do_sample=do_sample, max_new_tokens=number("max_new_tokens", int),
            extra={k: v for k, v in d.items() if k not in _FIELDS},
        )

    @classmethod
    def from_model_config(cls, config) -> "GenerationConfig":
        """What ``transformers`` derives when a checkpoint has no file: the config's special tokens."""
        return cls(eos_token_id=tuple(config.eos_token_id), pad_token_id=config.pad_token_id,
                   bos_token_id=config.bos_token_id, extra={"_from_model_config": True})

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.extra)
        for key in _FIELDS:
            value = getattr(self, key)
            if key == "eos_token_id":
                value = None if not value else value[0] if len(value) == 1 else list(value)
            if value is not None:
                out[key] = value
        return out

    def save(self, path: str | os.PathLike) -> Path:
        file = Path(path) / GENERATION_CONFIG_FILE
        file.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return file

    def sampling_defaults(self) -> dict[str, float | int]:
        """``{"temperature", "top_p", "top_k"}`` the file recommends (only those it sets); ``do_sample:
        false`` means greedy, i.e. temperature 0."""
        if self.do_sample is False:
            return {"temperature": 0.0}
        out = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        return {k: v for k, v in out.items() if v is not None}


def load_generation_config(path: str | os.PathLike) -> GenerationConfig:
    """The checkpoint directory's ``generation_config.json``, or an empty config when it has none."""
    root = Path(path)
    file = root / GENERATION_CONFIG_FILE if root.is_dir() or not root.suffix else root
    if not file.exists():
        return GenerationConfig()
    try:
        data = json.loads(file.read_text())
        if not isinstance(data, dict):
            raise GenerationConfigError(f"the top level must be an object, got {type(data).__name__}")
        return GenerationConfig.from_dict(data)
    except json.JSONDecodeError as e:
        raise GenerationConfigError(f"{file} is not valid JSON: {e}") from e
    except GenerationConfigError as e:
        raise GenerationConfigError(f"{file}: {e}") from e


def stop_token_ids(model_config, generation: GenerationConfig | None = None, tokenizer=None) -> tuple[int, ...]:
    """Every id a response may end with, in order, without repeats: ``config.json``'s ``eos_token_id``,
    ``generation_config.json``'s (one or a list), and the tokenizer's ``eos_token_id``."""
    ids = [*model_config.eos_token_id, *(generation.eos_token_id if generation is not None else ())]
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return tuple(dict.fromkeys(int(i) for i in ids))


__all__ = ["GENERATION_CONFIG_FILE", "GenerationConfig", "GenerationConfigError", "load_generation_config",
           "stop_token_ids"]
