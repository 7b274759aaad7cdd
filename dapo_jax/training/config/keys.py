"""The dotted keys of a config model (`optim.lr`, `train.wandb.project`, ...): listing them, and the
"did you mean" an unknown key gets (a near spelling, the initials of a long name, the same key in another
section, or the name another trainer gives it).
"""

from __future__ import annotations

import difflib
import typing

from pydantic import BaseModel


def section_model(annotation) -> type[BaseModel] | None:
    """The section class inside a field's annotation (`X`, `X | None`, `list[X]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (found := section_model(arg)) is not None:
            return found
    return None



def all_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of `model` (a `RunConfig`: `optim.lr`, `train.wandb.project`, `reward.functions.name`, ...)."""
    out = []
    for name, field in model.model_fields.items():
        sub = section_model(field.annotation)
        out += all_keys(sub, f"{prefix}{name}.") if sub is not None else [f"{prefix}{name}"]
    return out


# the names other RL trainers give to this config's keys (TRL's GRPOConfig, verl's actor_rollout_ref.rollout)
PEER_KEYS = {"num_generations": "rollout.G", "rollout.n": "rollout.G", "n_samples": "rollout.G",
             "per_device_train_batch_size": "rollout.train_batch",
             "max_completion_length": "rollout.max_new_tokens", "max_prompt_length": "data.max_prompt_length",
             "response_length": "rollout.max_new_tokens", "beta": "objective.kl_beta", "epsilon": "objective.eps_low",
             "epsilon_high": "objective.eps_high", "clip_ratio_high": "objective.eps_high",
             "clip_ratio_low": "objective.eps_low"}



def suggest(loc: tuple, root: type[BaseModel]) -> str:
    """` (did you mean 'optim.lr'?)` for an unknown key at `loc` of the model `root`: a near spelling in its
    section, the initials of a long name (`learning_rate` -> `lr`), or the same key in another section."""
    section: type[BaseModel] | None = root
    for part in loc[:-1]:
        if isinstance(part, int) or section is None:
            continue
        field = section.model_fields.get(part)
        section = section_model(field.annotation) if field is not None else None
    if section is None:
        return ""
    key, names = str(loc[-1]), list(section.model_fields)
    dotted = ".".join(str(p) for p in loc)
    peer = PEER_KEYS.get(dotted.split(".", 1)[-1]) or PEER_KEYS.get(key)
    if peer is not None and peer != dotted:
        return f" (did you mean {peer!r}? {key!r} is what other trainers call it)"
    prefix = ".".join(str(p) for p in loc[:-1])
    prefix = f"{prefix}." if prefix else ""
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    initials = "".join(w[0] for w in key.split("_") if w)
    close = close or [n for n in names if "_" in key and n == initials]
    if close:
        return f" (did you mean {prefix + close[0]!r}?)"
    elsewhere = [k for k in all_keys(root) if k.rsplit(".", 1)[-1] == key]
    return f" (did you mean {elsewhere[0]!r}?)" if elsewhere else ""
