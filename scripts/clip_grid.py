"""Clip-higher where the clip binds: DAPO's off-policy regime over a grid of clip ranges, and a random-reward arm.

    python scripts/clip_grid.py [CONFIG] [--seeds 5] [--steps 60] [--eval-every 20] [--jobs 2]
                                [--rows l0.2-h0.2,l0.2-h0.28] [--out docs/clip_grid.md] [--runs-dir runs/clip_grid]

CONFIG (default the main job, cot_dapo) is run as `scripts/ablate.py` runs its rows (the generation batch is the
training batch, KL 0, each seed varies the sampling and the prompts' order) with DAPO's recipe (soft overlong
punishment, token-level loss, dynamic sampling) and each rollout batch split into OFF_POLICY_MINIBATCHES
optimizer steps (DAPO: 512 prompts per rollout in mini-batches of 32) at OFF_POLICY_LR. The rows differ in the clip range alone,
ε_low ∈ LOWS × ε_high ∈ HIGHS, plus `random`: DAPO's 0.2 / 0.28 trained on `scripts/random_reward.py`,
a reward with no signal, and `random-sym`: the same at the symmetric 0.2 / 0.2. Every row logs the clipped tokens' share of the gradient
(`objective.clip_grad_share`: the share of the output layer's per-token gradient norms that falls on clipped
tokens) beside their share of the tokens (`clip_frac_*`). Seeds vary the sampling and the prompts' order.

Runs go to RUNS_DIR/ROW/seedS, `--jobs` at a time, resumable; the page (tables, tests, DAPO's Fig. 2 as
entropy curves) is rebuilt from the runs with `--report-only`, also from kept runs (`--runs-dir results/...`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiment.py, ablate.py beside this script

import ablate  # noqa: E402
from experiment import (  # noqa: E402
    add_run_arguments, available_cores, default_config, finish, pick_rows, run_all, run_one, use_compile_cache,
    yaml_value,
)

REPO = Path(__file__).resolve().parents[1]
LOWS = (0.1, 0.2, 0.3)
HIGHS = (0.2, 0.28)
# DAPO makes 16 optimizer steps per rollout batch. OFF_POLICY_LR: 30-step pilots of the symmetric clip (0.2/0.2)
# on cot_dapo, 2026-11-25: at 2e-4 (the ladder's lr, 2 steps per rollout) the train accuracy fell from 0.19 to
# 0.06 within 8 steps; at 1e-4 held-out accuracy went 0.215 -> 0.255 -> 0.212 (steps 0/10/30); at 5e-5
# 0.215 -> 0.305 -> 0.390: the largest of the three that was stable.
OFF_POLICY_MINIBATCHES = 16
OFF_POLICY_LR = 5.0e-5
RANDOM_REWARD = "reward.functions=[{name: scripts/random_reward.py:score}]"  # relative to REPO, the runs' cwd


@dataclasses.dataclass(frozen=True)
class Row(ablate.Row):
    extra: tuple[str, ...] = ()  # overrides of this row only (the random arm's reward)
    # a row added after the first family of comparisons was read: its tests are a family of their own, so the
    # first family's corrections do not move with it (scripts/clip_grid_report.py)
    follow_up: bool = False

    @property
    def eps_low(self) -> float:
        return self.objective["eps_low"]

    @property
    def eps_high(self) -> float:
        return self.objective["eps_high"]


def define_rows(base) -> list[Row]:
    """The grid (DAPO's recipe, with overlong filtering only if CONFIG has it, at each clip range) and the
    random-reward arms at DAPO's 0.2 / 0.28 and at the symmetric 0.2 / 0.2 (a follow-up row)."""
    settings = ablate.technique_settings(base)
    recipe = ["soft_overlong", "token_loss", "dynamic_sampling"] + (["overlong_filtering"] if base.overlong_filtering else [])
    objective = {}
    for t in ablate.TECHNIQUES:
        objective.update(settings[t][0 if t in recipe else 1])

    def make(key, label, low, high, extra=(), follow_up=False):
        return Row(key, label, frozenset(recipe), {**objective, "eps_low": low, "eps_high": high,
                                                   "clip_grad_share": True}, extra, follow_up)

    rows = [make(f"l{low}-h{high}", f"ε_low {low}, ε_high {high}", low, high) for low in LOWS for high in HIGHS]
    return rows + [make("random", "random reward, ε_low 0.2, ε_high 0.28", 0.2, 0.28, (RANDOM_REWARD,)),
                   # is the random arm's entropy rise clip-higher's?
                   make("random-sym", "random reward, ε_low 0.2, ε_high 0.2", 0.2, 0.2, (RANDOM_REWARD,), True)]


def off_policy_minibatches(cfg) -> int:
    """The most optimizer steps per rollout batch up to OFF_POLICY_MINIBATCHES that the batch splits into
    (whole micro-batches, each divisible over the mesh's data x fsdp devices)."""
    unit = cfg.optim.micro_batches * cfg.mesh.data * cfg.mesh.fsdp
    return max(n for n in range(1, OFF_POLICY_MINIBATCHES + 1) if cfg.rollout.train_batch % (n * unit) == 0)


def make_plan(config: Path, cfg, *, steps: int, eval_every: int, seeds: int, runs_dir: Path, lr: float | None = None,
              extra: tuple[str, ...] = ()) -> ablate.Plan:
    """ablate's plan with the off-policy regime's mini-batches and lr; `cfg` is CONFIG with the `extra` overrides."""
    off = (f"optim.num_minibatches={off_policy_minibatches(cfg)}", f"optim.lr={yaml_value(lr or OFF_POLICY_LR)}")
    return ablate.make_plan(config, cfg, steps=steps, eval_every=eval_every, seeds=seeds, runs_dir=runs_dir,
                            extra=(*off, *extra))


def job(plan: ablate.Plan, row: Row, seed: int):
    j = ablate.job(plan, row, seed)
    return dataclasses.replace(j, overrides=(*j.overrides, *row.extra))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", type=Path, default=None, help="a DAPO run config (default: cot_dapo)")
    ap.add_argument("--seeds", type=int, default=5, help="seeds per row (train.seed = CONFIG's + 0..N-1)")
    ap.add_argument("--steps", type=int, default=60, help="training steps per run")
    ap.add_argument("--eval-every", type=int, default=20, help="held-out evaluation period")
    ap.add_argument("--lr", type=float, default=None, help=f"the lr (default OFF_POLICY_LR, {OFF_POLICY_LR})")
    ap.add_argument("--rows", default=None, help="comma-separated row keys (default: all)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "clip_grid.md", help="the page")
    ap.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "clip_grid")
    add_run_arguments(ap)
    args = ap.parse_args(argv)
    os.chdir(REPO)  # the random arm names its reward by a path relative to the working directory
    from dapo_jax.training.config.paths import find_config
    from dapo_jax.training.config.run import load_config

    config = find_config(args.config) if args.config else default_config()
    cfg = load_config(config, args.extra)
    plan = make_plan(config, cfg, steps=args.steps, eval_every=args.eval_every, seeds=args.seeds,
                     runs_dir=args.runs_dir.resolve(), lr=args.lr, extra=tuple(args.extra))
    rows = pick_rows(define_rows(cfg.objective_config), args.rows)
    if rows is None:
        return 2
    for row in rows:  # every row's config validates before any training starts
        load_config(config, list(job(plan, row, plan.seeds[0]).overrides))
    print(f"[clip_grid] {config}: {len(rows)} rows x {len(plan.seeds)} seeds, {plan.steps} steps, "
          f"eval every {plan.eval_every}, runs in {plan.runs_dir}", flush=True)
    if not args.no_compile_cache:
        use_compile_cache(plan.runs_dir)
    if args.only:
        key, _, seed = args.only.partition("/")
        row = next(r for r in rows if r.key == key)
        return 1 if run_one(job(plan, row, int(seed)), args.name or args.only, "clip_grid") else 0
    argv = list(argv if argv is not None else sys.argv[1:])
    jobs = [job(plan, row, seed) for seed in plan.seeds for row in rows]  # seed-major: a partial grid is balanced
    n_jobs = args.jobs if args.jobs is not None else min(len(available_cores()), 8)
    failed = [] if args.report_only else run_all(jobs, n_jobs=n_jobs, script=__file__, argv=argv, tag="clip_grid")
    from clip_grid_report import write

    missing = write(args.out, plan, rows, argv)
    return finish("clip_grid", failed, missing)


if __name__ == "__main__":
    sys.exit(main())
