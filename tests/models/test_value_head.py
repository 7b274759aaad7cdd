"""The value model: the head read at the position that predicts each response token, padding-proof,
and loaded from a Hugging Face folder with the decoder's own weights."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder
from dapo_jax.models.value_head import ValueModel, load_value_model, response_values

V = 32


def tiny_value_model(seed=0):
    cfg = ModelConfig(model_type="qwen2", vocab_size=V, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                      attention_bias=True)
    return ValueModel(Decoder(cfg, rngs=nnx.Rngs(seed)), rngs=nnx.Rngs(seed + 1))


def jitted(fn, model):
    """`fn(model, *args)` compiled once per shape (eager op-by-op dispatch is slow on a busy CPU)."""
    graphdef, params = nnx.split(model)
    call = jax.jit(lambda p, *a: fn(nnx.merge(graphdef, p), *a))
    return lambda *a: call(params, *a)


def reference_values(model, prompt, response):
    """One unpadded sequence at a time: hidden at index len(prompt) - 1 + t, then h·w + b in NumPy."""
    ids = jnp.asarray([list(prompt) + list(response)], jnp.int32)
    n = ids.shape[1]
    hidden = jitted(lambda m, *a: m.trunk(*a)[0], model)(ids, jnp.arange(n)[None], jnp.ones((1, n), jnp.int32))
    h = np.asarray(hidden[0], np.float64)
    w = np.asarray(model.value_head.kernel[...], np.float64)[:, 0]
    b = float(model.value_head.bias[...][0])
    return np.array([h[len(prompt) - 1 + t] @ w + b for t in range(len(response))])


def test_values_are_read_where_each_token_is_predicted_padding_proof():
    model = tiny_value_model()
    rng = np.random.default_rng(0)
    S, T = 5, 4
    prompts = [[3, 4, 5, 6, 7], [9, 10], [11, 12, 13]]
    lengths = [4, 2, 0]
    prompt_ids = np.zeros((3, S), np.int32)
    prompt_mask = np.zeros((3, S), np.int32)
    for i, p in enumerate(prompts):  # left padding
        prompt_ids[i, S - len(p):] = p
        prompt_mask[i, S - len(p):] = 1
    response_ids = rng.integers(0, V, (3, T)).astype(np.int32)
    response_mask = (np.arange(T) < np.array(lengths)[:, None]).astype(np.float32)
    response_ids = np.where(response_mask > 0, response_ids, 31)  # any padding id
    values = jitted(response_values, model)
    got = np.asarray(values(prompt_ids, prompt_mask, response_ids, response_mask))
    chex.assert_shape(got, (3, T))
    for i in range(3):
        want = reference_values(model, prompts[i], response_ids[i, :lengths[i]])
        np.testing.assert_allclose(got[i, :lengths[i]], want, rtol=1e-4, atol=1e-5)
        assert np.all(got[i, lengths[i]:] == 0.0)
    # [P, G, T] with prompts shared by G responses: the same numbers as the flattened rows
    grouped = values(prompt_ids[:1], prompt_mask[:1], response_ids[None, :2],
                              response_mask[None, :2])
    flat = values(np.repeat(prompt_ids[:1], 2, 0), np.repeat(prompt_mask[:1], 2, 0),
                           response_ids[:2], response_mask[:2])
    chex.assert_trees_all_close(grouped[0], flat, atol=1e-6)


def test_gradient_reaches_trunk_and_head():
    model = tiny_value_model(1)
    graphdef, params = nnx.split(model)
    ids = jnp.asarray([[1, 2, 3]], jnp.int32)
    mask = jnp.ones((1, 3), jnp.int32)

    def f(p):
        return jnp.sum(response_values(nnx.merge(graphdef, p), ids, mask, ids, mask.astype(jnp.float32)))

    grads = jax.jit(jax.grad(f))(params)
    norms = {"/".join(map(str, k)): float(jnp.linalg.norm(v)) for k, v in nnx.to_flat_state(grads)}
    assert norms["value_head/kernel"] > 0 and norms["value_head/bias"] > 0
    assert norms["trunk/layers/0/mlp/up_proj/kernel"] > 0


def test_load_value_model_keeps_the_decoder_weights(tmp_path):
    from dapo_jax.models.hf_io import save_pretrained
    from dapo_jax.parallel.mesh import make_mesh

    policy = tiny_value_model(2).trunk
    save_pretrained(policy, tmp_path)
    mesh = make_mesh(2, 1, 1, devices=jax.devices()[:2])
    with jax.set_mesh(mesh):
        critic = load_value_model(tmp_path, mesh=mesh, seed=3)
    for (k, a), (_, b) in zip(nnx.to_flat_state(nnx.state(policy, nnx.Param)),
                              nnx.to_flat_state(nnx.state(critic.trunk, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(k))
    assert float(jnp.abs(critic.value_head.kernel[...]).max()) > 0
    assert float(jnp.abs(critic.value_head.bias[...]).max()) == 0.0
    assert critic.value_head.kernel[...].sharding.is_fully_replicated
