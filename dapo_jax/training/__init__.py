"""The DAPO training loop: typed config, rollout with dynamic sampling, jitted update, checkpoints, metrics.

    from dapo_jax.training import load_config, train
    train(load_config("tiny_dapo", ["train.steps=20"]))
"""

from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import RunConfig, config_from_dict, load_config, save_config
from dapo_jax.training.rollout import Groups, StarvationError, collect_groups


def train(config):
    """`dapo_jax.training.loop.train` (imported lazily: it pulls in the whole stack)."""
    from dapo_jax.training.loop import train as _train

    return _train(config)


__all__ = ["ConfigError", "Groups", "RunConfig", "StarvationError", "collect_groups", "config_from_dict",
           "load_config", "save_config", "train"]
