"""A check that one process makes for all (process 0 takes the run dir's lock) ends every process alike.

    found = agree("the run dir's lock", None if ok else "the one-line error", timeout_s=300)  # {process: error}
    if found: raise ConfigError(...)     # on every process, each with the line the finder wrote

Left alone, process 0 raises its one line and exits 2, while the others go on into the first
collective, which waits for process 0; JAX's coordination service, which lives in process 0, then
waits in its shutdown barrier for them until the heartbeat timeout (100 s), blames the lost task and
aborts from C++ (exit 134, a stack dump), and the others stop blaming process 0 as lost (exit 7).

Every process calls `agree` at the same point of its start-up with what it found: each publishes its
verdict under `dapo_jax/agree/<name>/<call>/<i>` in JAX's key-value store and reads every other's.
When any process found an error, every process raises (its caller's one line), all of them reach JAX's
shutdown barrier together at exit, and the run ends at once and cleanly. A process that does not reach
the point within `timeout_s` is `PeerLost` (exit 7). Calls are numbered per name, so a second run in
the same processes (`dapo-jax stages`) agrees afresh.
"""

from __future__ import annotations

import collections
import re
import time

import jax

from dapo_jax.parallel.peers import PeerLost, coordination_client

KEY = "dapo_jax/agree/{}/{}/{}"
_OK = "ok"
_calls: collections.Counter[str] = collections.Counter()


def agree(name: str, error: str | None, *, timeout_s: float) -> dict[int, str]:
    """Every process's error at this point (`{process: one line}`; empty when all found none), on every
    process. In a one-process run: this process's own, without communication. Every process of the run
    must call it at the same point with the same `name`."""
    me = jax.process_index()
    client = coordination_client() if jax.process_count() > 1 else None
    if client is None:
        return {me: error} if error else {}
    key = re.sub(r"\W+", "_", name)
    call = _calls[key]
    _calls[key] += 1
    client.key_value_set(KEY.format(key, call, me), _OK if error is None else "error " + error)
    found, late, deadline = {me: error} if error else {}, [], time.monotonic() + timeout_s
    for p in range(jax.process_count()):
        if p == me:
            continue
        try:
            wait_ms = max(int((deadline - time.monotonic()) * 1000), 1)
            verdict = client.blocking_key_value_get(KEY.format(key, call, p), wait_ms)
        except Exception:  # noqa: BLE001 - timed out, or the store (in process 0) is gone
            late.append(p)
            continue
        if verdict != _OK:
            found[p] = verdict.removeprefix("error ")
    if late and not found:
        raise PeerLost(f"process(es) {late} of the run's {jax.process_count()} did not reach {name} within "
                       f"{timeout_s:g} s (mesh.distributed.start_timeout_s), so process {me} stops too: check "
                       f"their logs, then rerun the same command on every process")
    return found


__all__ = ["agree"]
