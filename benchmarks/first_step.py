"""The first minute of a run: how long until step 1 is done, from a cold compilation cache.

    python -m benchmarks.first_step                                   # the main job (cot_dapo), 2 runs
    python -m benchmarks.first_step --baseline /path/to/other/checkout --repeats 2
    python -m benchmarks.first_step --config tiny_dapo rollout.gen_batch=32   # overrides for every run

Each run is one `dapo-jax train CONFIG train.steps=1` process with the persistent compilation cache
off (`DAPO_JAX_COMPILATION_CACHE=off`), so every program compiles as on a fresh machine. With
`--baseline`, the same command runs from that checkout too (its `dapo_jax` first on `PYTHONPATH`),
alternating with this one, so both see the same machine load. From each run it prints:

- `to_step1_s`: launch to the moment step 1's metrics row is written (what a user waits before the
  first line of training), read from the row's file time;
- `step1_s`: step 1's own `step_time_s` (rollout + update, compilation they wait for included);
- `eval0_s`: the step-0 evaluation's time; `process_s`: launch to exit;
- `compilations` at step 1, as the run counts them.

and the medians' ratio baseline / this checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import REPO, median, run

KEYS = ("to_step1_s", "step1_s", "eval0_s", "process_s", "compilations")


def one_run(checkout: Path, config: str, run_dir: Path, extra: list[str]) -> dict:
    overrides = ["train.steps=1", f"train.run_dir={run_dir}", "train.checkpoint_every=0", "train.progress=false",
                 "train.tensorboard=false", *extra]
    env = {**os.environ, "DAPO_JAX_COMPILATION_CACHE": "off", "PYTHONUNBUFFERED": "1"}
    start = time.time()
    proc = run([sys.executable, "-m", "dapo_jax.cli", "train", config, *overrides], env=env, checkout=checkout)
    process_s = time.time() - start
    if proc.returncode:
        tail = " | ".join(proc.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"[benchmarks.first_step] {checkout}: exit {proc.returncode}: {tail}")
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    step1 = next(r for r in rows if r.get("step") == 1 and "step_time_s" in r)
    eval0 = next((r for r in rows if r.get("step") == 0 and "eval/time_s" in r), {})
    # the step-1 row is the last row written before the run's end (no checkpoint, no later evaluation)
    return {"to_step1_s": metrics.stat().st_mtime - start, "step1_s": step1["step_time_s"],
            "eval0_s": eval0.get("eval/time_s", float("nan")), "process_s": process_s,
            "compilations": step1.get("compilations", float("nan"))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cot_dapo", help="a packaged recipe's name or a YAML path")
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout, run alternately with this one")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("overrides", nargs="*", help="section.key=value for every run")
    args = ap.parse_args(argv)
    checkouts = {"this": REPO} if args.baseline is None else {"baseline": args.baseline.resolve(), "this": REPO}
    results: dict[str, list[dict]] = {name: [] for name in checkouts}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for name, checkout in checkouts.items():
                r = one_run(checkout, args.config, Path(tmp) / f"{name}{i}", args.overrides)
                results[name].append(r)
                print(f"[benchmarks.first_step] {name} ({checkout}) run {i + 1}: "
                      + json.dumps({k: round(v, 2) for k, v in r.items()}), flush=True)
    print("\n| checkout | launch → step 1 done, s | step 1 s | eval at step 0 s | process s | compilations |")
    print("|---|---|---|---|---|---|")
    med = {name: {k: median(r[k] for r in rs) for k in KEYS} for name, rs in results.items()}
    for name, m in med.items():
        print(f"| {name} | {m['to_step1_s']:.1f} | {m['step1_s']:.1f} | {m['eval0_s']:.1f} | {m['process_s']:.1f} | "
              f"{m['compilations']:.0f} |")
    if "baseline" in med:
        b, t = med["baseline"], med["this"]
        print(f"\nbaseline / this (medians of {args.repeats}): launch → step 1 {b['to_step1_s'] / t['to_step1_s']:.2f}x, "
              f"step 1 {b['step1_s'] / t['step1_s']:.2f}x")


if __name__ == "__main__":
    main()
