"""Another process of a multi-process run is gone: say which one, and stop.

    with PeerWatch():      # a daemon thread bumps this process's counter in JAX's key-value store
        ...                # an exception while a peer has stopped answering becomes PeerLost (exit 7)

A process that dies (the OOM killer, a lost host, kill -9) makes the others' next collective fail
(Gloo: "Connection reset by peer"; the training loop runs one every step), a traceback that names no
process. Left alone, the survivor's exit then waits for the dead one in JAX's shutdown barrier until
the coordination service's heartbeat timeout (100 s) and ends in a C++ abort with a stack dump
(exit 134). PeerWatch turns it into one line that names the lost processes: each process bumps its
own key `dapo_jax/alive/<i>` every `beat_s` seconds; when an exception leaves the block, the peers
whose counter stood still for `settle_s` seconds are the lost ones (all of them, when the store
itself, which lives in process 0, cannot be reached). A failed checkpoint save is checked the same way
(Orbax's save runs collectives, so a peer killed during a save fails it with "Connection reset by
peer"): with a peer gone it is `PeerLost`, not a folder's `CheckpointSaveError`. `PeerLost` asks the checkpointer not to wait
for a save that needs the dead process, and the CLI exits at once (`os._exit`), skipping the
shutdown barrier. A survivor that waits where no error comes (a save's barrier in the coordination
service waits for a killed peer until the heartbeat timeout) is ended by the watch thread itself: a peer
seen alive whose counter stands still for `lost_s` (30 s) is lost, and the thread prints the same one
line and exits 7. A process that leaves its PeerWatch (finished, or stopping on its own) marks its
counter `done`, so a peer that ends first is never taken for a lost one.

Not covered: the death of process 0, the coordinator. The JAX client of every other process aborts
at once from C++ when its connection to the coordination service breaks (JAX's own message, exit
134): no Python code runs.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import jax

from dapo_jax.parallel.stopped import RunStopped

KEY = "dapo_jax/alive/{}"


class PeerLost(RunStopped):
    """Another process of the run is gone; this one stops too (exit 7)."""

    exit_code = 7
    abandon_saves = True


def coordination_client():
    """JAX's distributed runtime client (its key-value store), or None in a one-process run."""
    from jax._src import distributed  # no public accessor; Orbax reads it the same way

    return distributed.global_state.client


DONE = "done"  # a process's counter once it has left its PeerWatch (finished, or stopping on its own)
LOST_S = 30.0  # a peer seen alive whose counter stands still this long is lost, whatever this process is doing


class PeerWatch:
    def __init__(self, *, beat_s: float = 1.0, settle_s: float = 3.0, lost_s: float = LOST_S):
        self.beat_s, self.settle_s, self.lost_s = beat_s, settle_s, lost_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.client = None

    def __enter__(self) -> "PeerWatch":
        if jax.process_count() > 1 and coordination_client() is not None:
            self.client = coordination_client()
            self.me, self.n = jax.process_index(), jax.process_count()
            self._beat()  # the first beat before anyone can ask
            self._thread = threading.Thread(target=self._run, name="dapo-jax-alive", daemon=True)
            self._thread.start()
        return self

    def _beat(self, count: int = 0) -> None:
        self.client.key_value_set(KEY.format(self.me), str(count), allow_overwrite=True)

    def _run(self) -> None:
        """Beats, and watches the others: a peer seen alive whose counter stands still for `lost_s` is gone
        even when this process waits where no error comes (a save's barrier in the coordination service
        waits for a killed peer until JAX's heartbeat timeout, 100 s, then aborts from C++): this thread then
        says so in one line and ends the process with PeerLost's exit code, as the CLI would."""
        count, seen = 1, {}  # peer -> (its last counter, when it last moved)
        while not self._stop.wait(self.beat_s):
            try:
                self._beat(count)
                now = time.monotonic()
                for p in range(self.n):
                    value = None if p == self.me else self.client.key_value_try_get(KEY.format(p))
                    if value is None or value == DONE:
                        seen.pop(p, None)
                    elif seen.get(p, (None,))[0] != value:
                        seen[p] = (value, now)
            except Exception:  # noqa: BLE001 - the store is gone (process 0 died): nothing left to tell
                return
            lost = sorted(p for p, (_, moved) in seen.items() if now - moved > self.lost_s)
            if lost and not self._stop.is_set():
                lost_now(PeerLost(f"process(es) {lost} of the run's {self.n} stopped answering {self.lost_s:g} s ago "
                                  f"(killed, out of memory or a lost host?), so process {self.me} stops too. Rerun "
                                  f"the same command on every process to resume from the last checkpoint"))
                return
            count += 1

    def lost(self) -> list[int]:
        """The other processes whose counter did not move in `settle_s` seconds (every other process
        when the store cannot be read)."""
        others = [p for p in range(self.n) if p != self.me]
        try:
            before = {p: self.client.key_value_try_get(KEY.format(p)) for p in others}
            time.sleep(self.settle_s)
            after = {p: self.client.key_value_try_get(KEY.format(p)) for p in others}
        except Exception:  # noqa: BLE001 - the coordination service (in process 0) is unreachable
            return others
        return [p for p in others if after[p] is None or after[p] == before[p]]

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self.client is not None:
            try:
                self.client.key_value_set(KEY.format(self.me), DONE, allow_overwrite=True)  # gone on purpose
            except Exception:  # noqa: BLE001 - the store is gone (process 0 died)
                pass
        if self.client is None or exc is None or isinstance(exc, KeyboardInterrupt):
            return
        if isinstance(exc, RunStopped) and not exc.peer_may_be_the_cause:  # PeerLost itself, a preemption, ...
            return
        lost = self.lost()
        if lost:
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            raise PeerLost(f"process(es) {lost} of the run's {self.n} stopped answering (killed, out of memory or "
                           f"a lost host?), so process {self.me} stops too; what it saw: {type(exc).__name__}: "
                           f"{first}. Rerun the same command on every process to resume from the last "
                           f"checkpoint") from exc


def lost_now(error: PeerLost) -> None:
    """Ends this process from the watch thread: the one line the CLI prints for `error`, then its exit code
    (`os._exit`: the main thread may be blocked in C++, and JAX's shutdown barrier would wait for the lost
    peer)."""
    sys.stderr.write(f"dapo-jax: {type(error).__name__}: {error}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(error.exit_code)
