"""ModelConfig from/to Hugging Face config.json, checked against transformers' own config classes."""

import dataclasses
import json

import pytest
import transformers

from dapo_jax.models import ModelConfig, ModelConfigError, RopeScaling

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


def test_qwen2_from_transformers_config():
    hf = transformers.Qwen2Config(**TINY, eos_token_id=[5, 6], tie_word_embeddings=True).to_dict()
    cfg = ModelConfig.from_hf_dict(hf)
    assert (cfg.model_type, cfg.head_dim, cfg.attention_bias, cfg.qk_norm) == ("qwen2", 8, True, False)
    assert cfg.eos_token_id == (5, 6) and cfg.tie_word_embeddings and cfg.rope_scaling is None
    assert cfg.num_query_groups == 2


def test_qwen3_explicit_head_dim_and_qk_norm():
    cfg = ModelConfig.from_hf_dict(transformers.Qwen3Config(**TINY, head_dim=16, rope_theta=1e6).to_dict())
    assert (cfg.head_dim, cfg.qk_norm, cfg.attention_bias, cfg.rope_theta) == (16, True, False, 1e6)


@pytest.mark.parametrize("style", ["rope_parameters", "legacy_rope_scaling"])
def test_llama3_rope_scaling_both_key_styles(style):
    if style == "rope_parameters":  # transformers 5 writes this
        hf = transformers.LlamaConfig(**TINY, rope_scaling=LLAMA3, rope_theta=500000.0).to_dict()
        assert "rope_parameters" in hf
    else:  # what Llama 3.x checkpoints on the hub carry
        hf = dict(model_type="llama", **TINY, rope_theta=500000.0, rope_scaling=dict(LLAMA3))
    cfg = ModelConfig.from_hf_dict(hf)
    assert cfg.rope_theta == 500000.0
    assert cfg.rope_scaling == RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=8192)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_to_hf_dict_round_trips_and_transformers_reads_it(family):
    cfg = ModelConfig(model_type=family, vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16 if family == "qwen3" else 8,
                      rope_theta=123.0, attention_bias=family == "qwen2", qk_norm=family == "qwen3",
                      eos_token_id=(3,), bos_token_id=1, tie_word_embeddings=family == "qwen3",
                      rope_scaling=RopeScaling(4.0, 1.0, 4.0, 64) if family == "llama" else None)
    hf = cfg.to_hf_dict()
    assert ModelConfig.from_hf_dict(json.loads(json.dumps(hf))) == cfg
    theirs = transformers.AutoConfig.for_model(**hf)
    assert type(theirs).__name__.lower().startswith(family)
    assert (theirs.head_dim, theirs.num_key_value_heads, theirs.tie_word_embeddings) == (
        cfg.head_dim, 2, cfg.tie_word_embeddings)
    assert ModelConfig.from_hf_dict(theirs.to_dict()) == cfg


def test_overrides_and_frozen(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(transformers.LlamaConfig(**TINY).to_dict()))
    cfg = ModelConfig.from_pretrained(tmp_path, dtype="bfloat16", remat="full")
    assert (cfg.dtype, cfg.remat, cfg.param_dtype) == ("bfloat16", "full", "float32")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.vocab_size = 3
    assert cfg.replace(vocab_size=3).vocab_size == 3


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(model_type="mistral"), r"unsupported architecture model_type='mistral'"),
        (dict(vocab_size=None), r"missing the required field 'vocab_size'"),
        (dict(hidden_act="gelu"), r"hidden_act='gelu'"),
        (dict(mlp_bias=True), r"mlp_bias"),
        (dict(num_key_value_heads=3), r"num_attention_heads=4 is not a multiple of num_key_value_heads=3"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}), r"rope_scaling type 'yarn'"),
        (dict(rope_scaling={"rope_type": "llama3", "factor": 2.0}), r"llama3 is missing the field 'low_freq_factor'"),
        (dict(hidden_size=30), r"hidden_size=30 is not divisible by num_attention_heads=4"),
    ],
)
def test_bad_config_names_the_field(change, match):
    hf = {"model_type": "llama", **TINY, **change}
    with pytest.raises(ModelConfigError, match=match):
        ModelConfig.from_hf_dict(hf)


@pytest.mark.parametrize("field,value", [("dtype", "int8"), ("remat", "sometimes"), ("head_dim", 7),
                                         ("num_hidden_layers", 0)])
def test_invalid_values_rejected_at_construction(field, value):
    with pytest.raises(ModelConfigError, match=field):
        kw = dict(model_type="llama", vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=4)
        ModelConfig(**{**kw, field: value})


def test_from_pretrained_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        ModelConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError, match=r"config\.json is not valid JSON"):
        ModelConfig.from_pretrained(tmp_path)
