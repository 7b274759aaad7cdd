"""The character-level tokenizer: exact round trip, special ids, and offline AutoTokenizer loading."""

import json

from hypothesis import given, settings, strategies as st
from transformers import AutoTokenizer

from dapo_jax.data.char_tokenizer import ALPHABET, EOS, PAD, build_char_tokenizer, save_char_tokenizer

TOK = build_char_tokenizer()


def test_one_token_per_character_and_special_ids():
    assert len(TOK) == 3 + len(ALPHABET) == 99
    assert (TOK.pad_token_id, TOK.eos_token_id, TOK.unk_token_id) == (0, 1, 2)
    assert TOK.convert_ids_to_tokens([0, 1]) == [PAD, EOS]
    ids = TOK.encode("12+7=", add_special_tokens=False)
    assert ids == [3 + ALPHABET.index(c) for c in "12+7="]
    assert TOK.encode("a" + EOS, add_special_tokens=False) == [3 + ALPHABET.index("a"), 1]
    assert set(TOK.encode("é", add_special_tokens=False)) == {TOK.unk_token_id}  # one per byte of its UTF-8


@settings(max_examples=25, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=40))
def test_round_trip_is_exact(text):
    ids = TOK.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    assert TOK.decode(ids) == text


def test_auto_tokenizer_loads_the_saved_files(tmp_path):
    save_char_tokenizer(tmp_path)
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= {p.name for p in tmp_path.iterdir()}
    assert json.loads((tmp_path / "special_tokens_map.json").read_text())["eos_token"] == EOS
    tok = AutoTokenizer.from_pretrained(tmp_path)
    text = "Answer: 42\n 7-3=4 ~"
    assert tok.encode(text, add_special_tokens=False) == TOK.encode(text, add_special_tokens=False)
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert (tok.pad_token_id, tok.eos_token_id, tok.padding_side) == (0, 1, "left")
    chat = tok.apply_chat_template([{"role": "user", "content": "3+4="}], tokenize=False, add_generation_prompt=True)
    assert chat == "3+4="


def test_a_qwen2_folder_loads_as_qwen2_tokenizer_with_the_same_ids(tmp_path):
    """transformers 5 loads a folder whose config.json says qwen2 as Qwen2Tokenizer (byte-level
    pre-tokenizer and decoder forced on): spaces and newlines must survive (they were dropped)."""
    save_char_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": len(TOK)}))
    tok = AutoTokenizer.from_pretrained(tmp_path)
    assert type(tok).__name__ == "Qwen2Tokenizer"
    text = "a3+b4=\n3\n  7\nAnswer: 7"
    assert tok.encode(text, add_special_tokens=False) == TOK.encode(text, add_special_tokens=False)
    assert len(tok.encode(text, add_special_tokens=False)) == len(text)
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
