"""Parameter sharding rules on the 8 fake CPU devices: same logits as one device, params really split."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from dapo_jax.models import Decoder, ModelConfig, load_pretrained, positions_from_mask, save_pretrained
from dapo_jax.models.sharding import (
    PARTITION_RULES,
    check_divisible,
    constrain_batch,
    param_partition_specs,
    param_shardings,
    partition_spec,
    shard_model,
)
from dapo_jax.parallel import MeshError, batch_sharding, make_mesh

# Every sharded dimension divides 8, 4 and 2: heads 8, kv heads 4, hidden 32, intermediate 64, vocab 64.
CFG = ModelConfig(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=8, attention_bias=True)
MESHES = [dict(fsdp=8), dict(fsdp=2, tensor=4), dict(data=2, fsdp=2, tensor=2)]
WANT_SPECS = {
    "embed_tokens/embedding": ("tensor", "fsdp"),
    "layers/1/self_attn/q_proj/kernel": ("fsdp", "tensor"),
    "layers/1/self_attn/k_proj/kernel": ("fsdp", "tensor"),
    "layers/1/self_attn/v_proj/bias": ("tensor",),
    "layers/1/self_attn/o_proj/kernel": ("tensor", "fsdp"),
    "layers/0/mlp/gate_proj/kernel": ("fsdp", "tensor"),
    "layers/0/mlp/up_proj/kernel": ("fsdp", "tensor"),
    "layers/0/mlp/down_proj/kernel": ("tensor", "fsdp"),
    "layers/0/input_layernorm/weight": (),
    "layers/0/self_attn/q_norm/weight": (),
    "norm/weight": (),
    "lm_head/kernel": ("fsdp", "tensor"),
}


def batch(b=8, s=6, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, s + 1, size=b)
    mask = (np.arange(s)[None, :] >= s - lengths[:, None]).astype(np.int32)  # left padded
    ids = np.where(mask == 1, rng.integers(0, CFG.vocab_size, size=(b, s)), 0)
    return jnp.asarray(ids), jnp.asarray(positions_from_mask(mask)), jnp.asarray(mask)


@nnx.jit
def forward(model, ids, pos, mask):
    hidden, _ = model(ids, pos, mask)
    return model.logits(hidden)


def test_table_names_every_parameter_as_specified():
    assert partition_spec("layers/17/self_attn/q_proj/kernel") == P("fsdp", "tensor")
    for name, want in WANT_SPECS.items():
        assert tuple(partition_spec(name)) == want, name
    for model_type, extra in [("qwen3", dict(qk_norm=True)), ("llama", dict(tie_word_embeddings=True))]:
        cfg = CFG.replace(model_type=model_type, **extra)
        specs = param_partition_specs(nnx.eval_shape(lambda c=cfg: Decoder(c, rngs=nnx.Rngs(0))))
        assert len(jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P))) > 0
    # 8 rules for the decoder's weights, 4 for LoRA adapters (A split like its kernel's input, B like its
    # output), 3 for classifier heads (models/classifier.py)
    assert len(PARTITION_RULES) == 15
    assert partition_spec("score/kernel") == P("fsdp", None) and partition_spec("score/hidden/bias") == P()
    assert partition_spec("layers/3/self_attn/q_proj/lora/lora_a") == P("fsdp", None)
    assert partition_spec("layers/3/mlp/up_proj/lora/lora_b") == P(None, "tensor")
    assert partition_spec("layers/3/self_attn/o_proj/lora/lora_a") == P("tensor", None)
    assert partition_spec("layers/3/mlp/down_proj/lora/lora_b") == P(None, "fsdp")


def test_unknown_parameter_is_an_error_naming_it():
    with pytest.raises(KeyError, match=r"layers/0/mlp/extra_proj/kernel"):
        partition_spec(("layers", 0, "mlp", "extra_proj", "kernel"))


@pytest.mark.parametrize("remat", ["none", "full"])  # full: the blocks run as a lax.scan over stacked weights
@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(f"{k}{v}" for k, v in s.items()))
def test_sharded_model_matches_one_device(shape, remat):
    model = Decoder(CFG.replace(remat=remat), rngs=nnx.Rngs(0))
    ids, pos, mask = batch()
    want = np.asarray(forward(model, ids, pos, mask))

    mesh = make_mesh(**shape)
    same = shard_model(model, mesh)
    assert same is model  # in place
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name = "/".join(map(str, path))
        x = var.get_value()
        spec = partition_spec(name)
        assert x.sharding == NamedSharding(mesh, spec), name
        split = [np.prod([mesh.shape[a] for a in ((ax,) if isinstance(ax, str) else ax or ())]) for ax in spec]
        split += [1] * (x.ndim - len(split))
        assert x.addressable_shards[0].data.shape == tuple(d // k for d, k in zip(x.shape, split)), name
    # e.g. q_proj [32, 64] over fsdp=2 x tensor=4 -> [16, 16] per device: really split, not replicated.
    if shape == dict(fsdp=2, tensor=4):
        assert model.layers[0].self_attn.q_proj.kernel[...].addressable_shards[0].data.shape == (16, 16)

    sharded_in = [jax.device_put(a, batch_sharding(mesh)) for a in (ids, pos, mask)]
    got = forward(model, *sharded_in)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)


def test_non_dividing_mesh_fails_clearly():
    bad = CFG.replace(num_key_value_heads=2)
    with pytest.raises(MeshError, match=r"num_key_value_heads=2 .*'tensor' of size 4"):
        check_divisible(bad, make_mesh(fsdp=2, tensor=4))
    with pytest.raises(MeshError, match=r"vocab_size=66 .*'tensor' of size 4"):
        check_divisible(CFG.replace(vocab_size=66), make_mesh(fsdp=2, tensor=4))
    with pytest.raises(MeshError, match=r"hidden_size=36 .*'fsdp' of size 8"):
        check_divisible(CFG.replace(hidden_size=36), make_mesh(fsdp=8))
    with pytest.raises(MeshError, match=r"intermediate_size=66 .*'tensor' of size 4"):
        check_divisible(CFG.replace(intermediate_size=66), make_mesh(fsdp=2, tensor=4))
    model = Decoder(bad, rngs=nnx.Rngs(0))
    before = model.layers[0].self_attn.k_proj.kernel[...]
    with pytest.raises(MeshError, match="num_key_value_heads"):
        shard_model(model, make_mesh(fsdp=2, tensor=4))
    assert model.layers[0].self_attn.k_proj.kernel[...] is before  # nothing moved


def test_load_pretrained_onto_bad_mesh_fails_before_reading(tmp_path):
    save_pretrained(Decoder(CFG.replace(num_attention_heads=4, num_key_value_heads=2), rngs=nnx.Rngs(0)), tmp_path)
    with pytest.raises(MeshError, match=r"num_attention_heads=4 .*'tensor' of size 8"):
        load_pretrained(tmp_path, mesh=make_mesh(fsdp=1, tensor=8))


def test_param_shardings_drive_jit_out_shardings():
    mesh = make_mesh(fsdp=4, tensor=2)
    abstract = nnx.eval_shape(lambda: Decoder(CFG, rngs=nnx.Rngs(0)))
    _, abstract_state = nnx.split(abstract)
    shardings = param_shardings(abstract_state, mesh)

    def init():
        return nnx.state(Decoder(CFG, rngs=nnx.Rngs(0)), nnx.Param)

    state = jax.jit(init, out_shardings=shardings)()
    kernel = state["layers"][0]["mlp"]["down_proj"]["kernel"].get_value()
    assert kernel.sharding.spec == P("tensor", "fsdp")
    reference = nnx.state(Decoder(CFG, rngs=nnx.Rngs(0)), nnx.Param)
    # Same RNG stream as eager init (jit may differ in the last ulp of the normal sampler).
    np.testing.assert_allclose(
        np.asarray(kernel), np.asarray(reference["layers"][0]["mlp"]["down_proj"]["kernel"].get_value()), rtol=1e-6
    )


def test_constrain_batch_pins_leading_dim():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    x = jnp.arange(8 * 5, dtype=jnp.float32).reshape(8, 5)

    @jax.jit
    def f(tree):
        return constrain_batch(jax.tree.map(lambda a: a * 2, tree), mesh)

    out = f({"a": x, "b": x[:, 0]})
    assert out["a"].sharding.spec == P(("data", "fsdp")) and out["b"].sharding.spec == P(("data", "fsdp"))
    np.testing.assert_array_equal(np.asarray(out["a"]), np.asarray(x) * 2)
    with jax.set_mesh(mesh):  # the ambient mesh works too
        out = jax.jit(lambda a: constrain_batch(a))(x)
    assert out.sharding.spec == P(("data", "fsdp"))
