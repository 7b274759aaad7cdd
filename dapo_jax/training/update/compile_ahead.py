"""The first step's programs, compiled on background threads while the main thread loads, evaluates and
samples.

    ahead = CompileAhead([("rollout", lambda: actor.precompile(params, programs)),
                          ("update", lambda: learner.precompile(state))])   # on programs.blank()
    ...                      # eval@0 and step 1's rollout run meanwhile
    ahead.wait()             # at the end of step 1: nothing compiles after it

A run compiles every program before its first step ends: the evaluation's sampler, the rollout's, the
log-prob pass and the update (with packing, a program per chunk height). On the main thread they come one
after the other, and on a CPU they are most of the first minute (docs/benchmarks.md, "The first step").
Each job here lowers a program on the exact shapes, dtypes and layouts the step will call it with (the
caller's own code builds the arguments: `Actor.precompile`, `Learner.precompile`, from the programs'
declarations, `RunPrograms.sampler_programs` / `step_programs` and the packed update's `stages`, which
`dapo-jax plan` lowers too) and compiles it. JAX keeps the executable in the jitted function's cache, so
the step's call finds it; a call that comes while the same program is still compiling waits for that compilation instead
of starting another. A job may return more `(name, compile)` jobs (the chunk heights, each a program of its
own), which run on the other threads.

Nothing here can change a result: the step runs the programs it would have compiled itself. Should a job
not match the step's call (or fail), the step compiles its own program as before; `errors` keeps what
failed, and the `compilations` metric counts every compilation whichever thread made it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import jax

Job = tuple[str, Callable[[], Any]]


def abstract(tree):
    """Each array of `tree` as the `jax.ShapeDtypeStruct` a jitted function compiles for: its shape, dtype
    and sharding (none for an uncommitted array, which a jitted function places itself). The arrays
    themselves may be donated meanwhile."""
    def spec(x):
        if not isinstance(x, jax.Array):
            return x
        sharding = x.sharding if getattr(x, "committed", True) else None
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding, weak_type=x.weak_type)

    return jax.tree.map(spec, tree)


def compiled_outputs(fn, *args, **kwargs):
    """Compiles the jitted `fn` for these arguments (arrays or `jax.ShapeDtypeStruct`s) and returns its
    outputs as `ShapeDtypeStruct`s with the layouts the compiled program gives them: the arguments of the
    next program in the chain."""
    lowered = fn.lower(*args, **kwargs)
    compiled = lowered.compile()
    return jax.tree.map(lambda info, sharding: jax.ShapeDtypeStruct(info.shape, info.dtype, sharding=sharding,
                                                                    weak_type=getattr(info, "weak_type", False)),
                        lowered.out_info, compiled.output_shardings)


def run_outputs(layout: str, fn, args: tuple, kwargs: dict | None = None):
    """The run's `outputs` for `Program` declarations (`RunPrograms.step_programs`, `PackedUpdate.stages`):
    `compiled_outputs`, the layouts the compiled program really gives (`layout`, the plan's rule for them,
    is not needed)."""
    del layout
    return compiled_outputs(fn, *args, **(kwargs or {}))


@dataclasses.dataclass(frozen=True)
class Program:
    """One jitted program of a run with the inputs it is called with, declared once
    (training/update/programs.py's `RunPrograms.step_programs`, the packed update's `stages`): the run
    compiles it ahead (`compile`), the plan lowers it on its abstract inputs (training/plan/programs.py).

    `args` may be a function giving them: inputs that are another program's outputs, derived (and that
    program compiled, in a run) only when asked."""

    name: str
    fn: Any  # jitted (or jit_keeping_layout)
    args: Any  # tuple, or () -> tuple
    kwargs: dict = dataclasses.field(default_factory=dict)

    def inputs(self) -> tuple[tuple, dict]:
        """`(args, kwargs)` of the program."""
        return (self.args() if callable(self.args) else self.args), self.kwargs

    def lower(self):
        args, kwargs = self.inputs()
        return self.fn.lower(*args, **kwargs)

    def compile(self):
        return self.lower().compile()


def compile_jobs(programs: list[Program]) -> list[Job]:
    """`(name, compile)` jobs of `programs`, one each; a program whose inputs are another's outputs (its `args`
    a function) compiles in the same job as the program before it, which that function compiles."""
    jobs: list[list[Program]] = []
    for program in programs:
        if callable(program.args) and jobs:
            jobs[-1].append(program)
        else:
            jobs.append([program])
    def compile_all(group: list[Program]) -> None:  # returns nothing: a returned list would be more jobs
        for program in group:
            program.compile()

    return [(group[0].name, functools.partial(compile_all, group)) for group in jobs]


def default_workers() -> int:
    """One thread per core the main thread leaves free, at most 2 (each compilation of a large model holds
    gigabytes of host memory): on a 2-core CPU the main thread and one compiling thread fill the cores."""
    return max(1, min(2, (os.cpu_count() or 2) - 1))


class CompileAhead:
    """Runs compile jobs on `workers` background threads, from construction on."""

    def __init__(self, jobs: list[Job], *, workers: int | None = None,
                 context: Callable[[], Any] = contextlib.nullcontext):
        """`workers`: threads (default `default_workers()`). `context()`: entered around each job on its thread
        (JAX's mesh context is per thread: pass `lambda: jax.set_mesh(mesh)`)."""
        workers = workers or default_workers()
        self.done: list[str] = []
        self.errors: list[tuple[str, BaseException]] = []
        self._context = context
        self._lock = threading.Lock()
        self._futures: list[Future] = []
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dapo-compile")
        for job in jobs:
            self._submit(job)

    def _submit(self, job: Job) -> None:
        with self._lock:
            if self._pool is not None:
                self._futures.append(self._pool.submit(self._run, *job))

    def _run(self, name: str, compile_job: Callable[[], Any]) -> None:
        try:
            with self._context():
                more = compile_job()
        except Exception as e:  # noqa: BLE001 - the step compiles this program itself, as without this module
            logging.getLogger(__name__).debug("compiling %s ahead failed", name, exc_info=True)
            self.errors.append((name, e))
            return
        self.done.append(name)
        for job in more if isinstance(more, list) else ():  # a list of further jobs; anything else is a result
            self._submit(job)

    def wait(self) -> None:
        """Returns when every job (and every job they added) has ended."""
        while True:
            with self._lock:
                pending = [f for f in self._futures if not f.done()]
            if not pending:
                break
            for f in pending:
                f.result()
        self.close()

    def close(self) -> None:
        """Drops the jobs not started (a run that stopped early: its error is not held up by them); the
        compilations running end on their own (they cannot be stopped)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["CompileAhead", "Program", "abstract", "compile_jobs", "compiled_outputs", "run_outputs"]
