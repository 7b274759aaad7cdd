"""A child for tests/benchmarks/test_harness.py: `python -m tests.benchmarks.harness_child MODE [ARGS]`."""

import sys
import time

from benchmarks.harness import emit, peak_rss_bytes

if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if mode == "ok":
        print("noise before the result")
        emit({"args": rest, "peak_rss": peak_rss_bytes()})
    elif mode == "fail":
        print("the child's last words", file=sys.stderr)
        sys.exit(3)
    elif mode == "sleep":
        time.sleep(float(rest[0]))
