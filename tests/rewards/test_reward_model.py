"""Learned reward models on the device: outcome scores and process step rewards against transformers,
batched over several fixed-shape device calls, sharded over a 2-device mesh, and their refusals."""

import jax
import numpy as np
import pytest
import torch
import transformers
from jax.sharding import PartitionSpec as P

from dapo_jax.data.char_tokenizer import build_char_tokenizer
from dapo_jax.data.templates import render_prompt
from dapo_jax.models.safetensors_files import CheckpointError
from dapo_jax.parallel import make_mesh
from dapo_jax.rewards.reward_model import make_learned_reward, prompt_unwrapper
from tests.rewards.conftest import SEPARATOR, make_rm

PROMPTS = ["a1+b2=", "a5+b7+c4=", "a9+b9=", "a1+b1+c1+d1=", "a3+b4=", "a2+b2=", "a7+b1+c0="]
RESPONSES = ["a1+b2=3\nAnswer: 3", "a5+b7=12\n12+c4=16\nAnswer: 16", "", "a1+b1=2\n2+c1=3\n3+d1=4\nAnswer: 5",
             "Answer: 7", "a2+b2=4\nAns", "a7+b1=8\n8+c0=8\nAnswer: 8"]


def hf_outcome(path, texts):
    """transformers' score of each rendered row alone (no padding at all)."""
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.Qwen2ForSequenceClassification.from_pretrained(path).eval()
    out = []
    for text in texts:
        ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            out.append(float(model(input_ids=ids).logits[0, 0]))
    return np.asarray(out, np.float32)


def test_outcome_scores_equal_transformers_over_several_device_calls(orm_dir):
    rm = make_learned_reward("reward_model", orm_dir, {"batch_size": 3}, max_length=64)  # 7 rows: 3 + 3 + 1 calls
    texts = [rm.tokenizer.apply_chat_template([{"role": "user", "content": p}, {"role": "assistant", "content": r}],
                                              tokenize=False) for p, r in zip(PROMPTS, RESPONSES)]
    assert texts[0] == "a1+b2=\na1+b2=3\nAnswer: 3<|endoftext|>"  # the RM's own template, read at its EOS
    scores, errors = rm.score_rows(PROMPTS, RESPONSES)
    assert errors == {} and scores.dtype == np.float32 and scores.shape == (7,)
    want = hf_outcome(orm_dir, texts)
    assert np.ptp(want) > 0.1  # the rows score differently: the comparison has teeth
    np.testing.assert_allclose(scores, want, atol=1e-5, rtol=0)
    # the batch size (how rows are packed into calls) does not change a score
    again, _ = make_learned_reward("reward_model", orm_dir, {"batch_size": 8}, max_length=64).score_rows(PROMPTS, RESPONSES)
    np.testing.assert_allclose(again, scores, atol=1e-6, rtol=0)


def test_default_row_length_is_the_run_budget_plus_the_template_rounded_up(orm_dir):
    rm = make_learned_reward("reward_model", orm_dir, max_length=100)
    assert rm.max_length == 112  # 100 + 2 template tokens (newline, EOS), rounded up to 16
    assert make_learned_reward("reward_model", orm_dir).max_length == 256  # no budget: the model's positions


def test_rows_longer_than_max_length_are_named_errors_scored_wrong(orm_dir):
    rm = make_learned_reward("reward_model", orm_dir, {"max_length": 20, "wrong": -3.0})
    scores, errors = rm.score_rows(PROMPTS, RESPONSES)
    lengths = [len(p) + 1 + len(r) + 1 for p, r in zip(PROMPTS, RESPONSES)]  # one token per character
    assert sorted(errors) == [i for i, n in enumerate(lengths) if n > 20]
    assert "max_length=20" in errors[1]
    assert np.all(scores[sorted(errors)] == -3.0)
    full, _ = make_learned_reward("reward_model", orm_dir, max_length=64).score_rows(PROMPTS, RESPONSES)
    ok = [i for i in range(7) if i not in errors]
    np.testing.assert_allclose(scores[ok], full[ok], atol=1e-6)


