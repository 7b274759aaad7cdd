"""The DAPO ablation ladder in miniature, one command.

    python scripts/ablate.py [CONFIG] [--seeds 3] [--steps N] [--quick] [--rows grpo,dapo] [--jobs 2]
                             [--out docs/ablation.md] [--runs-dir runs/ablate] [--target ACC]

CONFIG (a recipe's name or a YAML file; default the main job, cot_dapo) is a DAPO run. Every row of
the ladder is that run with objective overrides only; each row x seed is one
`dapo_jax.training.loop.train` run in RUNS_DIR/ROW/seedS, `--jobs` of them at a time (each in its own
process, on one core, with one XLA thread; `--jobs 1`: one after another in this process). The rows are
the ladder of DAPO's Table 1, in its order, each row adding one technique:

    naive GRPO                  clip 0.2/0.2, seq_mean_token_mean, no dynamic sampling, no overlong shaping
    + overlong filtering        truncated responses left out of the loss
    + clip-higher               eps_high from CONFIG (0.28)
    + soft overlong punishment  CONFIG's overlong_buffer / overlong_penalty_factor
    + token-level loss          token_mean (normalised over the batch's tokens, as verl and TRL do)
    + dynamic sampling          = DAPO
    DAPO, per-group token mean  DAPO with Eq. 8 as written: group_mean_token_mean

Row keys (--rows, run folders): grpo, filter, clip, soft, token, dapo, dapo-eq8. `--set KEY=VALUE`
adds a non-objective override to every row (e.g. data.eval_size).

Every row gets the same model, data, lr, G, batch, steps, seed(s), evaluation and KL 0; the
generation batch is the training batch for all rows, so a row without dynamic sampling trains on
everything it generates, and rows with it refill in as many rounds as CONFIG's generation budget
allows (`gen_batch * max_gen_batches` prompts per step).

Compiled programs are cached in RUNS_DIR/.jax_cache and shared by the rows. A rerun of the same
command skips finished runs and resumes unfinished ones from their newest checkpoint. It then writes
a markdown report (mean ± sd over seeds; command, machine, date) to --out and figures in the spirit
of DAPO's Figures 2-6 to docs/figures/ablation_*.png (beside --out). `--quick`: one seed and a tenth
of the steps (at least 10), evaluated 4 times, in runs/ablate_quick. Clip ranges in DAPO's off-policy
regime (16 optimizer steps per rollout) are `scripts/clip_grid.py`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiment.py beside this script

from experiment import (  # noqa: E402
    finish, FINDINGS_PLACEHOLDER, DONE_FILE, SINGLE_THREAD_XLA, Job, add_run_arguments, column, default_config,
    default_target, fmt_cell, is_finished, machine, markdown_table, pick_rows, read_run, rel,
    run_all, run_one, series, smooth, summarize_run, use_compile_cache, value_at, write_page, yaml_value,
)

__all__ = ["DONE_FILE", "SINGLE_THREAD_XLA", "fmt_cell", "markdown_table", "read_run", "summarize_run"]
import significance  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------- the rows
# The techniques of DAPO's Table 1 in its order, as the objective fields each one sets, and one more:
# Eq. 8's per-group normalisation of the token-level loss (a variant of DAPO, not a rung of the table).
TECHNIQUES = ("overlong_filtering", "clip_higher", "soft_overlong", "token_loss", "dynamic_sampling", "group_norm")
TECHNIQUE_LABELS = {"overlong_filtering": "overlong filtering", "clip_higher": "clip-higher",
                    "soft_overlong": "soft overlong punishment", "token_loss": "token-level loss",
                    "dynamic_sampling": "dynamic sampling", "group_norm": "per-group token mean (Eq. 8)"}
TECHNIQUE_KEYS = {"overlong_filtering": "filter", "clip_higher": "clip", "soft_overlong": "soft",
                  "token_loss": "token", "dynamic_sampling": "dapo", "group_norm": "dapo-eq8"}
LADDER = TECHNIQUES[:5]  # Table 1's rungs

@dataclasses.dataclass(frozen=True)
class Row:
    key: str  # its run folder and --rows name
    label: str
    techniques: frozenset[str]  # which of TECHNIQUES are on
    objective: dict  # objective field -> value, applied on CONFIG's objective


def technique_settings(base) -> dict[str, tuple[dict, dict]]:
    """technique -> (objective fields when on, when off), the "on" values taken from CONFIG's
    resolved objective `base` (an `ObjectiveConfig`). Per-group normalisation is a kind of token-level
    loss: off, it leaves `loss_agg` to the token-level technique."""
    eps_high = base.eps_high if base.eps_high > base.eps_low else 0.28
    return {
        "overlong_filtering": ({"overlong_filtering": True}, {"overlong_filtering": False}),
        "clip_higher": ({"eps_low": base.eps_low, "eps_high": eps_high},
                        {"eps_low": base.eps_low, "eps_high": base.eps_low}),
        "soft_overlong": ({"overlong_buffer": base.overlong_buffer, "overlong_penalty_factor": base.overlong_penalty_factor},
                          {"overlong_buffer": None, "overlong_penalty_factor": base.overlong_penalty_factor}),
        "token_loss": ({"loss_agg": "token_mean"}, {"loss_agg": "seq_mean_token_mean"}),
        "dynamic_sampling": ({"dynamic_sampling": True}, {"dynamic_sampling": False}),
        "group_norm": ({"loss_agg": "group_mean_token_mean"}, {}),
    }


def define_rows(base) -> tuple[list[Row], list[tuple[Row, Row]]]:
    """The cumulative ladder of DAPO's Table 1, then DAPO with Eq. 8's per-group token mean; and the
    (dropped, same as) pairs: a row whose objective equals an earlier row's is not run twice (without
    soft overlong punishment in CONFIG that rung equals the one before it)."""
    settings = technique_settings(base)

    def make(key, label, on):
        objective = {}
        for t in TECHNIQUES:
            objective.update(settings[t][0 if t in on else 1])
        return Row(key, label, frozenset(on), objective)

    rows = [make("grpo", "naive GRPO", [])]
    for i, t in enumerate(LADDER):
        full = t == "dynamic_sampling"
        rows.append(make(TECHNIQUE_KEYS[t], "DAPO (+ dynamic sampling)" if full else f"+ {TECHNIQUE_LABELS[t]}",
                         LADDER[:i + 1]))
    rows.append(make(TECHNIQUE_KEYS["group_norm"], "DAPO, per-group token mean (Eq. 8)", TECHNIQUES))
    unique, dropped, seen = [], [], {}
    for row in rows:
        sig = json.dumps(row.objective, sort_keys=True)
        if sig in seen:
            dropped.append((row, seen[sig]))
            continue
        seen[sig] = row
        unique.append(row)
    return unique, dropped


@dataclasses.dataclass(frozen=True)
class Plan:
    config: Path
    steps: int
    eval_every: int
    seeds: tuple[int, ...]
    runs_dir: Path
    common: tuple[str, ...]  # overrides shared by every row


def make_plan(config: Path, cfg, *, steps: int, eval_every: int, seeds: int, runs_dir: Path,
              extra: tuple[str, ...] = ()) -> Plan:
    """`cfg` is CONFIG loaded with the `extra` overrides (`--set`), which every row gets too."""
    r = cfg.rollout
    budget = r.gen_batch * r.max_gen_batches  # prompts one step may generate under dynamic sampling
    common = (
        f"rollout.gen_batch={r.train_batch}",
        f"rollout.max_gen_batches={max(1, math.ceil(budget / r.train_batch))}",
        f"train.steps={steps}", f"train.eval_every={eval_every}", "train.progress=false",
        "objective.kl_beta=0.0", *extra,
    )
    return Plan(config, steps, eval_every, tuple(cfg.train.seed + i for i in range(seeds)), runs_dir, common)


def run_dir(plan: Plan, row: Row, seed: int) -> Path:
    return plan.runs_dir / row.key / f"seed{seed}"


def run_overrides(plan: Plan, row: Row, seed: int) -> list[str]:
    objective = [f"objective.{k}={yaml_value(v)}" for k, v in row.objective.items()]
    return [*plan.common, *objective, f"train.seed={seed}", f"data.order_seed={seed}", f"train.run_dir={run_dir(plan, row, seed)}"]


def job(plan: Plan, row: Row, seed: int) -> Job:
    return Job(row.key, seed, row.label, run_dir(plan, row, seed), plan.config,
               tuple(run_overrides(plan, row, seed)), plan.steps)


# ----------------------------------------------------------------------------- summaries
def clip_summary(run: dict) -> dict:
    """Where the clip binds, over the whole run (token-weighted: each step's fractions of its update
    tokens times its update tokens): the share of the upper- / lower-clipped tokens with π_old < 0.2,
    the fraction of update tokens with A > 0 and ρ in [1.2, 1.28) (what clip-higher un-clips), those the
    upper clip could reach at all (A > 0, π_old < 1/(1 + ε_high)), and the upper clip fraction over
    the last 10% of steps. Empty for runs logged before the histograms."""
    rows = [r for r in run["rows"] if "clip_high_p_old_0" in r and r.get("update_tokens")]
    if not rows:
        return {}
    tokens = np.array([r["update_tokens"] for r in rows], float)
    hist = {side: np.array([[r[f"clip_{side}_p_old_{k}"] for k in range(10)] for r in rows]) * tokens[:, None]
            for side in ("high", "low")}
    out = {}
    for side, h in hist.items():
        total = h.sum()
        if total > 0:
            out[f"{side}_clip_p_old_lt02"] = h[:, :2].sum() / total
            out[f"{side}_clip_p_old_mean"] = float((h.sum(0) * (np.arange(10) + 0.5) / 10).sum() / total)
    for name, key in (("ratio_pos_between", "ratio_pos_5"), ("ratio_pos_above", "ratio_pos_6"),
                      ("clip_high_possible", "clip_high_possible")):
        if key in rows[0]:
            out[name] = float(np.sum(np.array([r[key] for r in rows]) * tokens) / tokens.sum())
    high = np.array([r["clip_frac_high"] for r in rows])
    out["clip_high_end"] = high[-max(1, len(high) // 10):].mean()
    out["clip_high_max"] = high.max()
    return out


def summarize_all(plan: Plan, rows: list[Row], target: float | None) -> tuple[dict, dict, float | None, list[str]]:
    """Row key -> per-seed summaries, row key -> per-seed runs, the target used, and the runs left
    out because they have not finished."""
    runs, missing = {}, []
    for row in rows:
        runs[row.key] = []
        for seed in plan.seeds:
            if not is_finished(job(plan, row, seed)):
                missing.append(f"{row.key}/seed{seed}")
                continue
            runs[row.key].append(read_run(run_dir(plan, row, seed), plan.steps))
    if target is None:
        target = default_target({k: [summarize_run(r, None) for r in v] for k, v in runs.items()}, 0.2)
    summaries = {k: [{**summarize_run(r, target), **clip_summary(r)} for r in v] for k, v in runs.items()}
    return summaries, runs, target, missing


def equal_budget_table(rows: list[Row], runs: dict[str, list[dict]]) -> str:
    """Held-out accuracy at equal numbers of generated responses (each run's evaluations interpolated
    linearly in samples): at a quarter, half and all of the smallest total any run generated."""
    totals = [series(r["rows"], "eval/accuracy", x="samples", G=r["G"])[0] for v in runs.values() for r in v]
    totals = [x[-1] for x in totals if len(x)]
    if not totals:
        return "(no runs)"
    budgets = [round(min(totals) * f) for f in (0.25, 0.5, 1.0)]
    lines = ["| row | " + " | ".join(f"acc. at {b:,} samples" for b in budgets) + " |", "|---|" + "---|" * len(budgets)]
    for row in rows:
        curves = [series(r["rows"], "eval/accuracy", x="samples", G=r["G"]) for r in runs.get(row.key, [])]
        cells = [fmt_cell([value_at(c, b) for c in curves]) if curves else "no runs" for b in budgets]
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


OUTCOME_COLUMNS = [  # (header, summary key, digits)
    ("held-out acc. final", "final_acc", 3), ("best", "best_acc", 3), ("pass@k final", "final_pass", 3),
    ("steps to target", "steps_to_target", 0), ("samples to target", "samples_to_target", 0),
    ("samples generated", "samples", 0), ("wall time (s)", "wall_s", 0),
]
DYNAMICS_COLUMNS = [
    ("H gen. end", "ent_gen_end", 3), ("H gen. min", "ent_gen_min", 3), ("H update end", "ent_upd_end", 3),
    ("H update min", "ent_upd_min", 3), ("length mean", "len_mean", 2), ("length sd over steps", "len_sd_steps", 2),
    ("length sd in step", "len_spread", 2), ("truncated", "trunc", 3), ("truncated end", "trunc_end", 3),
    ("clip low", "clip_low", 4), ("clip high", "clip_high", 4), ("zero-adv. groups", "zero_adv", 3),
    ("length-only groups", "length_only", 3), ("gen. rounds", "gen_rounds", 2),
]

# Per technique, the metrics DAPO's paper says it moves (and held-out accuracy for all).
EFFECT_METRICS = {
    "overlong_filtering": ("trunc", "trunc_end", "final_acc"),
    "clip_higher": ("ent_gen_end", "ent_gen_min", "final_pass", "final_acc"),
    "soft_overlong": ("trunc", "trunc_end", "final_acc"),
    "token_loss": ("len_sd_steps", "len_spread", "ent_gen_end", "final_acc"),
    "dynamic_sampling": ("final_acc", "best_acc", "final_pass"),
    "group_norm": ("len_sd_steps", "len_spread", "final_acc"),
}
METRIC_NAMES = {key: name for name, key, _ in OUTCOME_COLUMNS + DYNAMICS_COLUMNS}


def effect_pairs(rows: list[Row], technique: str) -> list[tuple[Row, Row]]:
    """Every (with, without) pair of rows that differ in `technique` alone."""
    return [(a, b) for a in rows for b in rows if a.techniques == b.techniques | {technique}
            and technique not in b.techniques]


def effects_table(rows: list[Row], summaries: dict[str, list[dict]]) -> str:
    """Each technique's effect: Δ = mean(with) − mean(without) over seeds, its bootstrap 95% interval,
    Welch's p and the verdict at a Holm-adjusted p < 0.05 over every comparison of the table."""
    found = []
    for t in TECHNIQUES:
        for a, b in effect_pairs(rows, t):
            for key in EFFECT_METRICS[t]:
                va = [v for v in column(summaries.get(a.key, []), key) if v is not None]
                vb = [v for v in column(summaries.get(b.key, []), key) if v is not None]
                if va and vb:
                    found.append((t, a, b, key, va, vb, significance.compare(va, vb)))
    adjusted = significance.holm([c.p for *_, c in found])
    lines = ["| technique | with → without | metric | with | without | Δ [95% interval] | p | Holm p | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (t, a, b, key, va, vb, c), p_adj in zip(found, adjusted):
        lines.append(f"| {TECHNIQUE_LABELS[t]} | `{a.key}` → `{b.key}` | {METRIC_NAMES.get(key, key)} | "
                     f"{np.mean(va):.4f} | {np.mean(vb):.4f} | {significance.tested_cells(c, p_adj, 4)} |")
    return "\n".join(lines) + "\n\n" + significance.legend(significance.family_size(adjusted))


# ----------------------------------------------------------------------------- figures
# figure -> (title, rows compared, [(panel title, y label, metric, x)])
FIGURES = {
    "ablation_clip_higher": ("Clip-higher (DAPO Fig. 2)", ["filter", "clip"], [
        ("Entropy of all generated responses", "nats / token", "entropy_generated", "step"),
        ("Held-out accuracy", "avg@k", "eval/accuracy", "step")]),
    "ablation_token_loss": ("Sequence-mean vs token-mean loss (DAPO Fig. 4)", ["soft", "token", "dapo", "dapo-eq8"], [
        ("Response length, mean", "tokens", "response_length_mean", "step"),
        ("Response length, sd within a step", "tokens", "response_length_std", "step")]),
    "ablation_dynamic_sampling": ("Dynamic sampling (DAPO Fig. 6)", ["token", "dapo"], [
        ("Held-out accuracy vs steps", "avg@k", "eval/accuracy", "step"),
        ("Held-out accuracy vs generated samples", "avg@k", "eval/accuracy", "samples")]),
    "ablation_overlong": ("Overlong filtering and soft punishment (DAPO Fig. 5)", ["grpo", "filter", "clip", "soft"], [
        ("Truncated responses", "fraction of generated", "truncated_fraction", "step"),
        ("Held-out accuracy", "avg@k", "eval/accuracy", "step")]),
}
def row_styles(rows: list[Row]) -> dict[str, dict]:
    """One colour per row in every figure; DAPO variants dashed."""
    order = ["grpo", *TECHNIQUE_KEYS.values()]
    return {row.label: {"color": f"C{order.index(row.key) % 10}",
                        "linestyle": "--" if row.key.startswith("dapo-") else "-"} for row in rows}


def write_figures(out_dir: Path, rows: list[Row], runs: dict[str, list[dict]], steps: int,
                  figures: dict = FIGURES) -> list[Path]:
    """One PNG per `figures` entry that has data; per-step metrics smoothed over 5% of the steps."""
    from dapo_jax.plot import Panel, plot_panels

    by_key = {row.key: row for row in rows}
    w = max(1, steps // 20)
    written = []
    for name, (title, keys, panel_specs) in figures.items():
        panels = []
        for ptitle, ylabel, metric, x in panel_specs:
            data = {}
            for key in keys:
                if key not in by_key or not runs.get(key):
                    continue
                curves = []
                for run in runs[key]:
                    xs, ys = series(run["rows"], metric, x=x, G=run["G"])
                    curves.append((xs, ys if metric.startswith("eval/") else smooth(ys, w)))
                data[by_key[key].label] = [c for c in curves if len(c[0])]
            xlabel = "training step" if x == "step" else "generated responses"
            panels.append(Panel(ptitle, xlabel, ylabel, data))
        path = plot_panels(out_dir / f"{name}.png", panels, suptitle=title, styles=row_styles(rows))
        if path is not None:
            written.append(path)
    return written


# ----------------------------------------------------------------------------- the report
def _fields(fields: dict) -> str:
    return ", ".join(f"`{k}={yaml_value(v)}`" for k, v in fields.items())


def row_definitions(rows: list[Row], settings: dict[str, tuple[dict, dict]],
                    dropped: list[tuple[Row, Row]] = ()) -> str:
    """The objective fields of each technique on / off, then which are on in each row."""
    lines = ["| technique | on | off |", "|---|---|---|"]
    lines += [f"| {TECHNIQUE_LABELS[t]} | {_fields(settings[t][0])} | {_fields(settings[t][1]) or 'as the token-level loss'} |"
              for t in TECHNIQUES]
    lines += ["", "| row | run folder | " + " | ".join(TECHNIQUE_LABELS[t] for t in TECHNIQUES) + " |",
              "|---|---|" + "---|" * len(TECHNIQUES)]
    for row in rows:
        on = " | ".join("on" if t in row.techniques else "off" for t in TECHNIQUES)
        lines.append(f"| {row.label} | `{row.key}` | {on} |")
    if dropped:
        lines += ["", "Not run twice: " + "; ".join(f"{d.label} = {same.label}" for d, same in dropped) + "."]
    return "\n".join(lines)


def write_report(out: Path, plan: Plan, rows: list[Row], dropped: list, settings: dict, summaries: dict,
                 runs: dict, target: float | None, figures: list[Path], command: str, missing: list[str]) -> str:
    n_seeds = len(plan.seeds)
    figs = "\n".join(f"![{p.stem}]({os.path.relpath(p, out.parent)})" for p in figures)
    text = f"""# The DAPO ablation ladder in miniature

Generated by `scripts/ablate.py`; the tables and figures are rewritten by every run of it.

- Command: `{command}`
- Config: `{rel(plan.config)}`, {plan.steps} steps, evaluation every {plan.eval_every} steps,
  {n_seeds} seed(s) ({", ".join(map(str, plan.seeds))}: `train.seed`), runs in `{rel(plan.runs_dir)}/ROW/seedS`
- Shared overrides (every row): {", ".join(f"`{o}`" for o in plan.common)}
- Machine: {machine()}
- Date: {datetime.date.today().isoformat()}
{"- Unfinished or failed runs, left out of the tables: " + ", ".join(missing) if missing else ""}

## Rows

Each row is CONFIG with the shared overrides and, for each technique, its objective fields on or
off; everything else is identical. "On" values are CONFIG's own (clip-higher: its eps_high, or 0.28
if it has none).

{row_definitions(rows, settings, dropped)}

## Results

Mean ± sd (sample sd) over seeds. Held-out accuracy is avg@k at the final step (best: the best
evaluation). Target accuracy: **{"none" if target is None else f"{target:.3f}"}** (default: the mean
step-0 accuracy + 0.2); "steps/samples to target" are those of the first evaluation at or above it
(samples = generated responses, Σ generated groups × G, kept or not), averaged over the seeds that
reached it ("k/n" when not all did). Wall time includes evaluation and compilation (a program an
earlier row compiled comes from RUNS_DIR/.jax_cache, so the first row pays the most).

{markdown_table(rows, summaries, OUTCOME_COLUMNS)}

Held-out accuracy at equal budgets of generated samples (each run's evaluations interpolated in
samples; dynamic sampling generates up to `max_gen_batches` rounds per step, so per step and per
sample are different readings):

{equal_budget_table(rows, runs)}

Training dynamics. H gen. = entropy of the sampling distribution over ALL generated responses
(`entropy_generated`), H update = over the tokens the update trains on (`entropy`); "end" = mean over
the last 10% of steps, "min" = the minimum of their 10%-of-steps moving average. Length: response
tokens of the generated responses (mean over steps, sd of the per-step mean over steps, mean of the
within-step sd). Truncated, clip low/high (fraction of update tokens clipped, `clip_frac_low/high`),
zero-adv. groups (generated groups whose rewards are all equal) and gen. rounds: means over steps.

{markdown_table(rows, summaries, DYNAMICS_COLUMNS)}

Each technique's effect, row pair by row pair: the difference of the seed means (seeds vary the
sampling and the order of the training prompts), Welch's test and a bootstrap interval.

{effects_table(rows, summaries)}

## Figures

Mean curve and ±1 sd band over seeds; per-step metrics smoothed by a moving average over 5% of the steps.

{figs}

{FINDINGS_PLACEHOLDER}"""
    return write_page(out, text)


# ----------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", type=Path, default=None, help="a DAPO run config: a recipe's "
                    "name or a YAML file (default: the main job, cot_dapo)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per row (train.seed = CONFIG's + 0..N-1)")
    ap.add_argument("--steps", type=int, default=None, help="training steps per run (default: CONFIG's; --quick: a tenth)")
    ap.add_argument("--eval-every", type=int, default=None,
                    help="held-out evaluation period (default: steps / 10; --quick: steps / 4)")
    ap.add_argument("--quick", action="store_true", help="one seed, a tenth of the steps")
    ap.add_argument("--rows", default=None, help="comma-separated row keys to run (default: all)")
    ap.add_argument("--target", type=float, default=None, help="held-out accuracy target (default: step-0 mean + 0.2)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the report (default: docs/ablation.md)")
    ap.add_argument("--figures-dir", type=Path, default=None, help="default: figures/ beside --out")
    ap.add_argument("--runs-dir", type=Path, default=None,
                    help="default: runs/ablate (runs/ablate_quick with --quick)")
    add_run_arguments(ap)
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    return args


def main(argv=None) -> int:
    from experiment import available_cores

    args = parse_args(argv)
    from dapo_jax.training.config.paths import find_config
    from dapo_jax.training.config.run import load_config

    config = find_config(args.config) if args.config else default_config()  # a recipe's name or a file
    cfg = load_config(config, args.extra)
    steps = args.steps or (max(10, cfg.train.steps // 10) if args.quick else cfg.train.steps)
    seeds = 1 if args.quick else args.seeds
    name = "ablate"
    runs_dir = args.runs_dir or REPO / "runs" / (name + ("_quick" if args.quick else ""))
    out = args.out or REPO / "docs" / "ablation.md"
    eval_every = args.eval_every or max(1, steps // (4 if args.quick else 10))
    plan = make_plan(config, cfg, steps=steps, eval_every=eval_every, seeds=seeds, runs_dir=runs_dir,
                     extra=tuple(args.extra))
    settings = technique_settings(cfg.objective_config)
    rows, dropped = define_rows(cfg.objective_config)
    for row, same in dropped:
        print(f"[ablate] {row.label} is the same run as {same.label} ({same.key}): not run twice", flush=True)
    rows = pick_rows(rows, args.rows)
    if rows is None:
        return 2
    for row in rows:  # every row's config must validate before hours of training start
        load_config(config, run_overrides(plan, row, plan.seeds[0]))
    print(f"[ablate] {config}: {len(rows)} rows x {len(plan.seeds)} seed(s), {steps} steps each, "
          f"eval every {plan.eval_every}, runs in {runs_dir}", flush=True)
    if not args.no_compile_cache:
        use_compile_cache(runs_dir)
    if args.only:  # a --jobs child: train one run, the parent writes the report
        key, _, seed = args.only.partition("/")
        row = next(r for r in rows if r.key == key)
        return 1 if run_one(job(plan, row, int(seed)), args.name or args.only, "ablate") else 0
    argv = list(argv if argv is not None else sys.argv[1:])
    jobs = [job(plan, row, seed) for row in rows for seed in plan.seeds]
    n_jobs = args.jobs if args.jobs is not None else min(len(available_cores()), 8)
    failed = [] if args.report_only else run_all(jobs, n_jobs=n_jobs, script=__file__, argv=argv, tag="ablate")

    summaries, runs, target, missing = summarize_all(plan, rows, args.target)
    figures_dir = args.figures_dir or out.parent / "figures"
    figures = write_figures(figures_dir, rows, runs, steps, FIGURES)
    command = " ".join(["python", "scripts/ablate.py", *argv])
    write_report(out, plan, rows, dropped, settings, summaries, runs, target, figures, command, missing)
    print(f"\ntarget held-out accuracy: {target}\n")
    print(markdown_table(rows, summaries, OUTCOME_COLUMNS))
    print()
    print(markdown_table(rows, summaries, DYNAMICS_COLUMNS))
    print(f"\n[ablate] wrote {out} and {len(figures)} figure(s)", flush=True)
    return finish("ablate", failed, missing)


if __name__ == "__main__":
    sys.exit(main())
