"""The DAPO ablation ladder in miniature, one command.

    python scripts/ablate.py [CONFIG] [--seeds 3] [--steps N] [--quick] [--rows grpo,dapo] [--jobs 2]
                             [--out docs/ablation.md] [--runs-dir runs/ablate] [--target ACC]

CONFIG (a recipe's name or a YAML file; default the main job, cot_dapo) is a DAPO run. Every row of
the ladder is that run with objective overrides only; each row x seed is one
`dapo_jax.training.loop.train` run in RUNS_DIR/ROW/seedS, `--jobs` of them at a time (each in its own
process, on one core, with one XLA thread; `--jobs 1`: one after another in this process):

    naive GRPO          clip 0.2/0.2, seq_mean_token_mean, no dynamic sampling, no overlong shaping
    + clip-higher       eps_high from CONFIG (0.28)
    + overlong shaping  CONFIG's soft overlong punishment / overlong filtering
    + token-level loss  token_mean
    + dynamic sampling  = full DAPO
    DAPO - X            full DAPO without one of the four (DAPO - dynamic sampling is the 4th row)

Row keys (--rows, run folders): grpo, clip, overlong, token, dapo, dapo-clip, dapo-overlong,
dapo-token. `--set KEY=VALUE` adds a non-objective override to every row (e.g. data.eval_size).

Every row gets the same model, data, lr, G, batch, steps, seed(s), evaluation and KL 0; the
generation batch is the training batch for all rows, so a row without dynamic sampling trains on
everything it generates, and rows with it refill in as many rounds as CONFIG's generation budget
allows (`gen_batch * max_gen_batches` prompts per step).

Compiled programs are cached in RUNS_DIR/.jax_cache and shared by the rows (most of a short run's
time is compilation otherwise). A rerun of the same command skips finished runs and resumes unfinished ones from their newest
checkpoint (a 90-minute ladder is restartable). It then writes a markdown report (mean ± sd over
seeds; command, machine, date) to --out and figures in the spirit of DAPO's Figures 2-6 to
docs/figures/ablation_*.png (beside --out). `--quick`: one seed and a tenth of CONFIG's steps
(at least 10), evaluated 4 times, in runs/ablate_quick.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import math
import os
import platform
import queue
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
DONE_FILE = "ablate.json"  # per run dir: {"steps": completed steps, "wall_s": [seconds per session]}

# ----------------------------------------------------------------------------- the rows
# The four techniques of DAPO's Table 1, as the objective fields each one sets.
TECHNIQUES = ("clip_higher", "overlong", "token_loss", "dynamic_sampling")
TECHNIQUE_LABELS = {"clip_higher": "clip-higher", "overlong": "overlong shaping",
                    "token_loss": "token-level loss", "dynamic_sampling": "dynamic sampling"}
TECHNIQUE_KEYS = {"clip_higher": "clip", "overlong": "overlong", "token_loss": "token", "dynamic_sampling": "dynsamp"}


@dataclasses.dataclass(frozen=True)
class Row:
    key: str  # its run folder and --rows name
    label: str
    techniques: frozenset[str]  # which of TECHNIQUES are on
    objective: dict  # objective field -> value, applied on CONFIG's objective


def technique_settings(base) -> dict[str, tuple[dict, dict]]:
    """technique -> (objective fields when on, when off), the "on" values taken from CONFIG's
    resolved objective `base` (an `ObjectiveConfig`)."""
    eps_high = base.eps_high if base.eps_high > base.eps_low else 0.28
    return {
        "clip_higher": ({"eps_low": base.eps_low, "eps_high": eps_high},
                        {"eps_low": base.eps_low, "eps_high": base.eps_low}),
        "overlong": ({"overlong_filtering": base.overlong_filtering, "overlong_buffer": base.overlong_buffer,
                      "overlong_penalty_factor": base.overlong_penalty_factor},
                     {"overlong_filtering": False, "overlong_buffer": None,
                      "overlong_penalty_factor": base.overlong_penalty_factor}),
        "token_loss": ({"loss_agg": "token_mean"}, {"loss_agg": "seq_mean_token_mean"}),
        "dynamic_sampling": ({"dynamic_sampling": True}, {"dynamic_sampling": False}),
    }


def define_rows(base) -> tuple[list[Row], list[tuple[Row, Row]]]:
    """The cumulative ladder, then full DAPO minus each technique, and the (dropped, same as) pairs:
    a row whose objective equals an earlier row's is not run twice (DAPO - dynamic sampling is the
    ladder's 4th row; without overlong shaping in CONFIG the overlong rows equal their neighbours)."""
    settings = technique_settings(base)

    def make(key, label, on):
        objective = {}
        for t in TECHNIQUES:
            objective.update(settings[t][0 if t in on else 1])
        return Row(key, label, frozenset(on), objective)

    rows = [make("grpo", "naive GRPO", [])]
    for i, t in enumerate(TECHNIQUES):
        full = t == "dynamic_sampling"
        rows.append(make("dapo" if full else TECHNIQUE_KEYS[t],
                         "DAPO (+ dynamic sampling)" if full else f"+ {TECHNIQUE_LABELS[t]}", TECHNIQUES[:i + 1]))
    for t in TECHNIQUES:
        rows.append(make(f"dapo-{TECHNIQUE_KEYS[t]}", f"DAPO − {TECHNIQUE_LABELS[t]}", [u for u in TECHNIQUES if u != t]))
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


