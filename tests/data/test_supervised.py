"""Supervised rows -> tokenised examples (data/supervised.py): prompt/response pairs and chat conversations,
the response's stop token, the budgets, the errors naming the row, and the resumable stream."""

import numpy as np
import pytest

from dapo_jax.data.char_tokenizer import build_char_tokenizer
from dapo_jax.data.datasets import DataError
from dapo_jax.data.supervised import SupervisedStream, supervised_examples

EOS = 1


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def examples(rows, tok, **kw):
    opts = dict(format="sft", stop_ids=(EOS,), max_prompt_length=16, max_response_length=8, source="rows.jsonl")
    return supervised_examples(rows, tok, **{**opts, **kw})


def test_prompt_response_rows(tok):
    out, skipped = examples([{"prompt": "3+4=", "response": "7"}, {"prompt": "12+9=", "response": "21"}], tok)
    assert skipped == {"prompt": 0, "response": 0}
    assert [e.ids for e in out] == [tuple(tok("3+4=")["input_ids"]), tuple(tok("12+9=")["input_ids"])]
    # the response's own tokens, then the stop token the model must learn to write
    assert out[0].response_ids == (*tok("7", add_special_tokens=False)["input_ids"], EOS)
    assert out[1].response_ids == (*tok("21", add_special_tokens=False)["input_ids"], EOS)
    assert [e.index for e in out] == [0, 1] and out[1].answer == "21"


def test_a_response_ends_at_its_first_stop_token(tok):
    two = tok("2", add_special_tokens=False)["input_ids"][0]
    out, _ = examples([{"prompt": "1+1=", "response": "2"}], tok, stop_ids=(two, EOS))
    assert out[0].response_ids == (two,)  # "2" is a stop token here: nothing appended after it


def test_custom_fields_and_budgets(tok):
    rows = [{"q": "1+1=", "a": "2"}, {"q": "1" * 20, "a": "2"}, {"q": "1+2=", "a": "3" * 9}]
    out, skipped = examples(rows, tok, prompt_field="q", response_field="a")
    assert [e.index for e in out] == [0]
    assert skipped == {"prompt": 1, "response": 1}  # never cut: left out and counted


@pytest.mark.parametrize("row, match", [({"prompt": "1+1="}, "row 0 has no response field 'response'"),
                                        ({"prompt": "1+1=", "response": "  "}, "row 0 has no response"),
                                        ({"response": "2"}, "row 0 has no prompt field")])
def test_bad_rows_name_the_row_and_field(tok, row, match):
    with pytest.raises(DataError, match=match):
        examples([row], tok)


def test_messages_one_example_per_assistant_turn(tok):
    # the character tokenizer's chat template writes the contents one after the other
    conversation = [{"role": "system", "content": "S"}, {"role": "user", "content": "1+1="},
                    {"role": "assistant", "content": "2"}, {"role": "user", "content": "+3="},
                    {"role": "assistant", "content": "5"}]
    out, _ = examples([{"messages": conversation}], tok, format="messages")
    enc = lambda s: tuple(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    assert [e.ids for e in out] == [enc("S1+1="), enc("S1+1=2+3=")]
    # only the assistant's tokens are ever a response (the trained tokens): never the user's or the system's
    assert [e.response_ids for e in out] == [(*enc("2"), EOS), (*enc("5"), EOS)]
    assert [e.index for e in out] == [0, 0]


@pytest.mark.parametrize("messages, match", [
    ([{"role": "user", "content": "hi"}], "no message with role 'assistant'"),
    ([{"role": "robot", "content": "hi"}], "message 0 must be"),
    ("hello", "expected a non-empty list of messages"),
])
def test_bad_conversations(tok, messages, match):
    with pytest.raises(DataError, match=match):
        examples([{"messages": messages}], tok, format="messages")


def test_messages_with_the_real_qwen_template(shared):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(shared("tokenizers", "qwen2.5"))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    conversation = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
                    {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6"}]
    out, _ = examples([{"messages": conversation}], tok, format="messages", stop_ids=(im_end,),
                      max_prompt_length=200, max_response_length=8)
    assert len(out) == 2
    for e, answer in zip(out, ("4", "6")):
        assert tok.decode(e.response_ids) == f"{answer}<|im_end|>"  # the turn and its end-of-turn token only
        assert e.text.endswith("<|im_start|>assistant\n")  # the generation prompt ends the context
    assert "What is 2+2?" in out[1].text and "4<|im_end|>" in out[1].text


def test_stream_is_seeded_and_resumable(tok):
    rows = [{"prompt": f"{i}+1=", "response": str(i + 1)} for i in range(7)]
    ex, _ = examples(rows, tok)
    a = SupervisedStream(ex, tok, max_prompt_length=16, seed=3)
    first = [e.index for e in a.next_examples(5)]
    state = a.state_dict()
    rest = [e.index for e in a.next_examples(6)]
    b = SupervisedStream(ex, tok, max_prompt_length=16, seed=3)
    b.load_state_dict(state)
    assert [e.index for e in b.next_examples(6)] == rest
    assert sorted(first + rest[:2]) == list(range(7))  # an epoch visits every example once
    batch = a.pad(ex[:2])
    assert batch.input_ids.shape == (2, 16) and np.all(batch.attention_mask[:, -1] == 1)  # left-padded
    changed, _ = examples([{**rows[0], "response": "9"}, *rows[1:]], tok)
    with pytest.raises(DataError, match="not in content"):  # a changed response is a changed stream
        SupervisedStream(changed, tok, max_prompt_length=16, seed=3).load_state_dict(state)


def test_unknown_format(tok):
    with pytest.raises(DataError, match="not a supervised format"):
        examples([{"prompt": "a", "response": "b"}], tok, format="gsm8k")