@pytest.mark.parametrize("axis", ["fsdp", "tensor"])
def test_sharded_on_a_2_device_mesh_equals_one_device(orm_dir, axis):
    one, _ = make_learned_reward("reward_model", orm_dir, {"batch_size": 4}, max_length=64).score_rows(PROMPTS, RESPONSES)
    mesh = make_mesh(fsdp=2 if axis == "fsdp" else 1, tensor=2 if axis == "tensor" else 1, devices=jax.devices()[:2])
    rm = make_learned_reward("reward_model", orm_dir, {"batch_size": 3}, max_length=64).load(mesh)
    assert rm._rows == 4 if axis == "fsdp" else rm._rows == 3  # a call's rows split over the batch shards
    up = rm.params["trunk"]["layers"][0]["mlp"]["up_proj"]["kernel"].get_value()
    assert up.sharding.spec == P("fsdp", "tensor") and len(up.sharding.device_set) == 2
    assert rm.params["score"]["kernel"].get_value().sharding.spec == P("fsdp", None)
    two, _ = rm.score_rows(PROMPTS, RESPONSES)
    np.testing.assert_allclose(two, one, atol=1e-5, rtol=0)


def test_compute_dtype_bfloat16_stores_and_scores_in_it(orm_dir):
    rm = make_learned_reward("reward_model", orm_dir, max_length=64).load(dtype="bfloat16")
    assert rm.params["trunk"]["embed_tokens"]["embedding"].get_value().dtype == np.dtype("bfloat16")
    low, _ = rm.score_rows(PROMPTS, RESPONSES)
    full, _ = make_learned_reward("reward_model", orm_dir, max_length=64).score_rows(PROMPTS, RESPONSES)
    assert low.dtype == np.float32 and np.abs(low - full).max() < 0.1


def test_process_step_rewards_against_a_hand_computed_case(prm_dir):
    prm = make_learned_reward("process_reward_model", prm_dir, {"separator": SEPARATOR}, max_length=64)
    prompt, response = "a1+b2=", "a1+b2=3\n\nAnswer: 3\n"
    # by hand: the RM reads "a1+b2=\n" + "a1+b2=3#" + "Answer: 3#" + EOS, one token per character, so the
    # separators sit at 7 + 7 = 14 and 15 + 9 = 24; the steps end at characters 6 and 17 of the response
    text = "a1+b2=\na1+b2=3#Answer: 3#<|endoftext|>"
    tok = transformers.AutoTokenizer.from_pretrained(prm_dir)
    ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
    assert ids[0, 14] == ids[0, 24] == tok.convert_tokens_to_ids(SEPARATOR)
    with torch.no_grad():
        probs = torch.softmax(transformers.Qwen2ForTokenClassification.from_pretrained(prm_dir).eval()(
            input_ids=ids).logits[0], dim=-1)[:, 1].numpy()
    steps, errors = prm.step_rows([prompt], [response])
    assert errors == {}
    assert [e for _, e in steps[0]] == [6, 17]
    np.testing.assert_allclose([r for r, _ in steps[0]], probs[[14, 24]], atol=1e-5, rtol=0)
    scores, _ = prm.score_rows([prompt, prompt], [response, ""])  # outcome: the weakest step; no step: 0
    np.testing.assert_allclose(scores, [probs[[14, 24]].min(), 0.0], atol=1e-5)

    # through the pipeline's step scorer: [P, G, T] step fields with the ends as response-token indices
    from dapo_jax.rewards.pipeline import RewardPipeline

    policy_tok = build_char_tokenizer()
    t = 24
    rid = np.zeros((1, 2, t), np.int32)
    rmask = np.zeros((1, 2, t), np.float32)
    for g, r in enumerate([response, "a1+b2=3"]):
        enc = policy_tok(r, add_special_tokens=False).input_ids
        rid[0, g, :len(enc)], rmask[0, g, :len(enc)] = enc, 1
    fields = RewardPipeline([("process_reward_model", prm, 1.0)]).step_scorer(policy_tok)(rid, rmask, [prompt], ["3"])
    assert fields["step_rewards"].shape == (1, 2, t)
    np.testing.assert_allclose(fields["step_rewards"][0, 0, :2], probs[[14, 24]], atol=1e-5)
    assert fields["step_ends"][0, 0, :2].tolist() == [6, 17] and fields["step_mask"][0, 0].sum() == 2
    assert fields["step_ends"][0, 1, 0] == 6 and fields["step_mask"][0, 1].sum() == 1


