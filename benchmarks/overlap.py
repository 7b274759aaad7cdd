"""Step time with and without `rollout.overlap` (one-step off-policy rollouts, training/overlap.py).

    python -m benchmarks.overlap                          # the cot_dapo recipe, 8 steps each
    python -m benchmarks.overlap --config tiny_dapo --steps 30
    python -m benchmarks.overlap --steps 12 rollout.gen_batch=32   # extra overrides for both runs

Runs the config twice, each in its own `dapo-jax train` process and run dir: synchronous, then with
`rollout.overlap=true`. Both train `objective.name=dapo_tis` (so both recompute log π_old and weigh by
π_old/μ: only the overlap differs), with evaluation, checkpoints and rollout logs off (a checkpoint
waits for the rollout in flight, which would move rollout time out of the step's timer). From each
run's metrics.jsonl, over the steps after the first (compilation), it prints the medians of:
`step_time_s` (the loop's wall time per step: with overlap, the wait for the prefetched rollout plus
the update), `rollout_busy_s` (the rollout's own wall time, wherever it ran), `rollout_time_s` (the
part of it the step waited for) and `update_time_s`, their sums, and the gain in step time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import median
from benchmarks.harness import run as run_command

KEYS = ("step_time_s", "rollout_busy_s", "rollout_time_s", "update_time_s", "gen_rounds")


def run(config: str, run_dir: Path, steps: int, overlap: bool, extra: list[str]) -> tuple[list[dict], float]:
    overrides = [
        "objective.name=dapo_tis", f"rollout.overlap={str(overlap).lower()}", f"train.steps={steps}",
        f"train.run_dir={run_dir}", "data.eval=null", "train.eval_every=0", "train.checkpoint_every=0",
        "train.rollouts_every=0", "train.progress=false", "train.tensorboard=false", *extra,
    ]
    t0 = time.perf_counter()
    proc = run_command([sys.executable, "-m", "dapo_jax.cli", "train", config, *overrides],
                       env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture=False)
    if proc.returncode:
        raise SystemExit(f"[benchmarks.overlap] the run failed (exit {proc.returncode})")
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "step_time_s" in r], wall


def summary(rows: list[dict]) -> dict:
    timed = [r for r in rows if r["step"] > 1]  # step 1 compiles (and is never overlapped)
    out = {f"median_{k}": median(r.get(k, 0.0) for r in timed) for k in KEYS}
    out.update({f"sum_{k}": sum(r.get(k, 0.0) for r in timed) for k in KEYS[:4]})
    out["timed_steps"] = len(timed)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cot_dapo", help="a packaged recipe's name or a YAML path")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None, help="run dirs here (default: a temporary folder)")
    ap.add_argument("overrides", nargs="*", help="section.key=value for both runs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = args.out or Path(tmp)
        result = {}
        for name, overlap in (("sync", False), ("overlap", True)):
            rows, wall = run(args.config, base / name, args.steps, overlap, args.overrides)
            result[name] = {**summary(rows), "process_wall_s": wall}
            print(f"[benchmarks.overlap] {name}: " + json.dumps({k: round(v, 4) for k, v in result[name].items()}),
                  flush=True)
    s, o = result["sync"], result["overlap"]
    print(f"\n| run | median step s | median rollout busy s | median rollout wait s | median update s | "
          f"steps 2..{args.steps} total s |")
    print("|---|---|---|---|---|---|")
    for name, r in result.items():
        print(f"| {name} | {r['median_step_time_s']:.3f} | {r['median_rollout_busy_s']:.3f} | "
              f"{r['median_rollout_time_s']:.3f} | {r['median_update_time_s']:.3f} | {r['sum_step_time_s']:.2f} |")
    gain = s["median_step_time_s"] / max(o["median_step_time_s"], 1e-9)
    total = s["sum_step_time_s"] / max(o["sum_step_time_s"], 1e-9)
    print(f"\nstep-time gain (sync / overlap): median {gain:.2f}x, total {total:.2f}x; "
          f"ideal max(rollout, update) bound: {(s['median_rollout_busy_s'] + s['median_update_time_s']) / max(max(s['median_rollout_busy_s'], s['median_update_time_s']), 1e-9):.2f}x")


if __name__ == "__main__":
    main()
