"""What the multi-seed experiment scripts share (`ablate.py`, `league.py`): restartable runs, one
process per run pinned to a core, and the reading of their metrics into mean ± sd tables.

    job = Job(key="dapo", seed=0, label="DAPO", path=RUNS/dapo/seed0, config=CONFIG, overrides=(...))
    failed = run_all(jobs, jobs=2, script=__file__, argv=sys.argv[1:])   # skips finished runs
    run = read_run(job.path)                                             # metrics rows, G, wall time
    summary = summarize_run(run, target=0.4)                             # one run's table entries

A run is one `dapo_jax.training.loop.train` call in its own run folder; RUN/experiment.json records
that it finished (`finished`, its last step) and the wall time of every session, so a rerun of the
same command skips finished runs and resumes the others from their newest checkpoint.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
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

from dapo_jax.startup import quiet_libtpu

quiet_libtpu()  # as every CLI command: no libtpu start-up errors in a run's log on a host without a TPU

DONE_FILE = "experiment.json"  # per run dir: {"steps": last step, "finished": bool, "wall_s": [seconds per session]}
LEGACY_DONE_FILE = "ablate.json"  # what ablate.py wrote before this module (the same fields but `finished`)
REPO = Path(__file__).resolve().parents[1]
LOG_FILE = "experiment.log"  # per run dir: the output of the child process that trained it


@dataclasses.dataclass(frozen=True)
class Job:
    key: str  # the row: its run folder and --rows name
    seed: int
    label: str  # the row's name in messages and tables
    path: Path  # the run folder (train.run_dir)
    config: Path
    overrides: tuple[str, ...]  # train.run_dir and train.seed included
    steps: int  # train.steps: a run that stops earlier (train.max_samples) is finished too


def yaml_value(v) -> str:
    """`v` as the override parser (`yaml.safe_load`) reads it back: 1e-05 -> '1.0e-05', None -> 'null'."""
    return yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()


# ----------------------------------------------------------------------------- bookkeeping
def done(path: Path) -> dict:
    f = Path(path) / DONE_FILE
    if not f.exists():
        f = Path(path) / LEGACY_DONE_FILE
    state = json.loads(f.read_text()) if f.exists() else {}
    return {"steps": 0, "finished": False, "wall_s": [], **state}


def record(path: Path, **changes) -> None:
    state = {**done(path), **changes}
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / (DONE_FILE + ".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path / DONE_FILE)


def is_finished(job: Job) -> bool:
    """The run returned from `train` (or, recorded before `finished` existed, reached its steps)."""
    state = done(job.path)
    return bool(state["finished"]) or state["steps"] >= job.steps


def say(line: str) -> None:
    """One whole line to stdout (the --jobs threads' lines must not interleave)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run_one(job: Job, name: str, tag: str = "run") -> str | None:
    """Trains one job in this process (resuming its checkpoint); returns its error, if any."""
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.state.guards import Preempted
    from dapo_jax.training.loop import train

    say(f"[{tag}] {name}: training {job.steps} steps in {job.path}")
    t0 = time.perf_counter()
    try:
        final = train(load_config(job.config, list(job.overrides)))
    except BaseException as e:
        record(job.path, wall_s=[*done(job.path)["wall_s"], time.perf_counter() - t0])
        # Ctrl-C or SIGTERM: stop here (the run's checkpoint lets a rerun resume); any other
        # error fails this run only
        if isinstance(e, Preempted) or not isinstance(e, Exception):
            raise
        traceback.print_exc()
        say(f"[{tag}] {name}: FAILED ({type(e).__name__}: {e})")
        return f"{type(e).__name__}: {e}"
    wall = time.perf_counter() - t0
    record(job.path, steps=int(final.get("step", job.steps)), finished=True, wall_s=[*done(job.path)["wall_s"], wall])
    acc = final.get("eval/accuracy")
    say(f"[{tag}] {name}: done in {wall:.1f} s" + (f", held-out accuracy {acc:.3f}" if acc is not None else ""))
    return None


# One XLA thread per job: on 2 cores, two single-threaded runs side by side do 1.6x the steps of one
# run using both cores (measured on the chain-of-thought task: 2.6 s/step each against 2.05 s/step).
SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def available_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def run_pinned(cmd: list[str], log_path: Path, cores: queue.Queue, *, announce: str = "", nice: int = 0,
               cwd: Path | None = None) -> int:
    """Runs `cmd` in a child process pinned to a free core of `cores` with one XLA thread (the repository on its
    PYTHONPATH, at `nice`), its output appended to `log_path`; `announce` (with `{core}`) is said as it starts.
    Returns the child's exit code. The one way the experiment scripts start a run on a core of their own."""
    core = cores.get()
    env = {**os.environ, "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " " + SINGLE_THREAD_XLA).strip(),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

    def child():
        if nice:
            os.nice(nice)
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {core})

    try:
        with open(log_path, "a") as log:
            if announce:
                say(announce.format(core=core))
            return subprocess.run(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                  preexec_fn=child).returncode
    finally:
        cores.put(core)


def _run_child(script: str, argv: list[str], job: Job, name: str, cores: queue.Queue, tag: str) -> str | None:
    """Runs `job` in a child process of `script` (`--only KEY/SEED`) pinned to one free core."""
    job.path.mkdir(parents=True, exist_ok=True)
    log_path = job.path / LOG_FILE
    cmd = [sys.executable, str(Path(script).resolve()), *argv, "--jobs", "1", "--only", f"{job.key}/{job.seed}",
           "--name", name]
    rc = run_pinned(cmd, log_path, cores, announce=f"[{tag}] {name}: training on core {{core}}, log in {log_path}")
    if rc != 0 or not is_finished(job):
        say(f"[{tag}] {name}: FAILED (exit {rc}; see {log_path})")
        return f"exit {rc}, see {log_path}"
    say(f"[{tag}] {name}: done in {done(job.path)['wall_s'][-1]:.1f} s")
    return None


def finish(tag: str, failed: list[str], missing: list[str]) -> int:
    """The script's exit code after its report: each failed run and each run left out of the tables on
    standard error, 1 when a run failed."""
    for line in failed:
        print(f"[{tag}] FAILED {line}", file=sys.stderr)
    if missing:
        print(f"[{tag}] left out of the tables (unfinished or failed): {', '.join(missing)}", file=sys.stderr)
    return 1 if failed else 0


def run_all(jobs: list[Job], *, n_jobs: int = 1, script: str = "", argv: list[str] | None = None,
            tag: str = "run") -> list[str]:
    """Trains every unfinished job; returns the runs that failed (as 'key/seedS: error').

    n_jobs == 1: one after another in this process. n_jobs > 1: that many child processes of `script`
    at a time (its `argv` plus `--jobs 1 --only KEY/SEED`), each one XLA thread pinned to its own core."""
    named = []
    for i, job in enumerate(jobs, 1):
        name = f"({i}/{len(jobs)}) {job.label}, seed {job.seed}"
        if is_finished(job):
            say(f"[{tag}] {name}: finished earlier, skipped")
        else:
            named.append((job, name))
    if n_jobs <= 1:
        errors = [(job, run_one(job, name, tag)) for job, name in named]
    else:
        cores = queue.Queue()
        for c in (available_cores() * n_jobs)[:n_jobs]:
            cores.put(c)
        with concurrent.futures.ThreadPoolExecutor(n_jobs) as pool:
            futures = [(job, pool.submit(_run_child, script, argv or [], job, name, cores, tag)) for job, name in named]
            errors = [(job, f.result()) for job, f in futures]
    return [f"{job.key}/seed{job.seed}: {e}" for job, e in errors if e]


def use_compile_cache(runs_dir: Path) -> None:
    """Rows share most programs (the samplers, and the update wherever the objective's static fields
    agree): XLA's persistent cache in RUNS_DIR/.jax_cache compiles each once for the whole experiment."""
    import jax

    jax.config.update("jax_compilation_cache_dir", str(runs_dir / ".jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


# ----------------------------------------------------------------------------- reading runs
def read_run(path: Path, steps: int | None = None) -> dict:
    """A run's metrics rows (step <= steps), its G and its recorded wall time."""
    from dapo_jax.training.metrics import read_metrics

    archived = (path / "metrics.jsonl").exists() or (path / "metrics.jsonl.gz").exists()
    rows = read_metrics(path) if archived else []
    if steps is not None:
        rows = [r for r in rows if r["step"] <= steps]
    config = path / "config.yaml"
    g = yaml.safe_load(config.read_text())["rollout"]["G"] if config.exists() else None
    wall = done(path)["wall_s"]
    return {"rows": rows, "G": g, "wall_s": float(sum(wall)) if wall else None}


def series(rows: list[dict], key: str, *, x: str = "step", G: int | None = None,
           offset: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(x, values) of `key` over the rows that have it. x = "step" or "samples" (responses generated
    up to and including that step: `offset` + Σ generated_groups · G)."""
    xs, ys, samples = [], [], float(offset)
    for r in rows:
        if x == "samples" and r.get("generated_groups") is not None:
            samples += r["generated_groups"] * G
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(r["step"] if x == "step" else samples)
            ys.append(float(v))
    return np.asarray(xs, float), np.asarray(ys, float)


def window(n: int) -> int:
    return max(1, n // 10)


def smooth(y: np.ndarray, w: int) -> np.ndarray:
    """Trailing moving average (the first w-1 points average what exists so far)."""
    if w <= 1 or len(y) == 0:
        return y
    c = np.cumsum(np.insert(y, 0, 0.0))
    idx = np.arange(1, len(y) + 1)
    lo = np.maximum(idx - w, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def _last_eval(rows: list[dict], prefix: str):
    key = next((k for r in reversed(rows) for k in r if k.startswith(prefix)), None)
    return series(rows, key)[1][-1] if key else None


def summarize_run(run: dict, target: float | None, *, offset: float = 0.0) -> dict:
    """One run's table entries. "end" = mean over the last 10% of steps, "start" over the first 10%;
    "min" = minimum of the 10%-window moving average; other per-step metrics: mean over every step.
    `offset`: responses generated before step 1 (VAPO's value pre-training), counted in the samples."""
    rows, G = run["rows"], run["G"]
    steps, acc = series(rows, "eval/accuracy")
    out: dict = {"wall_s": run["wall_s"]}
    train_steps = [r["step"] for r in rows if r.get("generated_groups") is not None]
    if train_steps:
        out["steps"] = float(max(train_steps))
    if len(acc):
        out.update(start_acc=acc[0], final_acc=acc[-1], best_acc=acc.max())
        for name, prefix in (("final_pass", "eval/pass@"), ("final_maj", "eval/maj@")):
            value = _last_eval(rows, prefix)
            if value is not None:
                out[name] = value
        if target is not None:
            hit = np.flatnonzero(acc >= target)
            out["steps_to_target"] = steps[hit[0]] if len(hit) else None
            if len(hit) and G:
                samples, _ = series(rows, "eval/accuracy", x="samples", G=G, offset=offset)
                out["samples_to_target"] = samples[hit[0]]
            elif not len(hit):
                out["samples_to_target"] = None
    for name, key in (("ent_gen", "entropy_generated"), ("ent_upd", "entropy")):
        _, y = series(rows, key)
        if len(y):
            w = window(len(y))
            out[f"{name}_end"], out[f"{name}_min"] = y[-w:].mean(), smooth(y, w).min()
    for name, key in (("len_mean", "response_length_mean"), ("len_spread", "response_length_std"),
                      ("trunc", "truncated_fraction"), ("clip_low", "clip_frac_low"),
                      ("clip_high", "clip_frac_high"), ("zero_adv", "zero_adv_fraction"),
                      ("gen_rounds", "gen_rounds")):
        _, y = series(rows, key)
        if len(y):
            out[name] = y.mean()
            if name == "len_mean":
                w = window(len(y))
                out["len_sd_steps"] = y.std()
                out["len_start"], out["len_end"] = y[:w].mean(), y[-w:].mean()
                out["len_drift"] = out["len_end"] - out["len_start"]
            if name == "trunc":
                out["trunc_end"] = y[-window(len(y)):].mean()
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
            out["samples"] = gen.sum() * G + offset
    return out


def value_at(curve: tuple[np.ndarray, np.ndarray], x: float) -> float | None:
    """The curve linearly interpolated at x; None outside its range (no extrapolation)."""
    xs, ys = curve
    if not len(xs) or x < xs[0] or x > xs[-1]:
        return None
    return float(np.interp(x, xs, ys))


# ----------------------------------------------------------------------------- tables
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


def markdown_table(rows, summaries: dict[str, list[dict]], columns, *, first: str = "row") -> str:
    """`rows`: objects with `.key` and `.label`; `columns`: (header, summary key, digits)."""
    lines = [f"| {first} | " + " | ".join(h for h, _, _ in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for row in rows:
        runs = summaries.get(row.key, [])
        cells = [fmt_cell(column(runs, key), digits) if runs else "no runs" for _, key, digits in columns]
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def default_target(summaries: dict[str, list[dict]], gain: float) -> float | None:
    """The mean step-0 held-out accuracy + gain."""
    starts = [s["start_acc"] for runs in summaries.values() for s in runs if "start_acc" in s]
    return round(float(np.mean(starts)) + gain, 3) if starts else None


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


def rel(path: Path) -> str:
    """`path` relative to the checkout when it is inside it (a report names no home folders)."""
    try:
        return str(Path(path).resolve().relative_to(Path(__file__).resolve().parents[1]))
    except ValueError:
        return str(path)


FINDINGS_PLACEHOLDER = """## Findings

> **Placeholder, to be written by the lead after the full run.** Nothing in this section has been
> measured yet; the tables above are what a run of the command produced.
"""


def write_page(out: Path, text: str) -> str:
    """Writes the report `text` (ending in `FINDINGS_PLACEHOLDER`) to `out`, keeping the findings already
    written there by hand (`keep_findings`); returns what it wrote."""
    text = keep_findings(out, text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


def default_config() -> Path:
    """The main job's recipe: the run every experiment varies by default."""
    from dapo_jax.training.config.paths import CONFIG_DIR

    return CONFIG_DIR / "cot_dapo.yaml"


def add_run_arguments(ap) -> None:
    """The options of how the runs are trained, the same in every experiment script."""
    import argparse

    ap.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every row (repeatable), e.g. --set data.eval_size=200")
    ap.add_argument("--no-compile-cache", action="store_true",
                    help="do not cache compiled programs in RUNS_DIR/.jax_cache (a process-wide JAX setting)")
    ap.add_argument("--jobs", type=int, default=None,
                    help="runs trained at once, each in its own process on one core with one XLA thread "
                    "(default: the cores available, at most 8; 1: one after another in this process)")
    ap.add_argument("--only", default=None, help=argparse.SUPPRESS)  # ROW/SEED: a --jobs child's one run
    ap.add_argument("--name", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--report-only", action="store_true", help="train nothing: the report from the runs there")


def pick_rows(rows: list, spec: str | None) -> list | None:
    """The rows `--rows a,b` names, in their own order (all for None); None, with a line on stderr, when it
    names a row that does not exist."""
    if not spec:
        return rows
    wanted = [k.strip() for k in spec.split(",") if k.strip()]
    unknown = sorted(set(wanted) - {r.key for r in rows})
    if unknown:
        print(f"unknown row(s) {unknown}; rows: {[r.key for r in rows]}", file=sys.stderr)
        return None
    return [r for r in rows if r.key in wanted]


def keep_findings(out: Path, text: str) -> str:
    """`text` with the `## Findings` section of the page already at `out` when that one was written by
    hand (not the placeholder): a rerun (e.g. --report-only) rewrites the tables and keeps them.
    The section ends at the next `## ` heading: the report ends with it, so any heading after it is not
    part of it (a page whose findings were written above its tables must not carry them in twice)."""
    previous = out.read_text() if out.exists() else ""
    if "\n## Findings\n" not in previous:
        return text
    findings = previous.split("\n## Findings\n", 1)[1].split("\n## ", 1)[0].rstrip("\n") + "\n"
    if "**Placeholder" in findings:
        return text
    return text.split("## Findings\n", 1)[0] + "## Findings\n" + findings
