"""Running user code (tools, environment steps) so that it can neither hang nor crash a run.

    outcomes = run_contained([(fn, args), ...], timeout=5.0)   # one `Outcome` per call, in order

Every call starts at once: a plain function in a daemon thread of its own, a coroutine function on
one shared event loop (a daemon thread too), so the calls of every paused episode overlap. The
caller waits for all of them until one common deadline; a call still running then is abandoned
(an async one is cancelled) and reported as `"timeout"`. A daemon thread never keeps the process
alive, so a tool stuck in an endless loop costs one idle thread, never the run. A call that raises
is reported as `"error"` with the exception's one-line summary.

What this cannot contain: a coroutine that blocks its event loop (a `time.sleep` inside an
`async def`) delays the other coroutines until it yields; the caller's deadline still holds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
import threading
import time
from typing import Any, Callable, NamedTuple


class Outcome(NamedTuple):
    """What one contained call gave: `status` is "ok", "error" or "timeout"."""

    status: str
    value: Any = None  # the return value when "ok"
    error: str = ""  # one line when "error" or "timeout"


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _shared_loop() -> asyncio.AbstractEventLoop:
    """The event loop the async tools run on, started once in a daemon thread."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="dapo_jax-tools", daemon=True).start()
            _LOOP = loop
    return _LOOP


def _start(fn: Callable, args: tuple, kwargs: dict) -> cf.Future:
    if inspect.iscoroutinefunction(fn):
        return asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), _shared_loop())
    future: cf.Future = cf.Future()

    def target():
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - user code: anything it raises is the tool's error
            future.set_exception(exc)

    threading.Thread(target=target, name=f"dapo_jax-call-{getattr(fn, '__name__', 'fn')}", daemon=True).start()
    return future


def one_line(exc: BaseException, limit: int = 200) -> str:
    """`TypeName: message`, on one line, at most `limit` characters."""
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_contained(calls: list[tuple[Callable, tuple, dict]], *, timeout: float) -> list[Outcome]:
    """Runs every `(fn, args, kwargs)` concurrently; waits at most `timeout` seconds for all of them."""
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    futures = []
    for fn, args, kwargs in calls:
        try:
            futures.append(_start(fn, args, kwargs))
        except BaseException as exc:  # noqa: BLE001 - calling an async fn can raise before it runs
            failed: cf.Future = cf.Future()
            failed.set_exception(exc)
            futures.append(failed)
    deadline = time.monotonic() + timeout
    cf.wait(futures, timeout=max(deadline - time.monotonic(), 0.0))
    outcomes = []
    for future in futures:
        if not future.done():
            future.cancel()  # cancels an async call; a thread cannot be stopped and is left to finish alone
            outcomes.append(Outcome("timeout", error=f"timed out after {timeout:g} s"))
        elif future.cancelled():
            outcomes.append(Outcome("error", error="cancelled"))
        elif future.exception() is not None:
            outcomes.append(Outcome("error", error=one_line(future.exception())))
        else:
            outcomes.append(Outcome("ok", future.result()))
    return outcomes
