"""`dapo-jax plan`: will the run fit? Exit 0 when it does, 3 when a phase does not (training/plan/).

`prepare_plan` runs before JAX starts (a TPU target needs no TPU here); `cmd_plan` compiles the run's
programs, or every stage's of a stages file, and prints or writes the plan.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dapo_jax.cli.commands import MAIN_JOB, resolve_config, split_config_and_overrides
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import load_config


def cmd_plan(args) -> int:
    """Exit 0 when the run fits, 3 when a phase does not (dapo_jax/training/plan/memory.py)."""
    from dapo_jax.training.plan.compile import PlanCompileError

    config, overrides = split_config_and_overrides(args.items)
    from dapo_jax.training.stages import is_stages_file

    if config is not None and is_stages_file(config):  # every stage, each a run of its own
        return _plan_stages(args, config, overrides)
    cfg = load_config(resolve_config(config) or MAIN_JOB, overrides)  # a bad key fails here, before compiling
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


def prepare_plan(args) -> None:
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
