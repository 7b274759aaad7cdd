"""`dapo-jax`: train, evaluate, export, show rollouts and plot.

    dapo-jax train [RECIPE|CONFIG.yaml] [key.sub=value ...]  # no config = the main job, cot_dapo; rerun = resume
    dapo-jax sft [RECIPE|CONFIG.yaml] [key.sub=value ...]    # supervised fine-tuning (default cot_sft); same loop
    dapo-jax rft MODEL --out kept.jsonl [--k 8] [--per-prompt 2]   # rejection sampling into an SFT file
    dapo-jax stages STAGES.yaml                         # sft -> dapo -> rft -> dapo ... as one run; rerun = resume
    dapo-jax eval --model RUN_OR_HF_DIR [--data F ...]  # avg@k, pass@k, maj@k; table + results JSON + samples
    dapo-jax eval RUN_DIR [key.sub=value ...]           # the same, old form: the run's newest checkpoint
    dapo-jax export CHECKPOINT OUT_DIR [--peft]         # Hugging Face model + tokenizer (--peft: LoRA adapter)
    dapo-jax show RUN_DIR [STEP]                        # the logged rollouts: prompts, responses, rewards
    dapo-jax plot RUN_DIR                               # PNG curves into RUN_DIR/plots
    dapo-jax plan [CONFIG.yaml] [key=value ...] [--topology v5p-64]  # will it fit? exit 0 yes, 3 no
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path


class _NoTorchBanner(logging.Filter):
    """transformers says "PyTorch was not found..." when it is imported without torch: this project's models
    are JAX, it only reads tokenizers and configs with transformers, so the line would only alarm. Every
    other transformers message passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("PyTorch was not found")


logging.getLogger("transformers").addFilter(_NoTorchBanner())  # before anything imports transformers

from dapo_jax import startup  # noqa: E402

startup.prepare()  # SIGTERM / SIGHUP during the imports below: one line; libtpu quiet without a TPU

from dapo_jax.data.templates import TEMPLATES  # noqa: E402
from dapo_jax.training.config.base import ConfigError  # noqa: E402
from dapo_jax.training.config.paths import CONFIG_DIR, find_config  # noqa: E402
from dapo_jax.training.config.run import RunConfig, load_config  # noqa: E402
from dapo_jax.training.rollout import StarvationError  # noqa: E402
from dapo_jax.training.sources import DataError  # noqa: E402


def _split_config_and_overrides(items: list[str]) -> tuple[str | None, list[str]]:
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return None, items


def _resolve_config(path: str | None) -> Path | None:
    """A config path; a bare name like `tiny_grpo` (or `configs/tiny_grpo.yaml`) is a packaged recipe."""
    return None if path is None else find_config(path)


# `dapo-jax train` with no config: DAPO on the chain-of-thought task (docs/cot_task.md), where its
# length-related mechanisms have work to do. `load_config(None)` stays the tiny task (tests, examples).
MAIN_JOB = CONFIG_DIR / "cot_dapo.yaml"


def cmd_train(args) -> int:
    config, overrides = _split_config_and_overrides(args.items)
    return _train(load_config(_resolve_config(config) or MAIN_JOB, overrides))


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
    config, overrides = _split_config_and_overrides(args.items)
    cfg = load_config(_resolve_config(config) or CONFIG_DIR / "cot_sft.yaml", overrides)
    if not cfg.objective_config.supervised:
        raise ConfigError(f"objective.name: {cfg.objective.name!r} is not supervised fine-tuning: `dapo-jax sft` runs "
                          f"a recipe with objective.name=sft (or use `dapo-jax train` for RL)")
    return _train(cfg)


def cmd_rft(args) -> int:
    """Rejection sampling: a model's accepted answers to data.train as an SFT file (training/rejection.py)."""
    from dapo_jax.training.rejection import run_rft

    model, overrides = _split_config_and_overrides(args.items)
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

    target, overrides = _split_config_and_overrides(args.items)
    # `--data a.jsonl model.dtype=bfloat16`: the greedy --data list took a config override; give it back
    sections = tuple(f"{name}." for name in RunConfig.model_fields)
    overrides += [d for d in args.data or [] if d.split("=", 1)[0].startswith(sections)]
    args.data = [d for d in args.data or [] if not d.split("=", 1)[0].startswith(sections)]
    if (target is None) == (args.model is None):
        raise ConfigError("eval: name one model: --model PATH (a run dir, a checkpoint, a config or a Hugging Face "
                          "model dir), or the old positional form `dapo-jax eval RUN_DIR [key=value ...]`")
    model = args.model or str(_resolve_config(target))
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


