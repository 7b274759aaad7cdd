"""GRPO on the rule reward vs on a learned outcome reward model, KL beta 0.04 vs 0, several seeds.

    python scripts/compare_rewards.py [--seeds 0 1 2] [--steps 150] [--eval-every 25] [--jobs 2]
                                      [--runs-dir runs/compare_rewards] [--out docs/reward_models.md]
                                      [--report-only]

Four conditions of `dapo_jax/configs/cot_grpo_rm.yaml` (the chain-of-thought task, cot_base, GRPO), each
trained for `--steps` steps per seed:

    rule, KL 0.04   reward = the `cot` rule (1 / 0); the RM is scored with weight 0 (logged only)
    rule, KL 0      the same without the KL term (no reference model)
    RM, KL 0.04     reward = dapo_jax/assets/cot_rm's logit; the rule has weight 0 (it judges accuracy)
    RM, KL 0        the same without the KL term

so every run logs both the RM score (`reward/reward_model`, `eval/reward/reward_model`) and the
rule-checked accuracy (`accuracy`, `eval/accuracy`, held-out avg@4 on 200 problems). Every run is
one `dapo-jax train` process, `--jobs` at a time, each niced, on one core with one XLA thread;
checkpoints every `--eval-every` steps, so a rerun of the same command skips finished runs and
resumes the others. Every `--eval-every` steps the run also logs 16 groups of its rollouts
(RUN/rollouts/STEP.jsonl); the report re-reads them, classifies each response (right; well-formed
but wrong: its last line is `Answer: N` with a wrong N; malformed) and scores it with the RM, to
show which kind of response the RM's score rewards as training goes on.

Then it writes the results between the `<!-- compare_rewards -->` markers of `--out` and figures
to docs/figures/reward_models_*.png.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import platform
import queue
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from dapo_jax.training.config.paths import CONFIG_DIR  # noqa: E402
from experiment import run_pinned  # noqa: E402

CONFIG = CONFIG_DIR / "cot_grpo_rm.yaml"
RM_PATH = "dapo_jax/assets/cot_rm"
CONDITIONS = {  # key -> (label, overrides)
    "rule_kl0.04": ("rule, KL 0.04", [f"reward.functions=[{{name: cot, weight: 1.0}}, {{name: reward_model, "
                                      f"path: {RM_PATH}, weight: 0.0}}]"]),
    "rule_kl0": ("rule, KL 0", [f"reward.functions=[{{name: cot, weight: 1.0}}, {{name: reward_model, "
                                f"path: {RM_PATH}, weight: 0.0}}]", "objective.kl_beta=0.0"]),
    "rm_kl0.04": ("RM, KL 0.04", []),
    "rm_kl0": ("RM, KL 0", ["objective.kl_beta=0.0"]),
}
MARK_START, MARK_END = "<!-- compare_rewards:start -->", "<!-- compare_rewards:end -->"


def run_dir(args, key: str, seed: int) -> Path:
    return args.runs_dir / key / f"seed{seed}"


def overrides(args, key: str, seed: int) -> list[str]:
    e = args.eval_every
    return [*CONDITIONS[key][1], f"train.steps={args.steps}", f"train.seed={seed}", f"train.eval_every={e}",
            f"train.checkpoint_every={e}", "train.keep_checkpoints=1", f"train.rollouts_every={e}",
            "train.rollouts_sample=16", "train.progress=false", "train.tensorboard=false",
            f"train.run_dir={run_dir(args, key, seed)}"]


def metrics(path: Path) -> list[dict]:
    f = path / "metrics.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else []


def finished(args, key: str, seed: int) -> bool:
    return any(r.get("step") == args.steps and "eval/accuracy" in r for r in metrics(run_dir(args, key, seed)))


def train_one(args, key: str, seed: int, cores: queue.Queue) -> str | None:
    path = run_dir(args, key, seed)
    path.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "dapo_jax.cli", "train", str(CONFIG), *overrides(args, key, seed)]
    with open(path / "compare.log", "a") as log:
        log.write(f"$ {' '.join(cmd)}\n")
    t0 = time.time()
    rc = run_pinned(cmd, path / "compare.log", cores, nice=10, cwd=REPO,
                    announce=f"[compare] {key} seed {seed}: training on core {{core}}, log {path / 'compare.log'}")
    wall = time.time() - t0
    with open(path / "wall_s.jsonl", "a") as f:
        f.write(json.dumps({"rc": rc, "wall_s": round(wall, 1)}) + "\n")
    if rc != 0 or not finished(args, key, seed):
        print(f"[compare] {key} seed {seed}: FAILED (exit {rc}), see {path / 'compare.log'}", flush=True)
        return f"{key}/seed{seed}: exit {rc}"
    print(f"[compare] {key} seed {seed}: done in {wall:.0f} s", flush=True)
    return None


def run_all(args) -> list[str]:
    todo = [(k, s) for s in args.seeds for k in CONDITIONS if not finished(args, k, s)]
    cores = queue.Queue()
    avail = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    for c in (avail * args.jobs)[:args.jobs]:
        cores.put(c)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        errors = list(pool.map(lambda ks: train_one(args, *ks, cores), todo))
    return [e for e in errors if e]


# ----------------------------------------------------------------------------- analysis
def eval_series(rows, key: str) -> dict[int, float]:
    return {r["step"]: float(r[key]) for r in rows if key in r and isinstance(r[key], (int, float))}


def classify(text: str, answer: str) -> str:
    from dapo_jax.data import cot

    if cot.is_correct(text, answer):
        return "right"
    lines = [x.strip() for x in text.split("\n") if x.strip()]
    return "well-formed wrong" if lines and lines[-1].startswith("Answer:") else "malformed"


def rollout_table(args, rm) -> dict:
    """condition -> step -> {class: [fraction, mean RM score]} over the seeds' logged rollouts."""
    from dapo_jax.data import cot

    out: dict = {}
    for key in CONDITIONS:
        per_step: dict[int, dict[str, list]] = {}
        for seed in args.seeds:
            for f in sorted((run_dir(args, key, seed) / "rollouts").glob("*.jsonl")):
                groups = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
                prompts = [g["prompt"] for g in groups for _ in g["responses"]]
                texts = [r["text"] for g in groups for r in g["responses"]]
                answers = [str(sum(cot.parse_prompt(g["prompt"].strip()))) for g in groups for _ in g["responses"]]
                scores, _ = rm.score_rows(prompts, texts)
                bucket = per_step.setdefault(int(groups[0]["step"]), {})
                for text, answer, s in zip(texts, answers, scores):
                    bucket.setdefault(classify(text, answer), []).append(float(s))
        out[key] = {step: {c: (len(v) / sum(len(x) for x in d.values()), float(np.mean(v))) for c, v in d.items()}
                    for step, d in sorted(per_step.items())}
    return out


