"""A character-level tokenizer in Hugging Face format, for the embedded tiny model.

One token per character of printable ASCII plus newline, and the special tokens ``<pad>``,
``<|endoftext|>`` (EOS) and ``<unk>``. Built with the ``tokenizers`` library (a ``WordLevel`` model
over single characters, a pre-tokenizer that isolates every character, and a byte-level decoder so
``decode`` concatenates without spaces), and saved so that
``transformers.AutoTokenizer.from_pretrained(dir)`` loads it offline. For every text over the
alphabet, ``decode(encode(text)) == text`` exactly.

The vocabulary spells each character the GPT-2 byte-level way (space ``Ġ``, newline ``Ċ``; printable
ASCII is itself) behind a ``ByteLevel`` pre-tokenizer and decoder. transformers 5 loads a folder whose
config.json says ``qwen2`` as ``Qwen2Tokenizer`` whatever tokenizer_config.json names, and that class
replaces the pre-tokenizer and decoder with byte-level ones: with a plain-character vocabulary it
silently dropped every space and newline on encode. Spelled this way, both loaders give the same ids
(which are unchanged from the plain spelling, so the shipped models did not need retraining).
"""

from __future__ import annotations

import json
from pathlib import Path

PAD, EOS, UNK = "<pad>", "<|endoftext|>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, UNK)
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))  # newline + printable ASCII
# Plain concatenation of the messages' contents: the tiny model was trained on raw prompts, so
# "chat" and "raw" templates agree for it (real chat models bring their own template).
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def byte_level(char: str) -> str:
    """`char` as GPT-2's byte-level alphabet spells it (" " -> "Ġ", "\n" -> "Ċ", "a" -> "a")."""
    from tokenizers.pre_tokenizers import ByteLevel

    return ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(char)[0][0]


def char_vocab(alphabet: str = ALPHABET) -> dict[str, int]:
    """Token -> id: the special tokens first (pad 0, eos 1, unk 2), then the characters (byte-level spelling)."""
    if len(set(alphabet)) != len(alphabet):
        raise ValueError("alphabet has repeated characters")
    if any(len(c.encode()) != 1 for c in alphabet):
        raise ValueError("the alphabet must be single-byte (ASCII) characters: one byte-level token each")
    tokens = list(SPECIAL_TOKENS) + [byte_level(c) for c in alphabet]
    return {tok: i for i, tok in enumerate(tokens)}


def build_char_tokenizer(alphabet: str = ALPHABET):
    """A ``transformers.PreTrainedTokenizerFast`` with one token per character of ``alphabet``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab=char_vocab(alphabet), unk_token=UNK))
    # `[\s\S]` rather than `.`: the regex `.` would not match a newline.
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK,
        padding_side="left", clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_char_tokenizer(path: str | Path, alphabet: str = ALPHABET) -> Path:
    """Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json into ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = build_char_tokenizer(alphabet)
    tok.save_pretrained(str(path))
    # transformers 5 no longer writes special_tokens_map.json; older loaders still look for it.
    special = {"pad_token": PAD, "eos_token": EOS, "unk_token": UNK}
    (path / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    # The generic fast class name loads in transformers 4.x as well as 5.x.
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config, indent=2) + "\n")
    return path


