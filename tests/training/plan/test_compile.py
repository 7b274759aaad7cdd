"""Compiling for the plan (training/plan/compile.py): the refusal read, the per-layer line, the cache."""

import importlib.util
import json
from pathlib import Path

import pytest

from dapo_jax.training.plan.compile import Figures, extrapolate, lower_for, parse_refusal, shard_bytes

GiB = 2**30


@pytest.mark.parametrize("message, required, available", [
    ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (23.78G) exceeds "
     "available HBM (15.75G).", 23.78 * GiB, 15.75 * GiB),
    ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 235.10G of "
     "95.74G hbm. Exceeded hbm capacity by 139.36G.", 235.10 * GiB, 95.74 * GiB),
    ("RESOURCE_EXHAUSTED: ... required for HLO temporaries (512.00M) exceeds available HBM (15.75G)", 512 * 2**20,
     15.75 * GiB),
])
def test_refusals_are_read_in_binary_units(message, required, available):
    assert parse_refusal(message) == (int(required), int(available))


def test_other_errors_are_not_refusals():
    assert parse_refusal("INVALID_ARGUMENT: the shapes do not match") is None
    assert parse_refusal("RESOURCE_EXHAUSTED: too many open files") is None


def test_extrapolation_is_the_line_through_two_compiles():
    f2 = Figures(arguments=200, outputs=100, temporaries=1000, aliased=90, resident_args=150, held=10)
    f3 = Figures(arguments=260, outputs=130, temporaries=1300, aliased=120, resident_args=200, held=10)
    f64 = extrapolate(f2, f3, 2, 3, 64)
    assert (f64.arguments, f64.outputs, f64.temporaries, f64.aliased, f64.resident_args, f64.held) == (
        200 + 62 * 60, 100 + 62 * 30, 1000 + 62 * 300, 90 + 62 * 30, 150 + 62 * 50, 10)
    assert f64.added == f64.arguments - f64.resident_args + f64.outputs - f64.aliased + f64.temporaries + f64.held
    refused = Figures(1, 1, 50 * GiB, 0, refused="RESOURCE_EXHAUSTED ...", available=int(15.75 * GiB))
    assert extrapolate(f2, refused, 2, 3, 4).refused and extrapolate(f2, refused, 2, 3, 4).available == refused.available


def test_resident_arguments_count_only_what_the_program_keeps(tmp_path):
    """jit drops an unused argument: its bytes are neither in the program's arguments nor in its resident part."""
    import jax
    import jax.numpy as jnp

    params = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    unused = jax.ShapeDtypeStruct((512, 512), jnp.float32)
    x = jax.ShapeDtypeStruct((8, 256), jnp.float32)
    fn = jax.jit(lambda p, u, x: x @ p)
    m = lower_for(lambda: fn.lower(params, unused, x), target="t", args=((params, unused, x), {}),
                  resident=(params, unused), cache=tmp_path)
    figures, _, cached = m.run()
    assert not cached and m.resident_args == 256 * 256 * 4
    assert figures.arguments == 256 * 256 * 4 + 8 * 256 * 4  # what XLA counts: the kept ones
    again, _, cached = lower_for(lambda: fn.lower(params, unused, x), target="t", args=((params, unused, x), {}),
                                 resident=(params,), cache=tmp_path).run()
    assert cached and again.arguments == figures.arguments and again.temporaries == figures.temporaries
    assert len(list(tmp_path.glob("*.json"))) == 1
    other, _, cached = lower_for(lambda: fn.lower(params, unused, x), target="another chip", args=((params, unused, x), {}),
                                 cache=tmp_path).run()
    assert not cached and len(list(tmp_path.glob("*.json"))) == 2  # the target is part of the key
    assert json.loads(next(tmp_path.glob("*.json")).read_text())["arguments"] == figures.arguments


def test_shard_bytes_divides_by_the_sharding():
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((4, 2), ("a", "b"), devices=jax.devices()[:8])
    x = jax.ShapeDtypeStruct((64, 32), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec("a", "b")))
    y = jax.ShapeDtypeStruct((64,), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))
    assert shard_bytes([x, y]) == 64 * 32 * 2 // 8 + 64 * 4


