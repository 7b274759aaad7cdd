"""The GRPO family's league table on the chain-of-thought task: every objective, the same budget of
generated samples, three seeds, one command.

    python scripts/league.py [CONFIG] [--quick] [--jobs 2] [--seeds 3] [--budget SAMPLES] [--rows grpo,dapo]
                             [--eval-samples N] [--eval-size N] [--out docs/league.md] [--runs-dir runs/league]
                             [--target ACC] [--report-only]

CONFIG (default the recipes folder's cot_dapo.yaml) gives everything but the objective: model, data,
G, batch, lr, updates per rollout, sampling, evaluation. Each row is CONFIG with `objective.name` =
the row's recipe (`configs/objectives/NAME.yaml`) at its published operating point: its own
advantage, loss, clip, aggregation, KL (and reference model), rewards and shaping; the only changes a
row gets are those its recipe cannot run without here (ROWS: soft overlong punishment scaled to
CONFIG's buffer, a critic's learning rate, the bf16 sampler that DAPO + TIS corrects for, packing off
for group DPO). Nothing is tuned per objective.

The budget is in GENERATED SAMPLES, not steps: each run stops after the step whose responses (kept or
not: dynamic sampling and GFPO generate more per step) reach `--budget` (`train.max_samples`); VAPO's
value pre-training rollouts count too. Held-out avg@k is measured every `--eval-samples` generated
samples (in steps: a row without dynamic sampling generates gen_batch x G per step, one with it
about twice that), and at the budget.

Runs go to RUNS_DIR/ROW/seedS, `--jobs` at a time (each its own process on one core with one XLA
thread), seed 0 of every row first; a rerun of the command skips finished runs and resumes the others
from their checkpoints. The report (mean ± sd over seeds, curves against generated samples with seed
bands in docs/figures/league_*.png) goes to --out; its Findings section is kept across reruns.
`--quick`: one seed, a fifth of the budget, 50 held-out problems, in runs/league_quick.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiment.py beside this script

from experiment import (  # noqa: E402
    finish, FINDINGS_PLACEHOLDER, Job, add_run_arguments, available_cores, column, default_config, default_target,
    fmt_cell, is_finished, machine, markdown_table, pick_rows, read_run, rel, run_all, run_one,
    series, smooth, summarize_run, use_compile_cache, value_at, write_page, yaml_value,
)

import significance  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DS_ROUNDS = 2  # generation rounds per step assumed for rows with dynamic sampling (DAPO's mean in docs/ablation.md)


@dataclasses.dataclass(frozen=True)
class Row:
    key: str  # run folder, --rows name
    label: str
    recipe: str  # configs/objectives/RECIPE.yaml
    fixes: str  # what the method was designed to fix (its paper's claim)
    family: str  # which figure it is drawn in
    extra: tuple[str, ...] = ()  # overrides this recipe needs here (documented in the report)


ROWS = (
    Row("grpo", "GRPO", "grpo", "the baseline: a group-relative advantage instead of PPO's critic", "group"),
    Row("dapo", "DAPO", "dapo", "entropy collapse (clip-higher), zero-gradient groups (dynamic sampling), "
        "long-response under-weighting (token-level loss), truncation noise (overlong shaping)", "group"),
    Row("dr_grpo", "Dr. GRPO", "dr_grpo", "GRPO's length and difficulty biases (dividing by the response length and by the group std)", "group"),
    Row("rloo", "RLOO", "rloo", "a biased baseline: leave-one-out mean, no std scaling", "group"),
    Row("reinforce_pp", "REINFORCE++", "reinforce_pp",
        "prompt-level overfitting of group baselines: batch-whitened returns, KL in the reward", "group"),
    Row("reinforce_pp_baseline", "REINFORCE++-baseline", "reinforce_pp_baseline",
        "the same with a group-mean baseline, whitened over the batch", "group"),
    Row("gspo", "GSPO", "gspo", "token-ratio noise: one length-normalised sequence ratio, clipped", "ratio"),
    Row("gspo_token", "GSPO-token", "gspo_token", "GSPO's ratio admitting token advantages (same gradient here)", "ratio"),
    Row("cispo", "CISPO", "cispo", "clipped tokens losing their gradient: clip the IS weight, not the update", "ratio"),
    Row("gfpo", "GFPO", "gfpo", "length inflation: train on the k shortest of G responses", "ratio"),
    Row("edge_grpo", "EDGE-GRPO", "edge_grpo", "advantage collapse: scale A by the response's entropy", "ratio"),
    Row("dapo_tis", "DAPO + TIS (bf16 sampler)", "dapo_tis",
        "sampler/trainer mismatch: truncated importance weights π_old/μ", "ratio", ("rollout.sampler_dtype=bfloat16",)),
    Row("ppo", "PPO", "ppo", "the reference: a learned critic and GAE", "other"),
    Row("vapo", "VAPO", "vapo", "PPO's critic on long CoT: value pre-training, decoupled and length-adaptive GAE", "other"),
    Row("gdpo", "group DPO", "gdpo", "no ratio, no clip: a DPO loss on each group's best vs worst",
        "other", ("optim.packing=false",)),
    Row("grpo_process", "GRPO + process supervision", "grpo_process",
        "sparse outcome reward: one reward per running-sum line", "other"),
    # added since mid-2025 (docs/objectives_recent.md#since-mid-2025)
    Row("sapo", "SAPO", "sapo", "the hard clip's cliff: a smooth sigmoid gate, colder for negative advantages", "recent"),
    Row("gmpo", "GMPO", "gmpo", "outlier token ratios: the geometric mean of clipped ratios per response", "recent"),
    Row("clip_cov", "Clip-Cov", "clip_cov", "entropy collapse: cut the gradient of a few high-covariance tokens",
        "recent"),
    Row("kl_cov", "KL-Cov", "kl_cov", "entropy collapse: a KL penalty on the highest-covariance tokens", "recent"),
    Row("dppo", "DPPO (binary TV)", "dppo", "the ratio clip's poor trust region: mask on a probability change",
        "recent"),
    Row("dppo_kl", "DPPO (binary KL)", "dppo_kl", "the same with a KL region on the sampled token", "recent"),
    Row("grpo_v32", "GRPO (DeepSeek-V3.2)", "grpo_v32",
        "stale negative samples and k3's gradient: off-policy sequence mask, unbiased KL", "recent"),
    Row("dapo_geo_mask", "DAPO + geometric mask (bf16 sampler)", "dapo_geo_mask",
        "sampler/trainer mismatch without the length bias of the ratio product", "recent",
        ("rollout.sampler_dtype=bfloat16",)),
    Row("dapo_icepop", "DAPO + IcePop (bf16 sampler)", "dapo_icepop",
        "sampler/trainer mismatch: the ratio as weight inside [0.5, 5], 0 outside", "recent",
        ("rollout.sampler_dtype=bfloat16",)),
    Row("dapo_k3_mask", "DAPO + K3 rejection (bf16 sampler)", "dapo_k3_mask",
        "sampler/trainer mismatch: drop responses whose KL(mu || pi_old) estimate is large", "recent",
        ("rollout.sampler_dtype=bfloat16",)),
    Row("skywork_or1", "Skywork-OR1 (adaptive entropy)", "skywork_or1",
        "entropy collapse: an entropy bonus whose coefficient moves to hold a target entropy", "recent"),
    Row("dapo_bypass_geo_mask", "DAPO bypass + geometric mask (bf16 sampler)", "dapo_bypass_geo_mask",
        "the recomputation pass: the sampler's log-probs as pi_old, a mask on pi_theta / mu", "recent",
        ("rollout.sampler_dtype=bfloat16",)),
)
FAMILIES = {"group": "Group baselines and their normalisations", "ratio": "Ratios, weights and filters",
            "recent": "Objectives added since mid-2025",
            "other": "Critics, preferences and process rewards"}
REFERENCE_ROWS = ("grpo", "dapo")  # drawn in every family's figure


@dataclasses.dataclass(frozen=True)
class Plan:
    config: Path
    budget: int  # generated samples per run
    eval_samples: int  # held-out evaluation period, in generated samples
    eval_size: int
    seeds: tuple[int, ...]
    runs_dir: Path
    common: tuple[str, ...]
    samples_per_round: int  # gen_batch x G
    cap: int  # train.steps: every row reaches the budget within it (a step generates >= one round)


def make_plan(config: Path, cfg, *, budget: int, eval_samples: int, eval_size: int, seeds: int, runs_dir: Path,
              extra: tuple[str, ...] = ()) -> Plan:
    r = cfg.rollout
    per_round = r.gen_batch * r.G
    cap = math.ceil(budget / per_round)
    common = (f"train.steps={cap}", f"data.eval_size={eval_size}", "train.progress=false",
              f"train.checkpoint_every={max(5, cap // 4)}", *extra)
    return Plan(config, budget, eval_samples, eval_size, tuple(cfg.train.seed + i for i in range(seeds)), runs_dir,
                common, per_round, cap)


def recipe(row: Row):
    from dapo_jax.objectives.registry import load_objective

    return load_objective(row.recipe)


def pretrain_steps(plan: Plan, row: Row) -> int:
    """VAPO's value pre-training steps: the recipe's (50), unless they would leave the policy less than a
    quarter of the budget (a --quick league's), then as many as leave it that quarter."""
    return min(recipe(row).value_pretrain_steps, plan.budget * 3 // 4 // plan.samples_per_round)


def pretrain_samples(plan: Plan, row: Row) -> int:
    """Responses a row generates before its first step: VAPO's value pre-training on the initial policy
    (one rollout batch per pre-training step); they count in its budget."""
    return pretrain_steps(plan, row) * plan.samples_per_round


def eval_every(plan: Plan, row: Row) -> int:
    """The evaluation period in steps that is closest to `plan.eval_samples` generated samples."""
    per_step = plan.samples_per_round * (DS_ROUNDS if recipe(row).dynamic_sampling else 1)
    return max(1, round(plan.eval_samples / per_step))


def row_overrides(cfg, row: Row, plan: Plan | None = None) -> list[str]:
    """What makes CONFIG run `row`'s recipe: the name, soft overlong punishment only where the recipe
    has it (with CONFIG's buffer, 16 of 144 tokens for cot, not DAPO's 4096 of 20480), a critic's
    learning rate twice the policy's (VAPO's published 2e-6 / 1e-6) and the row's own extras."""
    own = recipe(row)
    buffer = cfg.objective_config.overlong_buffer if own.overlong_buffer is not None else None
    out = [f"objective.name={row.recipe}", f"objective.overlong_buffer={yaml_value(buffer)}"]
    if own.uses_critic:
        out.append(f"critic.lr={yaml_value(2 * cfg.optim.lr)}")
    if plan is not None and own.value_pretrain_steps and pretrain_steps(plan, row) != own.value_pretrain_steps:
        out.append(f"objective.value_pretrain_steps={pretrain_steps(plan, row)}")
    return [*out, *row.extra]


def run_dir(plan: Plan, row: Row, seed: int) -> Path:
    return plan.runs_dir / row.key / f"seed{seed}"


def run_overrides(plan: Plan, cfg, row: Row, seed: int) -> list[str]:
    return [*plan.common, *row_overrides(cfg, row, plan), f"train.max_samples={plan.budget - pretrain_samples(plan, row)}",
            f"train.eval_every={eval_every(plan, row)}", f"train.seed={seed}", f"data.order_seed={seed}",
            f"train.run_dir={run_dir(plan, row, seed)}"]


def job(plan: Plan, cfg, row: Row, seed: int) -> Job:
    return Job(row.key, seed, row.label, run_dir(plan, row, seed), plan.config,
               tuple(run_overrides(plan, cfg, row, seed)), plan.cap)


def jobs(plan: Plan, cfg, rows: list[Row]) -> list[Job]:
    """Seed 0 of every row first: an interrupted league has every row once before any twice."""
    return [job(plan, cfg, row, seed) for seed in plan.seeds for row in rows]


# ----------------------------------------------------------------------------- reading
def summarize_all(plan: Plan, cfg, rows: list[Row], target: float | None):
    """Row key -> per-seed summaries and runs, the target used, and the runs left out (unfinished)."""
    runs, missing, offsets = {}, [], {}
    for row in rows:
        runs[row.key], offsets[row.key] = [], pretrain_samples(plan, row)
        for seed in plan.seeds:
            if not is_finished(job(plan, cfg, row, seed)):
                missing.append(f"{row.key}/seed{seed}")
                continue
            runs[row.key].append(read_run(run_dir(plan, row, seed)))
    if target is None:
        target = default_target({k: [summarize_run(r, None) for r in v] for k, v in runs.items()}, 0.1)
    summaries = {k: [{**summarize_run(r, target, offset=offsets[k]), "pretrain_samples": offsets[k] or None}
                     for r in v] for k, v in runs.items()}
    return summaries, runs, offsets, target, missing


TABLE_COLUMNS = [  # (header, summary key, digits)
    ("avg@4 at budget", "final_acc", 3), ("best avg@4", "best_acc", 3), ("pass@4", "final_pass", 3),
    ("maj@4", "final_maj", 3), ("samples to target", "samples_to_target", 0), ("steps", "steps", 0),
    ("H end", "ent_gen_end", 3), ("H min", "ent_gen_min", 3), ("length mean", "len_mean", 1),
    ("length drift", "len_drift", 1), ("truncated", "trunc", 3), ("wall time (s)", "wall_s", 0),
]
COMPARE = [("final_acc", "avg@4 at budget"), ("final_pass", "pass@4"), ("ent_gen_end", "H end"),
           ("len_drift", "length drift"), ("trunc", "truncated")]


def versus_grpo(rows: list[Row], summaries: dict[str, list[dict]]) -> str:
    """Each row's Δ to GRPO on the main outcomes: the bootstrap 95% interval and Welch's p, marked only
    where the Holm-adjusted p (over every cell of the table) is below 0.05; then the legend."""
    base = summaries.get("grpo", [])
    others = [row for row in rows if row.key != "grpo"]
    comparisons = {}
    for row in others:
        for key, _ in COMPARE:
            a = [v for v in column(summaries.get(row.key, []), key) if v is not None]
            b = [v for v in column(base, key) if v is not None]
            if a and b:
                comparisons[row.key, key] = significance.compare(a, b)
    keys = list(comparisons)
    adjusted = dict(zip(keys, significance.holm([comparisons[k].p for k in keys])))
    lines = ["| row | " + " | ".join(f"Δ {name}" for _, name in COMPARE) + " |", "|---|" + "---|" * len(COMPARE)]
    for row in others:
        cells = [significance.cell(comparisons[row.key, key], adjusted[row.key, key])
                 if (row.key, key) in comparisons else "–" for key, _ in COMPARE]
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    m = significance.family_size(adjusted.values())
    return "\n".join(lines) + "\n\n" + significance.legend(m)


def accuracy_at(rows: list[Row], runs: dict, offsets: dict, fractions=(0.25, 0.5, 0.75)) -> str:
    """Held-out avg@4 interpolated at fractions of the budget (curves against generated samples)."""
    totals = [series(r["rows"], "eval/accuracy", x="samples", G=r["G"], offset=offsets[k])[0][-1]
              for k, v in runs.items() for r in v if series(r["rows"], "eval/accuracy")[0].size]
    if not totals:
        return "(no runs)"
    points = [round(min(totals) * f) for f in fractions]
    lines = ["| row | " + " | ".join(f"avg@4 at {p:,}" for p in points) + " |", "|---|" + "---|" * len(points)]
    for row in rows:
        curves = [series(r["rows"], "eval/accuracy", x="samples", G=r["G"], offset=offsets[row.key])
                  for r in runs.get(row.key, [])]
        cells = [fmt_cell([value_at(c, p) for c in curves]) if curves else "no runs" for p in points]
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- figures
PANELS = [("Held-out accuracy", "avg@4", "eval/accuracy"),
          ("Entropy of the generated responses", "nats / token", "entropy_generated"),
          ("Response length", "tokens", "response_length_mean")]


def curves(runs: list[dict], metric: str, x: str, offset: float, w: int) -> list[tuple]:
    out = []
    for run in runs:
        xs, ys = series(run["rows"], metric, x=x, G=run["G"], offset=offset)
        if len(xs):
            out.append((xs, ys if metric.startswith("eval/") else smooth(ys, w)))
    return out


def write_figures(out_dir: Path, rows: list[Row], runs: dict, offsets: dict, budget: int) -> list[Path]:
    """Per family (with GRPO and DAPO in each): accuracy, entropy and length against generated samples,
    mean and ±1 sd over seeds; then accuracy against steps and against samples for the rows that
    generate more per step (dynamic sampling, GFPO) beside GRPO's."""
    from dapo_jax.plot import Panel, plot_panels

    styles = {row.label: {"color": f"C{i % 10}", "linestyle": ("-", "--", ":")[i // 10 % 3]}
              for i, row in enumerate(ROWS)}
    w = max(1, budget // (40 * 128))  # per-step metrics: ~5% of a no-dynamic-sampling run
    written = []
    for family, title in FAMILIES.items():
        members = [r for r in rows if r.family == family or r.key in REFERENCE_ROWS]
        panels = [Panel(t, "generated responses", y, {r.label: curves(runs.get(r.key, []), m, "samples",
                                                                     offsets[r.key], w) for r in members})
                  for t, y, m in PANELS]
        path = plot_panels(out_dir / f"league_{family}.png", panels, suptitle=f"{title}: against generated samples",
                           styles=styles)
        written += [path] if path is not None else []
    more = [r for r in rows if r.key == "grpo" or recipe(r).dynamic_sampling]
    panels = [Panel("Held-out accuracy vs steps", "training step", "avg@4",
                    {r.label: curves(runs.get(r.key, []), "eval/accuracy", "step", 0, w) for r in more}),
              Panel("Held-out accuracy vs generated samples", "generated responses", "avg@4",
                    {r.label: curves(runs.get(r.key, []), "eval/accuracy", "samples", offsets[r.key], w) for r in more})]
    path = plot_panels(out_dir / "league_dynamic_sampling.png", panels,
                       suptitle="Dynamic sampling per step and per sample", styles=styles)
    return written + ([path] if path is not None else [])


# ----------------------------------------------------------------------------- the report
class LoadMonitor:
    """The 1-minute load average every `period` s while the league trains (other jobs on the machine
    slow every run down: the report says how loaded it was)."""

    def __init__(self, path: Path, period: float = 60.0):
        self.path, self.period, self._stop = path, period, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._stop.wait(self.period):
            self.record(os.getloadavg()[0])

    def record(self, load: float) -> None:
        state = json.loads(self.path.read_text()) if self.path.exists() else {"load": [], "sessions": []}
        state["load"].append(round(load, 2))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(state))

    def __enter__(self):
        self._t0 = time.time()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        state = json.loads(self.path.read_text()) if self.path.exists() else {"load": [], "sessions": []}
        state["sessions"].append({"start": time.strftime("%Y-%m-%d %H:%M", time.localtime(self._t0)),
                                  "wall_s": round(time.time() - self._t0, 1)})
        self.path.write_text(json.dumps(state))


def load_line(path: Path) -> str:
    if not path.exists():
        return "not recorded"
    state = json.loads(path.read_text())
    load, sessions = state.get("load", []), state.get("sessions", [])
    wall = sum(s["wall_s"] for s in sessions)
    text = f"{len(sessions)} session(s), {wall / 60:.1f} min of wall time in all"
    if load:
        text += (f"; 1-minute load average while training (2 cores): mean {np.mean(load):.1f}, "
                 f"max {np.max(load):.1f}, over {len(load)} samples")
    return text


def row_table(plan: Plan, cfg, rows: list[Row]) -> str:
    lines = ["| row | recipe | designed to fix | overrides besides the shared ones | eval every (steps) |",
             "|---|---|---|---|---|"]
    for row in rows:
        own = [o for o in row_overrides(cfg, row, plan) if not o.startswith("objective.name=")]
        pre = pretrain_samples(plan, row)
        if pre:
            own.append(f"train.max_samples={plan.budget - pre} (budget − {pre:,} value pre-training samples)")
        lines.append(f"| {row.label} | `{row.recipe}` | {row.fixes} | {', '.join(f'`{o}`' for o in own)} | "
                     f"{eval_every(plan, row)} |")
    return "\n".join(lines)


def write_report(out: Path, plan: Plan, cfg, rows: list[Row], summaries: dict, runs: dict, offsets: dict,
                 target: float | None, figures: list[Path], command: str, missing: list[str]) -> str:
    figs = "\n".join(f"![{p.stem}]({os.path.relpath(p, out.parent)})" for p in figures)
    partial = (f"\n> **Partial results.** Not finished yet, so left out of the tables: {', '.join(missing)}. "
               f"Rerun the command to finish them (finished runs are skipped).\n" if missing else "")
    text = f"""# The GRPO family's league table on the chain-of-thought task

Generated by `scripts/league.py`; the tables and figures are rewritten by every run of it.
{partial}
- Command: `{command}`
- Config: `{rel(plan.config)}` (model, data, G, batch, lr, updates per rollout, sampling), one row per
  objective recipe; {len(plan.seeds)} seed(s) ({", ".join(map(str, plan.seeds))}), runs in `{rel(plan.runs_dir)}/ROW/seedS`
- Budget: **{plan.budget:,} generated responses per run** (kept or not; `train.max_samples`, at most
  {plan.cap} steps of {plan.samples_per_round} responses); held-out avg@4 on {plan.eval_size} problems every
  ~{plan.eval_samples:,} generated responses and at the budget
- Shared overrides: {", ".join(f"`{o}`" for o in plan.common)}
- Machine: {machine()}; {load_line(plan.runs_dir / "league_load.json")}
- Date: {datetime.date.today().isoformat()}

## Rows

Each row is CONFIG with `objective.name` = its recipe (`configs/objectives/`, the published
operating point: advantage, loss, clip, aggregation, KL and its reference model, reward values,
shaping) and only the overrides listed. The evaluation period is set in samples: rows with dynamic
sampling generate about {DS_ROUNDS}× as much per step, so they are evaluated every half as many steps.

{row_table(plan, cfg, rows)}

## Results

Mean ± sd (sample sd) over seeds, at the budget. avg@4 / pass@4 / maj@4: held-out, at the budget
(best: the best evaluation up to it). Target: **{"none" if target is None else f"{target:.3f}"}**
(default: the mean step-0 avg@4 + 0.1); samples to target: generated responses at the first
evaluation at or above it ("k/n": seeds that reached it). Steps: updates made within the budget. H:
entropy of the generated responses (nats / token; end = last 10% of steps, min = minimum of the
10%-of-steps moving average). Length: generated response tokens, mean over steps; drift = last 10%
of steps − first 10%. Truncated: fraction of generated responses cut at max_new_tokens, mean over
steps. Wall time: training, evaluation and compilation, on a shared machine (see the load above).

{markdown_table(rows, summaries, TABLE_COLUMNS, first="objective")}

Each row against GRPO (Δ = row mean − GRPO mean; seeds vary the sampling and the order of the training prompts):

{versus_grpo(rows, summaries)}

Held-out avg@4 at fractions of the budget (each run's evaluations interpolated in generated samples):

{accuracy_at(rows, runs, offsets)}

## Figures

Mean and ±1 sd band over seeds, against generated responses (VAPO's curve starts after its value
pre-training samples); per-step metrics smoothed by a moving average.

{figs}

{FINDINGS_PLACEHOLDER}"""
    return write_page(out, text)


# ----------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", type=Path, default=None, help="the shared run (default: cot_dapo.yaml)")
    ap.add_argument("--quick", action="store_true", help="one seed, a fifth of the budget, 50 held-out problems")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget", type=int, default=None, help="generated responses per run (default 10240; --quick 2048)")
    ap.add_argument("--eval-samples", type=int, default=None,
                    help="evaluate every this many generated responses (default: an eighth of the budget; "
                    "--quick: half)")
    ap.add_argument("--eval-size", type=int, default=None, help="held-out problems (default 100; --quick 50)")
    ap.add_argument("--rows", default=None, help="comma-separated row keys (default: all)")
    ap.add_argument("--target", type=float, default=None, help="held-out avg@4 target (default: step-0 mean + 0.1)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "league.md")
    ap.add_argument("--figures-dir", type=Path, default=None, help="default: figures/ beside --out")
    ap.add_argument("--runs-dir", type=Path, default=None, help="default: runs/league (runs/league_quick)")
    add_run_arguments(ap)
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from dapo_jax.training.config.run import load_config

    config = args.config or default_config()
    cfg = load_config(config, args.extra)
    budget = args.budget or (2048 if args.quick else 10240)
    plan = make_plan(config, cfg, budget=budget, eval_samples=args.eval_samples or max(1, budget // (2 if args.quick else 8)),
                     eval_size=args.eval_size or (50 if args.quick else 100), seeds=1 if args.quick else args.seeds,
                     runs_dir=args.runs_dir or REPO / "runs" / ("league_quick" if args.quick else "league"),
                     extra=tuple(args.extra))
    rows = list(ROWS)
    rows = pick_rows(rows, args.rows)
    if rows is None:
        return 2
    for row in rows:  # every row's config must validate before hours of training start
        load_config(config, run_overrides(plan, cfg, row, plan.seeds[0]))
    print(f"[league] {config}: {len(rows)} rows x {len(plan.seeds)} seed(s), {plan.budget:,} generated samples each, "
          f"runs in {plan.runs_dir}", flush=True)
    if not args.no_compile_cache:
        use_compile_cache(plan.runs_dir)
    if args.only:  # a --jobs child: train one run, the parent writes the report
        key, _, seed = args.only.partition("/")
        row = next(r for r in rows if r.key == key)
        return 1 if run_one(job(plan, cfg, row, int(seed)), args.name or args.only, "league") else 0
    argv = list(argv if argv is not None else sys.argv[1:])
    failed = []
    if not args.report_only:
        n_jobs = args.jobs if args.jobs is not None else min(len(available_cores()), 8)
        with LoadMonitor(plan.runs_dir / "league_load.json"):
            failed = run_all(jobs(plan, cfg, rows), n_jobs=n_jobs, script=__file__, argv=argv, tag="league")

    summaries, runs, offsets, target, missing = summarize_all(plan, cfg, rows, args.target)
    figures = write_figures(args.figures_dir or args.out.parent / "figures", rows, runs, offsets, plan.budget)
    command = " ".join(["python", "scripts/league.py", *argv])
    write_report(args.out, plan, cfg, rows, summaries, runs, offsets, target, figures, command, missing)
    print(markdown_table(rows, summaries, TABLE_COLUMNS, first="objective"))
    print(f"\n[league] wrote {args.out} and {len(figures)} figure(s)", flush=True)
    return finish("league", failed, missing)


if __name__ == "__main__":
    sys.exit(main())
