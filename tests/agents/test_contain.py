"""Contained calls: results in order, errors and timeouts as outcomes, sync and async calls overlapping."""

import asyncio
import threading
import time

import pytest

from dapo_jax.agents.contain import Outcome, one_line, run_contained


def test_results_errors_and_timeouts_come_back_in_order():
    def ok(x):
        return x * 2

    def boom():
        raise KeyError("missing\nsecond line")

    def hang():
        time.sleep(3600)

    async def async_hang():
        await asyncio.sleep(3600)

    out = run_contained([(ok, (4,), {}), (boom, (), {}), (hang, (), {}), (async_hang, (), {}), (ok, (), {"x": 1})],
                        timeout=0.3)
    assert out[0] == Outcome("ok", 8) and out[4] == Outcome("ok", 2)
    assert out[1].status == "error" and out[1].error == "KeyError: 'missing\\nsecond line'"
    assert out[2].status == "timeout" and out[3].status == "timeout" and "0.3 s" in out[2].error


def test_sync_calls_overlap():
    """Each call waits at a barrier that opens only once all four are running at the same time."""
    barrier = threading.Barrier(4, timeout=10)

    def meet(i):
        barrier.wait()
        return i

    assert [o.value for o in run_contained([(meet, (i,), {}) for i in range(4)], timeout=20)] == [0, 1, 2, 3]


def test_async_calls_overlap():
    state = {"running": 0, "most": 0}

    async def meet(i):
        state["running"] += 1
        state["most"] = max(state["most"], state["running"])
        for _ in range(1000):  # returns once all four have started (the shared loop interleaves them)
            if state["most"] == 4:
                break
            await asyncio.sleep(0.005)
        state["running"] -= 1
        return i

    out = run_contained([(meet, (i,), {}) for i in range(4)], timeout=20)
    assert [o.status for o in out] == ["ok"] * 4 and state["most"] == 4


def test_one_line_and_a_bad_timeout():
    assert one_line(ValueError("a" * 500), limit=20) == "ValueError: aaaaa..."
    with pytest.raises(ValueError, match="timeout must be > 0"):
        run_contained([], timeout=0)
