"""Hugging Face checkpoint I/O against the transformers PyTorch models (the independent reference)."""

import json

import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import save_file

from dapo_jax.models import Decoder, ModelConfig, ModelConfigError, positions_from_mask
from dapo_jax.models.hf_io import load_model_and_tokenizer, load_pretrained, load_tokenizer, save_pretrained
from dapo_jax.models.safetensors_files import SAFETENSORS_INDEX, CheckpointError, SafetensorsFile, checkpoint_tensor_names
from dapo_jax.parallel import make_mesh

FP32_ATOL = 1e-4
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8}


def hf_model(family: str, tied: bool, seed: int = 0):
    """A tiny random transformers model, weights spread well beyond HF's N(0, 0.02) init."""
    kw = dict(TINY, tie_word_embeddings=tied, attn_implementation="eager")
    if family == "qwen2":
        cfg = transformers.Qwen2Config(**kw)
        cls = transformers.Qwen2ForCausalLM
    elif family == "qwen3":
        cfg = transformers.Qwen3Config(**kw, head_dim=16)  # head_dim != hidden/heads on purpose
        cls = transformers.Qwen3ForCausalLM
    elif family == "llama":
        cfg = transformers.LlamaConfig(**kw)
        cls = transformers.LlamaForCausalLM
    elif family == "llama3_rope":
        cfg = transformers.LlamaConfig(**kw, rope_scaling=LLAMA3_ROPE, rope_theta=500000.0)
        cls = transformers.LlamaForCausalLM
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model


def padded_batch(side: str, vocab: int = 64, seed: int = 0):
    lengths, s = [9, 5, 2], 9
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, size=(len(lengths), s))
    mask = np.zeros((len(lengths), s), np.int32)
    for b, n in enumerate(lengths):
        mask[b, s - n:] = 1 if side == "left" else 0
        mask[b, :n] = 1 if side == "right" else mask[b, :n]
    ids = np.where(mask == 1, ids, 0)
    return ids, mask, np.asarray(positions_from_mask(mask))


def ours_logits(model, ids, mask, positions):
    hidden, _ = model(ids, positions, mask)
    return np.asarray(model.logits(hidden))


def hf_logits(model, ids, mask, positions):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    position_ids=torch.tensor(positions))
    return out.logits.float().numpy()


def max_diff_on_real(a, b, mask):
    return float(np.abs(a - b)[mask.astype(bool)].max())


FAMILIES = ["qwen2", "qwen3", "llama", "llama3_rope"]


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("family", FAMILIES)
def test_logit_parity_with_transformers(family, tied, tmp_path):
    ref = hf_model(family, tied)
    ref.save_pretrained(tmp_path)
    model = load_pretrained(tmp_path)
    assert model.config.tie_word_embeddings == tied
    assert model.config.rope_scaling is not None if family == "llama3_rope" else model.config.rope_scaling is None
    for side in ("left", "right"):
        ids, mask, pos = padded_batch(side)
        want, got = hf_logits(ref, ids, mask, pos), ours_logits(model, ids, mask, pos)
        assert got.dtype == np.float32
        assert np.abs(want).max() > 1.0  # the check has teeth: logits are not all ~0
        assert max_diff_on_real(got, want, mask) <= FP32_ATOL, (family, tied, side)


