"""PromptStream: skipping long prompts, deterministic seeded order, exact resume across epochs, padded batches."""

import numpy as np
import pytest

from dapo_jax.data.char_tokenizer import build_char_tokenizer
from dapo_jax.data.datasets import Problem
from dapo_jax.data.stream import PromptStream

TOK = build_char_tokenizer()
PROBLEMS = [Problem(problem="x" * (1 + i % 7), answer=str(i), index=i) for i in range(23)]


def make(**kw):
    kw.setdefault("max_prompt_length", 8)
    return PromptStream(PROBLEMS, TOK, **kw)


def test_long_prompts_are_skipped_and_counted_never_truncated():
    stream = make(max_prompt_length=5)
    # lengths 1..7 cycle: 6 and 7 are too long -> rows i % 7 in {5, 6}
    too_long = [i for i in range(23) if i % 7 >= 5]
    assert stream.skipped == too_long and stream.num_skipped == 6
    assert len(stream) == 17
    assert all(len(e.ids) <= 5 and e.text == "x" * (1 + e.index % 7) for e in stream.examples)


def test_one_epoch_is_a_permutation_and_seed_fixes_it():
    a = [e.index for e in make(seed=1).next_examples(23)]
    b = [e.index for e in make(seed=1).next_examples(23)]
    c = [e.index for e in make(seed=2).next_examples(23)]
    assert a == b and sorted(a) == list(range(23)) and a != c
    assert [e.index for e in make(shuffle=False).next_examples(23)] == list(range(23))


@pytest.mark.parametrize("k, n", [(3, 5), (4, 5), (5, 7), (1, 23), (2, 30)])
def test_resume_continues_exactly(k, n):
    """Consume k batches, save, rebuild from the state: the rest matches the uninterrupted stream."""
    full = make(seed=7)
    uninterrupted = [e.index for _ in range(k + 6) for e in full.next_examples(n)]
    first = make(seed=7)
    before = [e.index for _ in range(k) for e in first.next_examples(n)]
    state = first.state_dict()
    resumed = make(seed=7).load_state_dict(dict(state))
    after = [e.index for _ in range(6) for e in resumed.next_examples(n)]
    assert before + after == uninterrupted
    # every epoch is visited exactly once per index: no repeats or skips across epoch boundaries
    total = before + after
    for start in range(0, len(total) - 22, 23):
        assert sorted(total[start:start + 23]) == list(range(23))


def test_state_dict_values_and_mismatch_errors():
    s = make(seed=3)
    s.next_examples(25)
    assert s.state_dict() == {"epoch": 1, "index": 2, "seed": 3, "num_examples": 23}
    with pytest.raises(ValueError, match="seed=3"):
        make(seed=4).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="23 examples"):
        make(seed=3, max_prompt_length=5).load_state_dict(s.state_dict())
    with pytest.raises(KeyError, match="'epoch'"):
        make(seed=3).load_state_dict({"index": 0})


def test_next_batch_is_left_padded_to_a_bucket():
    stream = make(shuffle=False, buckets=(4, 8))
    batch = stream.next_batch(3)  # texts x, xx, xxx -> bucket 4
    x = TOK.convert_tokens_to_ids("x")
    np.testing.assert_array_equal(batch.input_ids, [[0, 0, 0, x], [0, 0, x, x], [0, x, x, x]])
    np.testing.assert_array_equal(batch.attention_mask, [[0, 0, 0, 1], [0, 0, 1, 1], [0, 1, 1, 1]])
    assert batch.answers == ["0", "1", "2"] and batch.texts == ["x", "xx", "xxx"] and batch.indices == [0, 1, 2]
    batch = stream.next_batch(3)  # lengths 4, 5, 6 -> bucket 8
    assert batch.input_ids.shape == (3, 8)
    np.testing.assert_array_equal(batch.attention_mask.sum(1), [4, 5, 6])
    assert stream.state_dict()["index"] == 6


def test_iterate_once_covers_all_in_order_and_keeps_position():
    stream = make(seed=0)
    stream.next_examples(4)
    state = stream.state_dict()
    seen = [i for b in stream.iterate_once(10) for i in b.indices]
    assert seen == list(range(23)) and stream.state_dict() == state


def test_real_tokenizer_with_dapo_template(shared):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(shared("tokenizers", "qwen2.5"))
    problems = [Problem("What is 1+1?", "2", 0), Problem("word " * 300, "0", 1)]
    stream = PromptStream(problems, tok, template="dapo_chat", max_prompt_length=128, seed=0)
    assert stream.skipped == [1]
    batch = stream.next_batch(1)
    assert batch.input_ids.shape[1] in stream.buckets
    assert tok.decode(batch.input_ids[0][batch.attention_mask[0] == 1]) == batch.texts[0]
    assert batch.texts[0].startswith("<|im_start|>")
