"""Where the metrics go besides RUN_DIR/metrics.jsonl: TensorBoard and/or Weights & Biases.

    train:
      loggers: [tensorboard, wandb]         # default: [tensorboard] (or [] with the older train.tensorboard: false)
      wandb: {project: dapo-jax, mode: offline}

`metrics.jsonl` is always written (the plots, `dapo-jax eval` and resume read it); these are views
of the same rows. Weights & Biases is an optional extra (`pip install -e ".[wandb]"`); with
`mode: offline` (or `WANDB_MODE=offline` in the environment) it needs no network and no account,
and `wandb sync RUN_DIR/wandb/offline-run-*` uploads later. A resumed run continues the same W&B run
(its id is kept in RUN_DIR/wandb_run_id); steps redone after a resume are dropped by W&B, which only
accepts increasing steps (metrics.jsonl keeps them). Only process 0 builds loggers.
"""

from __future__ import annotations

import math
import uuid
from pathlib import Path

from dapo_jax.training.config.base import ConfigError


class TensorBoardLogger:
    def __init__(self, run_dir: str | Path):
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"), flush_secs=10)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self._tb.add_scalar(k, v, int(step))

    def close(self) -> None:
        self._tb.close()


def _import_wandb():
    try:
        import wandb
    except ImportError:
        raise ConfigError("train.loggers: wandb is listed but the package is not installed: "
                          "pip install -e \".[wandb]\" (or drop it from train.loggers)") from None
    return wandb


def check_loggers(cfg) -> None:
    """Raises `ConfigError` when a logger `cfg.train` asks for cannot be built (wandb not installed). Every
    process calls it before the model loads: only process 0 builds the loggers, after the model, where
    its error would leave the other processes of the run waiting in their first collective."""
    if "wandb" in cfg.train.active_loggers:
        _import_wandb()


class WandbLogger:
    def __init__(self, run_dir: str | Path, settings, config: dict | None = None):
        wandb = _import_wandb()
        run_dir = Path(run_dir)
        id_file = run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        self._run = wandb.init(project=settings.project, entity=settings.entity, group=settings.group,
                               name=settings.name or run_dir.resolve().name, tags=list(settings.tags),
                               mode=settings.mode, dir=str(run_dir), id=run_id, resume="allow", config=config)
        id_file.write_text(run_id + "\n")

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=int(step))

    def close(self) -> None:
        self._run.finish()


def make_loggers(cfg, run_dir: str | Path) -> list:
    """The loggers `cfg.train` asks for (`cfg`: a RunConfig; its resolved config goes to W&B)."""
    out = []
    for name in cfg.train.active_loggers:
        if name == "tensorboard":
            out.append(TensorBoardLogger(run_dir))
        elif name == "wandb":
            out.append(WandbLogger(run_dir, cfg.train.wandb, config=cfg.model_dump(mode="json")))
    return out


def scalars(row: dict) -> dict[str, float]:
    """The finite numbers of a metrics row (not `step`, not flags): what the loggers plot."""
    return {k: v for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
