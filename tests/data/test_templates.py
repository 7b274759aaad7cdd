"""Prompt templates: DAPO text verbatim, chat wrapping through the tokenizer, raw passthrough."""

import pytest

from dapo_jax.data.char_tokenizer import build_char_tokenizer
from dapo_jax.data.templates import DAPO_TEMPLATE, render_prompt

EXPECTED_DAPO = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\nWhat is 1+1?\n\n"
    "Remember to put your answer on its own line after \"Answer:\"."
)


def test_raw_and_dapo():
    assert render_prompt("What is 1+1?") == "What is 1+1?"
    assert render_prompt("What is 1+1?", template="dapo") == EXPECTED_DAPO
    assert DAPO_TEMPLATE.count("{problem}") == 1


def test_chat_with_a_real_chat_template(shared):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(shared("tokenizers", "qwen2.5"))
    text = render_prompt("2+2?", template="chat", tokenizer=tok, system="Be brief.")
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    text = render_prompt("What is 1+1?", template="dapo_chat", tokenizer=tok)
    assert text.endswith(f"<|im_start|>user\n{EXPECTED_DAPO}<|im_end|>\n<|im_start|>assistant\n")


def test_chat_with_the_tiny_tokenizer_is_the_problem():
    assert render_prompt("3+4=", template="chat", tokenizer=build_char_tokenizer()) == "3+4="


def test_errors():
    with pytest.raises(ValueError, match="template='nope'"):
        render_prompt("x", template="nope")
    with pytest.raises(ValueError, match="needs a tokenizer with a chat_template"):
        render_prompt("x", template="chat")
    with pytest.raises(ValueError, match="system= is only used"):
        render_prompt("x", template="raw", system="s")


def test_r1_zero_is_the_papers_conversation_ending_at_assistant():
    text = render_prompt("What is 1+1?", template="r1_zero")
    assert text == (
        "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
        "assistant first thinks about the reasoning process in the mind and then provides the user with the answer. "
        "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, "
        "respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>. "
        "User: What is 1+1?. Assistant:")
    assert render_prompt("{x}", template="r1_zero").count("User: {x}.") == 1  # braces in a problem are kept
    chat = render_prompt("What is 1+1?", template="r1_zero_chat", tokenizer=build_char_tokenizer())
    assert chat == text  # the tiny tokenizer's chat template is the user message itself
