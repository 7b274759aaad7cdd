"""`dapo-jax plan` for on-policy distillation and SFT: the frozen teacher's weights are resident beside the
policy and its log-prob pass is in `prepare` (as a learned reward model's are), and an SFT recipe is sized
with SFT's batch (one data response per prompt, nothing sampled to train on)."""

import pytest
from flax import nnx

from dapo_jax.training.config.run import load_config
from tests.training.plan.test_memory import TINY, independent_param_bytes


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    from dapo_jax.data.char_tokenizer import build_char_tokenizer, save_char_tokenizer
    from dapo_jax.models.config import ModelConfig
    from dapo_jax.models.decoder import Decoder
    from dapo_jax.models.hf_io import save_pretrained

    tok = build_char_tokenizer()
    path = tmp_path_factory.mktemp("teacher")
    cfg = ModelConfig(model_type="qwen2", vocab_size=len(tok), hidden_size=96, intermediate_size=128,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                      tie_word_embeddings=True, attention_bias=True, eos_token_id=(tok.eos_token_id,),
                      pad_token_id=tok.pad_token_id, max_position_embeddings=64)
    save_pretrained(Decoder(cfg, rngs=nnx.Rngs(3)), path)
    save_char_tokenizer(path)
    return path


def _plan(overrides, only=None):
    from dapo_jax.training.plan.memory import make_plan

    return make_plan(load_config(TINY, ["optim.packing=false", "data.eval=null", *overrides]), cache=False, only=only)


def test_the_teacher_is_resident_and_its_pass_is_in_prepare(teacher_dir):
    import json

    plain = _plan([], only=("prepare",))
    taught = _plan([f"distill.teacher={teacher_dir}"], only=("prepare",))
    hf = json.loads((teacher_dir / "config.json").read_text())
    assert plain.resident["distillation teacher (frozen)"] == 0
    assert taught.resident["distillation teacher (frozen)"] == independent_param_bytes(hf)
    assert sum(taught.resident.values()) - sum(plain.resident.values()) == independent_param_bytes(hf)
    prep = {p.name: p for p in taught.programs}["prepare"]
    assert "the teacher's log-probs" in prep.shape
    # the teacher's weights are arguments of prepare, counted as resident; its pass adds its log-probs' buffers
    before = {p.name: p for p in plain.programs}["prepare"].figures
    assert prep.figures.resident_args - before.resident_args == independent_param_bytes(hf)
    assert prep.figures.temporaries > before.temporaries


def test_an_sft_recipe_is_sized_with_one_data_response_per_prompt_and_no_sampler():
    sft = _plan(["objective.name=sft", "objective.overlong_buffer=null", "objective.dynamic_sampling_metric=correct"])
    rl = _plan([], only=("update",))
    names = [p.name for p in sft.programs]
    assert "rollout" not in names and names == ["prepare", "update"]  # data.eval=null: nothing is sampled
    programs = {p.name: p for p in sft.programs}
    assert "16 prompts x 1 responses" in programs["prepare"].shape  # tiny_dapo: train_batch 16, G 8 for RL
    assert "x 1," in programs["update"].shape
    up_rl, up_sft = ({p.name: p for p in x.programs}["update"].figures for x in (rl, sft))
    # the batch's [P, G, T] arrays: 8 times smaller (the parameters and moments are the same arguments)
    assert up_sft.arguments < up_rl.arguments and up_sft.temporaries < up_rl.temporaries
    assert sft.kv_cache == 0  # no sampling at all without data.eval