def cmd_plan(args) -> int:
    """Exit 0 when the run fits, 3 when a phase does not (dapo_jax/training/plan/memory.py)."""
    from dapo_jax.training.plan.compile import PlanCompileError

    config, overrides = _split_config_and_overrides(args.items)
    from dapo_jax.training.stages import is_stages_file

    if config is not None and is_stages_file(config):  # every stage, each a run of its own
        return _plan_stages(args, config, overrides)
    cfg = load_config(_resolve_config(config) or MAIN_JOB, overrides)  # a bad key fails here, before compiling
    log = (lambda msg: None) if args.quiet else (lambda msg: print(f"[dapo-jax plan] {msg}", file=sys.stderr, flush=True))
    options = dict(device_memory_gib=args.device_memory, model_config=args.model_config, exact=args.exact, log=log,
                   cache=not args.no_cache, estimate={"response_tokens": args.response_tokens, "mfu": args.mfu},
                   only=tuple(args.only) if args.only else None)
    try:
        if args.search:
            from dapo_jax.training.plan.search import format_search, search, search_dict

            result = search(cfg, args.topology, **options)
            text, data, fits = format_search(result), search_dict(result), result.best is not None
        else:
            from dapo_jax.training.plan.memory import make_plan
            from dapo_jax.training.plan.report import format_plan, plan_dict

            plan = make_plan(cfg, topology=args.topology, **options)
            text, data, fits = format_plan(plan, title=config or str(MAIN_JOB)), plan_dict(plan), plan.fits
            if not fits and not args.no_fit:  # the smallest change that makes it fit (training/plan/fit.py)
                from dapo_jax.training.plan.fit import fit_dict, fit_search, format_fit

                tries = fit_search(cfg, plan, topology=args.topology, **{**options, "estimate": None})
                text, data = text + "\n" + format_fit(tries), {**data, "fit": fit_dict(tries)}
    except PlanCompileError as e:
        print(f"dapo-jax: the compiler failed: {e}", file=sys.stderr)
        return 1
    if args.json == "-":
        print(json.dumps(data, indent=1))
    else:
        print(text)
        if args.json:
            Path(args.json).write_text(json.dumps(data, indent=1))
            print(f"wrote {args.json}")
    return 0 if fits else 3


def _plan_stages(args, config: str, overrides: list[str]) -> int:
    """`dapo-jax plan STAGES.yaml`: the plan of every stage (on the first stage's model shapes); exit 3 when
    one does not fit."""
    from dapo_jax.training.plan.memory import make_plan
    from dapo_jax.training.plan.report import format_plan, plan_dict
    from dapo_jax.training.stages import load_stages

    if args.search or overrides:
        raise ConfigError("plan of a stages file: no --search and no overrides (put them in the stages' overrides)")
    log = (lambda msg: None) if args.quiet else (lambda msg: print(f"[dapo-jax plan] {msg}", file=sys.stderr, flush=True))
    fits, data = True, {}
    for p in load_stages(config, for_plan=True):
        plan = make_plan(p.cfg, topology=args.topology, device_memory_gib=args.device_memory,
                         model_config=args.model_config, exact=args.exact, log=log, cache=not args.no_cache,
                         estimate={"response_tokens": args.response_tokens, "mfu": args.mfu},
                         only=tuple(args.only) if args.only else None)
        fits &= plan.fits
        data[p.stage.name] = plan_dict(plan)
        if args.json != "-":
            print(format_plan(plan, title=f"{config}: {p.label}"))
    if args.json == "-":
        print(json.dumps(data, indent=1))
    elif args.json:
        Path(args.json).write_text(json.dumps(data, indent=1))
        print(f"wrote {args.json}")
    return 0 if fits else 3


