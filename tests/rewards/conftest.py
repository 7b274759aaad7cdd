"""Tiny reward-model folders written by transformers itself, with the character tokenizer beside them."""

from pathlib import Path

import pytest

# the reward model's chat template: prompt, newline, response, EOS (the score is read at the EOS)
RM_TEMPLATE = ("{% for message in messages %}{{ message['content'] }}{% if message['role'] == 'user' %}{{ '\\n' }}"
               "{% endif %}{% endfor %}<|endoftext|>")
SEPARATOR = "#"  # a process RM's step separator: one character, one token


def make_rm(path: Path, task: str, seed: int = 0, num_labels: int | None = None) -> Path:
    """A 1-layer Qwen2 classifier (`task`: "sequence", 1 label, or "token", 2 labels) with weights
    spread beyond HF's init, saved by transformers, plus the character tokenizer and RM_TEMPLATE."""
    import torch
    import transformers

    from dapo_jax.data.char_tokenizer import build_char_tokenizer, save_char_tokenizer

    tok = build_char_tokenizer()
    labels = num_labels or (1 if task == "sequence" else 2)
    cfg = transformers.Qwen2Config(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                                   pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, num_labels=labels,
                                   attn_implementation="eager")
    cls = transformers.Qwen2ForSequenceClassification if task == "sequence" else transformers.Qwen2ForTokenClassification
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if name.endswith("norm.weight") else 0.3 * torch.randn_like(p))
    model.save_pretrained(path)
    save_char_tokenizer(path)
    (path / "chat_template.jinja").write_text(RM_TEMPLATE)
    return path


@pytest.fixture(scope="session")
def orm_dir(tmp_path_factory) -> Path:
    return make_rm(tmp_path_factory.mktemp("orm"), "sequence")


@pytest.fixture(scope="session")
def prm_dir(tmp_path_factory) -> Path:
    return make_rm(tmp_path_factory.mktemp("prm"), "token", seed=1)
