"""generation_config.json: read (int or list EOS, sampling defaults), merged into the sampler's stop
tokens (a rollout stops at either of Qwen-style two EOS ids), written on export."""

import json
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from flax import nnx

from dapo_jax.models import Decoder, ModelConfig, save_pretrained
from dapo_jax.models.checks import check_tokenizer_fits
from dapo_jax.models.generation_config import (
    GenerationConfig,
    GenerationConfigError,
    load_generation_config,
    stop_token_ids,
)
from dapo_jax.models.safetensors_files import CheckpointError

# Qwen2.5-0.5B-Instruct's generation_config.json, verbatim in content.
QWEN_INSTRUCT = {"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": True,
                 "eos_token_id": [151645, 151643], "repetition_penalty": 1.05, "temperature": 0.7,
                 "top_p": 0.8, "top_k": 20, "transformers_version": "4.37.0"}
TINY = dict(model_type="qwen2", vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
            attention_bias=True, max_position_embeddings=64)


def test_reads_a_qwen_instruct_file_and_writes_it_back_unchanged(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(QWEN_INSTRUCT))
    gen = load_generation_config(tmp_path)
    assert gen.eos_token_id == (151645, 151643) and gen.pad_token_id == 151643
    assert gen.sampling_defaults() == {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
    out = tmp_path / "out"
    out.mkdir()
    gen.save(out)
    assert json.loads((out / "generation_config.json").read_text()) == QWEN_INSTRUCT  # repetition_penalty kept


def test_single_int_eos_absent_file_and_greedy(tmp_path):
    assert load_generation_config(tmp_path) == GenerationConfig()  # no file: nothing added
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": 7, "do_sample": false, "temperature": 0.6}')
    gen = load_generation_config(tmp_path)
    assert gen.eos_token_id == (7,) and gen.sampling_defaults() == {"temperature": 0.0}


@pytest.mark.parametrize("text, field", [('{"eos_token_id": "x"}', "eos_token_id"), ('{"top_k": 0.5}', "top_k"),
                                         ("[1, 2]", "top level"), ("{oops", "not valid JSON")])
def test_bad_file_names_file_and_field(tmp_path, text, field):
    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(GenerationConfigError, match=field) as e:
        load_generation_config(tmp_path)
    assert "generation_config.json" in str(e.value)


def test_stop_tokens_merge_config_generation_and_tokenizer_without_repeats():
    cfg = ModelConfig(**TINY, eos_token_id=(151645,))
    gen = GenerationConfig.from_dict(QWEN_INSTRUCT)
    tok = SimpleNamespace(eos_token_id=151645)
    assert stop_token_ids(cfg, gen, tok) == (151645, 151643)
    assert stop_token_ids(cfg, None, SimpleNamespace(eos_token_id=3)) == (151645, 3)


def test_generation_eos_outside_the_vocabulary_is_refused():
    cfg = ModelConfig(**TINY, eos_token_id=(1,), pad_token_id=0)
    tok = type("Tok", (), {"eos_token_id": 1, "pad_token_id": 0, "__len__": lambda self: 99})()
    with pytest.raises(CheckpointError, match=r"generation_config.json\) = 151645"):
        check_tokenizer_fits(cfg, tok, generation=GenerationConfig(eos_token_id=(151645,)))


def test_save_pretrained_writes_a_file_transformers_reads(tmp_path):
    import transformers

    model = Decoder(ModelConfig(**TINY, eos_token_id=(1,), pad_token_id=0), rngs=nnx.Rngs(0))
    save_pretrained(model, tmp_path / "derived")  # no source file: derived from config.json's tokens
    assert load_generation_config(tmp_path / "derived").eos_token_id == (1,)
    save_pretrained(model, tmp_path / "kept", generation_config=GenerationConfig(eos_token_id=(1, 5), top_p=0.9))
    hf = transformers.GenerationConfig.from_pretrained(tmp_path / "kept")
    assert hf.eos_token_id == [1, 5] and hf.top_p == 0.9


def test_rollout_stops_at_either_eos_listed_only_in_generation_config(tmp_path):
    """config.json names one EOS, generation_config.json two (as Qwen2.5-Instruct): rows end at either."""
    from dapo_jax.sampling import SamplingConfig, make_generate
    from dapo_jax.training.config.resolve import resolve
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.loop import sampling_config

    model = Decoder(ModelConfig(**TINY, eos_token_id=(1,), pad_token_id=0), rngs=nnx.Rngs(3))
    graphdef, state = nnx.split(model)
    ids = np.array([[5, 6, 7, 8], [9, 10, 11, 12]], np.int32)
    mask = np.ones_like(ids)
    key = jax.random.key(0)
    free = make_generate(graphdef, SamplingConfig(max_new_tokens=12, pad_token_id=0), 32)(state, ids, mask, key)
    counts = np.bincount(np.asarray(free.response_ids).ravel(), minlength=100)
    counts[:2] = 0  # pad and the config's EOS
    a, b = (int(i) for i in np.argsort(counts)[-2:])  # the two ids the model samples most: both will occur
    save_pretrained(model, tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**json.loads((tmp_path / "config.json").read_text()),
                                                       "eos_token_id": a}))
    GenerationConfig(eos_token_id=(a, b)).save(tmp_path)

    cfg = resolve(load_config(None, [f"model.path={tmp_path}", "rollout.max_new_tokens=12"]))
    scfg = sampling_config(cfg, SimpleNamespace(eos_token_id=None, pad_token_id=0),
                           ModelConfig.from_pretrained(tmp_path))
    assert set(scfg.eos_token_ids) == {a, b}
    out = make_generate(graphdef, scfg, 32)(state, ids, mask, key)
    toks, m = np.asarray(out.response_ids).reshape(-1, 12), np.asarray(out.response_mask).reshape(-1, 12)
    ends = []
    for row, rm, ref in zip(toks, m, np.asarray(free.response_ids).reshape(-1, 12)):
        stops = [t for t, tok in enumerate(ref) if tok in (a, b)]
        if stops:  # same key, same draws: the row is the free row cut after its first a or b
            n = stops[0] + 1
            assert rm.sum() == n and (rm[:n] == 1).all() and list(row[:n]) == list(ref[:n])
            ends.append(int(ref[stops[0]]))
        else:
            assert rm.sum() == 12
    assert a in ends and b in ends  # a rollout stops at either
