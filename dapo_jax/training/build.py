"""What a run is built from: the device mesh, the tokenizer and model of `model.path`, the sampler's
settings, and a trained checkpoint's model.

    mesh = build_mesh(cfg)                              # data x fsdp x tensor devices
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, mesh, tokenizer)            # sharded on the mesh, checked
    scfg = sampling_config(cfg, tokenizer, model.config)                  # the rollout's
    model, tokenizer, step = load_trained_model(cfg, "runs/x")           # a run's newest checkpoint

Each raises a one-line `ConfigError` naming the key to change before anything long starts.
"""

from __future__ import annotations

from pathlib import Path

import jax
from flax import nnx

from dapo_jax.models.checks import check_finite_weights, check_tokenizer_fits
from dapo_jax.models.generation_config import load_generation_config, stop_token_ids
from dapo_jax.models.hf_io import load_pretrained, load_tokenizer as load
from dapo_jax.models.lora import merged_decoder
from dapo_jax.parallel.mesh import make_mesh
from dapo_jax.parallel.process_data import start_processes
from dapo_jax.sampling.config import SamplingConfig
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.paths import resolve_path
from dapo_jax.training.config.run import RunConfig
from dapo_jax.training.state.checkpoint_reader import restore_params
from dapo_jax.training.update.lora import PolicyWeights
from dapo_jax.training.update.train_step import init_train_state, make_optimizer


def build_mesh(cfg: RunConfig):
    start_processes(cfg.mesh.distributed)  # before any other JAX call (docs/multihost.md)
    n = cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.tensor
    devices = jax.devices()
    if n > len(devices):
        raise ConfigError(f"mesh: data*fsdp*tensor={n} but only {len(devices)} devices are visible")
    if n < len(devices) and jax.process_index() == 0:
        print(f"[dapo-jax] warning: the mesh (data={cfg.mesh.data}, fsdp={cfg.mesh.fsdp}, tensor={cfg.mesh.tensor}) "
              f"uses {n} of the {len(devices)} visible devices; the other {len(devices) - n} stay idle", flush=True)
    return make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, devices=devices[:n])


def _model_path(cfg: RunConfig):
    path = resolve_path(cfg.model.path)
    if not (path / "config.json").exists():
        raise ConfigError(f"model.path: no Hugging Face checkpoint (config.json) at {path}: download one beside its "
                          f"tokenizer files (README, 'Bring your own model and data') or set model.path=DIR")
    return path


def load_tokenizer(cfg: RunConfig):
    return load(_model_path(cfg))


def load_model(cfg: RunConfig, mesh, tokenizer):
    """The configured model on `mesh`, checked: finite weights, a tokenizer that fits its vocabulary."""
    path = _model_path(cfg)
    model = load_pretrained(path, mesh=mesh, param_dtype=cfg.model.param_dtype, dtype=cfg.model.dtype,
                            remat=cfg.model.remat, attention=cfg.model.attention)
    check_tokenizer_fits(model.config, tokenizer, source=str(path), generation=load_generation_config(path))
    check_finite_weights(model, source=str(path))
    return model


def sampling_config(cfg: RunConfig, tokenizer, model_cfg, *, eval_mode: bool = False, generation=None):
    """The sampler's settings; it stops on every EOS id of config.json, generation_config.json (read
    from model.path when `generation` is None: chat models list their end-of-turn token only there)
    and the tokenizer."""
    generation = generation if generation is not None else load_generation_config(_model_path(cfg))
    eos = stop_token_ids(model_cfg, generation, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (model_cfg.pad_token_id or 0)
    r, t = cfg.rollout, cfg.train
    return SamplingConfig(
        max_new_tokens=r.max_new_tokens,
        temperature=t.eval_temperature if eval_mode else r.temperature,
        top_p=t.eval_top_p if eval_mode else r.top_p,
        top_k=t.eval_top_k if eval_mode else r.top_k,
        eos_token_ids=eos, pad_token_id=int(pad), compaction=r.compaction, compaction_min_rows=r.compaction_min_rows,
    )


def load_trained_model(cfg: RunConfig, checkpoint: str | Path | None = None, *, mesh=None, adapters: bool = False):
    """`(model, tokenizer, step)`: the base model with the params of `checkpoint` (a run dir, its
    `checkpoints/` folder or one `checkpoints/STEP`; None = the run dir's newest, base model if none).
    A LoRA run's adapters come merged into a plain Decoder, or with `adapters=True` as LoRA modules."""
    mesh = mesh or build_mesh(cfg)
    with jax.set_mesh(mesh):
        tokenizer = load_tokenizer(cfg)
        model = load_model(cfg, mesh, tokenizer)
        _, params = PolicyWeights.build(model, cfg.lora, seed=cfg.train.seed, mesh=mesh)  # LoRA: the adapters
        path = Path(checkpoint) if checkpoint is not None else Path(cfg.train.run_dir)
        step = None
        if path.name.isdigit() and path.parent.name == "checkpoints":
            path, step = path.parent, int(path.name)
        elif (path / "checkpoints").is_dir():
            path = path / "checkpoints"
        if not path.is_dir() or not any(p.name.isdigit() for p in path.iterdir()):
            if checkpoint is not None:
                raise FileNotFoundError(f"no checkpoint under {checkpoint}")
            return (model if adapters else merged_decoder(model)), tokenizer, 0
        tx, _ = make_optimizer(cfg.optim)
        target = jax.eval_shape(lambda p: init_train_state(p, tx), params)
        target = target._replace(params=params)
        restored = restore_params(path, target, step)
        nnx.update(model, restored.state.params)
        return (model if adapters else merged_decoder(model)), tokenizer, restored.step


__all__ = ["build_mesh", "load_model", "load_tokenizer", "load_trained_model", "sampling_config"]
