"""benchmarks/harness.py: the one way a benchmark runs a piece in its own process, times it and reports."""

import json

import jax
import jax.numpy as jnp

from benchmarks.harness import emit, median, median_time, parse_result, run_child

CHILD = "tests.benchmarks.harness_child"


def test_the_result_line_round_trips_and_the_last_one_wins(capsys):
    emit({"a": 1, "b": [1.5, "x"]})
    emit({"a": 2})
    out = capsys.readouterr().out
    assert parse_result("noise\n" + out + "trailing noise\n") == {"a": 2}
    assert parse_result(out.splitlines()[0]) == {"a": 1, "b": [1.5, "x"]}
    assert parse_result("no result here\n" + json.dumps({"a": 3})) is None


def test_median_of_nothing_is_nan_not_an_error():
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0]) == 2.5
    assert median([]) != median([])  # NaN


def test_a_child_process_reports_its_result_its_failure_or_its_timeout():
    r = run_child(CHILD, ["ok", "x", "y"])
    assert r["args"] == ["x", "y"] and r["peak_rss"] > 1 << 20  # its own process: its own high-water mark
    r = run_child(CHILD, ["fail"])
    assert r == {"error": "exit 3: the child's last words"}
    assert run_child(CHILD, ["sleep", "30"], timeout=1) == {"error": "timed out after 1 s"}


def test_median_time_waits_for_every_call_and_counts_the_first_apart():
    calls = []

    def fn(x):
        calls.append(1)
        return jnp.sin(x) * 2

    first, med = median_time(jax.jit(fn), jnp.ones(8), repeats=3)
    assert len(calls) == 1  # traced once: the first call compiles, the others reuse it
    assert first > 0 and med > 0


def test_every_benchmark_goes_through_the_harness_and_the_readme_lists_it():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    helpers = {"__init__", "harness", "workload", "peers_trl", "peers_tunix"}  # not benchmarks themselves
    names = sorted(p.stem for p in (root / "benchmarks").glob("*.py") if p.stem not in helpers)
    assert len(names) >= 10
    readme = (root / "README.md").read_text()
    assert [n for n in names if f"`python -m benchmarks.{n}" not in readme] == []
    for path in (root / "benchmarks").glob("*.py"):
        if path.stem == "harness":
            continue
        text = path.read_text()
        # a child process, a median and the import path each have one home: benchmarks/harness.py
        for own in (r"subprocess\.run\(", r"sys\.path\.insert", r"sys\.path\[", r"statistics\.median", r"np\.median",
                    r"ru_maxrss"):
            assert re.search(own, text) is None, f"{path.name} does {own!r} itself: use benchmarks.harness"
