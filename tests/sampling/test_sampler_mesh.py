"""The same rollout on one device and on a (data=2, fsdp=2, tensor=2) mesh of 8 fake CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder
from dapo_jax.sampling import SamplingConfig, make_generate, pad_to_bucket

PROMPTS = [[5, 9, 2], [7, 1, 1, 4, 8, 3, 6], [11, 12, 13, 14, 15], [20, 21]]


def model_and_inputs():
    cfg = ModelConfig(
        model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, attention_bias=True,
    )
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    model.lm_head.kernel[...] = model.lm_head.kernel[...] * 40  # a peaked policy: greedy margins are wide
    ids, mask = pad_to_bucket(PROMPTS, (8,), pad_id=0)
    return model, jnp.asarray(ids), jnp.asarray(mask)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs the 8 fake CPU devices from tests/conftest.py")
@pytest.mark.parametrize("greedy", [True, False])
def test_mesh_rollout_equals_single_device(greedy):
    from dapo_jax.models.sharding import shard_model
    from dapo_jax.parallel.mesh import make_mesh

    config = SamplingConfig(max_new_tokens=8, greedy=greedy, temperature=0.9, eos_token_ids=(3,), pad_token_id=0)
    model, ids, mask = model_and_inputs()
    graphdef, state = nnx.split(model)
    key = jax.random.key(5)
    single = make_generate(graphdef, config, 2)(state, ids, mask, key)

    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    with jax.set_mesh(mesh):
        model, ids, mask = model_and_inputs()
        shard_model(model, mesh)
        graphdef, state = nnx.split(model)
        sharded = make_generate(graphdef, config, 2)(state, ids, mask, key)
    # the batch really is split: each device holds a quarter of the P*G rows
    shard_rows = {s.data.shape[0] for s in sharded.response_ids.addressable_shards}
    assert shard_rows == {1}, shard_rows  # [P=4, G, T] over ("data", "fsdp") = 4 ways
    np.testing.assert_array_equal(single.response_ids, sharded.response_ids)
    np.testing.assert_array_equal(single.response_mask, sharded.response_mask)
    np.testing.assert_allclose(single.logprobs, sharded.logprobs, atol=1e-5)
    np.testing.assert_allclose(single.sampled_logprobs, sharded.sampled_logprobs, atol=1e-5)
