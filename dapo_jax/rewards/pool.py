"""Calls to user code that never hang the run: a bounded set of worker threads, a timeout per call.

    pool = BoundedPool(workers=8, timeout_s=10.0)
    outcomes = pool.map([lambda: fn(r, t) for r, t in pairs])   # [Outcome(value, error)], in call order

Each call runs on its own daemon thread; at most ``workers`` run at once. A call that returns a
coroutine (an ``async def`` function) has it run to completion on that thread's own event loop,
cancelled at the timeout. A call still running ``timeout_s`` after it started is a failure
(``Outcome.error`` says so) and is left behind: Python cannot stop a thread, so it keeps its worker
until it returns, and a daemon thread never holds up the process's exit. When every worker is held
by such calls, the rest of the batch fails at once instead of waiting for them.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

__all__ = ["BoundedPool", "Outcome"]


class Outcome(NamedTuple):
    value: Any = None
    error: str | None = None  # None: the call returned `value`; else why it failed (a traceback, or a timeout)
    brief: str | None = None  # the error in one line (`ZeroDivisionError: division by zero`, `timed out after 2s`)


async def _bounded(awaitable, timeout_s: float):
    return await asyncio.wait_for(awaitable, timeout_s)


class BoundedPool:
    """``workers`` concurrent calls at most, each failed after ``timeout_s`` seconds (module docstring)."""

    def __init__(self, workers: int, timeout_s: float):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.workers, self.timeout_s = int(workers), float(timeout_s)
        self._slots = threading.Semaphore(self.workers)  # held by a call until it returns, even past its timeout

    def _run(self, call: Callable[[], Any], box: list, done: threading.Event) -> None:
        try:
            value = call()
            if inspect.isawaitable(value):
                value = asyncio.run(_bounded(value, self.timeout_s))
            box.append(Outcome(value))
        except asyncio.TimeoutError:
            why = f"timed out after {self.timeout_s:g}s"
            box.append(Outcome(error=why, brief=why))
        except BaseException as e:  # noqa: BLE001 - user code: anything it raises is a counted failure
            box.append(Outcome(error=traceback.format_exc(), brief=f"{type(e).__name__}: {e}"))
        finally:
            self._slots.release()
            done.set()

    def map(self, calls: Sequence[Callable[[], Any]]) -> list[Outcome]:
        """Runs every call (at most ``workers`` at once); the outcomes in call order, within about
        ``ceil(len(calls) / workers) * timeout_s`` seconds whatever the calls do."""
        n = len(calls)
        boxes: list[list] = [[] for _ in range(n)]
        events = [threading.Event() for _ in range(n)]
        started: list[float | None] = [None] * n
        out: list[Outcome | None] = [None] * n
        for i, call in enumerate(calls):
            if not self._slots.acquire(timeout=self.timeout_s):
                why = (f"not started: all {self.workers} workers are held by calls still running past their "
                       f"{self.timeout_s:g}s timeout")
                for j in range(i, n):
                    out[j] = Outcome(error=why, brief=why)
                break
            started[i] = time.monotonic()
            threading.Thread(target=self._run, args=(call, boxes[i], events[i]), daemon=True,
                             name=f"dapo-jax-reward-{i}").start()
        for i in range(n):
            if started[i] is None:
                continue
            remaining = started[i] + self.timeout_s - time.monotonic()
            # a small grace beyond the deadline: an async call's own cancellation reports first
            if events[i].wait(max(remaining, 0.0) + 0.05) and boxes[i]:
                out[i] = boxes[i][0]
            else:
                why = f"timed out after {self.timeout_s:g}s"
                out[i] = Outcome(error=why, brief=why)
        return out  # type: ignore[return-value]
