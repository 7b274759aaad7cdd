"""What every benchmark shares: a piece run in its own process, timing, peak memory and the result line.

    from benchmarks.harness import emit, median, median_time, peak_rss_bytes, run, run_child

- `run_child("benchmarks.logprobs", [...])` runs `python -m benchmarks.logprobs ...` in a fresh process
  (its own peak memory, its own XLA flags) with this checkout importable, and returns the dict the
  child printed with `emit`, or `{"error": why}`. A peer framework's runner goes through the same call
  with its own interpreter (`python=`).
- `median_time(fn, *args, repeats=5)` is the first call's time (compilation included) and the median
  of the next `repeats` calls, each waited for with `jax.block_until_ready`.
- `peak_rss_bytes()` is the process's high-water resident memory (what a child reports on exit).

Nothing here imports JAX or dapo_jax at module level, so a peer's interpreter can import it.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULT_TAG = "BENCH_JSON "


def emit(result: dict) -> None:
    """Prints the result line a parent reads back (`parse_result`)."""
    print(RESULT_TAG + json.dumps(result), flush=True)


def parse_result(stdout: str) -> dict | None:
    """The last result line of a child's output, or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    return None


def median(xs) -> float:
    """The median, NaN for nothing (a benchmark whose timed part never ran says so, never fails)."""
    xs = list(xs)
    return float(statistics.median(xs)) if xs else float("nan")


def median_time(fn, *args, repeats: int = 5) -> tuple[float, float]:
    """`(first_s, median_s)`: the first call (compilation included) and the median of `repeats` more."""
    import jax

    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return first, median(times)


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run(cmd: list[str], *, env: dict | None = None, timeout: float | None = None,
        capture: bool = True, checkout: Path = REPO) -> subprocess.CompletedProcess:
    """`cmd` from the checkout's root with the checkout first on PYTHONPATH (this `benchmarks` and
    `dapo_jax`, whatever is installed); `checkout`: another clone's root, to run its code instead."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(checkout), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(cmd, cwd=checkout, env=env, timeout=timeout, capture_output=capture, text=True)


def run_child(module: str, args: list[str] = (), *, python: str = sys.executable, env: dict | None = None,
              timeout: float | None = None) -> dict:
    """`python -m module args` in a fresh process: the dict it `emit`ted, or `{"error": why}`."""
    try:
        proc = run([python, "-m", module, *args], env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    result = parse_result(proc.stdout)
    if result is None or proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return result
