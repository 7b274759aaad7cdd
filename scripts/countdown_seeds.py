"""DAPO on the Countdown task over several seeds: held-out accuracy per evaluation, a figure and a table.

    python scripts/countdown_seeds.py [--seeds 0 1 2] [--steps 150] [--runs runs/countdown_seeds]
                                      [--figure docs/figures/countdown_dapo.png]

Each seed is one `dapo_jax/configs/countdown_dapo.yaml` run (`train.seed` = the seed) in RUNS/seedS,
trained in this process one after another (XLA's persistent cache in RUNS/.jax_cache compiles the
programs once). Rerunning the same command skips finished runs and resumes the others from their
newest checkpoint. The figure plots held-out accuracy (avg@k, at temperature 1) against the step,
one line per seed and their mean; the table gives step 0 and the last step, mean ± sd.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment import Job, machine, mean_sd, read_run, rel, run_all, series, use_compile_cache  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "dapo_jax" / "configs" / "countdown_dapo.yaml"
KEY = "eval/accuracy"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "countdown_seeds")
    parser.add_argument("--figure", type=Path, default=ROOT / "docs" / "figures" / "countdown_dapo.png")
    args = parser.parse_args(argv)
    use_compile_cache(args.runs)
    jobs = [Job("dapo", s, "DAPO", args.runs / f"seed{s}", CONFIG,
                (f"train.run_dir={args.runs / f'seed{s}'}", f"train.seed={s}", f"train.steps={args.steps}",
                 "train.progress=false"), args.steps) for s in args.seeds]
    failed = run_all(jobs, tag="countdown")
    curves = {job.seed: series(read_run(job.path)["rows"], KEY) for job in jobs}
    curves = {s: c for s, c in curves.items() if len(c[0])}
    if not curves:
        print("no evaluations yet", file=sys.stderr)
        return 1
    first = [float(y[0]) for _, y in curves.values()]
    last = [float(y[-1]) for _, y in curves.values()]
    steps = [int(x[-1]) for x, _ in curves.values()]
    (m0, s0), (m1, s1) = mean_sd(first), mean_sd(last)
    print(f"| seeds | held-out accuracy, step 0 | at step {min(steps)} |\n|---|---|---|\n"
          f"| {', '.join(map(str, curves))} | {m0:.3f} ± {s0 or 0:.3f} | {m1:.3f} ± {s1 or 0:.3f} |")
    for s, (x, y) in curves.items():
        print(f"seed {s}: " + ", ".join(f"{int(a)}: {b:.3f}" for a, b in zip(x, y)))
    where = machine()
    footer = (f"{time.strftime('%Y-%m-%d', time.gmtime())}, commit {commit()}, {where}\n"
              f"python scripts/countdown_seeds.py --seeds {' '.join(map(str, args.seeds))} --steps {args.steps}")
    plot(curves, args.figure, footer)
    print(f"figure: {rel(args.figure)}; machine: {where}")
    return 1 if failed else 0


def commit() -> str:
    """The checkout's short commit, with `+changes` when the working tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+changes" if dirty else "")


def plot(curves: dict[int, tuple[np.ndarray, np.ndarray]], path: Path, footer: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.6))
    for s, (x, y) in curves.items():
        ax.plot(x, y, alpha=0.5, marker="o", ms=3, label=f"seed {s}")
    common = min(len(x) for x, _ in curves.values())
    x = next(iter(curves.values()))[0][:common]
    ax.plot(x, np.mean([y[:common] for _, y in curves.values()], axis=0), color="k", lw=2, label="mean")
    ax.set_xlabel("DAPO step (16 prompts x 8 responses)")
    ax.set_ylabel("held-out accuracy (avg@4, T=1)")
    ax.set_title("DAPO on Countdown (3 numbers 1-9, target <= 50), from countdown_base", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.text(0.01, 0.01, footer, fontsize=7, color="0.35", va="bottom")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