def test_the_same_rows_twice_run_the_process_model_once(prm_dir, monkeypatch):
    prm = make_learned_reward("process_reward_model", prm_dir, {"separator": SEPARATOR}, max_length=64)
    calls = []
    run = prm._run
    monkeypatch.setattr(prm, "_run", lambda rows: calls.append(len(rows)) or run(rows))
    first = prm.score_rows(PROMPTS, RESPONSES)  # a rollout's outcome part ...
    steps, _ = prm.step_rows(PROMPTS, RESPONSES)  # ... and its step rewards
    assert len(calls) == 1
    np.testing.assert_allclose(first[0], [min(r for r, _ in s) if s else 0.0 for s in steps], atol=1e-6)
    prm.step_rows(PROMPTS[:2], RESPONSES[:2])
    assert len(calls) == 2


def test_splitters(prm_dir):
    for splitter, ends in (("lines", [6, 17]), ("paragraphs", [6, 17]), ("=3", [4, 17])):
        prm = make_learned_reward("process_reward_model", prm_dir, {"separator": SEPARATOR, "splitter": splitter},
                                  max_length=64)
        steps, _ = prm.step_rows(["a1+b2="], ["a1+b2=3\n\nAnswer: 3\n"])
        assert [e for _, e in steps[0]] == ends, splitter


def test_refusals(orm_dir, prm_dir, tmp_path):
    with pytest.raises(ValueError, match="2 tokens"):
        make_learned_reward("process_reward_model", prm_dir, {"separator": "##"})
    with pytest.raises(ValueError, match="one label"):
        make_learned_reward("reward_model", prm_dir)
    with pytest.raises(ValueError, match=">= 2 labels"):
        make_learned_reward("process_reward_model", orm_dir, {"separator": SEPARATOR})
    with pytest.raises(TypeError, match="separator"):
        make_learned_reward("reward_model", orm_dir, {"separator": "#"})  # a process RM's option
    with pytest.raises(FileNotFoundError, match="no reward model"):
        make_learned_reward("reward_model", tmp_path / "absent")
    transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2)).save_pretrained(tmp_path / "lm")
    with pytest.raises(CheckpointError, match="no score head"):
        make_learned_reward("reward_model", tmp_path / "lm")
    three = make_rm(tmp_path / "three", "sequence", num_labels=3)
    with pytest.raises(ValueError, match="has 3"):
        make_learned_reward("reward_model", three)


def test_prompt_unwrapper_strips_the_policys_chat_template_only():
    tok = build_char_tokenizer()
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</>{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    unwrap = prompt_unwrapper(tok)
    assert unwrap(render_prompt("a1+b2=", template="chat", tokenizer=tok)) == "a1+b2="
    dapo = render_prompt("a1+b2=", template="dapo_chat", tokenizer=tok)
    assert unwrap(dapo) == render_prompt("a1+b2=", template="dapo") and "a1+b2=" in unwrap(dapo)
    assert unwrap("a1+b2=") == "a1+b2="  # a raw prompt passes unchanged
    assert prompt_unwrapper(build_char_tokenizer())("x") == "x"  # the plain template wraps nothing


def test_prompt_unwrapper_on_the_qwen25_chat_template(shared):
    tok = transformers.AutoTokenizer.from_pretrained(shared("tokenizers", "qwen2.5"))
    unwrap = prompt_unwrapper(tok)
    rendered = render_prompt("What is 2+3?", template="chat", tokenizer=tok)
    assert rendered.startswith("<|im_start|>system") and unwrap(rendered) == "What is 2+3?"