@pytest.mark.parametrize("family,tied", [("qwen2", False), ("qwen3", True), ("llama3_rope", False)])
def test_round_trip_ours_to_transformers_and_back(family, tied, tmp_path):
    ref = hf_model(family, tied, seed=1)
    ref.save_pretrained(tmp_path / "hf")
    ours = load_pretrained(tmp_path / "hf")
    save_pretrained(ours, tmp_path / "ours")
    names = checkpoint_tensor_names(tmp_path / "ours")
    assert ("lm_head.weight" in names) == (not tied)
    reloaded_hf = type(ref).from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    ids, mask, pos = padded_batch("left", seed=3)
    np.testing.assert_allclose(hf_logits(reloaded_hf, ids, mask, pos), hf_logits(ref, ids, mask, pos), atol=1e-6)
    # ...and back again: transformers' save of our export loads into identical parameters.
    reloaded_hf.save_pretrained(tmp_path / "hf2")
    again = load_pretrained(tmp_path / "hf2")
    for (p, a), (_, b) in zip(nnx.to_flat_state(nnx.state(ours, nnx.Param)),
                              nnx.to_flat_state(nnx.state(again, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(p))


def test_sharded_save_writes_index_and_both_sides_load_it(tmp_path):
    ref = hf_model("qwen2", False, seed=2)
    ref.save_pretrained(tmp_path / "hf")
    ours = load_pretrained(tmp_path / "hf")
    save_pretrained(ours, tmp_path / "sharded", max_shard_bytes=20_000)
    index = json.loads((tmp_path / "sharded" / SAFETENSORS_INDEX).read_text())
    shard_files = sorted(set(index["weight_map"].values()))
    assert len(shard_files) > 2 and not (tmp_path / "sharded" / "model.safetensors").exists()
    assert all((tmp_path / "sharded" / f).exists() for f in shard_files)
    assert index["metadata"]["total_size"] == sum(p.numel() * 4 for p in ref.parameters())
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "sharded", attn_implementation="eager").eval()
    back = load_pretrained(tmp_path / "sharded")
    ids, mask, pos = padded_batch("right", seed=4)
    want = hf_logits(ref, ids, mask, pos)
    assert max_diff_on_real(hf_logits(hf, ids, mask, pos), want, mask) <= 1e-6
    assert max_diff_on_real(ours_logits(back, ids, mask, pos), want, mask) <= FP32_ATOL


def test_save_in_bfloat16_rounds_each_parameter(tmp_path):
    cfg = ModelConfig(model_type="llama", vocab_size=32, hidden_size=16, intermediate_size=24,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    save_pretrained(model, tmp_path, dtype="bfloat16")
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    f = SafetensorsFile(tmp_path / "model.safetensors")
    assert {e["dtype"] for e in f.entries.values()} == {"BF16"}
    back = load_pretrained(tmp_path, param_dtype="bfloat16")
    want = np.asarray(model.layers[0].mlp.up_proj.kernel[...]).astype("bfloat16")
    np.testing.assert_array_equal(np.asarray(back.layers[0].mlp.up_proj.kernel[...]), want)


def test_shared_tiny_llama_bf16_matches_transformers(shared):
    """bf16 weights widen exactly to fp32, so both sides compute the same fp32 model: tolerance 1e-4."""
    path = shared("models", "tiny-llama-random")
    ours = load_pretrained(path)
    assert ours.config.param_dtype == "float32" and ours.embed_tokens.embedding[...].dtype == np.float32
    ref = transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    ids, mask, pos = padded_batch("left", vocab=16, seed=5)
    want = hf_logits(ref, ids, mask, pos)
    assert max_diff_on_real(ours_logits(ours, ids, mask, pos), want, mask) <= FP32_ATOL
    # Kept in bf16 the stored bits come through unchanged.
    bf16 = load_pretrained(path, param_dtype="bfloat16")
    np.testing.assert_array_equal(
        np.asarray(bf16.norm.weight[...]).astype(np.float32), ref.model.norm.weight.detach().numpy()
    )


def test_load_onto_mesh_places_each_param_on_its_sharding(tmp_path):
    ref = hf_model("qwen3", False, seed=6)
    ref.save_pretrained(tmp_path)
    plain = load_pretrained(tmp_path)
    sharded = load_pretrained(tmp_path, mesh=make_mesh(fsdp=4, tensor=2))
    k = sharded.layers[1].self_attn.k_proj.kernel[...]
    assert tuple(k.sharding.spec) == ("fsdp", "tensor") and len(k.sharding.device_set) == 8
    assert k.addressable_shards[0].data.shape == (32 // 4, 2 * 16 // 2)
    np.testing.assert_array_equal(np.asarray(k), np.asarray(plain.layers[1].self_attn.k_proj.kernel[...]))
    save_pretrained(sharded, tmp_path / "from_mesh")  # gathers each sharded parameter back to the host
    again = load_pretrained(tmp_path / "from_mesh")
    np.testing.assert_array_equal(np.asarray(again.lm_head.kernel[...]), np.asarray(plain.lm_head.kernel[...]))


def test_tokenizer_qwen25(shared):
    tok = load_tokenizer(shared("tokenizers", "qwen2.5"))
    assert tok("Hello world")["input_ids"] == [9707, 1879]
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>user\nWhat is 2+2?<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


def test_load_model_and_tokenizer(tmp_path, shared):
    tok = load_tokenizer(shared("tokenizers", "qwen2.5"))
    model = Decoder(ModelConfig(model_type="qwen2", vocab_size=32, hidden_size=16, intermediate_size=24,
                                num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                attention_bias=True), rngs=nnx.Rngs(0))
    save_pretrained(model, tmp_path, tokenizer=tok)
    model2, tok2 = load_model_and_tokenizer(tmp_path)
    assert tok2("Hello world")["input_ids"] == [9707, 1879]
    np.testing.assert_array_equal(np.asarray(model2.norm.weight[...]), np.asarray(model.norm.weight[...]))


# --------------------------------------------------------------------------- errors name the thing
@pytest.fixture
def checkpoint(tmp_path):
    hf_model("qwen2", False, seed=7).save_pretrained(tmp_path)
    return tmp_path


def rewrite(path, change):
    f = SafetensorsFile(path / "model.safetensors")
    tensors = {n: np.array(f.array(n)) for n in f.entries}
    change(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_error_missing_tensor(checkpoint):
    rewrite(checkpoint, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight'.*missing"):
        load_pretrained(checkpoint)


def test_error_wrong_shape_names_tensor_and_file(checkpoint):
    rewrite(checkpoint, lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": np.zeros((32, 32), np.float32)}))
    with pytest.raises(CheckpointError, match=r"k_proj\.weight.*model\.safetensors.*\(32, 32\).*expected \(16, 32\)"):
        load_pretrained(checkpoint)


def test_error_non_float_dtype(checkpoint):
    rewrite(checkpoint, lambda t: t.update({"model.norm.weight": np.ones(32, np.int32)}))
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight'.*I32"):
        load_pretrained(checkpoint)


def test_error_or_warning_for_unexpected_tensor(checkpoint, caplog):
    rewrite(checkpoint, lambda t: t.update({"model.layers.0.mlp.up_proj.bias": np.zeros(48, np.float32),
                                            "model.layers.0.self_attn.rotary_emb.inv_freq": np.zeros(4, np.float32)}))
    with pytest.raises(CheckpointError, match=r"unexpected.*model\.safetensors.*up_proj\.bias") as e:
        load_pretrained(checkpoint)
    assert "inv_freq" not in str(e.value)  # a known buffer, always ignored
    load_pretrained(checkpoint, strict=False)
    assert "up_proj.bias" in caplog.text


def test_tied_model_ignores_a_stray_lm_head(tmp_path):
    ref = hf_model("llama", True, seed=8)
    ref.save_pretrained(tmp_path)
    rewrite(tmp_path, lambda t: t.update({"lm_head.weight": np.full((64, 32), 9.0, np.float32)}))
    model = load_pretrained(tmp_path)
    ids, mask, pos = padded_batch("right")
    assert max_diff_on_real(ours_logits(model, ids, mask, pos), hf_logits(ref, ids, mask, pos), mask) <= FP32_ATOL


def load_pretrained_from_hf(tmp_path):
    hf_model("llama", False, seed=9).save_pretrained(tmp_path / "hf")
    return load_pretrained(tmp_path / "hf")


def test_error_unsupported_architecture(checkpoint):
    cfg = json.loads((checkpoint / "config.json").read_text())
    cfg.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (checkpoint / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match=r"config\.json.*gpt2.*GPT2LMHeadModel"):
        load_pretrained(checkpoint)


def test_error_missing_config_field(checkpoint):
    cfg = json.loads((checkpoint / "config.json").read_text())
    del cfg["intermediate_size"]
    (checkpoint / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match=r"config\.json.*'intermediate_size'"):
        load_pretrained(checkpoint)


def test_error_tokenizer_path(tmp_path):
    with pytest.raises(CheckpointError, match=str(tmp_path)):
        load_tokenizer(tmp_path)


def test_a_model_folder_without_tokenizer_files_is_refused(tmp_path):
    # transformers would build an empty tokenizer from config.json alone: every prompt would encode to nothing
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(CheckpointError, match="must sit beside config.json and the weights"):
        load_tokenizer(tmp_path)
