"""The `dapo-jax` commands that run a job: train, sft, rft, stages, eval, export, show and plot.

Each `cmd_NAME(args) -> int` takes the parsed arguments of its sub-command (cli/parser.py) and returns the
process's exit code; a user error is raised (ConfigError, DataError, ...) and becomes exit code 2 in
`dapo_jax.cli.main`. Heavy modules are imported inside the command that needs them, so `--help` and a
config error stay quick.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.paths import CONFIG_DIR, find_config
from dapo_jax.training.config.run import RunConfig, load_config


def split_config_and_overrides(items: list[str]) -> tuple[str | None, list[str]]:
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return None, items


def resolve_config(path: str | None) -> Path | None:
    """A config path; a bare name like `tiny_grpo` (or `configs/tiny_grpo.yaml`) is a packaged recipe."""
    return None if path is None else find_config(path)


# `dapo-jax train` with no config: DAPO on the chain-of-thought task (docs/cot_task.md), where its
# length-related mechanisms have work to do. `load_config(None)` stays the tiny task (tests, examples).
MAIN_JOB = CONFIG_DIR / "cot_dapo.yaml"


def cmd_train(args) -> int:
    config, overrides = split_config_and_overrides(args.items)
    return _train(load_config(resolve_config(config) or MAIN_JOB, overrides))


def _train(cfg: RunConfig) -> int:
    from dapo_jax.training.loop import train

    final = train(cfg)
    summary = ("step", "steps_skipped", "prompts_dropped_too_long")
    print(json_line({k: v for k, v in final.items() if k.startswith("eval/") or k in summary}))
    return 0


def json_line(value) -> str:
    """`value` as one line of strict JSON: a NaN or infinite number is written `null` (never a bare `NaN`)."""
    def finite(v):
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [finite(x) for x in v]
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return json.dumps(finite(value), allow_nan=False)


def cmd_sft(args) -> int:
    """`train` on a recipe whose objective is supervised fine-tuning (training/supervised.py): same loop."""
    config, overrides = split_config_and_overrides(args.items)
    cfg = load_config(resolve_config(config) or CONFIG_DIR / "cot_sft.yaml", overrides)
    if not cfg.objective_config.supervised:
        raise ConfigError(f"objective.name: {cfg.objective.name!r} is not supervised fine-tuning: `dapo-jax sft` runs "
                          f"a recipe with objective.name=sft (or use `dapo-jax train` for RL)")
    return _train(cfg)


def cmd_rft(args) -> int:
    """Rejection sampling: a model's accepted answers to data.train as an SFT file (training/rejection.py)."""
    from dapo_jax.training.rejection import run_rft

    model, overrides = split_config_and_overrides(args.items)
    if model is None:
        raise ConfigError("rft: name the model: a run dir, RUN_DIR/checkpoints/STEP, a run config or a Hugging Face "
                          "model dir, then --out FILE")
    stats = run_rft(model, out=args.out,
                    checkpoint=args.checkpoint, overrides=overrides, k=args.k, per_prompt=args.per_prompt,
                    limit=args.limit)
    print(json.dumps(stats))
    return 0


def cmd_stages(args) -> int:
    """A chain of stages (training/stages.py): each an ordinary run from the previous one's final weights."""
    from dapo_jax.training.stages import load_stages, run_stages

    final = run_stages(load_stages(args.file))
    print(json.dumps({k: v for k, v in final.items() if k.startswith("eval/") or k == "step"}))
    return 0