def _prepare_plan(args) -> None:
    """Before JAX starts: a TPU target needs no TPU here (quiet libtpu, CPU backends); `--cpu-devices`."""
    from dapo_jax.training.plan.memory import set_cpu_devices
    from dapo_jax.training.plan.slices import parse_family, parse_slice, quiet_tpu_environment

    quiet_tpu_environment()
    if args.topology is not None:
        family = parse_family(args.topology)
        if family is not None:
            args.search = True
        elif args.search:
            raise ConfigError(f"--search takes a TPU family (--topology {args.topology.split('-')[0]}), "
                              f"got the slice {args.topology}")
        else:
            parse_slice(args.topology)  # an unknown name: one line listing the valid ones, before JAX starts
    elif args.search:
        raise ConfigError("--search needs a TPU family: --topology v5p (or v4, v5e, v6e, tpu7x)")
    if args.cpu_devices:
        set_cpu_devices(args.cpu_devices)


class _Parser(argparse.ArgumentParser):
    """Overrides may follow options (`dapo-jax plan CONFIG --topology v5p-64 mesh.fsdp=32`): what argparse
    leaves over after the options, when it is `key=value` words, joins the command's config overrides."""

    def parse_args(self, args=None, namespace=None):
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            if getattr(ns, "items", None) is None or any("=" not in x or x.startswith("-") for x in extra):
                self.error(f"unrecognized arguments: {' '.join(extra)}")
            ns.items = [*ns.items, *extra]
        return ns


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dapo-jax", description="DAPO / GRPO-family RL post-training in JAX.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train (or resume) a run")
    p.add_argument("items", nargs="*", metavar="[CONFIG.yaml] key.sub=value",
                   help="a packaged recipe's name (tiny_dapo, ...) or a config file (default: the main job, "
                        "cot_dapo) then dotted overrides")
    p.set_defaults(fn=cmd_train)
    p = sub.add_parser("sft", help="supervised fine-tuning (or resume) on prompt/response or chat data")
    p.add_argument("items", nargs="*", metavar="[CONFIG.yaml] key.sub=value",
                   help="a recipe whose objective is sft (default: cot_sft) then dotted overrides")
    p.set_defaults(fn=cmd_sft)
    p = sub.add_parser("rft", help="rejection sampling: a model's correct answers to data.train as an SFT data file")
    p.add_argument("items", nargs="*", metavar="MODEL [key.sub=value]",
                   help="a run dir, RUN_DIR/checkpoints/STEP, a run config or a Hugging Face model dir; overrides")
    p.add_argument("--out", required=True, help="the JSON-lines file of kept responses ({prompt, response, ...})")
    p.add_argument("--k", type=int, help="responses sampled per prompt (default: rollout.G)")
    p.add_argument("--per-prompt", dest="per_prompt", type=int, default=1, help="at most N kept per prompt (default 1)")
    p.add_argument("--limit", type=int, help="the first N prompts of data.train")
    p.add_argument("--checkpoint", type=int, help="the run's checkpoint step (default: the newest; 0 = base model)")
    p.set_defaults(fn=cmd_rft)
    p = sub.add_parser("stages", help="run (or resume) a chain of stages: sft -> dapo -> rft -> dapo, ...")
    p.add_argument("file", help="a stages file (run_dir + stages: [{name, recipe, overrides, rft}]), e.g. "
                   "dapo_jax/configs/stages/cot_r1.yaml")
    p.set_defaults(fn=cmd_stages)
    p = sub.add_parser("eval", help="avg@k, pass@k, maj@k of a base model or a run's checkpoint on data sets",
                       description="Evaluates a Hugging Face model directory, a run (its newest checkpoint or "
                       "--checkpoint STEP; 0 = its base model) or a run config on the run's held-out set or on "
                       "--data files; prints a table, writes a results JSON and the samples of every problem.")
    p.add_argument("items", nargs="*", metavar="[RUN_DIR|CONFIG] [key.sub=value]",
                   help="the old form: a run dir or config, then dotted config overrides (also allowed with --model)")
    p.add_argument("--model", help="a run dir, RUN_DIR/checkpoints/STEP, a run config, or a Hugging Face model dir")
    p.add_argument("--checkpoint", type=int, help="the run's checkpoint step (default: the newest; 0 = base model)")
    p.add_argument("--data", nargs="+", action="extend", metavar="[NAME=]PATH",
                   help="data files (GSM8K, MATH-500, AIME, AMC23, DAPO-Math, ...); default: the run's data.eval")
    p.add_argument("--format", help="the data's row format when its name/path does not tell (gsm8k, math500, aime, "
                   "amc, dapo_math, custom, ...)")
    p.add_argument("--template", choices=list(TEMPLATES),
                   help="prompt template for --data (default: the run's; a HF model: chat if it has a chat template)")
    p.add_argument("--prompt-field", dest="prompt_field",
                   help="the --data rows' prompt field, dotted (as data.*.prompt_field in a run config)")
    p.add_argument("--answer-field", dest="answer_field",
                   help="the --data rows' answer field, dotted (as data.*.answer_field in a run config)")
    p.add_argument("--reward", help="the reward that judges responses (default: the format's, see README)")
    p.add_argument("--k", type=int, help="samples per problem (default: the run's train.eval_k)")
    p.add_argument("--temperature", type=float, help="0 = greedy (default: the run's train.eval_temperature)")
    p.add_argument("--top-p", dest="top_p", type=float)
    p.add_argument("--top-k", dest="top_k", type=int)
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int)
    p.add_argument("--max-prompt-length", dest="max_prompt_length", type=int,
                   help="default: the run's for its own set; the longest prompt for --data")
    p.add_argument("--batch-size", dest="batch_size", type=int, help="prompts per batch (default: rollout.gen_batch)")
    p.add_argument("--seed", type=int, help="default: the run's train.seed (the same key as its evaluation)")
    p.add_argument("--limit", type=int, help="the first N problems of each set")
    p.add_argument("--out", help="results JSON (default RUN_DIR/eval/step_N.json or eval_results/MODEL.json); "
                   "samples go beside it as OUT.NAME.samples.jsonl")
    p.set_defaults(fn=cmd_eval)
    p = sub.add_parser("export", help="write a checkpoint as a Hugging Face model directory with its tokenizer")
    p.add_argument("checkpoint", help="a run dir, its checkpoints/ folder, or checkpoints/STEP")
    p.add_argument("out_dir")
    p.add_argument("--peft", action="store_true", help="a LoRA run: write its adapter in PEFT's format "
                   "(adapter_config.json + adapter_model.safetensors) instead of the merged model")
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("show", help="what the model wrote: a step's logged rollouts with rewards and advantages")
    p.add_argument("run_dir")
    p.add_argument("step", nargs="?", type=int, help="a logged step (default: the newest; see RUN_DIR/rollouts/)")
    p.add_argument("--groups", type=int, help="show only the first N groups")
    p.add_argument("--width", type=int, default=300, help="cut texts to N characters (0 = whole)")
    p.add_argument("--plain", action="store_true", help="plain text even when rich is installed")
    p.set_defaults(fn=cmd_show)
    p = sub.add_parser("plot", help="PNG curves of a run's metrics.jsonl")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="output folder (default RUN_DIR/plots)")
    p.set_defaults(fn=cmd_plot)
    p = sub.add_parser("plan", help="will it fit? per-device memory of each phase from the run's compiled programs",
                       description="Compiles the run's programs ahead of time (no weights, nothing runs) for this "
                       "machine or a TPU slice by name, and prints per-device memory by phase against the chip's. "
                       "Exit 0: it fits; 3: a phase does not; 2: a user error. Options and overrides in any order.")
    p.add_argument("items", nargs="*", metavar="[CONFIG.yaml] key.sub=value")
    p.add_argument("--topology", metavar="SLICE", help="a TPU slice (v4-8, v5e-4 .. v5e-256, v5litepod-N, v5p-8 .. "
                   "v5p-6144, v6e-N, tpu7x-N; 2xv5p-64 = two slices), or a family (v5p) to search its sizes; "
                   "needs libtpu: pip install 'dapo_jax[tpu]'")
    p.add_argument("--search", action="store_true", help="the smallest slice of the --topology family that fits, "
                   "over its sizes and the data x fsdp x tensor meshes that divide the batch and the heads")
    p.add_argument("--model-config", dest="model_config", metavar="config.json",
                   help="the model's shapes (default: model.path's config.json, else the published shape its name names)")
    p.add_argument("--no-fit", dest="no_fit", action="store_true", help="when the run does not fit, do not search "
                   "for the smallest change that makes it fit (more micro-batches, smaller packed chunks, remat, "
                   "another mesh: each compiled as a plan of its own, training/plan/fit.py)")
    p.add_argument("--exact", action="store_true", help="compile every layer (default: a model of more than 3 layers "
                   "is compiled at 2 and 3 and extrapolated per layer)")
    p.add_argument("--only", action="append", metavar="PROGRAM", help="compile only the programs whose names start "
                   "so (rollout, 'eval rollout', prepare, update; repeatable), e.g. one rollout with --exact")
    p.add_argument("--device-memory", dest="device_memory", type=float, metavar="GiB",
                   help="memory per device (default: the slice's usable HBM; the device's memory_stats(); on CPU the "
                   "host RAM / devices)")
    p.add_argument("--cpu-devices", dest="cpu_devices", type=int, metavar="N", help="N virtual CPU devices for the mesh")
    p.add_argument("--response-tokens", dest="response_tokens", type=int, metavar="T",
                   help="mean response length for the step-time estimate (default: rollout.max_new_tokens)")
    p.add_argument("--mfu", type=float, default=1.0, help="the fraction of the bf16 peak the estimate assumes (default 1.0)")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE", help="write the plan as JSON (bytes) to FILE; "
                   "alone: print JSON instead of the table")
    p.add_argument("--no-cache", dest="no_cache", action="store_true", help="compile again what an earlier plan compiled")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(fn=cmd_plan)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """What the user must fix (exit code 2): bad config, data, model or checkpoint files, mesh."""
    from dapo_jax.models.config import ModelConfigError
    from dapo_jax.models.hf_io import CheckpointError as ModelCheckpointError
    from dapo_jax.parallel.mesh import MeshError
    from dapo_jax.training.state.checkpoint import CheckpointError

    return (ConfigError, DataError, ModelCheckpointError, ModelConfigError, CheckpointError, MeshError,
            FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done; 2 a user error (one line naming the key, file or row); 3 dynamic sampling
    starved, or `plan`: the run does not fit; 4 non-finite updates kept coming; 6 a checkpoint could not
    be saved; 7 another process of a multi-process run is gone; 143 stopped by SIGTERM after saving a
    checkpoint (or before the first step, with nothing to save); 130 stopped by Ctrl-C (SIGINT), the same
    way (a second Ctrl-C, or one outside training: at once, without saving)."""
    from dapo_jax.training.state.guards import INTERRUPTED_EXIT_CODE
    from dapo_jax.parallel.stopped import RunStopped

    argv = sys.argv[1:] if argv is None else argv
    flag = next((a for a in argv[1:] if a.split("=", 1)[0] in ("--config", "--config-name", "--config-path")), None)
    if argv and argv[0] in ("train", "eval", "plan") and flag is not None:  # verl's / Hydra's way of naming it
        print(f"dapo-jax: ConfigError: {flag.split('=', 1)[0]}: the config is the first argument, as a recipe name or a "
              f"path: dapo-jax {argv[0]} CONFIG.yaml key.sub=value ...", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    if args.command in ("train", "sft", "rft", "stages", "eval"):  # a rerun or resume reads its compiled programs back (compile_cache.py)
        from dapo_jax.compile_cache import enable_compilation_cache

        enable_compilation_cache()
    try:
        if args.command == "plan":
            _prepare_plan(args)
        return args.fn(args)
    except StarvationError as e:
        print(f"dapo-jax: {e}", file=sys.stderr)
        return 3
    except RunStopped as e:
        print(f"dapo-jax: {type(e).__name__}: {e}", file=sys.stderr)
        if e.abandon_saves:  # a failed save or a lost peer: nothing left that could complete is waited for
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(e.exit_code)
        return e.exit_code
    except _user_errors() as e:
        print(f"dapo-jax: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside a run's steps, or twice during one (training/state/guards.py)
        print("dapo-jax: Interrupted: Ctrl-C: stopped without saving; rerun the same command to start or resume "
              "(from the last checkpoint)", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
