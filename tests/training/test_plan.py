"""`dapo-jax plan`: per-device memory from ahead-of-time compiled programs, checked against figures
computed here from the model's config.json and the sharding rules (no weights are loaded)."""

import dataclasses
import importlib.util
import json
import math

import pytest

from dapo_jax.training.config import ConfigError, load_config

TINY = "configs/tiny_dapo.yaml"


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
    from dapo_jax.training.config import resolve_path

    return json.loads((resolve_path("dapo_jax/assets/tiny_base") / "config.json").read_text())


@pytest.fixture(scope="module")
def tiny_plan():
    from dapo_jax.training.plan import make_plan

    return make_plan(load_config(TINY))


def test_tiny_plan_figures_match_independent_counts(tiny_plan, tiny_hf):
    p = tiny_plan
    assert p.params == independent_param_bytes(tiny_hf)
    # AdamW's two moments + its count and the schedule's count (int32 scalars)
    assert 2 * p.params < p.opt_state <= 2 * p.params + 64
    assert p.reference == 0 and p.critic == 0  # DAPO: no KL term, no critic
    assert set(p.programs) == {"rollout", "eval rollout", "update"}  # tiny_dapo does not recompute log pi_old
    up = p.programs["update"]
    # the state is donated: its buffers are reused for the new state (alias bytes cover params + moments)
    assert up.aliased >= p.params + p.opt_state
    assert p.phases["update"] == p.resident - (p.params + p.opt_state + 8) + up.arguments + up.outputs - up.aliased \
        + up.temporaries
    ro = p.programs["rollout"]
    assert p.phases["rollout"] == p.resident - p.params + ro.arguments + ro.outputs + ro.temporaries
    # KV cache: 2 (k, v) x layers x (gen_batch prompts x S + gen_batch x G x (T-1) response slots) x H_kv x D x 4 B
    cfg = load_config(TINY)
    r = cfg.rollout
    slots = r.gen_batch * cfg.data.max_prompt_length + r.gen_batch * r.G * (r.max_new_tokens - 1)
    assert p.kv_cache == 2 * tiny_hf["num_hidden_layers"] * slots * tiny_hf["num_key_value_heads"] * tiny_hf["head_dim"] * 4
    assert ro.temporaries >= p.kv_cache
    assert p.peak == max(p.phases.values()) and p.fits


def test_tiny_plan_prints_every_line(tiny_plan):
    from dapo_jax.training.plan import format_plan, human, plan_dict

    text = format_plan(tiny_plan)
    for label in ("parameters", "optimizer state", "reference model", "critic (parameters + optimizer)", "resident",
                  "KV cache", "program rollout", "program eval rollout", "program update", "phase rollout",
                  "phase update", "peak "):
        assert label in text, label
    assert human(tiny_plan.params) in text.split("optimizer state")[0]
    assert "WARNING" not in text
    d = plan_dict(tiny_plan)
    assert d["peak"] == tiny_plan.peak and d["programs"]["update"]["aliased"] == tiny_plan.programs["update"].aliased
    json.dumps(d)


def test_fsdp_shrinks_per_device_parameters(tiny_plan, tiny_hf):
    """conftest gives 8 virtual CPU devices: over fsdp=2, each holds half of every weight matrix."""
    from dapo_jax.training.plan import make_plan

    p2 = make_plan(load_config(TINY, ["mesh.fsdp=2", "data.eval=null"]))
    assert p2.mesh == {"data": 1, "fsdp": 2, "tensor": 1} and p2.devices.startswith("2 x")
    assert p2.params == independent_param_bytes(tiny_hf, fsdp=2) < tiny_plan.params
    assert 2 * p2.params < p2.opt_state <= 2 * p2.params + 64
    assert p2.programs["update"].arguments < tiny_plan.programs["update"].arguments
    assert p2.kv_cache == tiny_plan.kv_cache // 2  # the rollout's rows are split over fsdp too


def test_too_big_warns_and_strict_exits_nonzero(tiny_plan, monkeypatch, capsys):
    from dapo_jax import cli
    from dapo_jax.training import plan as plan_mod

    small = dataclasses.replace(tiny_plan, capacity=1024, capacity_source="--device-memory")
    assert not small.fits
    assert "WARNING: will not fit" in plan_mod.format_plan(small)
    seen = {}

    def fake_make_plan(cfg, *, device_memory_gib=None, topology=None, log=None):
        seen["gib"] = device_memory_gib
        return dataclasses.replace(tiny_plan, capacity=int(device_memory_gib * plan_mod.GiB))

    monkeypatch.setattr(plan_mod, "make_plan", fake_make_plan)
    assert cli.main(["plan", TINY, "--device-memory", "0.000001", "--strict"]) == 5
    out = capsys.readouterr().out
    assert seen["gib"] == 0.000001 and "WARNING: will not fit" in out
    assert cli.main(["plan", TINY, "--device-memory", "0.000001"]) == 0  # warns, exits 0 without --strict
    assert cli.main(["plan", TINY, "--device-memory", "64", "--strict"]) == 0
    assert "WARNING" not in capsys.readouterr().out.split("peak")[-1]


def test_bad_config_key_fails_in_one_line_before_compiling(monkeypatch, capsys):
    from dapo_jax import cli
    from dapo_jax.training import plan as plan_mod

    monkeypatch.setattr(plan_mod, "make_plan", lambda *a, **k: pytest.fail("compiled despite a bad key"))
    assert cli.main(["plan", TINY, "rollout.bogus=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rollout.bogus" in err


def test_absent_model_uses_its_published_shape():
    import jax
    from flax import nnx

    from dapo_jax.models.decoder import Decoder
    from dapo_jax.training.plan import plan_model_config

    cfg = load_config("configs/qwen2.5-0.5b-gsm8k-dapo.yaml", ["model.path=/nonexistent/Qwen2.5-0.5B-Instruct"])
    model_cfg, source = plan_model_config(cfg)
    assert "qwen2.5-0.5b" in source and model_cfg.dtype == "bfloat16" and model_cfg.param_dtype == "float32"
    params = nnx.state(nnx.eval_shape(lambda: Decoder(model_cfg, rngs=nnx.Rngs(0))), nnx.Param)
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(params)) == 494_032_768  # Qwen2.5-0.5B's count
    with pytest.raises(ConfigError, match="model.path"):
        plan_model_config(load_config(TINY, ["model.path=/nonexistent/some-model"]))


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is not None, reason="libtpu is installed here")
def test_tpu_topology_without_libtpu_is_a_config_error():
    from dapo_jax.training.plan import plan_devices

    with pytest.raises(ConfigError, match="libtpu"):
        plan_devices(load_config(TINY), topology="v5e:2x2")
