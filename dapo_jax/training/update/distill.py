"""On-policy distillation's teacher: a frozen model on the mesh beside the policy (objectives/distill.py).

    check_teacher(cfg, tokenizer)              # before any model loads: same tokenizer, or one line
    teacher = load_teacher(cfg, mesh)          # frozen, sharded like the policy, never trained or saved
    programs = build_programs(..., teacher=teacher)   # `prepare` scores the student's tokens with it

The teacher may have another size than the student (layers, width, heads): it only has to read and
score the same token ids, so its tokenizer must be the student's (the same vocabulary, the same ids).
Its weights stay resident for the run, in `model.param_dtype`, computing in `model.dtype`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from dapo_jax.models.checks import check_finite_weights, check_tokenizer_fits
from dapo_jax.models.hf_io import load_pretrained, load_tokenizer
from dapo_jax.objectives.distill import reverse_kl_metric
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.paths import resolve_path
from dapo_jax.training.config.run import RunConfig


class Teacher(NamedTuple):
    graphdef: Any
    params: Any  # nnx.State on the mesh (frozen)
    path: str


def _teacher_path(cfg: RunConfig):
    path = resolve_path(cfg.distill.teacher)
    if not (path / "config.json").exists():
        raise ConfigError(f"distill.teacher: no Hugging Face checkpoint (config.json) at {path}")
    return path


def check_teacher(cfg: RunConfig, tokenizer) -> None:
    """Refuses, in one line naming `distill.teacher`, a teacher whose tokenizer is not the policy's."""
    path = _teacher_path(cfg)
    try:
        theirs = load_tokenizer(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"distill.teacher: cannot read the tokenizer at {path}: {e}") from None
    ours, other = tokenizer.get_vocab(), theirs.get_vocab()
    if ours != other:
        diff = sorted(set(ours.items()) ^ set(other.items()))[:3]
        raise ConfigError(f"distill.teacher: its tokenizer ({path}, {len(other)} tokens) is not model.path's "
                          f"({len(ours)} tokens; first differences {diff}): the teacher scores the student's token "
                          f"ids, so both must use the same tokenizer")


def load_teacher(cfg: RunConfig, mesh, tokenizer) -> Teacher:
    """The teacher's weights on `mesh`, checked (finite, its vocabulary holds the tokenizer's ids)."""
    path = _teacher_path(cfg)
    model = load_pretrained(path, mesh=mesh, param_dtype=cfg.model.param_dtype, dtype=cfg.model.dtype,
                            remat=cfg.model.remat, attention=cfg.model.attention)
    check_tokenizer_fits(model.config, tokenizer, source=str(path))
    check_finite_weights(model, source=str(path))
    graphdef, params = nnx.split(model)
    return Teacher(graphdef, params, str(path))


@jax.jit
def reverse_kl_mean(old_logp, teacher_logp, mask):
    """The batch's token-mean `log π_old − log π_T` over the response mask (the metric `distill/reverse_kl`)."""
    value, count = reverse_kl_metric(old_logp, teacher_logp, mask)
    return value / jnp.maximum(count, 1.0)


__all__ = ["Teacher", "check_teacher", "load_teacher", "reverse_kl_mean"]