def cmd_eval(args) -> int:
    from dapo_jax.eval_command.report import flat_metrics, print_report, write_report
    from dapo_jax.eval_command.run import EvalFlags, resolve_target, run_eval
    from dapo_jax.eval_command.sets import check_exists, parse_data
    from dapo_jax.training.sources import load_source

    target, overrides = split_config_and_overrides(args.items)
    # `--data a.jsonl model.dtype=bfloat16`: the greedy --data list took a config override; give it back
    sections = tuple(f"{name}." for name in RunConfig.model_fields)
    overrides += [d for d in args.data or [] if d.split("=", 1)[0].startswith(sections)]
    args.data = [d for d in args.data or [] if not d.split("=", 1)[0].startswith(sections)]
    if (target is None) == (args.model is None):
        raise ConfigError("eval: name one model: --model PATH (a run dir, a checkpoint, a config or a Hugging Face "
                          "model dir), or the old positional form `dapo-jax eval RUN_DIR [key=value ...]`")
    model = args.model or str(resolve_config(target))
    resolved = resolve_target(model, checkpoint=args.checkpoint, overrides=overrides)
    template = args.template or _default_template(resolved)
    for d in args.data or []:
        check_exists(d)
    sets = [parse_data(d, format=args.format, template=template, reward=args.reward, limit=args.limit,
                       prompt_field=args.prompt_field, answer_field=args.answer_field) for d in args.data or []]
    for spec in sets:  # each file read and its fields found before the model loads (a one-line DataError)
        load_source(spec.source)
    flags = EvalFlags(k=args.k, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                      max_new_tokens=args.max_new_tokens, max_prompt_length=args.max_prompt_length,
                      batch_size=args.batch_size, seed=args.seed, limit=args.limit)
    report = run_eval(resolved, sets, flags)
    print_report(report)
    for path in write_report(report, args.out):
        print(f"wrote {path}")
    print(json_line(flat_metrics(report)))
    return 0


def _default_template(target) -> str:
    """The run's prompt template; for a Hugging Face model, `chat` when its tokenizer has a chat template."""
    if not target.hf_only:
        return (target.cfg.data.eval or target.cfg.data.train).template
    from dapo_jax.training.loop import load_tokenizer

    return "chat" if getattr(load_tokenizer(target.cfg), "chat_template", None) else "raw"


def cmd_export(args) -> int:
    from dapo_jax.models.generation_config import load_generation_config
    from dapo_jax.models.hf_io import save_pretrained
    from dapo_jax.training.config.paths import resolve_path
    from dapo_jax.training.loop import load_trained_model

    ckpt = Path(args.checkpoint)
    run_dir = ckpt
    while run_dir != run_dir.parent and not (run_dir / "config.yaml").exists():
        run_dir = run_dir.parent
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{ckpt}: no config.yaml in it or its parents: not inside a run directory")
    cfg = load_config(run_dir / "config.yaml")
    if args.peft:  # the LoRA adapter alone, in PEFT's format (models/lora.py)
        from dapo_jax.models.lora import save_peft_adapter

        if cfg.lora is None:
            raise ConfigError(f"export --peft: the run in {run_dir} has no lora section (it trained every weight); "
                              f"export it without --peft")
        model, _, step = load_trained_model(cfg, ckpt, adapters=True)
        out = save_peft_adapter(model, args.out_dir, base_model_name_or_path=str(resolve_path(cfg.model.path)))
        print(f"exported step {step}'s LoRA adapter to {out}")
        return 0
    model, tokenizer, step = load_trained_model(cfg, ckpt)  # a LoRA run's adapters merged into the weights
    generation = load_generation_config(resolve_path(cfg.model.path))  # the base's stop tokens and defaults
    out = save_pretrained(model, args.out_dir, tokenizer=tokenizer, generation_config=generation)
    print(f"exported step {step} to {out}")
    return 0


def cmd_show(args) -> int:
    from dapo_jax.show import show_rollouts

    if not Path(args.run_dir).exists():
        raise ConfigError(f"show: {args.run_dir} does not exist: name a run directory (train.run_dir)")
    show_rollouts(args.run_dir, args.step, groups=args.groups, width=args.width, plain=args.plain or None)
    return 0


def cmd_plot(args) -> int:
    from dapo_jax.plot import plot_run

    for path in plot_run(args.run_dir, args.out):
        print(path)
    return 0
