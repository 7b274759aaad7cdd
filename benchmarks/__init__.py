"""The benchmarks: speed and memory, measured by programs that print figures, never by timed tests.

Each runs as `python -m benchmarks.NAME [--help]` from the checkout's root and shares `harness.py`
(a piece in its own process, medians, peak memory, the result line). The README lists them, one line
each; their figures, with date, commit, machine and command, are in docs/benchmarks.md.
"""