def yaml_value(v) -> str:
    """`v` as the override parser (`yaml.safe_load`) reads it back: 1e-05 -> '1.0e-05', None -> 'null'."""
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


def run_overrides(plan: Plan, row: Row, seed: int) -> list[str]:
    objective = [f"objective.{k}={yaml_value(v)}" for k, v in row.objective.items()]
    return [*plan.common, *objective, f"train.seed={seed}", f"train.run_dir={run_dir(plan, row, seed)}"]


# ----------------------------------------------------------------------------- running
def _done(path: Path) -> dict:
    f = path / DONE_FILE
    return json.loads(f.read_text()) if f.exists() else {"steps": 0, "wall_s": []}


def _record(path: Path, **changes) -> None:
    state = {**_done(path), **changes}
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / (DONE_FILE + ".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path / DONE_FILE)


def run_one(plan: Plan, row: Row, seed: int, name: str) -> str | None:
    """Trains one row x seed in this process (resuming its checkpoint); returns its error, if any."""
    from dapo_jax.training.config import load_config
    from dapo_jax.training.guards import Preempted
    from dapo_jax.training.loop import train

    path = run_dir(plan, row, seed)
    print(f"[ablate] {name}: training {plan.steps} steps in {path}", flush=True)
    t0 = time.perf_counter()
    try:
        final = train(load_config(plan.config, run_overrides(plan, row, seed)))
    except BaseException as e:
        _record(path, wall_s=[*_done(path)["wall_s"], time.perf_counter() - t0])
        # Ctrl-C or SIGTERM: stop here (the run's checkpoint lets a rerun resume); any other
        # error fails this run only
        if isinstance(e, Preempted) or not isinstance(e, Exception):
            raise
        traceback.print_exc()
        print(f"[ablate] {name}: FAILED ({type(e).__name__}: {e})", flush=True)
        return f"{type(e).__name__}: {e}"
    wall = time.perf_counter() - t0
    _record(path, steps=plan.steps, wall_s=[*_done(path)["wall_s"], wall])
    acc = final.get("eval/accuracy")
    print(f"[ablate] {name}: done in {wall:.1f} s" + (f", held-out accuracy {acc:.3f}" if acc is not None else ""),
          flush=True)
    return None


# One XLA thread per job: on 2 cores, two single-threaded runs side by side do 1.6x the steps of one
# run using both cores (measured on the chain-of-thought task: 2.6 s/step each against 2.05 s/step).
SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def say(line: str) -> None:
    """One whole line to stdout (the --jobs threads' lines must not interleave)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _run_child(argv: list[str], row: Row, seed: int, plan: Plan, name: str, cores: queue.Queue) -> str | None:
    """Runs `row` x `seed` in a child process of this script pinned to one free core."""
    core = cores.get()
    path = run_dir(plan, row, seed)
    path.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + SINGLE_THREAD_XLA).strip()}
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--jobs", "1", "--only", f"{row.key}/{seed}",
           "--name", name]
    try:
        with open(path / "ablate.log", "a") as log:
            say(f"[ablate] {name}: training {plan.steps} steps on core {core}, log in {path / 'ablate.log'}")
            pin = (lambda: os.sched_setaffinity(0, {core})) if hasattr(os, "sched_setaffinity") else None
            rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin).returncode
    finally:
        cores.put(core)
    done = _done(path)
    if rc != 0 or done["steps"] < plan.steps:
        say(f"[ablate] {name}: FAILED (exit {rc}; see {path / 'ablate.log'})")
        return f"exit {rc}, see {path / 'ablate.log'}"
    say(f"[ablate] {name}: done in {done['wall_s'][-1]:.1f} s")
    return None


def available_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def run_all(plan: Plan, rows: list[Row], *, jobs: int = 1, argv: list[str] | None = None) -> list[str]:
    """Trains every unfinished row x seed; returns the runs that failed (as 'row/seedS: error').

    jobs == 1: one after another in this process. jobs > 1: that many child processes at a time,
    each one XLA thread pinned to its own core (`argv`: this script's arguments, for the children)."""
    todo = [(row, seed) for row in rows for seed in plan.seeds]
    named = []
    for i, (row, seed) in enumerate(todo, 1):
        name = f"({i}/{len(todo)}) {row.label}, seed {seed}"
        if _done(run_dir(plan, row, seed))["steps"] >= plan.steps:
            print(f"[ablate] {name}: finished earlier, skipped", flush=True)
        else:
            named.append((row, seed, name))
    if jobs <= 1:
        errors = [(row, seed, run_one(plan, row, seed, name)) for row, seed, name in named]
    else:
        cores = queue.Queue()
        for c in (available_cores() * jobs)[:jobs]:
            cores.put(c)
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            futures = [(row, seed, pool.submit(_run_child, argv or [], row, seed, plan, name, cores))
                       for row, seed, name in named]
            errors = [(row, seed, f.result()) for row, seed, f in futures]
    return [f"{row.key}/seed{seed}: {e}" for row, seed, e in errors if e]


# ----------------------------------------------------------------------------- reading runs
def read_run(path: Path, steps: int | None = None) -> dict:
    """A run's metrics rows (step <= steps), its G and its recorded wall time."""
    from dapo_jax.training.metrics import read_metrics

    rows = read_metrics(path) if (path / "metrics.jsonl").exists() else []
    if steps is not None:
        rows = [r for r in rows if r["step"] <= steps]
    config = path / "config.yaml"
    g = yaml.safe_load(config.read_text())["rollout"]["G"] if config.exists() else None
    wall = _done(path)["wall_s"]
    return {"rows": rows, "G": g, "wall_s": float(sum(wall)) if wall else None}


def series(rows: list[dict], key: str, *, x: str = "step", G: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(x, values) of `key` over the rows that have it. x = "step" or "samples" (responses generated
    up to and including that step: Σ generated_groups · G)."""
    xs, ys, samples = [], [], 0.0
    for r in rows:
        if x == "samples" and r.get("generated_groups") is not None:
            samples += r["generated_groups"] * G
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(r["step"] if x == "step" else samples)
            ys.append(float(v))
    return np.asarray(xs, float), np.asarray(ys, float)


def _window(n: int) -> int:
    return max(1, n // 10)


def _smooth(y: np.ndarray, w: int) -> np.ndarray:
    """Trailing moving average (the first w-1 points average what exists so far)."""
    if w <= 1 or len(y) == 0:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    idx = np.arange(1, len(y) + 1)
    lo = np.maximum(idx - w, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def summarize_run(run: dict, target: float | None) -> dict:
    """One run's table entries. "end" = mean over the last 10% of steps; "min" = minimum of the
    10%-window moving average; "over training" = over every step."""
    rows, G = run["rows"], run["G"]
    steps, acc = series(rows, "eval/accuracy")
    out: dict = {"wall_s": run["wall_s"]}
    if len(acc):
        out.update(start_acc=acc[0], final_acc=acc[-1], best_acc=acc.max())
        pass_key = next((k for r in reversed(rows) for k in r if k.startswith("eval/pass@")), None)
        if pass_key:
            out["final_pass"] = series(rows, pass_key)[1][-1]
        if target is not None:
            hit = np.flatnonzero(acc >= target)
            out["steps_to_target"] = steps[hit[0]] if len(hit) else None
            if len(hit) and G:
                samples, _ = series(rows, "eval/accuracy", x="samples", G=G)
                out["samples_to_target"] = samples[hit[0]]
            elif not len(hit):
                out["samples_to_target"] = None
    for name, key in (("ent_gen", "entropy_generated"), ("ent_upd", "entropy")):
        _, y = series(rows, key)
        if len(y):
            w = _window(len(y))
            out[f"{name}_end"], out[f"{name}_min"] = y[-w:].mean(), _smooth(y, w).min()
    for name, key in (("len_mean", "response_length_mean"), ("len_spread", "response_length_std"),
                      ("trunc", "truncated_fraction"), ("clip_low", "clip_frac_low"),
                      ("clip_high", "clip_frac_high"), ("zero_adv", "zero_adv_fraction"),
                      ("gen_rounds", "gen_rounds")):
        _, y = series(rows, key)
        if len(y):
            out[name] = y.mean()
            if name == "len_mean":
                out["len_sd_steps"] = y.std()
            if name == "trunc":
                out["trunc_end"] = y[-_window(len(y)):].mean()
    # groups with no correctness spread (all right or all wrong) whose shaped rewards still differ:
    # their only signal is the soft overlong penalty, i.e. "be shorter"
    _, same = series(rows, "all_correct_fraction")
    _, wrong = series(rows, "all_wrong_fraction")
    _, zero = series(rows, "zero_adv_fraction")
    if len(same) and len(same) == len(wrong) == len(zero):
        out["length_only"] = float(np.mean(same + wrong - zero))
    if G:
        _, gen = series(rows, "generated_groups")
        if len(gen):
            out["samples"] = gen.sum() * G
    return out


# ----------------------------------------------------------------------------- aggregating
def mean_sd(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample sd (ddof 1; None for a single value)."""
    v = np.asarray(values, float)
    return float(v.mean()), (float(v.std(ddof=1)) if len(v) > 1 else None)


def fmt_cell(values: list, digits: int = 3) -> str:
    """'mean ± sd' over the seeds that have a value; None entries are runs that never got there
    ('not reached' when none did, else the mean over those that did and 'k/n')."""
    present = [v for v in values if v is not None]
    if not values:
        return "–"
    if not present:
        return "not reached"
    m, sd = mean_sd(present)
    big = abs(m) >= 1000
    f = (lambda x: f"{x:,.0f}") if big else (lambda x: f"{x:.{digits}f}")
    cell = f(m) if sd is None else f"{f(m)} ± {f(sd)}"
    return cell if len(present) == len(values) else f"{cell} ({len(present)}/{len(values)})"


def column(summaries: list[dict], key: str) -> list:
    """The key's value in each run's summary that has the metric at all (None = not reached)."""
    return [s[key] for s in summaries if key in s]


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


def markdown_table(rows: list[Row], summaries: dict[str, list[dict]], columns) -> str:
    lines = ["| row | " + " | ".join(h for h, _, _ in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for row in rows:
        runs = summaries.get(row.key, [])
        cells = [fmt_cell(column(runs, key), digits) if runs else "no runs" for _, key, digits in columns]
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def default_target(summaries: dict[str, list[dict]]) -> float | None:
    starts = [s["start_acc"] for runs in summaries.values() for s in runs if "start_acc" in s]
    return round(float(np.mean(starts)) + 0.2, 3) if starts else None


def summarize_all(plan: Plan, rows: list[Row], target: float | None) -> tuple[dict, dict, float | None, list[str]]:
    """Row key -> per-seed summaries, row key -> per-seed runs, the target used, and the runs left
    out because they have not finished `plan.steps` steps."""
    runs, missing = {}, []
    for row in rows:
        runs[row.key] = []
        for seed in plan.seeds:
            path = run_dir(plan, row, seed)
            if _done(path)["steps"] < plan.steps:
                missing.append(f"{row.key}/seed{seed}")
                continue
            runs[row.key].append(read_run(path, plan.steps))
    if target is None:
        target = default_target({k: [summarize_run(r, None) for r in v] for k, v in runs.items()})
    return {k: [summarize_run(r, target) for r in v] for k, v in runs.items()}, runs, target, missing


# ----------------------------------------------------------------------------- figures
# figure -> (title, rows compared, [(panel title, y label, metric, x)])
FIGURES = {
    "ablation_clip_higher": ("Clip-higher (DAPO Fig. 2)", ["grpo", "clip", "dapo-clip", "dapo"], [
        ("Entropy of all generated responses", "nats / token", "entropy_generated", "step"),
        ("Held-out accuracy", "avg@k", "eval/accuracy", "step")]),
    "ablation_token_loss": ("Sequence-mean vs token-mean loss (DAPO Fig. 4)", ["overlong", "token", "dapo-token", "dapo"], [
        ("Response length, mean", "tokens", "response_length_mean", "step"),
        ("Response length, sd within a step", "tokens", "response_length_std", "step")]),
    "ablation_dynamic_sampling": ("Dynamic sampling (DAPO Fig. 6)", ["token", "dapo"], [
        ("Held-out accuracy vs steps", "avg@k", "eval/accuracy", "step"),
        ("Held-out accuracy vs generated samples", "avg@k", "eval/accuracy", "samples")]),
    "ablation_overlong": ("Overlong shaping (DAPO Fig. 5)", ["clip", "overlong", "dapo-overlong", "dapo"], [
        ("Truncated responses", "fraction of generated", "truncated_fraction", "step"),
        ("Held-out accuracy", "avg@k", "eval/accuracy", "step")]),
}


def write_figures(out_dir: Path, rows: list[Row], runs: dict[str, list[dict]], steps: int) -> list[Path]:
    """One PNG per FIGURES entry that has data; per-step metrics smoothed over 5% of the steps."""
    from dapo_jax.plot import Panel, plot_panels

    by_key = {row.key: row for row in rows}
    w = max(1, steps // 20)
    # one colour per row in every figure; DAPO-minus rows dashed
    order = ["grpo", "clip", "overlong", "token", "dapo", *(f"dapo-{k}" for k in TECHNIQUE_KEYS.values())]
    styles = {row.label: {"color": f"C{order.index(row.key) % 10}",
                          "linestyle": "--" if row.key.startswith("dapo-") else "-"} for row in rows}
    written = []
    for name, (title, keys, panel_specs) in FIGURES.items():
        panels = []
        for ptitle, ylabel, metric, x in panel_specs:
            data = {}
            for key in keys:
                if key not in by_key or not runs.get(key):
                    continue
                curves = []
                for run in runs[key]:
                    xs, ys = series(run["rows"], metric, x=x, G=run["G"])
                    curves.append((xs, ys if metric.startswith("eval/") else _smooth(ys, w)))
                data[by_key[key].label] = [c for c in curves if len(c[0])]
            xlabel = "training step" if x == "step" else "generated responses"
            panels.append(Panel(ptitle, xlabel, ylabel, data))
        path = plot_panels(out_dir / f"{name}.png", panels, suptitle=title, styles=styles)
        if path is not None:
            written.append(path)
    return written


# ----------------------------------------------------------------------------- the report
def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    import jax

    devices = ", ".join(sorted({d.device_kind for d in jax.devices()}))
    return f"{model}, {os.cpu_count()} cores; jax {jax.__version__} on {devices}"


def _fields(fields: dict) -> str:
    return ", ".join(f"`{k}={yaml_value(v)}`" for k, v in fields.items())


def row_definitions(rows: list[Row], settings: dict[str, tuple[dict, dict]],
                    dropped: list[tuple[Row, Row]] = ()) -> str:
    """The objective fields of each technique on / off, then which are on in each row."""
    lines = ["| technique | on | off |", "|---|---|---|"]
    lines += [f"| {TECHNIQUE_LABELS[t]} | {_fields(settings[t][0])} | {_fields(settings[t][1])} |" for t in TECHNIQUES]
    lines += ["", "| row | run folder | " + " | ".join(TECHNIQUE_LABELS[t] for t in TECHNIQUES) + " |",
              "|---|---|" + "---|" * len(TECHNIQUES)]
    for row in rows:
        on = " | ".join("on" if t in row.techniques else "off" for t in TECHNIQUES)
        lines.append(f"| {row.label} | `{row.key}` | {on} |")
    if dropped:
        lines += ["", "Not run twice: " + "; ".join(f"{d.label} = {same.label}" for d, same in dropped) + "."]
    return "\n".join(lines)


def write_report(out: Path, plan: Plan, rows: list[Row], dropped: list, settings: dict, summaries: dict,
                 target: float | None, figures: list[Path], command: str, missing: list[str]) -> str:
    n_seeds = len(plan.seeds)
    figs = "\n".join(f"![{p.stem}]({os.path.relpath(p, out.parent)})" for p in figures)
    text = f"""# The DAPO ablation ladder in miniature

Generated by `scripts/ablate.py`; the tables and figures are rewritten by every run of it.

- Command: `{command}`
- Config: `{plan.config}`, {plan.steps} steps, evaluation every {plan.eval_every} steps,
  {n_seeds} seed(s) ({", ".join(map(str, plan.seeds))}: `train.seed`), runs in `{plan.runs_dir}/ROW/seedS`
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

Training dynamics. H gen. = entropy of the sampling distribution over ALL generated responses
(`entropy_generated`), H update = over the tokens the update trains on (`entropy`); "end" = mean over
the last 10% of steps, "min" = the minimum of their 10%-of-steps moving average. Length: response
tokens of the generated responses (mean over steps, sd of the per-step mean over steps, mean of the
within-step sd). Truncated, clip low/high (fraction of update tokens clipped, `clip_frac_low/high`),
zero-adv. groups (generated groups whose rewards are all equal) and gen. rounds: means over steps.

{markdown_table(rows, summaries, DYNAMICS_COLUMNS)}

Each technique's effect, row pair by row pair (the ladder's step and full DAPO without it): the
difference of the seed means against the seed spread (the larger sample sd of the two rows).

{effects_table(rows, summaries)}

## Figures

Mean curve and ±1 sd band over seeds; per-step metrics smoothed by a moving average over 5% of the steps.

{figs}

## Findings

> **Placeholder, to be written by the lead after the full run.** Nothing in this section has been
> measured yet; the tables above are what a run of the command produced.
"""
    # the Findings are written by hand: a rerun (e.g. --report-only) rewrites the rest and keeps them
    previous = out.read_text() if out.exists() else ""
    if "\n## Findings\n" in previous and "**Placeholder" not in previous.split("\n## Findings\n", 1)[1]:
        text = text.split("## Findings\n", 1)[0] + "## Findings\n" + previous.split("\n## Findings\n", 1)[1]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


# Per technique, the metrics DAPO's paper says it moves (and held-out accuracy for all).
EFFECT_METRICS = {
    "clip_higher": ("ent_gen_end", "ent_gen_min", "final_pass", "final_acc"),
    "overlong": ("trunc", "trunc_end", "final_acc"),
    "token_loss": ("len_sd_steps", "len_spread", "ent_gen_end", "final_acc"),
    "dynamic_sampling": ("final_acc", "best_acc", "final_pass"),
}
METRIC_NAMES = {key: name for name, key, _ in OUTCOME_COLUMNS + DYNAMICS_COLUMNS}


def effect_pairs(rows: list[Row], technique: str) -> list[tuple[Row, Row]]:
    """Every (with, without) pair of rows that differ in `technique` alone."""
    return [(a, b) for a in rows for b in rows if a.techniques == b.techniques | {technique}
            and technique not in b.techniques]


def effects_table(rows: list[Row], summaries: dict[str, list[dict]]) -> str:
    """Each technique's effect: Δ = mean(with) − mean(without) over seeds, against the seed spread
    (the larger of the two rows' sample sds); "yes" when |Δ| exceeds it."""
    lines = ["| technique | with → without | metric | with | without | Δ | seed sd | \\|Δ\\| > sd |",
             "|---|---|---|---|---|---|---|---|"]
    for t in TECHNIQUES:
        for a, b in effect_pairs(rows, t):
            for key in EFFECT_METRICS[t]:
                va = [v for v in column(summaries.get(a.key, []), key) if v is not None]
                vb = [v for v in column(summaries.get(b.key, []), key) if v is not None]
                if not va or not vb:
                    continue
                (ma, sa), (mb, sb) = mean_sd(va), mean_sd(vb)
                sd = max(x for x in (sa, sb, 0.0) if x is not None)
                big = "yes" if len(va) > 1 and len(vb) > 1 and abs(ma - mb) > sd else "no"
                lines.append(f"| {TECHNIQUE_LABELS[t]} | `{a.key}` → `{b.key}` | {METRIC_NAMES.get(key, key)} | "
                             f"{ma:.4f} | {mb:.4f} | {ma - mb:+.4f} | {sd:.4f} | {big} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main
def default_config() -> Path:
    from dapo_jax.training.config import CONFIG_DIR

    return CONFIG_DIR / "cot_dapo.yaml"


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
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "ablation.md", help="the report (default: docs/ablation.md)")
    ap.add_argument("--figures-dir", type=Path, default=None, help="default: figures/ beside --out")
    ap.add_argument("--runs-dir", type=Path, default=None, help="default: runs/ablate (runs/ablate_quick with --quick)")
    ap.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every row (repeatable), e.g. --set data.eval_size=200")
    ap.add_argument("--no-compile-cache", action="store_true",
                    help="do not cache compiled programs in RUNS_DIR/.jax_cache (a process-wide JAX setting)")
    ap.add_argument("--jobs", type=int, default=min(len(available_cores()), 8),
                    help="runs trained at once, each in its own process on one core with one XLA thread "
                    "(default: the cores available, at most 8; 1: one after another in this process)")
    ap.add_argument("--only", default=None, help=argparse.SUPPRESS)  # ROW/SEED: a --jobs child's one run
    ap.add_argument("--name", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--report-only", action="store_true", help="train nothing: tables and figures from the runs there")
    args = ap.parse_args(argv)
    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from dapo_jax.training.config import find_config, load_config

    config = find_config(args.config) if args.config else default_config()  # a recipe's name or a file
    cfg = load_config(config, args.extra)
    steps = args.steps or (max(10, cfg.train.steps // 10) if args.quick else cfg.train.steps)
    seeds = 1 if args.quick else args.seeds
    runs_dir = args.runs_dir or REPO / "runs" / ("ablate_quick" if args.quick else "ablate")
    eval_every = args.eval_every or max(1, steps // (4 if args.quick else 10))
    plan = make_plan(config, cfg, steps=steps, eval_every=eval_every, seeds=seeds,
                     runs_dir=runs_dir, extra=tuple(args.extra))
    settings = technique_settings(cfg.objective_config)
    rows, dropped = define_rows(cfg.objective_config)
    for row, same in dropped:
        print(f"[ablate] {row.label} is the same run as {same.label} ({same.key}): not run twice", flush=True)
    if args.rows:
        wanted = [k.strip() for k in args.rows.split(",") if k.strip()]
        unknown = sorted(set(wanted) - {r.key for r in rows})
        if unknown:
            print(f"unknown row(s) {unknown}; rows: {[r.key for r in rows]}", file=sys.stderr)
            return 2
        rows = [r for r in rows if r.key in wanted]
    for row in rows:  # every row's config must validate before hours of training start
        load_config(config, run_overrides(plan, row, plan.seeds[0]))
    print(f"[ablate] {config}: {len(rows)} rows x {len(plan.seeds)} seed(s), {steps} steps each, "
          f"eval every {plan.eval_every}, runs in {runs_dir}", flush=True)
    if not args.no_compile_cache:
        # Rows share most programs (the samplers, and the update wherever the objective's static
        # fields agree): XLA's persistent cache compiles each once for the whole ladder.
        import jax

        jax.config.update("jax_compilation_cache_dir", str(runs_dir / ".jax_cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    if args.only:  # a --jobs child: train one run, the parent writes the report
        key, _, seed = args.only.partition("/")
        row = next(r for r in rows if r.key == key)
        return 1 if run_one(plan, row, int(seed), args.name or args.only) else 0
    argv = list(argv if argv is not None else sys.argv[1:])
    failed = [] if args.report_only else run_all(plan, rows, jobs=args.jobs, argv=argv)

    summaries, runs, target, missing = summarize_all(plan, rows, args.target)
    figures = write_figures(args.figures_dir or args.out.parent / "figures", rows, runs, steps)
    command = " ".join(["python", "scripts/ablate.py", *argv])
    write_report(args.out, plan, rows, dropped, settings, summaries, target, figures, command, missing)
    print(f"\ntarget held-out accuracy: {target}\n")
    print(markdown_table(rows, summaries, OUTCOME_COLUMNS))
    print()
    print(markdown_table(rows, summaries, DYNAMICS_COLUMNS))
    print(f"\n[ablate] wrote {args.out} and {len(figures)} figure(s)", flush=True)
    for line in failed:
        print(f"[ablate] FAILED {line}", file=sys.stderr)
    if missing:
        print(f"[ablate] left out of the tables (unfinished or failed): {', '.join(missing)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
