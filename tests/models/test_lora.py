"""LoRA adapters (models/lora.py): the adapted layer against numpy (values and gradients), the merged
model against the adapter path, and both exports against transformers + peft (the independent reference)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from safetensors import safe_open

from dapo_jax.models.hf_io import load_pretrained, save_pretrained
from dapo_jax.models.lora import (
    ADAPTER_CONFIG, ADAPTER_WEIGHTS, TARGETS, LoRALinear, add_lora, lora_modules, merged_decoder, save_peft_adapter,
)
from dapo_jax.models.sharding import partition_spec
from dapo_jax.parallel import make_mesh
from tests.models.test_hf_io import hf_logits, hf_model, ours_logits, padded_batch

ATOL = 1e-4  # float32 logits, as in test_hf_io


def randomize_adapters(model, seed: int = 0, scale: float = 0.3):
    """Nonzero A and B (B starts at zero: the adapters would otherwise change nothing)."""
    adapters = nnx.state(model, nnx.LoRAParam)
    leaves, tree = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    nnx.update(model, jax.tree.unflatten(tree, [scale * jax.random.normal(k, x.shape, x.dtype)
                                                for k, x in zip(keys, leaves)]))


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A tiny random Qwen2 (q/k/v biases, untied) saved by transformers."""
    path = tmp_path_factory.mktemp("lora_base")
    hf_model("qwen2", tied=False, seed=2).save_pretrained(path)
    return path


def test_lora_linear_values_and_gradients_against_numpy():
    rng = np.random.default_rng(0)
    linear = nnx.Linear(6, 5, use_bias=True, rngs=nnx.Rngs(0))
    nnx.update(linear, {"bias": nnx.Param(jnp.asarray(rng.normal(size=5), jnp.float32))})
    layer = LoRALinear.from_linear(linear, rank=3, alpha=12.0, rngs=nnx.Rngs(1))
    assert layer.kernel is linear.kernel and layer.bias is linear.bias  # shared, not copied
    a = rng.normal(size=(6, 3)).astype(np.float32)
    b = rng.normal(size=(3, 5)).astype(np.float32)
    layer.lora.lora_a.set_value(jnp.asarray(a))
    layer.lora.lora_b.set_value(jnp.asarray(b))
    x = rng.normal(size=(4, 6)).astype(np.float32)
    g = rng.normal(size=(4, 5)).astype(np.float32)  # d loss / d y
    w, bias, s = np.asarray(linear.kernel[...]), np.asarray(linear.bias[...]), 12.0 / 3
    np.testing.assert_allclose(np.asarray(layer(jnp.asarray(x))), x @ w + bias + s * (x @ a) @ b, rtol=1e-5, atol=1e-5)

    graphdef, adapters, rest = nnx.split(layer, nnx.LoRAParam, ...)
    loss = lambda ad: jnp.sum(nnx.merge(graphdef, ad, rest)(jnp.asarray(x)) * g)  # noqa: E731
    grads = jax.grad(loss)(adapters)
    np.testing.assert_allclose(np.asarray(grads["lora"]["lora_a"][...]), s * x.T @ (g @ b.T), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(grads["lora"]["lora_b"][...]), s * (x @ a).T @ g, rtol=1e-5, atol=1e-5)


def test_adapters_start_at_the_base_model(base_dir):
    model = load_pretrained(base_dir)
    ids, mask, pos = padded_batch("left")
    want = ours_logits(model, ids, mask, pos)
    kernel = model.layers[0].self_attn.q_proj.kernel
    add_lora(model, rank=4, alpha=8, targets=TARGETS, rngs=nnx.Rngs(0))
    assert model.layers[0].self_attn.q_proj.kernel is kernel  # the base weights are not copied
    assert len(lora_modules(model)) == 7 * model.config.num_hidden_layers
    a = np.asarray(model.layers[1].mlp.down_proj.lora.lora_a[...])  # [in=48, r=4], PEFT's U(±1/sqrt(in))
    assert a.shape == (48, 4) and np.abs(a).max() <= 1 / np.sqrt(48) and np.abs(a).max() > 0.5 / np.sqrt(48)
    assert not np.any(np.asarray(model.layers[1].mlp.down_proj.lora.lora_b[...]))
    np.testing.assert_array_equal(ours_logits(model, ids, mask, pos), want)  # B = 0 adds exactly zero
    # every leaf but the adapters is exactly a plain Decoder's state, at the same paths
    plain = {p for p, _ in nnx.to_flat_state(nnx.state(load_pretrained(base_dir), nnx.Param))}
    _, adapters, rest = nnx.split(model, nnx.LoRAParam, ...)
    assert {p for p, _ in nnx.to_flat_state(rest)} == plain
    assert all(p[-2:] in {("lora", "lora_a"), ("lora", "lora_b")} for p, _ in nnx.to_flat_state(adapters))


