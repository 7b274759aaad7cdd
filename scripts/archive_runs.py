"""Keeps an experiment's runs in the repository, small: per run its metrics (gzip), config and bookkeeping,
so the pages built from them can be rebuilt and checked without the run folders (checkpoints, logs).

    python scripts/archive_runs.py runs/league results/league          # ROW/seedS/ under each
    python scripts/league.py --report-only --runs-dir results/league   # the page again, from the archive

What is kept of each run folder: `metrics.jsonl` as `metrics.jsonl.gz`, `config.yaml`, and the experiment
scripts' `experiment.json` (finished, steps, wall time); of a chain of stages (`dapo-jax stages`), its
`stages.yaml` and each stage's `i-NAME/config.yaml`. A run without metrics is left out and named.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
from pathlib import Path

KEPT = ("config.yaml", "experiment.json", "stages.yaml")


def archive(runs: Path, out: Path) -> tuple[list[Path], list[Path]]:
    """Copies every ROW/seedS run under `runs` to `out`; returns (archived, skipped) run folders."""
    archived, skipped = [], []
    for run in sorted(p for p in runs.glob("*/seed*") if p.is_dir()):
        metrics = run / "metrics.jsonl"
        if not metrics.exists():
            skipped.append(run)
            continue
        dest = out / run.relative_to(runs)
        dest.mkdir(parents=True, exist_ok=True)
        # mtime 0: the same metrics give the same bytes, so a rerun of the command changes nothing in git
        (dest / "metrics.jsonl.gz").write_bytes(gzip.compress(metrics.read_bytes(), mtime=0))
        for name in KEPT:
            if (run / name).exists():
                shutil.copyfile(run / name, dest / name)
        for stage_config in sorted(run.glob("[0-9]*-*/config.yaml")):  # a chain's stages, each a run
            (dest / stage_config.parent.name).mkdir(exist_ok=True)
            shutil.copyfile(stage_config, dest / stage_config.parent.name / "config.yaml")
        archived.append(dest)
    return archived, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, help="the experiment's runs folder (ROW/seedS/ under it)")
    ap.add_argument("out", type=Path, help="where to keep them, e.g. results/league")
    args = ap.parse_args(argv)
    if not args.runs.is_dir():
        print(f"archive_runs: {args.runs}: no such folder", file=sys.stderr)
        return 2
    archived, skipped = archive(args.runs, args.out)
    for run in skipped:
        print(f"archive_runs: {run}: no metrics.jsonl, left out", file=sys.stderr)
    size = sum(f.stat().st_size for d in archived for f in d.rglob("*") if f.is_file())
    print(f"archive_runs: {len(archived)} runs into {args.out} ({size / 1024:.0f} KiB)")
    return 0 if archived else 2


if __name__ == "__main__":
    sys.exit(main())