def mean_sd(xs) -> str:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return "-"
    return f"{np.mean(xs):.3f} ± {np.std(xs, ddof=1):.3f}" if len(xs) > 1 else f"{xs[0]:.3f}"


def _save(fig, axes, path: Path) -> None:
    """Grids on every panel, the legend on the first, the PNG written and the figure closed."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(args) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dapo_jax.rewards.reward_model import make_learned_reward

    runs = {k: {s: metrics(run_dir(args, k, s)) for s in args.seeds} for k in CONDITIONS}
    eval_steps = sorted({st for k in runs for s in runs[k] for st in eval_series(runs[k][s], "eval/accuracy")})
    figs = args.out.parent / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    colors = {"rule_kl0.04": "tab:blue", "rule_kl0": "tab:cyan", "rm_kl0.04": "tab:red", "rm_kl0": "tab:orange"}

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for key, (label, _) in CONDITIONS.items():
        for ax, metric in zip(axes[:2], ("eval/accuracy", "eval/reward/reward_model")):
            ys = np.array([[eval_series(runs[key][s], metric).get(st, np.nan) for st in eval_steps] for s in args.seeds])
            m = np.nanmean(ys, axis=0)
            ax.plot(eval_steps, m, "-o", color=colors[key], label=label, ms=3)
            if len(args.seeds) > 1:
                sd = np.nanstd(ys, axis=0, ddof=1)
                ax.fill_between(eval_steps, m - sd, m + sd, color=colors[key], alpha=0.15)
        acc = np.array([[eval_series(runs[key][s], "eval/accuracy").get(st, np.nan) for st in eval_steps] for s in args.seeds])
        rms = np.array([[eval_series(runs[key][s], "eval/reward/reward_model").get(st, np.nan) for st in eval_steps]
                        for s in args.seeds])
        axes[2].plot(np.nanmean(rms, 0), np.nanmean(acc, 0), "-o", color=colors[key], label=label, ms=3)
    axes[0].set(title="held-out accuracy (rule-checked, avg@4)", xlabel="step")
    axes[1].set(title="held-out RM score (mean logit)", xlabel="step")
    axes[2].set(title="accuracy against RM score (held-out, per eval)", xlabel="RM score", ylabel="accuracy")
    _save(fig, axes, figs / "reward_models_heldout.png")

    rm = make_learned_reward("reward_model", REPO / RM_PATH, max_length=48 + 144)
    table = rollout_table(args, rm)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, (label, _) in CONDITIONS.items():
        steps = sorted(table[key])
        for ax, cls in zip(axes, ("right", "well-formed wrong")):
            ax.plot(steps, [table[key][st].get(cls, (0.0, np.nan))[0] for st in steps], "-o", color=colors[key],
                    label=label, ms=3)
    axes[0].set(title="rollouts: fraction right", xlabel="step")
    axes[1].set(title="rollouts: fraction well-formed but wrong", xlabel="step")
    _save(fig, axes, figs / "reward_models_rollouts.png")

    lines = [f"Measured by `python scripts/compare_rewards.py --seeds {' '.join(map(str, args.seeds))} --steps "
             f"{args.steps} --eval-every {args.eval_every} --jobs {args.jobs}` on {platform.node() or 'this machine'} "
             f"({os.cpu_count()} cores, shared with other jobs; single-threaded runs, {args.jobs} at a time), "
             f"{datetime.date.today().isoformat()}, commit {_commit()}.", "",
             "Held-out (200 problems, avg@4 at temperature 1), mean ± sd over seeds:", "",
             "| condition | " + " | ".join(f"acc@{st}" for st in eval_steps) + " | RM score@0 | RM score@end | best acc (step) |",
             "|---|" + "---|" * (len(eval_steps) + 3)]
    for key, (label, _) in CONDITIONS.items():
        accs = [[eval_series(runs[key][s], "eval/accuracy").get(st) for s in args.seeds] for st in eval_steps]
        rm0 = [eval_series(runs[key][s], "eval/reward/reward_model").get(eval_steps[0]) for s in args.seeds]
        rmz = [eval_series(runs[key][s], "eval/reward/reward_model").get(eval_steps[-1]) for s in args.seeds]
        means = [np.mean([a for a in acc if a is not None]) if any(a is not None for a in acc) else np.nan for acc in accs]
        best = int(np.nanargmax(means)) if np.isfinite(means).any() else 0
        lines.append(f"| {label} | " + " | ".join(mean_sd(a) for a in accs) +
                     f" | {mean_sd(rm0)} | {mean_sd(rmz)} | {means[best]:.3f} ({eval_steps[best]}) |")
    lines += ["", "Logged rollouts (16 groups x 8 responses per seed every "
              f"{args.eval_every} steps, all seeds pooled): fraction of each kind of response and the RM's mean "
              "score on it:", "", "| condition | step | right | well-formed wrong | malformed |", "|---|---|---|---|---|"]
    for key, (label, _) in CONDITIONS.items():
        for st in sorted(table[key]):
            cells = [f"{table[key][st][c][0]:.2f} ({table[key][st][c][1]:+.2f})" if c in table[key][st] else "-"
                     for c in ("right", "well-formed wrong", "malformed")]
            lines.append(f"| {label} | {st} | " + " | ".join(cells) + " |")
    wall = [json.loads(x)["wall_s"] for k in CONDITIONS for s in args.seeds
            for x in (run_dir(args, k, s) / "wall_s.jsonl").read_text().splitlines()
            if (run_dir(args, k, s) / "wall_s.jsonl").exists()]
    lines += ["", f"Wall time: {sum(wall) / 60:.0f} min of runs in all ({len(wall)} sessions).", "",
              "![held-out](figures/reward_models_heldout.png)", "",
              "![rollouts](figures/reward_models_rollouts.png)"]
    (args.runs_dir / "summary.json").write_text(json.dumps(
        {"eval_steps": eval_steps, "runs": {k: {str(s): {"accuracy": eval_series(runs[k][s], "eval/accuracy"),
                                                          "rm_score": eval_series(runs[k][s], "eval/reward/reward_model")}
                                                for s in args.seeds} for k in CONDITIONS},
         "rollouts": {k: {str(st): v for st, v in table[k].items()} for k in table}}, indent=1))
    return "\n".join(lines)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"


def write_block(out: Path, block: str) -> None:
    text = out.read_text() if out.exists() else f"{MARK_START}\n{MARK_END}\n"
    if MARK_START not in text:
        text += f"\n{MARK_START}\n{MARK_END}\n"
    head, rest = text.split(MARK_START, 1)
    _, tail = rest.split(MARK_END, 1)
    out.write_text(f"{head}{MARK_START}\n{block}\n{MARK_END}{tail}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "compare_rewards")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "reward_models.md")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args(argv)
    if args.steps % args.eval_every:
        parser.error(f"--steps {args.steps} must be a multiple of --eval-every {args.eval_every}")
    errors = [] if args.report_only else run_all(args)
    block = report(args)
    write_block(args.out, block)
    print(block)
    if errors:
        print(f"[compare] {len(errors)} run(s) failed: {errors}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
