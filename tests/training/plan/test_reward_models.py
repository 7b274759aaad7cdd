"""The memory plan's view of a run's reward models: the run's shapes, shardings and program, no weights read."""

import jax
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from dapo_jax.models.hf_classifier_io import load_classifier
from dapo_jax.parallel import make_mesh
from dapo_jax.training.config.run import config_from_dict
from dapo_jax.training.plan.reward_models import reward_model_shapes
from tests.rewards.conftest import make_rm


def test_shapes_shardings_bytes_and_program_as_the_run_builds_them(tmp_path):
    orm = make_rm(tmp_path / "orm", "sequence")
    cfg = config_from_dict({
        "model": {"dtype": "bfloat16"}, "data": {"max_prompt_length": 16}, "rollout": {"max_new_tokens": 30},
        "objective": {"name": "grpo"},
        "reward": {"functions": [{"name": "synthetic"},
                                 {"name": "reward_model", "path": str(orm), "options": {"batch_size": 5}}]}})
    mesh = make_mesh(fsdp=2, devices=jax.devices()[:2])
    assert reward_model_shapes(config_from_dict({"objective": {"name": "grpo"}}), mesh) == []
    (plan,) = reward_model_shapes(cfg, mesh)
    assert (plan.index, plan.name, plan.path) == (1, "reward_model", orm)
    up = plan.params["trunk"]["layers"][0]["mlp"]["up_proj"]["kernel"].get_value()
    assert up.dtype == np.dtype("bfloat16") and up.sharding.spec == P("fsdp", "tensor")
    assert plan.params["score"]["kernel"].get_value().sharding.spec == P("fsdp", None)
    ids, mask = plan.inputs
    assert ids.shape == (6, 48) and ids.sharding.spec == P(("data", "fsdp"))  # 5 rows -> 6 over 2 shards; 16+30+2 -> 48
    # the per-device bytes are those of the real sharded weights on the most loaded device
    real = load_classifier(orm, mesh=mesh, dtype="bfloat16", param_dtype="bfloat16")
    on = {}
    for x in jax.tree.leaves(nnx.state(real, nnx.Param)):
        for s in x.addressable_shards:
            on[s.device] = on.get(s.device, 0) + s.data.nbytes
    assert plan.param_bytes == max(on.values())
    compiled = plan.score_fn.lower(plan.params, *plan.inputs).compile()
    assert compiled.memory_analysis() is not None
    assert compiled.out_info.shape == (6,)


def test_the_plan_holds_the_reward_model_resident_and_compiles_its_scoring_once(tmp_path):
    """`dapo-jax plan` of a run with an outcome RM: its frozen weights in the resident state of every phase,
    its scoring program a phase of its own, compiled once (not per policy depth) with the run's shapes."""
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.plan.memory import make_plan

    import json

    from dapo_jax.training.config.paths import CONFIG_DIR

    orm = make_rm(tmp_path / "orm", "sequence")
    cfg = load_config("tiny_dapo", ["data.eval=null", "reward.functions=[{name: synthetic}, {name: reward_model, "
                                    f"path: {orm}, weight: 0.0, options: {{batch_size: 8}}}}]"])
    deep = json.loads((CONFIG_DIR.parent / "assets" / "tiny_base" / "config.json").read_text())
    deep["num_hidden_layers"] = 5  # the policy's programs compiled at 2 and 3 layers and extrapolated
    (tmp_path / "deep.json").write_text(json.dumps(deep))
    said = []
    plan = make_plan(cfg, cache=False, model_config=tmp_path / "deep.json", log=said.append)
    assert [s for s in said if s.startswith("compiling reward model 1 for")] == [f"compiling reward model 1 for {plan.target} ..."]
    assert any(p.extrapolated for p in plan.programs)
    (expected,) = reward_model_shapes(cfg, make_mesh(devices=jax.devices()[:1]))
    assert plan.resident["reward models (frozen)"] == expected.param_bytes > 0
    (scoring,) = [p for p in plan.programs if p.phase == "reward scoring"]
    assert scoring.name == "reward model 1" and not scoring.extrapolated
    assert scoring.shape.startswith(f"8 rows x {expected.inputs[0].shape[1]} tokens, reward.functions.1")
    phase = next(p for p in plan.phases if p.name == "reward scoring")
    assert phase.total == plan.resident_total + scoring.figures.added
    assert scoring.figures.temporaries > 0 and scoring.figures.resident_args == expected.param_bytes
    assert all(p.total >= plan.resident_total for p in plan.phases)
