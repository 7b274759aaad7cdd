"""The memory plan's view of a run's reward models: the run's shapes, shardings and program, no weights read."""

import jax
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from dapo_jax.models.hf_io import load_classifier
from dapo_jax.parallel import make_mesh
from dapo_jax.training.config import config_from_dict
from dapo_jax.training.reward_models import reward_model_shapes
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
