"""PromptStream: skipping long prompts, deterministic seeded order, exact resume across epochs, padded batches."""

import numpy as np
import pytest

from dapo_jax.data.char_tokenizer import build_char_tokenizer
from dapo_jax.data.datasets import Problem
from dapo_jax.data.datasets import DataError
from dapo_jax.data.stream import PromptStream, StreamMismatch

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
    resumed = make(seed=7)
    assert resumed.load_state_dict(dict(state)) == []
    after = [e.index for _ in range(6) for e in resumed.next_examples(n)]
    assert before + after == uninterrupted
    # every epoch is visited exactly once per index: no repeats or skips across epoch boundaries
    total = before + after
    for start in range(0, len(total) - 22, 23):
        assert sorted(total[start:start + 23]) == list(range(23))


def test_state_dict_values_and_mismatch_errors():
    s = make(seed=3)
    s.next_examples(25)
    state = s.state_dict()
    assert {k: state[k] for k in ("epoch", "index", "seed", "num_examples")} == \
        {"epoch": 1, "index": 2, "seed": 3, "num_examples": 23}
    with pytest.raises(StreamMismatch, match="data.seed=3 when the run started, 4 now"):
        make(seed=4).load_state_dict(state)
    with pytest.raises(StreamMismatch, match="23 prompts kept when the run started, 17 now"):
        make(seed=3, max_prompt_length=5).load_state_dict(state)
    with pytest.raises(StreamMismatch, match=r"lacks \['epoch', 'seed', 'num_examples'\]"):
        make(seed=3).load_state_dict({"index": 0})
    with pytest.raises(StreamMismatch, match="position"):
        make(seed=3).load_state_dict({**state, "index": 23})
    assert issubclass(StreamMismatch, DataError)  # the CLI's one line and exit 2


def reference_sha256(problems) -> str:
    """The identity written out independently: SHA-256 over one JSON line [index, text, answer] per prompt."""
    import hashlib
    import json

    text = "".join(json.dumps([p.index, p.problem, p.answer]) + "\n" for p in problems)
    return hashlib.sha256(text.encode()).hexdigest()


def test_the_state_names_its_prompts_and_a_same_size_edit_is_refused():
    """A file edited in place with the same number of rows: the position would silently point into other
    prompts. Refused by content, naming the source; `accept_changed` resumes and says what changed."""
    source = {"key": "data.train", "name": "train.jsonl", "path": "/data/train.jsonl"}
    s = make(seed=3, source=source)
    s.next_examples(5)
    state = s.state_dict()
    assert state["sha256"] == reference_sha256(PROBLEMS) and state["source"] == source
    edited = [*PROBLEMS[:4], Problem(problem=PROBLEMS[4].problem, answer="999", index=4), *PROBLEMS[5:]]
    other = PromptStream(edited, TOK, max_prompt_length=8, seed=3, source=source)
    with pytest.raises(StreamMismatch) as raised:
        other.load_state_dict(state)
    message = str(raised.value)
    assert message.startswith("data.train (/data/train.jsonl): the data changed") and "same 23 prompts" in message
    assert "data.accept_changed=true" in message and "\n" not in message
    changed = other.load_state_dict(state, accept_changed=True)
    assert len(changed) == 1 and "not in content" in changed[0] and other.index == 5
    assert make(seed=3, source=source).load_state_dict(state) == []  # the same prompts: nothing to say


def test_the_same_prompts_from_another_path_are_refused():
    s = make(seed=3, source={"key": "data.train", "name": "train.jsonl", "path": "/a/train.jsonl"})
    moved = make(seed=3, source={"key": "data.train", "name": "train.jsonl", "path": "/b/train.jsonl"})
    with pytest.raises(StreamMismatch, match="read from /a/train.jsonl when the run started, from /b/train.jsonl now"):
        moved.load_state_dict(s.state_dict())


def test_a_state_saved_before_the_identity_resumes_unchecked():
    old = {"epoch": 0, "index": 4, "seed": 3, "num_examples": 23}
    s = make(seed=3, source={"key": "data.train", "name": "x", "path": "/x"})
    assert s.load_state_dict(old) == [] and s.index == 4


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
