"""The bounded pool user rewards run in: order, the bound on concurrent calls, async calls, errors, timeouts."""

import asyncio
import threading
import time

import pytest

from dapo_jax.rewards.pool import BoundedPool


def test_outcomes_in_call_order_and_never_more_than_workers_at_once():
    running, peak, lock = [0], [0], threading.Lock()

    def call(i):
        def run():
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.02)
            with lock:
                running[0] -= 1
            return i * i
        return run

    out = BoundedPool(3, timeout_s=30).map([call(i) for i in range(10)])
    assert [o.value for o in out] == [i * i for i in range(10)] and all(o.error is None for o in out)
    assert 1 <= peak[0] <= 3


def test_async_calls_errors_and_timeouts():
    async def double(x):
        await asyncio.sleep(0)
        return 2 * x

    async def forever():
        await asyncio.sleep(3600)

    def boom():
        raise ValueError("bad row")

    out = BoundedPool(2, timeout_s=0.2).map([lambda: double(4), boom, forever, lambda: 7])
    assert out[0].value == 8 and out[3].value == 7
    assert out[1].brief == "ValueError: bad row" and "Traceback" in out[1].error
    assert out[2].brief == "timed out after 0.2s" and out[2].value is None


@pytest.mark.parametrize("workers, timeout_s, message", [(0, 1.0, "workers must be >= 1"),
                                                          (1, 0.0, "timeout_s must be > 0")])
def test_refusals(workers, timeout_s, message):
    with pytest.raises(ValueError, match=message):
        BoundedPool(workers, timeout_s)
