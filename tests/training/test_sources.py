"""Data and reward plumbing of the trainer: fixed prompt shapes, resumable stream, errors naming file/row/key."""

import json

import numpy as np
import pytest

from dapo_jax.data.char_tokenizer import build_char_tokenizer
from dapo_jax.training.config.data import SourceSection
from dapo_jax.training.config.reward import RewardSection
from dapo_jax.training.config.run import load_config
from dapo_jax.training.sources import DataError, decode_responses, load_source, make_scorer, make_stream

TOK = build_char_tokenizer()


def test_stream_batches_have_one_fixed_shape_and_resume_exactly():
    src = SourceSection(options={"max_operand": 9, "heldout_size": 20})
    a = make_stream(src, TOK, max_prompt_length=8, seed=3)
    shapes = {a.next_batch(5).input_ids.shape for _ in range(4)}
    assert shapes == {(5, 8)}
    state = a.state_dict()
    b = make_stream(src, TOK, max_prompt_length=8, seed=3)
    b.load_state_dict(state)
    x, y = a.next_batch(7), b.next_batch(7)
    np.testing.assert_array_equal(x.input_ids, y.input_ids)
    assert x.answers == y.answers
    # Left padding: every prompt's last token sits in the last column.
    assert (x.attention_mask[:, -1] == 1).all()


def test_dataset_file_errors_name_file_row_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n" + json.dumps({"question": "x"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl.*row 1.*answer"):
        load_source(SourceSection(name=str(path), format="gsm8k"))
    with pytest.raises(DataError, match="no such file"):
        load_source(SourceSection(name=str(tmp_path / "absent.jsonl"), format="gsm8k"))
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"question": "1+1?", "answer": "so #### 2"}) + "\n")
    assert load_source(SourceSection(name=str(good), format="gsm8k"))[0].answer == "2"


def test_too_long_prompts_are_a_named_error():
    src = SourceSection(options={"max_operand": 9, "heldout_size": 20})
    with pytest.raises(DataError, match="max_prompt_length=2"):
        make_stream(src, TOK, max_prompt_length=2, seed=0)


def test_scorer_weighted_sum_correct_from_first_function():
    obj = load_config(None).objective_config  # reward_correct 1, reward_wrong -1
    reward = RewardSection(functions=[{"name": "synthetic"}, {"name": "format", "weight": 0.5,
                                                           "options": {"pattern": "^1", "bonus": 1.0}}])
    score = make_scorer(reward, obj)
    rewards, correct, keys = score(["12", "13", "7"], ["12", "12", "7"])
    np.testing.assert_allclose(rewards, [1 + 0.5, -1 + 0.5, 1 + 0.0])
    np.testing.assert_array_equal(correct, [True, False, True])
    assert keys == ["12", "13", "7"]
    with pytest.raises(DataError, match=r"reward.functions.0"):
        make_scorer(RewardSection(functions=[{"name": "synthetic", "options": {"bogus": 1}}]), obj)


def test_decode_drops_padding_and_eos():
    ids = np.array([TOK.encode("42", add_special_tokens=False) + [TOK.eos_token_id, TOK.pad_token_id]])
    mask = np.array([[1, 1, 1, 0]])
    assert decode_responses(TOK, ids, mask) == ["42"]


def test_a_file_with_a_built_in_tasks_settings_says_which_to_change(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    with pytest.raises(DataError, match=r"options=\{'max_operand': 9\}.*data.train.options=\{\}"):
        load_source(SourceSection(name=str(path), format="gsm8k", options={"max_operand": 9}))
    with pytest.raises(DataError, match="format is 'synthetic'.*data.train.format=gsm8k"):
        load_source(SourceSection(name=str(path), format="synthetic"))


def test_order_seed_reorders_the_training_prompts_and_keeps_the_problems():
    """data.order_seed (what the experiment scripts vary per seed) changes the order prompts are visited in,
    not the built-in task's problems, which data.seed draws."""
    src = SourceSection(name="cot", options={"train_size": 40, "heldout_size": 10})
    base = make_stream(src, TOK, max_prompt_length=200, seed=0)
    same = make_stream(src, TOK, max_prompt_length=200, seed=0, order_seed=0)
    other = make_stream(src, TOK, max_prompt_length=200, seed=0, order_seed=1)
    first = lambda s: [tuple(r) for r in s.next_batch(40).input_ids.tolist()]  # noqa: E731 - one epoch
    a, b, c = first(base), first(same), first(other)
    assert a == b
    assert a != c and sorted(a) == sorted(c)  # the same 40 problems, another order


def test_reward_counts_have_the_same_keys_whether_or_not_anything_was_scored():
    """A metrics row's reward counts may be taken before any score call since the last row (rollout.overlap, a
    resume from a checkpoint holding a scored rollout): the keys must not depend on it."""
    obj = load_config(None).objective_config
    reward = RewardSection(functions=[{"name": "synthetic"}, {"name": "format", "options": {"pattern": "^1"}}])
    score = make_scorer(reward, obj)
    before = score.take_counts()
    score(["12", "x"], ["12", "not a number"])
    after = score.take_counts()
    assert set(before) == set(after) == set(score.take_counts())
    assert "reward_unreadable/synthetic" in before and not any(k.endswith("/format") and "unreadable" in k for k in before)
    assert all(v == 0 for v in before.values())
    assert after["reward_unreadable/synthetic"] == 1 and after["reward_failures/synthetic"] == 0