def test_merged_weights_compute_the_adapted_model(base_dir):
    model = load_pretrained(base_dir)
    add_lora(model, rank=4, alpha=6, targets=("q_proj", "v_proj", "o_proj", "up_proj", "down_proj"), rngs=nnx.Rngs(0))
    randomize_adapters(model)
    ids, mask, pos = padded_batch("right")
    adapted = ours_logits(model, ids, mask, pos)
    merged = merged_decoder(model)
    assert not lora_modules(merged)
    base = ours_logits(load_pretrained(base_dir), ids, mask, pos)
    assert np.abs(adapted - base).max() > 0.5  # the adapters do change the model
    np.testing.assert_allclose(ours_logits(merged, ids, mask, pos), adapted, atol=ATOL)
    # merged kernel = W + (alpha/r) A B, against numpy
    layer = model.layers[0].self_attn.v_proj
    w = np.asarray(layer.kernel[...]) + 1.5 * np.asarray(layer.lora.lora_a[...]) @ np.asarray(layer.lora.lora_b[...])
    np.testing.assert_allclose(np.asarray(merged.layers[0].self_attn.v_proj.kernel[...]), w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family,targets", [("qwen2", TARGETS), ("llama", ("q_proj", "k_proj", "gate_proj"))])
def test_exports_load_in_transformers_and_peft(family, targets, tmp_path):
    """The PEFT adapter on the transformers base, and the merged HF export, give our adapted model's logits."""
    from peft import PeftModel

    ref = hf_model(family, tied=False, seed=4)
    ref.save_pretrained(tmp_path / "base")
    model = add_lora(load_pretrained(tmp_path / "base"), rank=3, alpha=5, targets=targets, rngs=nnx.Rngs(1))
    randomize_adapters(model, seed=1)
    ids, mask, pos = padded_batch("left", seed=5)
    want = ours_logits(model, ids, mask, pos)

    save_peft_adapter(model, tmp_path / "adapter", base_model_name_or_path=str(tmp_path / "base"))
    config = json.loads((tmp_path / "adapter" / ADAPTER_CONFIG).read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 3, 5)
    assert sorted(config["target_modules"]) == sorted(targets)
    peft_model = PeftModel.from_pretrained(type(ref).from_pretrained(tmp_path / "base", attn_implementation="eager"),
                                           tmp_path / "adapter").eval()
    # every one of our adapters was loaded (a silently skipped key would leave PEFT's B at zero)
    n_loaded = sum(1 for n, _ in peft_model.named_parameters() if "lora_B" in n)
    assert n_loaded == len(targets) * ref.config.num_hidden_layers
    with safe_open(tmp_path / "adapter" / ADAPTER_WEIGHTS, "np") as f:
        assert len(list(f.keys())) == 2 * n_loaded  # A and B of each
    assert torch.stack([p.abs().max() for n, p in peft_model.named_parameters() if "lora_B" in n]).min() > 0
    with torch.no_grad():
        got = peft_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                         position_ids=torch.tensor(pos)).logits.numpy()
    real = mask.astype(bool)
    assert np.abs(want - ours_logits(load_pretrained(tmp_path / "base"), ids, mask, pos))[real].max() > 0.5
    np.testing.assert_allclose(got[real], want[real], atol=ATOL)

    save_pretrained(merged_decoder(model), tmp_path / "merged")
    merged_hf = type(ref).from_pretrained(tmp_path / "merged", attn_implementation="eager").eval()
    np.testing.assert_allclose(hf_logits(merged_hf, ids, mask, pos)[real], want[real], atol=ATOL)


def test_adapter_sharding_follows_its_kernel():
    assert partition_spec("layers/0/self_attn/q_proj/lora/lora_a") == jax.sharding.PartitionSpec("fsdp", None)
    assert partition_spec("layers/0/self_attn/q_proj/lora/lora_b") == jax.sharding.PartitionSpec(None, "tensor")
    assert partition_spec("layers/3/mlp/down_proj/lora/lora_a") == jax.sharding.PartitionSpec("tensor", None)
    assert partition_spec("layers/3/mlp/down_proj/lora/lora_b") == jax.sharding.PartitionSpec(None, "fsdp")


def test_adapters_on_a_mesh(base_dir):
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    model = load_pretrained(base_dir)
    ids, mask, pos = padded_batch("left")
    want = ours_logits(model, ids, mask, pos)
    with jax.set_mesh(mesh):
        sharded = load_pretrained(base_dir, mesh=mesh)
        add_lora(sharded, rank=2, alpha=2, targets=("o_proj", "up_proj"), rngs=nnx.Rngs(0), mesh=mesh)
        for path, var in nnx.to_flat_state(nnx.state(sharded, nnx.LoRAParam)):
            assert var.get_value().sharding.spec == partition_spec(path), path
        got = ours_logits(sharded, ids, mask, pos)
    np.testing.assert_allclose(got, want, atol=ATOL)


def test_bad_targets_and_double_adapters_are_refused(base_dir):
    model = load_pretrained(base_dir)
    with pytest.raises(ValueError, match="lm_head"):
        add_lora(model, rank=2, alpha=2, targets=("lm_head",), rngs=nnx.Rngs(0))
    add_lora(model, rank=2, alpha=2, targets=("q_proj",), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="already has a LoRA adapter"):
        add_lora(model, rank=2, alpha=2, targets=("q_proj",), rngs=nnx.Rngs(0))
