"""One-step off-policy rollouts: step k+1's rollout is generated while step k's update runs.

    prefetch = Prefetcher(collect, context=lambda: jax.set_mesh(mesh))
    groups, stats, carry = prefetch.take(step, state.params, carry)   # prefetched, else collected now
    prefetch.submit(step + 1, state.params, carry)                    # before the update donates params
    state = train_step(state, batch)                                  # runs while step+1 is generated

`collect(step, params, carry) -> (groups, stats, carry)` is the whole host side of a step's rollout
(generate -> decode -> reward -> dynamic sampling: `rollout.collect_groups`). With `θ_k` the params
after k updates, a synchronous run samples rollout k from `θ_{k-1}`; with `rollout.overlap` rollout
k+1 is submitted before update k and samples `θ_{k-1}` too, on one background thread, while update
k turns `θ_{k-1}` into `θ_k` (verl's one-step off-policy trainer). Update k+1 then trains `θ_k` on
tokens of `θ_{k-1}`: one step stale. The trainer recomputes `log π_old` with `θ_k` and the objective's
off-policy correction (docs/objectives.md#off-policy-correction: `dapo_tis`) weights each token by
`π_old / μ`, `μ` being
the sampler's `θ_{k-1}`; the config refuses `rollout.overlap` without a correction.

Only the params differ from a synchronous run: the rollout of step k+1 folds the same (step, round)
into the same key, reads the same prompts from the stream and the same carried groups.

The update donates its params, so `submit` takes a device copy for the sampler: while a rollout is
in flight the device holds one more copy of the params (in `model.param_dtype`), and the host holds
the prefetched groups until the next step takes them.

Exact resume: a checkpoint first waits for the rollout in flight (`drain`); the checkpoint then
holds that rollout's groups, stats and carry (`pack`), and the stream position after the prompts it
consumed, so a resumed run takes the same prefetched groups and equals the uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import jax
import jax.numpy as jnp

from dapo_jax.training.rollout import Groups

Collect = Callable[[int, Any, "Groups | None"], "tuple[Groups, dict, Groups | None]"]

_GROUPS, _CARRY = "prefetched_groups__", "prefetched_carry__"  # key prefixes in the checkpoint's carry item


@dataclasses.dataclass
class Prefetched:
    """A finished rollout for `step`: what `collect` returned (`stats` with `rollout_busy_s`, the
    collection's own wall time wherever it ran)."""

    step: int
    groups: Groups
    stats: dict
    carry: Groups | None


class Prefetcher:
    """At most one rollout in flight, on one background thread; `take` without a `submit` before it
    collects synchronously (overlap off, the first step, a resumed run without a prefetched rollout)."""

    def __init__(self, collect: Collect, *, context: Callable[[], Any] = contextlib.nullcontext,
                 ready: Prefetched | None = None):
        """`context()`: entered on the worker thread around each rollout (JAX's mesh context is per
        thread: pass `lambda: jax.set_mesh(mesh)`). `ready`: a rollout restored from a checkpoint."""
        self._collect, self._context = collect, context
        self._ready = ready
        self._pending: Future | None = None
        self._pool: ThreadPoolExecutor | None = None

    def _timed(self, step: int, params, carry: Groups | None) -> Prefetched:
        t0 = time.perf_counter()
        groups, stats, carry = self._collect(step, params, carry)
        return Prefetched(step, groups, {**stats, "rollout_busy_s": time.perf_counter() - t0}, carry)

    def take(self, step: int, params, carry: Groups | None) -> tuple[Groups, dict, Groups | None]:
        """Step `step`'s `(groups, stats, carry)`: the prefetched rollout (waiting for it), else one
        collected now with `params` and `carry`."""
        ready, self._ready = self.drain(), None
        if ready is None:
            ready = self._timed(step, params, carry)
        elif ready.step != step:
            raise RuntimeError(f"the prefetched rollout is for step {ready.step}, not step {step}")
        return ready.groups, ready.stats, ready.carry

    def submit(self, step: int, params, carry: Groups | None) -> None:
        """Starts collecting `step`'s rollout with a copy of `params` (the caller may donate `params`
        right after) and `carry` (the previous rollout's surplus)."""
        if self._pending is not None or self._ready is not None:
            raise RuntimeError(f"cannot submit step {step}: a prefetched rollout was not taken yet")
        snapshot = jax.tree.map(jnp.copy, params)  # new buffers, dispatched before the donating update

        def work() -> Prefetched:
            with self._context():
                return self._timed(step, snapshot, carry)

        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dapo-rollout")
        self._pending = self._pool.submit(work)

    def drain(self) -> Prefetched | None:
        """Waits for the rollout in flight (re-raising its error) and keeps it for `take`; returns the
        rollout that `take` will return next (None: nothing prefetched)."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._ready = pending.result()
        return self._ready

    def close(self) -> None:
        """Waits for a rollout still running (its result and error are dropped) and stops the thread."""
        pending, self._pending = self._pending, None
        if pending is not None:
            with contextlib.suppress(BaseException):
                pending.result()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def pack(carry: Groups | None, prefetched: Prefetched | None) -> tuple[dict | None, dict | None]:
    """The checkpoint's `carry` item (the carried groups' arrays under their own names, as without
    overlap, and the prefetched rollout's under prefixed names) and the JSON for its `meta`."""
    arrays = dict(carry.state_dict()) if carry is not None else {}
    meta = None
    if prefetched is not None:
        arrays.update({_GROUPS + k: v for k, v in prefetched.groups.state_dict().items()})
        if prefetched.carry is not None:
            arrays.update({_CARRY + k: v for k, v in prefetched.carry.state_dict().items()})
        meta = {"step": prefetched.step, "stats": prefetched.stats, "has_carry": prefetched.carry is not None}
    return (arrays or None), meta


def unpack(arrays: dict | None, meta: dict | None) -> tuple[Groups | None, Prefetched | None]:
    """Inverse of `pack`: `(carry, prefetched)`."""
    arrays = arrays or {}

    def groups(prefix: str) -> dict:
        return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}

    own = {k: v for k, v in arrays.items() if not k.startswith((_GROUPS, _CARRY))}
    carry = Groups.from_state_dict(own) if own else None
    if meta is None:
        return carry, None
    prefetched_carry = Groups.from_state_dict(groups(_CARRY)) if meta.get("has_carry") else None
    return carry, Prefetched(int(meta["step"]), Groups.from_state_dict(groups(_GROUPS)),
                             dict(meta["stats"]), prefetched_carry)
