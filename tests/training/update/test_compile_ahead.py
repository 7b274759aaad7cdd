"""Programs compiled on background threads are the ones the step runs: the step's call compiles nothing again."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from dapo_jax.parallel.mesh import make_mesh
from dapo_jax.training import loop
from dapo_jax.training.update.compile_ahead import (CompileAhead, Program, abstract, compile_jobs, compiled_outputs,
                                                     run_outputs)
from dapo_jax.training.config.run import load_config
from dapo_jax.training.metrics import compile_count


class Compiles:
    """(thread name, program name) of every XLA compilation while it is installed."""

    def __init__(self):
        self.seen: list[tuple[str, str]] = []
        jax.monitoring.register_event_duration_secs_listener(self._on)

    def _on(self, event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            name = str(kwargs.get("fun_name"))  # "jit(generate_fn)"
            self.seen.append((threading.current_thread().name, name[4:-1] if name.startswith("jit(") else name))

    def on(self, thread_prefix: str) -> list[str]:
        return [name for thread, name in self.seen if thread.startswith(thread_prefix)]

    def close(self):
        jax.monitoring.unregister_event_duration_listener(self._on)


@pytest.fixture
def compiles():
    c = Compiles()
    yield c
    c.close()


def test_a_chain_compiled_ahead_on_another_thread_is_not_compiled_again_by_the_calls(compiles):
    mesh = make_mesh(2, 4, 1)
    x = jax.device_put(np.arange(64, dtype=np.float32).reshape(8, 8), NamedSharding(mesh, P("data", "fsdp")))
    first = jax.jit(lambda v: (jnp.sin(v) @ v.T, v.sum(0)))
    second = jax.jit(lambda m, s: m * s[None, :] + 1.0)

    def job():
        out = compiled_outputs(first, abstract(x))  # the next program's arguments, as the first lays them out
        return [("second", lambda: second.lower(*out).compile())]

    ahead = CompileAhead([("first", job)], workers=2)
    ahead.wait()
    assert ahead.errors == [] and sorted(ahead.done) == ["first", "second"]
    before = compile_count()
    y = second(*first(x))
    assert compile_count() == before  # both found compiled
    np.testing.assert_allclose(y, (np.sin(x) @ np.asarray(x).T) * np.asarray(x).sum(0)[None, :] + 1.0, rtol=1e-5)
    assert sorted(compiles.on("dapo-compile")) == ["<lambda>", "<lambda>"]


def test_abstract_keeps_layouts_and_leaves_uncommitted_arrays_unplaced():
    placed = jax.device_put(np.zeros((8, 2), np.float32), NamedSharding(make_mesh(8, 1, 1), P("data")))
    spec = abstract({"w": placed, "n": jnp.zeros((), jnp.int32), "k": 3})
    assert spec["w"].sharding == placed.sharding and spec["w"].shape == (8, 2)
    assert spec["n"].sharding is None and spec["n"].dtype == jnp.int32 and spec["k"] == 3


def test_a_failed_job_is_kept_and_the_others_run():
    ran = []

    def fail():
        raise ValueError("no such shape")

    ahead = CompileAhead([("bad", fail), ("good", lambda: ran.append(1))], workers=1)
    ahead.wait()
    assert ran == [1] and ahead.done == ["good"] and [n for n, _ in ahead.errors] == ["bad"]
    ahead.wait()  # again: nothing left, returns


def test_close_drops_the_jobs_not_started():
    gate, ran = threading.Event(), []
    ahead = CompileAhead([("slow", gate.wait), ("later", lambda: ran.append(1))], workers=1)
    time.sleep(0.1)
    gate.set()
    ahead.close()
    assert ran == []


class Synchronous(CompileAhead):
    """Every job done before the run goes on: whatever the step compiles then, the warm-up did not cover."""

    made: list = []

    def __init__(self, jobs, **kwargs):
        super().__init__(jobs, **kwargs)
        self.wait()
        Synchronous.made.append(self)


@pytest.mark.parametrize("extra", [["optim.packing=true"], ["optim.packing=false"]], ids=["packed", "unpacked"])
def test_the_run_compiles_none_of_the_programs_compiled_ahead(tiny_model_dir, tmp_path, overrides_for, monkeypatch,
                                                             compiles, extra):
    monkeypatch.setattr(loop, "CompileAhead", Synchronous)
    Synchronous.made = []
    cfg = load_config(None, overrides_for(tiny_model_dir, tmp_path / "run", **{"train.steps": 1},
                                          **dict(e.split("=") for e in extra)))
    loop.train(cfg)
    (ahead,) = Synchronous.made
    assert ahead.errors == [], ahead.errors
    ahead_names = compiles.on("dapo-compile")
    main = compiles.on("MainThread")
    assert ahead_names.count("generate_fn") == 1 and "prepare" in ahead_names
    assert main.count("generate_fn") == 1  # the evaluation's sampler; the rollout's was compiled ahead
    for name in ("prepare", "_add_chunk", "zero_accumulator", "_start", "step_fn"):  # PackedUpdate's stages
        assert name not in main, (name, main)
    if extra == ["optim.packing=true"]:
        assert ahead_names.count("_add_chunk") == 2  # a program per chunk height (R and the R/2 tail), each once
    else:
        assert "step_fn" in ahead_names


def test_compile_jobs_runs_a_program_whose_inputs_are_outputs_after_the_program_that_gives_them():
    """`compile_jobs`: one job per program, but a program declared with its inputs as a function (another's
    outputs) shares the job of the program before it; nothing is compiled before the jobs run, and each
    program compiles for exactly the inputs the declaration gives it."""
    asked = []

    def double(x):
        return x * 2

    def total(y):
        return y.sum()

    first, second, third = jax.jit(double), jax.jit(total), jax.jit(lambda x: x + 1)
    x = jax.ShapeDtypeStruct((4, 3), jnp.float32)

    def from_first():
        asked.append("second's inputs")
        return (run_outputs("rows", first, (x,)),)

    programs = [Program("first", first, (x,)), Program("second", second, from_first), Program("third", third, (x,))]
    jobs = compile_jobs(programs)
    assert [name for name, _ in jobs] == ["first", "third"] and asked == []
    assert jobs[0][1]() is None  # a job returns nothing (a list would be more jobs for CompileAhead)
    assert asked == ["second's inputs"]
    (y,) = programs[1].inputs()[0]
    assert (y.shape, y.dtype) == ((4, 3), jnp.float32)
    compiled = programs[1].compile()
    assert compiled.out_info.shape == () and float(compiled(np.ones((4, 3), np.float32))) == 12.0