def _deeper_tiny(tmp_path, layers: int) -> Path:
    hf = json.loads(Path("dapo_jax/assets/tiny_base/config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**hf, "num_hidden_layers": layers}))
    return tmp_path


@pytest.mark.slow
def test_extrapolation_matches_a_full_compile_within_2_percent(tmp_path):
    """An 8-layer model whose update and log-prob pass scan their layers (remat: full): compiled at 2 and 3 layers
    and extrapolated, against all 8 layers compiled (on this CPU the line is exact to a few bytes)."""
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.plan.memory import make_plan

    cfg = load_config("tiny_dapo", ["model.remat=full", "data.eval=null", "rollout.recompute_old_logp=true",
                                   "optim.packing=false"])  # one update program
    kw = dict(model_config=_deeper_tiny(tmp_path, 8), only=("prepare", "update"), cache=tmp_path / "cache")
    line, whole = make_plan(cfg, **kw), make_plan(cfg, exact=True, **kw)
    assert [p.layers for p in line.programs] == [(2, 3), (2, 3)] and [p.layers for p in whole.programs] == [(8,), (8,)]
    for a, b in zip(line.programs, whole.programs):
        assert a.name == b.name
        assert a.figures.added == pytest.approx(b.figures.added, rel=0.02), a.name
        assert a.figures.temporaries == pytest.approx(b.figures.temporaries, rel=0.02), a.name
        assert a.figures.arguments == pytest.approx(b.figures.arguments, rel=0.02), a.name
    for a, b in zip(line.phases, whole.phases):
        assert a.total == pytest.approx(b.total, rel=0.02), a.name


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed")
def test_small_tpu_programs_are_compiled_whole(tmp_path):
    """On a TPU a small program may keep buffers in on-chip VMEM at 2 or 3 layers (memory_analysis leaves them out)
    and not at 8, so its figures leave the line: the plan compiles it at the full depth, as --exact does."""
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.plan.memory import make_plan

    # The smallest batch the 4 devices split (each TPU compile of it takes a third less time than tiny_dapo's
    # 16 x 8): the rule is about the route the plan takes, its figures are far under SMALL either way.
    cfg = load_config("tiny_dapo", ["model.remat=full", "mesh.fsdp=4", "data.eval=null", "optim.packing=false",
                                   "rollout.train_batch=4", "rollout.gen_batch=4", "rollout.G=2",
                                   "optim.num_minibatches=1", "rollout.max_new_tokens=4"])
    kw = dict(topology="v5e-4", model_config=_deeper_tiny(tmp_path, 8), only=("update",), cache=tmp_path / "cache")
    plan = make_plan(cfg, **kw)
    exact = make_plan(cfg, exact=True, **kw)  # the same 8-layer program: from the cache
    (p,), (e,) = plan.programs, exact.programs
    assert p.layers == (8,) and e.cached and p.figures.added == e.figures.added


def test_only_programs_small_at_full_depth_are_compiled_whole():
    """The rule on figures compiled at 2 and 3 layers (GiB of temporaries, the line to the full depth): the
    0.5B AdamW update (0.293, 0.296 -> 0.36 at 24) is compiled whole on a TPU; the 32B one (0.305, 0.365 ->
    4.0 at 64) is not, nor anything refused or compiled for a CPU."""
    from dapo_jax.training.plan.memory import compile_whole
    from dapo_jax.training.plan.compile import Figures

    def figs(*gib, refused=None):
        return {n: Figures(0, 0, int(g * 2**30), 0, refused=refused) for n, g in zip((2, 3), gib)}

    assert compile_whole(figs(0.293, 0.296), 24, platform="tpu")
    assert not compile_whole(figs(0.305, 0.365), 64, platform="tpu")
    assert compile_whole(figs(0.305, 0.365), 4, platform="tpu")  # 0.43 GiB at 4 layers
    assert not compile_whole(figs(0.293, 0.296), 24, platform="cpu")
    assert not compile_whole(figs(0.1, 0.1, refused="RESOURCE_EXHAUSTED"), 24, platform="tpu")
    assert not compile_whole({2: figs(0.1, 0.1)[2]}, 24, platform="tpu")


def test_an_extrapolated_rollout_says_its_line_is_approximate(tmp_path):
    """The sampler unrolls its layers: a 4-layer model's rollout (the shallowest one the plan extrapolates to: the
    exact plan's unrolled sampler is the costly compile), compiled at 2 and 3 layers, comes with the measured
    bounds of its line and the way to exact figures; an exact plan has no such note."""
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.plan.memory import make_plan

    cfg = load_config("tiny_dapo", ["data.eval=null"])
    kw = dict(model_config=_deeper_tiny(tmp_path, 4), only=("rollout",), cache=tmp_path / "cache")
    line = make_plan(cfg, **kw)
    assert [p.layers for p in line.programs] == [(2, 3)]
    assert any("unrolled" in n and "--exact" in n for n in line.notes), line.notes
    whole = make_plan(cfg, exact=True, **kw)
    assert [p.layers for p in whole.programs] == [(4,)] and not any("unrolled" in n for n in whole.notes)


def test_a_shorter_chunk_is_bounded_by_the_taller_one_when_extrapolating(tmp_path):
    """With a line in the depth, the packed update's tail chunks (the same program on fewer rows) are not compiled:
    they take the full chunk's figures, and say so. Compiled whole (--exact), each needs no more than that bound."""
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.plan.memory import make_plan
    from dapo_jax.training.plan.report import format_plan

    cfg = load_config("tiny_dapo", ["data.eval=null", "optim.packing=true", "optim.packing_rows=8",
                                   "optim.packing_tail_rows=4"])
    kw = dict(model_config=_deeper_tiny(tmp_path, 4), only=("update: chunk",), cache=tmp_path / "cache")
    line, whole = make_plan(cfg, **kw), make_plan(cfg, exact=True, **kw)
    tall, short = line.programs
    assert tall.name.startswith("update: chunk 8x") and short.name.startswith("update: chunk 4x")
    assert tall.layers == (2, 3) and tall.bounded_by is None and tall.compile_s > 0
    assert short.bounded_by == tall.name and short.compile_s == 0 and short.figures == tall.figures
    assert any("not compiled" in n and short.name in n and "--exact" in n for n in line.notes), line.notes
    assert [p.bounded_by for p in whole.programs] == [None, None] and [p.layers for p in whole.programs] == [(4,), (4,)]
    w_tall, w_short = whole.programs
    assert 0 < w_short.figures.temporaries < w_tall.figures.temporaries  # the bound holds, and is not an equality
    assert w_short.figures.added <= w_tall.figures.added
    assert f"at most {tall.name}'s: not compiled" in format_plan(line)
