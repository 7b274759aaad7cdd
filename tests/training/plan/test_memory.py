"""`dapo-jax plan`: per-device memory from ahead-of-time compiled programs, checked against figures
computed here from the model's config.json and the sharding rules (no weights are loaded); its verdict
and exit codes; a TPU slice compiled for from this CPU machine."""

import dataclasses
import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import pytest

from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import load_config

TINY = "configs/tiny_dapo.yaml"
GiB = 2**30
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not installed (pip install 'dapo_jax[tpu]')")


def independent_param_bytes(hf: dict, *, fsdp: int = 1, itemsize: int = 4) -> int:
    """Per-device parameter bytes of a tied-embedding qwen2 config.json with every weight matrix split
    `fsdp` ways (the rules shard one dimension of each matrix over fsdp; vectors are replicated)."""
    d, i, v, layers = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"], hf["num_hidden_layers"]
    h, kv = hf["num_attention_heads"], hf["num_key_value_heads"]
    hd = hf.get("head_dim", d // h)
    matrices = v * d + layers * (d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * i)
    vectors = layers * (h * hd + 2 * kv * hd + 2 * d) + d  # q/k/v biases, 2 norms per layer, final norm
    assert hf["tie_word_embeddings"]  # no separate lm_head
    return (matrices // fsdp + vectors) * itemsize


@pytest.fixture(scope="module")
def tiny_hf():
    from dapo_jax.training.config.paths import resolve_path

    return json.loads((resolve_path("dapo_jax/assets/tiny_base") / "config.json").read_text())


@pytest.fixture(scope="module")
def tiny_plan():
    from dapo_jax.training.plan.memory import make_plan

    return make_plan(load_config(TINY, ["optim.packing=false"]), cache=False)  # the padded update: one program


def test_tiny_plan_figures_match_independent_counts(tiny_plan, tiny_hf):
    p = tiny_plan
    assert p.resident["parameters"] == independent_param_bytes(tiny_hf)
    # AdamW's two moments + its count and the schedule's count, the step counters (int32 scalars)
    assert 2 * p.resident["parameters"] < p.resident["optimizer state"] <= 2 * p.resident["parameters"] + 64
    assert p.resident["reference"] == p.resident["critic (parameters + optimizer)"] == 0  # DAPO: no KL, no critic
    programs = {x.name: x for x in p.programs}
    assert set(programs) == {"rollout", "eval rollout", "prepare", "update"}  # tiny_dapo: unpacked, no recompute
    assert [x.name for x in p.phases] == ["rollout", "eval rollout", "log-prob", "update"]
    up = programs["update"].figures
    # the state is donated: its buffers are reused for the new state (alias bytes cover params + moments)
    assert up.aliased >= p.resident["parameters"] + p.resident["optimizer state"] - 8
    assert up.resident_args == p.resident["parameters"] + p.resident["optimizer state"]
    phase = {x.name: x for x in p.phases}
    assert phase["update"].total == p.resident_total + up.arguments - up.resident_args + up.outputs - up.aliased \
        + up.temporaries
    ro = programs["rollout"].figures
    assert ro.resident_args == p.resident["parameters"]
    assert phase["rollout"].total == p.resident_total + ro.arguments - p.resident["parameters"] + ro.outputs + ro.temporaries
    # KV cache: 2 (k, v) x layers x (gen_batch prompts x S + gen_batch x G x (T-1) response slots) x H_kv x D x 4 B
    cfg = load_config(TINY, ["optim.packing=false"])
    r = cfg.rollout
    slots = r.gen_batch * cfg.data.max_prompt_length + r.gen_batch * r.G * (r.max_new_tokens - 1)
    assert p.kv_cache == 2 * tiny_hf["num_hidden_layers"] * slots * tiny_hf["num_key_value_heads"] * tiny_hf["head_dim"] * 4
    assert ro.temporaries >= p.kv_cache
    assert p.peak == max(x.total for x in p.phases) and p.fits and p.num_params == independent_param_bytes(tiny_hf) // 4
    assert all(x.attention for x in p.programs if x.name != "prepare") and p.estimate is None


def test_the_report_prints_every_phase_and_the_verdict(tiny_plan):
    from dapo_jax.training.plan.report import format_plan, plan_dict, verdict_lines

    text = format_plan(tiny_plan)
    for label in ("parameters", "optimizer state", "inputs", "temporaries", "of which KV cache", "total", "rollout",
                  "eval rollout", "log-prob", "update", "programs", "VERDICT: fits"):
        assert label in text, label
    d = plan_dict(tiny_plan)
    assert d["peak"] == tiny_plan.peak and d["fits"] and d["over"] == []
    assert d["programs"][3]["figures"]["aliased"] == tiny_plan.programs[3].figures.aliased
    json.dumps(d)
    small = dataclasses.replace(tiny_plan, capacity=1024, capacity_source="--device-memory")
    lines = verdict_lines(small)
    assert lines[0] == "VERDICT: does not fit" and len(lines) == 1 + len(tiny_plan.phases)
    assert any(line.strip().startswith("update does not fit: needs ") and "per device, the chip has 0.00 GiB" in line
               for line in lines)


def test_a_fit_within_the_rollout_lines_error_is_flagged(tiny_plan):
    """A rollout extrapolated from 2 and 3 layers whose temporaries, 41% under the truth as the line has been
    measured, would not fit: the verdict still says fits (its figures do) and names the phase, the bytes
    and --exact; with room for that error, or compiled whole, it says nothing more."""
    from dapo_jax.training.plan.memory import ROLLOUT_LINE_LOW
    from dapo_jax.training.plan.report import plan_dict, verdict_lines

    programs = [dataclasses.replace(p, layers=(2, 3)) if p.phase == "rollout" else p for p in tiny_plan.programs]
    others = max(x.total for x in tiny_plan.phases if x.name != "rollout")
    phases = [dataclasses.replace(x, total=x.total + others, added={**x.added, "temporaries": x.added["temporaries"]
                                                                    + others}) if x.name == "rollout" else x
              for x in tiny_plan.phases]  # a rollout whose temporaries set the peak, as at DAPO's lengths
    rollout = {x.name: x for x in phases}["rollout"]
    temps = rollout.added["temporaries"]
    worst = rollout.total - temps + int(temps / (1 - ROLLOUT_LINE_LOW))
    assert worst > rollout.total > others
    tight = dataclasses.replace(tiny_plan, programs=programs, phases=phases, capacity=rollout.total)
    lines = verdict_lines(tight)
    assert lines[0].startswith("VERDICT: fits") and len(lines) == 2
    assert "rollout is extrapolated" in lines[1] and f"it would need {worst / 2**30:.2f} GiB" in lines[1]
    assert "--exact --only 'rollout'" in lines[1] and plan_dict(tight)["uncertain"] == {"rollout": worst}
    roomy = dataclasses.replace(tight, capacity=worst)
    assert len(verdict_lines(roomy)) == 1 and plan_dict(roomy)["uncertain"] == {}
    whole = dataclasses.replace(tight, programs=tiny_plan.programs)  # compiled at its depth: its figures are exact
    assert len(verdict_lines(whole)) == 1


def test_fsdp_shrinks_per_device_parameters(tiny_plan, tiny_hf):
    """conftest gives 8 virtual CPU devices: over fsdp=2, each holds half of every weight matrix."""
    from dapo_jax.training.plan.memory import make_plan

    p2 = make_plan(load_config(TINY, ["mesh.fsdp=2", "data.eval=null", "optim.packing=false"]), cache=False,
                   only=("update",))  # the resident state and the KV cache are counted whatever is compiled
    assert p2.mesh == {"data": 1, "fsdp": 2, "tensor": 1} and p2.target == "2 of 8 x cpu"
    assert p2.resident["parameters"] == independent_param_bytes(tiny_hf, fsdp=2) < tiny_plan.resident["parameters"]
    programs = {x.name: x.figures for x in p2.programs}
    assert programs["update"].arguments < {x.name: x.figures for x in tiny_plan.programs}["update"].arguments
    assert p2.kv_cache == tiny_plan.kv_cache // 2  # the rollout's rows are split over fsdp too


def test_exit_codes(tiny_plan, monkeypatch, capsys, tmp_path):
    """0 = fits, 3 = a phase does not fit (one line each), 2 = a user error; overrides may follow options."""
    from dapo_jax import cli
    from dapo_jax.training.plan import memory as plan_mod

    seen = {}

    def fake_make_plan(cfg, *, topology=None, device_memory_gib=None, only=None, **kw):
        seen.update(cfg=cfg, topology=topology, only=only)
        capacity = int(device_memory_gib * GiB) if device_memory_gib else tiny_plan.capacity
        return dataclasses.replace(tiny_plan, capacity=capacity)

    monkeypatch.setattr(plan_mod, "make_plan", fake_make_plan)
    assert cli.main(["plan", TINY, "--device-memory", "64"]) == 0
    assert "VERDICT: fits" in capsys.readouterr().out
    assert cli.main(["plan", "--device-memory", "0.000001", TINY, "--json", str(tmp_path / "p.json"), "rollout.G=4"]) == 3
    out = capsys.readouterr().out
    assert "VERDICT: does not fit" in out and "update does not fit: needs 0.01 GiB per device, the chip has 0.00 GiB" in out
    assert seen["cfg"].rollout.G == 4  # an override after the options
    assert json.loads((tmp_path / "p.json").read_text())["fits"] is False
    assert cli.main(["plan", TINY, "--json", "--device-memory", "64"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is True
    assert seen["only"] is None and cli.main(["plan", TINY, "--only", "eval rollout", "--only", "prepare"]) == 0
    assert seen["only"] == ("eval rollout", "prepare")


@pytest.mark.parametrize("argv, words", [
    (["plan", TINY, "rollout.bogus=1"], "rollout.bogus"),
    (["plan", TINY, "--topology", "v5p-7"], "v5p-{8,16,32,64"),
    (["plan", TINY, "--search"], "--search needs a TPU family"),
    (["plan", TINY, "--model-config", "/nonexistent/config.json"], "--model-config"),
])
def test_user_errors_are_one_line_and_exit_2_before_compiling(argv, words, monkeypatch, capsys):
    from dapo_jax import cli
    from dapo_jax.training.plan import memory as plan_mod

    if "--model-config" not in argv:
        monkeypatch.setattr(plan_mod, "make_plan", lambda *a, **k: pytest.fail("compiled despite a bad argument"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_a_mesh_larger_than_the_host_is_a_user_error():
    from dapo_jax.training.plan.memory import make_plan

    with pytest.raises(ConfigError, match=r"mesh: data\*fsdp\*tensor=16 .* 8 devices"):
        make_plan(load_config(TINY, ["mesh.fsdp=16", "rollout.train_batch=32", "rollout.gen_batch=32"]))


def test_absent_model_uses_its_published_shape(tmp_path):
    import jax
    from flax import nnx

    from dapo_jax.models.decoder import Decoder
    from dapo_jax.training.plan.model_config import plan_model_config

    cfg = load_config("configs/qwen2.5-0.5b-gsm8k-dapo.yaml", ["model.path=/nonexistent/Qwen2.5-0.5B-Instruct"])
    model_cfg, source = plan_model_config(cfg)
    assert "qwen2.5-0.5b" in source and model_cfg.dtype == "bfloat16" and model_cfg.param_dtype == "float32"
    params = nnx.state(nnx.eval_shape(lambda: Decoder(model_cfg, rngs=nnx.Rngs(0))), nnx.Param)
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(params)) == 494_032_768  # Qwen2.5-0.5B's count
    cfg32 = load_config("configs/qwen2.5-32b-dapo-math.yaml")  # models/Qwen2.5-32B is not shipped
    assert plan_model_config(cfg32)[0].num_hidden_layers == 64
    with pytest.raises(ConfigError, match="--model-config"):
        plan_model_config(load_config(TINY, ["model.path=/nonexistent/some-model"]))
    (tmp_path / "config.json").write_text(json.dumps({**json.loads(
        (__import__("pathlib").Path("dapo_jax/assets/tiny_base/config.json")).read_text()), "num_hidden_layers": 5}))
    given, source = plan_model_config(load_config(TINY, ["model.path=/nonexistent/some-model"]), tmp_path)
    assert given.num_hidden_layers == 5 and source == str(tmp_path / "config.json")


def test_missing_libtpu_is_exit_2_with_the_install_command(monkeypatch, capsys):
    from dapo_jax import cli
    from dapo_jax.training.plan import slices

    monkeypatch.setattr(slices, "libtpu_available", lambda: False)
    assert cli.main(["plan", TINY, "--topology", "v5e-4", "mesh.fsdp=4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'dapo_jax[tpu]'" in err


@needs_libtpu
@pytest.mark.slow
def test_tiny_model_planned_for_v5e_4_quietly(tmp_path, tiny_hf):
    """The command as a user runs it on a CPU machine with libtpu installed: no libtpu warnings, a verdict, exit 0,
    per-device figures of 4 TPU v5 lite devices."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    env.update(DAPO_JAX_PLAN_CACHE="", PYTHONPATH=os.getcwd())
    # the smallest batch the 4 devices split: nothing below depends on it, and each TPU compile takes less time
    small = ["rollout.train_batch=4", "rollout.gen_batch=4", "rollout.G=2", "optim.num_minibatches=1"]
    out = subprocess.run([sys.executable, "-m", "dapo_jax.cli", "plan", TINY, "--topology", "v5e-4", "mesh.fsdp=4",
                          "data.eval=null", "rollout.max_new_tokens=3", *small, "--json", str(tmp_path / "plan.json")],
                         capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    for noise in ("could not determine TPU", "E0000", "Traceback", "libtpu_lockfile"):
        assert noise not in out.stderr + out.stdout, noise
    assert "on v5e-4 (4 x TPU v5 lite)" in out.stdout and "VERDICT: fits" in out.stdout
    d = json.loads((tmp_path / "plan.json").read_text())
    assert d["slice_name"] == "v5e-4" and d["capacity"] == int(15.75 * GiB) and d["mesh"]["fsdp"] == 4
    assert d["resident"]["parameters"] == independent_param_bytes(tiny_hf, fsdp=4)
    assert {p["name"] for p in d["phases"]} == {"rollout", "log-prob", "update"}
    assert d["estimate"]["seconds"]["update"] > 0 and d["estimate"]["tokens_per_s_per_chip"] > 0


@needs_libtpu
@pytest.mark.slow
def test_a_real_refusal_is_a_verdict_not_a_traceback(monkeypatch, capsys):
    """An absurd batch on v5e-4 (65,536 prompts x 8 samples: a 16 GiB KV cache per device): the TPU compiler
    refuses the rollout; the plan reads what it required and the chip's HBM from the refusal and exits 3."""
    from dapo_jax import cli
    from dapo_jax.training.plan import memory as plan_mod

    real = plan_mod.make_plan
    monkeypatch.setattr(plan_mod, "make_plan", lambda cfg, **kw: real(cfg, **{**kw, "only": ("rollout",), "cache": False}))
    code = cli.main(["plan", TINY, "--topology", "v5e-4", "mesh.fsdp=4", "rollout.max_new_tokens=256",
                     "rollout.gen_batch=65536", "data.eval=null", "--quiet", "--no-fit"])  # fit: tests/training/plan/test_fit.py
    out = capsys.readouterr().out
    assert code == 3, out
    line = next(x for x in out.splitlines() if "does not fit:" in x)
    needs, has = (float(v) for v in re.search(r"needs ([\d.]+) GiB per device, the chip has ([\d.]+) GiB", line).groups())
    assert line.strip().startswith("rollout does not fit") and "refused" in line
    assert has == 15.75 and needs > 16  # at least the KV cache (16 GiB a device), counted from the config
    assert "REFUSED" in out and "Traceback" not in out
