"""The league with each objective at its own learning rate: a sweep of rates at few seeds, then more seeds
at each row's best rate and at the shared one, one command.

    python scripts/lr_sweep.py [CONFIG] [--lrs 5e-5,1e-4,2e-4] [--sweep-seeds 2] [--confirm-seeds 5]
                               [--rows grpo,dapo] [--phase sweep|confirm|all] [--jobs 2]
                               [--runs-dir runs/lr_sweep] [--out docs/league_lr.md] [--report-only]

Every run is a league run (`scripts/league.py`: the row's recipe, the same budget of generated samples,
evaluation and overrides) with `optim.lr=RATE`; a critic's rate follows the policy's (twice it, as in the
league). The shared rate is CONFIG's `optim.lr` (2e-4 for cot_dapo) and must be one of `--lrs`.

- **sweep**: every row at every rate, seeds 0 .. SWEEP_SEEDS-1. A row's best rate is the one with the
  highest mean avg@4 at the budget over those seeds (a tie goes to the shared rate).
- **confirm**: each row at its best rate and at the shared rate, on CONFIG_SEEDS fresh seeds (SWEEP_SEEDS ..
  SWEEP_SEEDS+CONFIRM_SEEDS-1: the seeds that chose the rate do not also judge it); a row whose best rate
  is the shared one is run once. GRPO, the baseline, is run at every rate, so the report can also compare
  each row with GRPO at GRPO's best confirmed rate. Needs every sweep run of that row finished.

Runs go to RUNS_DIR/lrRATE/ROW/seedS, the seed-0 run of every (rate, row) first, `--jobs` at a time; a
rerun skips finished runs and resumes the others from their checkpoints, so the hours this takes can be
spread over sessions. The report (--out) has the sweep table, the best rate per row, best against shared
with Welch's test and Holm's correction, which of the league's comparisons with GRPO hold at each row's
best rate, and GRPO at every rate; runs that have not finished are named and left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiment.py beside this script

from experiment import (  # noqa: E402
    FINDINGS_PLACEHOLDER, Job, add_run_arguments, available_cores, default_config, finish, fmt_cell,
    is_finished, machine, pick_rows, read_run, rel, run_all, run_one, summarize_run, use_compile_cache,
    write_page, yaml_value,
)

import league  # noqa: E402
import significance  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_LRS = (5e-5, 1e-4, 2e-4)
# The league of docs/league.md (16 rows); the rows added since mid-2025 can be named with --rows.
DEFAULT_ROWS = tuple(r.key for r in league.ROWS if r.family != "recent")
PHASES = ("sweep", "confirm", "all")
BASELINE = "grpo"  # the row every other is compared with


@dataclasses.dataclass(frozen=True)
class Sweep:
    config: Path
    lrs: tuple[float, ...]
    shared: float  # CONFIG's lr
    sweep_seeds: tuple[int, ...]
    confirm_seeds: tuple[int, ...]
    runs_dir: Path
    plans: dict  # rate -> league.Plan (its runs_dir RUNS_DIR/lrRATE)
    cfgs: dict  # rate -> CONFIG loaded at that rate


def lr_name(lr: float) -> str:
    return f"lr{lr:g}"


def make_sweep(config: Path, extra: tuple[str, ...], *, lrs: tuple[float, ...], sweep_seeds: int, confirm_seeds: int,
               runs_dir: Path, budget: int = 10240, eval_size: int = 100) -> Sweep:
    from dapo_jax.training.config.run import load_config

    shared = load_config(config, list(extra)).optim.lr
    if not any(np.isclose(shared, lr) for lr in lrs):
        raise SystemExit(f"lr_sweep: CONFIG's optim.lr {shared:g} is not one of --lrs {','.join(f'{x:g}' for x in lrs)}")
    plans, cfgs = {}, {}
    for lr in lrs:
        at = (*extra, f"optim.lr={yaml_value(lr)}")
        cfgs[lr] = load_config(config, list(at))
        plans[lr] = league.make_plan(config, cfgs[lr], budget=budget, eval_samples=max(1, budget // 8),
                                     eval_size=eval_size, seeds=sweep_seeds + confirm_seeds,
                                     runs_dir=runs_dir / lr_name(lr), extra=at)
    seeds = plans[lrs[0]].seeds
    return Sweep(config, tuple(lrs), next(lr for lr in lrs if np.isclose(lr, shared)), seeds[:sweep_seeds],
                 seeds[sweep_seeds:], runs_dir, plans, cfgs)


def job(sweep: Sweep, row, lr: float, seed: int) -> Job:
    j = league.job(sweep.plans[lr], sweep.cfgs[lr], row, seed)
    return dataclasses.replace(j, key=f"{row.key}@{lr:g}", label=f"{row.label} at lr {lr:g}")


def finished_values(sweep: Sweep, row, lr: float, seeds, key: str = "final_acc") -> list[float]:
    """`key` of each finished run of (row, rate) among `seeds` (league.summarize_run's summary)."""
    out = []
    for seed in seeds:
        j = job(sweep, row, lr, seed)
        if is_finished(j):
            value = _finished_summary(j.path, league.pretrain_samples(sweep.plans[lr], row)).get(key)
            if value is not None:
                out.append(value)
    return out


@functools.lru_cache(maxsize=None)
def _finished_summary(path: Path, offset: int) -> dict:
    """A finished run's summary, read once: the report's tables ask for each run several times, and a finished
    run does not change (unfinished ones are never passed here)."""
    return summarize_run(read_run(path), None, offset=offset)


def best_lr(sweep: Sweep, row) -> float | None:
    """The rate with the highest mean avg@4 at the budget over the sweep seeds; None until every sweep
    run of the row has finished. A tie goes to the shared rate, then to the lower rate."""
    means = {}
    for lr in sweep.lrs:
        values = finished_values(sweep, row, lr, sweep.sweep_seeds)
        if len(values) < len(sweep.sweep_seeds):
            return None
        means[lr] = float(np.mean(values))
    top = max(means.values())
    tied = [lr for lr in sweep.lrs if np.isclose(means[lr], top)]
    return sweep.shared if sweep.shared in tied else min(tied)


def confirm_rates(sweep: Sweep, row) -> list[float]:
    """The shared rate and the row's best; the baseline (GRPO) at every rate, so that a row at its own rate
    is also compared with the baseline at the baseline's best confirmed rate, not only its sweep-chosen one."""
    best = best_lr(sweep, row)
    if best is None:
        return []
    return list(sweep.lrs) if row.key == BASELINE else sorted({sweep.shared, best})


def sweep_jobs(sweep: Sweep, rows) -> list[Job]:
    """Seed by seed, every (rate, row) once before any twice."""
    return [job(sweep, row, lr, seed) for seed in sweep.sweep_seeds for lr in sweep.lrs for row in rows]


def confirm_jobs(sweep: Sweep, rows) -> list[Job]:
    return [job(sweep, row, lr, seed) for seed in sweep.confirm_seeds for row in rows for lr in confirm_rates(sweep, row)]


# ----------------------------------------------------------------------------- the report
def sweep_table(sweep: Sweep, rows) -> str:
    head = " | ".join(f"lr {lr:g}" + (" (shared)" if lr == sweep.shared else "") for lr in sweep.lrs)
    lines = [f"| row | {head} | best rate |", "|---|" + "---|" * (len(sweep.lrs) + 1)]
    for row in rows:
        cells = [fmt_cell(finished_values(sweep, row, lr, sweep.sweep_seeds)) for lr in sweep.lrs]
        best = best_lr(sweep, row)
        lines.append(f"| {row.label} | " + " | ".join(cells) + f" | {'–' if best is None else f'{best:g}'} |")
    return "\n".join(lines)


def confirm_cell(sweep: Sweep, values: list) -> str:
    """'mean ± sd' over a comparison's finished confirmation seeds, with their count while some are missing."""
    cell = fmt_cell(values)
    return cell if len(values) == len(sweep.confirm_seeds) else f"{cell} (n={len(values)})"


def _holm_table(head: str, found) -> str:
    """A table of comparisons that is one Holm family: `head` the cells before the test's ('row | rate | ...'),
    `found` one (leading cells, Comparison) per line; the family's legend under it."""
    adjusted = significance.holm([c.p for _, c in found])
    lines = [f"| {head} | Δ [95% interval] | p | Holm p | verdict |", "|" + "---|" * (head.count("|") + 5)]
    lines += [f"| {cells} | {significance.tested_cells(c, p_adj)} |" for (cells, c), p_adj in zip(found, adjusted)]
    return "\n".join(lines) + "\n\n" + significance.legend(significance.family_size(adjusted))


def _baseline_row():
    return next((r for r in league.ROWS if r.key == BASELINE), None)


def confirm_table(sweep: Sweep, rows) -> str:
    """Per row with a best rate other than the shared one: the confirmation seeds at both, Welch's test, Holm
    over the rows; rows whose best rate is the shared one are listed as such."""
    found = []
    for row in rows:
        best = best_lr(sweep, row)
        if best is None or best == sweep.shared:
            continue
        a = finished_values(sweep, row, best, sweep.confirm_seeds)
        b = finished_values(sweep, row, sweep.shared, sweep.confirm_seeds)
        if a and b:
            found.append((f"{row.label} | {best:g} | {confirm_cell(sweep, a)} | {confirm_cell(sweep, b)}",
                          significance.compare(a, b)))
    table = _holm_table("row | best rate | avg@4 at best | avg@4 at shared", found)
    shared_best = [row.label for row in rows if best_lr(sweep, row) == sweep.shared]
    tail = f"\n\nBest at the shared rate {sweep.shared:g} (one set of runs): {', '.join(shared_best)}." if shared_best else ""
    return table + tail


def baseline_top(sweep: Sweep) -> float | None:
    """The baseline's rate with the highest mean on the confirmation seeds (None until each rate has a
    finished confirmation run). Chosen on the seeds that then judge it: a bias in the baseline's favour."""
    grpo = _baseline_row()
    if grpo is None or best_lr(sweep, grpo) is None:
        return None
    means = {lr: np.mean(v) for lr in sweep.lrs if (v := finished_values(sweep, grpo, lr, sweep.confirm_seeds))}
    return max(means, key=means.get) if len(means) == len(sweep.lrs) else None


def baseline_table(sweep: Sweep) -> str:
    """The baseline at every rate on the confirmation seeds, each other rate against the shared one (Welch,
    Holm over the table)."""
    grpo = _baseline_row()
    if grpo is None or best_lr(sweep, grpo) is None:
        return "(GRPO's sweep has not finished)"
    shared = finished_values(sweep, grpo, sweep.shared, sweep.confirm_seeds)
    found = [(f"{lr:g} | {confirm_cell(sweep, a)} | {confirm_cell(sweep, shared)}", significance.compare(a, shared))
             for lr in sweep.lrs if lr != sweep.shared and (a := finished_values(sweep, grpo, lr, sweep.confirm_seeds))
             and shared]
    return _holm_table(f"rate | avg@4 | at the shared {sweep.shared:g}", found)


def versus_grpo(sweep: Sweep, rows, at_best: bool, baseline: str = "chosen") -> str:
    """Each row against GRPO on avg@4 at the budget over the confirmation seeds: both at the shared rate, or
    each at its own best rate; Welch, Holm over the table. With `at_best`, GRPO is at its sweep-chosen rate
    (baseline "chosen") or at its best rate on the confirmation seeds (baseline "top", see baseline_top)."""
    grpo = _baseline_row()
    rate = (lambda row: best_lr(sweep, row)) if at_best else (lambda row: sweep.shared)  # noqa: E731
    if grpo is None or rate(grpo) is None:
        return "(GRPO's runs have not finished)"
    base_rate = baseline_top(sweep) if at_best and baseline == "top" else rate(grpo)
    if base_rate is None:
        return "(GRPO's confirmation at every rate has not finished)"
    base = finished_values(sweep, grpo, base_rate, sweep.confirm_seeds)
    found = []
    for row in rows:
        if row.key == BASELINE or rate(row) is None:
            continue
        a = finished_values(sweep, row, rate(row), sweep.confirm_seeds)
        if a and base:
            found.append((f"{row.label} | {rate(row):g} | {confirm_cell(sweep, a)} | {confirm_cell(sweep, base)}",
                          significance.compare(a, base)))
    return _holm_table(f"row | rate | avg@4 | GRPO (lr {base_rate:g})", found)


def unfinished(sweep: Sweep, rows) -> list[str]:
    return [f"{j.key}/seed{j.seed}" for j in sweep_jobs(sweep, rows) + confirm_jobs(sweep, rows) if not is_finished(j)]


def write_report(out: Path, sweep: Sweep, rows, command: str) -> str:
    missing = unfinished(sweep, rows)
    undecided = [row.label for row in rows if best_lr(sweep, row) is None]
    plan = sweep.plans[sweep.shared]
    partial = (f"\n> **Partial results.** {len(missing)} run(s) not finished, left out of the tables: "
               f"{', '.join(missing[:12])}{' …' if len(missing) > 12 else ''}. Rows without a best rate yet "
               f"(their sweep is not finished, so their confirmation has not started): "
               f"{', '.join(undecided) or 'none'}. Rerun the command to go on.\n" if missing else "")
    text = f"""# The league at each objective's own learning rate

Generated by `scripts/lr_sweep.py`; the tables are rewritten by every run of it.
{partial}
- Command: `{command}`
- Config: `{rel(sweep.config)}`; each run is the league's (`scripts/league.py`, [league.md](league.md)) with
  `optim.lr` set: budget {plan.budget:,} generated responses, held-out avg@4 on {plan.eval_size} problems
- Rates: {", ".join(f"{lr:g}" for lr in sweep.lrs)}; the shared rate (CONFIG's, the league's) is **{sweep.shared:g}**
- Sweep seeds: {", ".join(map(str, sweep.sweep_seeds))}; confirmation seeds: {", ".join(map(str, sweep.confirm_seeds))}
  (each seed sets `train.seed` and `data.order_seed`); runs in `{rel(sweep.runs_dir)}/lrRATE/ROW/seedS`
- Machine: {machine()}
- Date: {datetime.date.today().isoformat()}

## The sweep

avg@4 at the budget, mean ± sd over the sweep seeds. The best rate is the highest mean (a tie goes to
the shared rate); with {len(sweep.sweep_seeds)} seeds it is a choice, not a finding.

{sweep_table(sweep, rows)}

## Best rate against the shared one

On the confirmation seeds, which did not choose the rate.

{confirm_table(sweep, rows)}

## Against GRPO, at the shared rate and at each row's best

At the shared rate (the league's setting):

{versus_grpo(sweep, rows, at_best=False)}

Each row (GRPO too) at its own best rate:

{versus_grpo(sweep, rows, at_best=True)}

## GRPO at every rate

The baseline is confirmed at every rate (the other rows at their best and the shared one only), so that
"above GRPO" can be checked against GRPO at its own best. Each rate against the shared one:

{baseline_table(sweep)}

Each row at its own best rate against GRPO at its rate with the highest mean on the confirmation seeds. That
rate is chosen on the seeds that judge it, which favours GRPO: a row still separable above it is so at every
rate GRPO was confirmed at.

{versus_grpo(sweep, rows, at_best=True, baseline="top")}

{FINDINGS_PLACEHOLDER}"""
    return write_page(out, text)


# ----------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", type=Path, default=None, help="the shared run (default: cot_dapo.yaml)")
    ap.add_argument("--lrs", default=",".join(f"{x:g}" for x in DEFAULT_LRS), help="comma-separated rates")
    ap.add_argument("--sweep-seeds", type=int, default=2)
    ap.add_argument("--confirm-seeds", type=int, default=5)
    ap.add_argument("--phase", choices=PHASES, default="all", help="all: the sweep, then the confirmation of the "
                    "rows whose sweep has finished")
    ap.add_argument("--budget", type=int, default=10240, help="generated responses per run (the league's)")
    ap.add_argument("--eval-size", type=int, default=100)
    ap.add_argument("--rows", default=None, help="comma-separated row keys (default: the league's 16)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "league_lr.md")
    ap.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "lr_sweep")
    add_run_arguments(ap)
    args = ap.parse_args(argv)
    try:
        args.lrs = tuple(float(x) for x in args.lrs.split(",") if x.strip())
    except ValueError:
        ap.error(f"--lrs: not a comma-separated list of numbers: {args.lrs!r}")
    if not args.lrs or min(args.lrs) <= 0:
        ap.error("--lrs: give positive rates")
    if args.sweep_seeds < 1 or args.confirm_seeds < 0:
        ap.error("--sweep-seeds must be >= 1 and --confirm-seeds >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from dapo_jax.training.config.run import load_config

    config = args.config or default_config()
    sweep = make_sweep(config, tuple(args.extra), lrs=args.lrs, sweep_seeds=args.sweep_seeds,
                       confirm_seeds=args.confirm_seeds, runs_dir=args.runs_dir, budget=args.budget,
                       eval_size=args.eval_size)
    rows = pick_rows([r for r in league.ROWS], args.rows or ",".join(DEFAULT_ROWS))
    if rows is None:
        return 2
    for lr in sweep.lrs:  # every run's config must validate before hours of training start
        for row in rows:
            load_config(config, list(job(sweep, row, lr, 0).overrides))
    print(f"[lr_sweep] {config}: {len(rows)} rows x rates {', '.join(f'{x:g}' for x in sweep.lrs)}, sweep seeds "
          f"{list(sweep.sweep_seeds)}, confirmation seeds {list(sweep.confirm_seeds)}, runs in {sweep.runs_dir}", flush=True)
    if not args.no_compile_cache:
        use_compile_cache(sweep.runs_dir)
    if args.only:  # a --jobs child: ROW@RATE/SEED
        key, _, seed = args.only.partition("/")
        name, _, lr = key.partition("@")
        row = next(r for r in rows if r.key == name)
        rate = next(x for x in sweep.lrs if np.isclose(x, float(lr)))
        return 1 if run_one(job(sweep, row, rate, int(seed)), args.name or args.only, "lr_sweep") else 0
    argv = list(argv if argv is not None else sys.argv[1:])
    failed = []
    if not args.report_only:
        n_jobs = args.jobs if args.jobs is not None else min(len(available_cores()), 8)
        if args.phase in ("sweep", "all"):
            failed += run_all(sweep_jobs(sweep, rows), n_jobs=n_jobs, script=__file__, argv=argv, tag="lr_sweep")
        if args.phase in ("confirm", "all"):
            failed += run_all(confirm_jobs(sweep, rows), n_jobs=n_jobs, script=__file__, argv=argv, tag="lr_sweep")
    command = " ".join(["python", "scripts/lr_sweep.py", *argv])
    write_report(args.out, sweep, rows, command)
    print(sweep_table(sweep, rows))
    print(f"\n[lr_sweep] wrote {args.out}", flush=True)
    return finish("lr_sweep", failed, unfinished(sweep, rows))


if __name__ == "__main__":
    sys.exit(main())
