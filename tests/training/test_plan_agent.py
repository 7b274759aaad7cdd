"""`dapo-jax plan` of a multi-turn recipe: the engine's prefill, decode and append at `cache_slots` are
compiled beside the update, and the KV cache is the engine's."""

import json

from dapo_jax.training.config.paths import resolve_path
from dapo_jax.training.config.run import load_config
from dapo_jax.training.plan.memory import make_plan


def test_plan_compiles_the_engine_programs_at_cache_slots():
    cfg = load_config("tiny_agent_calc", ["objective.name=grpo_process", "objective.overlong_buffer=null"])
    plan = make_plan(cfg, cache=False)
    programs = {p.name: p for p in plan.programs}
    engine = [f"{phase}: {step}" for phase in ("rollout", "eval rollout") for step in ("prefill", "decode", "append")]
    assert set(engine) <= set(programs) and "rollout" not in programs, sorted(programs)
    # the packed update's stages (episodes pack their tool ids as context), after prepare
    assert {"prepare", "update: select", "update: start", "update: apply"} <= set(programs), sorted(programs)
    assert [p.name for p in plan.phases][:2] == ["rollout", "eval rollout"]
    hf = json.loads((resolve_path(cfg.model.path) / "config.json").read_text())
    rows = cfg.rollout.gen_batch * cfg.rollout.G
    want = 2 * hf["num_hidden_layers"] * rows * (cfg.agent_cache_slots + cfg.agent.append_width) * hf["num_key_value_heads"] * hf["head_dim"] * 4
    assert plan.kv_cache == want
    # the decode program holds the cache it updates: its arguments include every slot of every row
    assert programs["rollout: decode"].figures.arguments >= want
    assert "cache slots" in programs["rollout: append"].shape and plan.fits
