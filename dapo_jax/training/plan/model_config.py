"""The model a plan compiles, read before anything is downloaded: `--model-config`'s config.json,
`model.path`'s, else the published shape its folder's name names (`known_shapes.py`); and the critic's trunk.

    model_cfg, source = plan_model_config(cfg)       # (models.config.ModelConfig, where it came from)
    trunk = critic_model_config(cfg, model_cfg)      # the policy's own config unless critic.path names another
"""

from __future__ import annotations

from pathlib import Path

from dapo_jax.models.config import ModelConfig
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.paths import resolve_path
from dapo_jax.training.config.run import RunConfig
from dapo_jax.training.plan.known_shapes import KNOWN_SHAPES, known_shape


def plan_model_config(cfg: RunConfig, model_config: str | Path | None = None):
    """`(ModelConfig, source)`: `--model-config`'s config.json, model.path's, else the published shape its
    folder's name names (`known_shapes.py`)."""
    m = cfg.model
    overrides = dict(param_dtype=m.param_dtype, dtype=m.dtype, remat=m.remat, attention=m.attention)
    return _model_config(m.path, model_config, overrides, key="model.path")


def critic_model_config(cfg: RunConfig, policy_cfg):
    """The critic's trunk: `critic.path`'s shapes when it names another model, else the policy's."""
    path = cfg.critic_optim.path
    if path is None or resolve_path(path) == resolve_path(cfg.model.path):
        return policy_cfg
    m = cfg.model
    overrides = dict(param_dtype=m.param_dtype, dtype=m.dtype, remat=m.remat, attention=m.attention)
    return _model_config(path, None, overrides, key="critic.path")[0]


def teacher_model_config(cfg: RunConfig):
    """On-policy distillation's teacher (`distill.teacher`): its config.json's shapes, or the published
    shape its folder's name names; None without a teacher."""
    if cfg.distill is None:
        return None
    m = cfg.model
    overrides = dict(param_dtype=m.param_dtype, dtype=m.dtype, remat=m.remat, attention=m.attention)
    return _model_config(cfg.distill.teacher, None, overrides, key="distill.teacher")[0]


def _model_config(model_path, model_config, overrides, *, key: str):
    if model_config is not None:
        path = Path(model_config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"--model-config {model_config}: no such config.json")
        return ModelConfig.from_pretrained(path, **overrides), str(path)
    path = resolve_path(model_path)
    if (path / "config.json").exists():
        return ModelConfig.from_pretrained(path, **overrides), str(path / "config.json")
    found = known_shape(path.name)
    if found is not None:
        name, hf = found
        return ModelConfig.from_hf_dict(hf, **overrides), f"{name}'s published config.json ({path} is absent)"
    raise ConfigError(f"{key}: no config.json at {path} and its name matches none of the published shapes the "
                      f"plan knows ({', '.join(KNOWN_SHAPES)}): pass --model-config path/to/config.json")


__all__ = ["critic_model_config", "plan_model_config", "teacher_model_config"]
