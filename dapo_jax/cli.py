"""`dapo-jax`: train, evaluate, export and plot.

    dapo-jax train [CONFIG.yaml] [key.sub=value ...]   # no config = configs/tiny_dapo.yaml; rerun = resume
    dapo-jax eval CONFIG_OR_RUN_DIR [key.sub=value ...] # avg@k, pass@k, maj@k of the newest checkpoint
    dapo-jax export CHECKPOINT OUT_DIR                  # Hugging Face model + tokenizer
    dapo-jax plot RUN_DIR                               # PNG curves into RUN_DIR/plots
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dapo_jax.training.config import CONFIG_DIR, ConfigError, load_config
from dapo_jax.training.rollout import StarvationError
from dapo_jax.training.sources import DataError


def _split_config_and_overrides(items: list[str]) -> tuple[str | None, list[str]]:
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return None, items


def _resolve_config(path: str | None) -> Path | None:
    """A config path; a bare name like `tiny_grpo` means configs/tiny_grpo.yaml."""
    if path is None:
        return None
    p = Path(path)
    if not p.exists() and (CONFIG_DIR / f"{path}.yaml").exists():
        return CONFIG_DIR / f"{path}.yaml"
    return p


def cmd_train(args) -> int:
    from dapo_jax.training.loop import train

    config, overrides = _split_config_and_overrides(args.items)
    cfg = load_config(_resolve_config(config), overrides)
    final = train(cfg)
    summary = ("step", "steps_skipped", "prompts_dropped_too_long")
    print(json.dumps({k: v for k, v in final.items() if k.startswith("eval/") or k in summary}))
    return 0


def cmd_eval(args) -> int:
    import jax
    from flax import nnx

    from dapo_jax.sampling.sampler import make_generate
    from dapo_jax.training import sources
    from dapo_jax.training.evaluate import evaluate
    from dapo_jax.training.loop import build_mesh, load_trained_model, sampling_config

    target, overrides = _split_config_and_overrides(args.items)
    target = _resolve_config(target)
    run_dir = target if target is not None and target.is_dir() else None
    cfg = load_config(target, overrides)
    if cfg.data.eval is None:
        raise ConfigError(f"{target}: data.eval is not set: nothing to evaluate on")
    mesh = build_mesh(cfg)
    model, tokenizer, step = load_trained_model(cfg, run_dir, mesh=mesh)
    with jax.set_mesh(mesh):
        graphdef, params = nnx.split(model)
        gen = make_generate(graphdef, sampling_config(cfg, tokenizer, model.config, eval_mode=True), cfg.train.eval_k)
        stream = sources.make_stream(cfg.data.eval, tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                                     seed=cfg.data.seed, shuffle=False)
        scorer = sources.make_scorer(cfg.reward, cfg.objective_config)
        res = evaluate(gen, params, stream, tokenizer=tokenizer, scorer=scorer, key=jax.random.PRNGKey(cfg.train.seed),
                       batch_size=cfg.rollout.gen_batch, k=cfg.train.eval_k, limit=cfg.data.eval_size)
    print(json.dumps({"step": step, **res}))
    return 0


def cmd_export(args) -> int:
    from dapo_jax.models.generation_config import load_generation_config
    from dapo_jax.models.hf_io import save_pretrained
    from dapo_jax.training.config import resolve_path
    from dapo_jax.training.loop import load_trained_model

    ckpt = Path(args.checkpoint)
    run_dir = ckpt
    while run_dir != run_dir.parent and not (run_dir / "config.yaml").exists():
        run_dir = run_dir.parent
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{ckpt}: no config.yaml in it or its parents: not inside a run directory")
    cfg = load_config(run_dir / "config.yaml")
    model, tokenizer, step = load_trained_model(cfg, ckpt)
    generation = load_generation_config(resolve_path(cfg.model.path))  # the base's stop tokens and defaults
    out = save_pretrained(model, args.out_dir, tokenizer=tokenizer, generation_config=generation)
    print(f"exported step {step} to {out}")
    return 0


def cmd_plot(args) -> int:
    from dapo_jax.plot import plot_run

    for path in plot_run(args.run_dir, args.out):
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dapo-jax", description="DAPO / GRPO-family RL post-training in JAX.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train (or resume) a run")
    p.add_argument("items", nargs="*", metavar="[CONFIG.yaml] key.sub=value",
                   help="a config file (default configs/tiny_dapo.yaml) then dotted overrides")
    p.set_defaults(fn=cmd_train)
    p = sub.add_parser("eval", help="avg@k, pass@k, maj@k of a run's newest checkpoint (or a config's base model)")
    p.add_argument("items", nargs="+", metavar="CONFIG_OR_RUN_DIR [key.sub=value]")
    p.set_defaults(fn=cmd_eval)
    p = sub.add_parser("export", help="write a checkpoint as a Hugging Face model directory with its tokenizer")
    p.add_argument("checkpoint", help="a run dir, its checkpoints/ folder, or checkpoints/STEP")
    p.add_argument("out_dir")
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("plot", help="PNG curves of a run's metrics.jsonl")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="output folder (default RUN_DIR/plots)")
    p.set_defaults(fn=cmd_plot)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """What the user must fix (exit code 2): bad config, data, model or checkpoint files, mesh."""
    from dapo_jax.models.config import ModelConfigError
    from dapo_jax.models.hf_io import CheckpointError as ModelCheckpointError
    from dapo_jax.parallel.mesh import MeshError
    from dapo_jax.training.checkpoint import CheckpointError

    return (ConfigError, DataError, ModelCheckpointError, ModelConfigError, CheckpointError, MeshError,
            FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done; 2 a user error (one line naming the key, file or row); 3 dynamic sampling
    starved; 4 non-finite updates kept coming; 143 stopped by SIGTERM after saving a checkpoint."""
    from dapo_jax.training.guards import RunStopped

    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except StarvationError as e:
        print(f"dapo-jax: {e}", file=sys.stderr)
        return 3
    except RunStopped as e:
        print(f"dapo-jax: {type(e).__name__}: {e}", file=sys.stderr)
        return e.exit_code
    except _user_errors() as e:
        print(f"dapo-jax: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
