"""Delta rendering: the ids appended after a turn equal the full conversation's rendering minus its
prefix, with Qwen2.5's real template and tokenizer; the check mode finds the first differing id."""

import pytest

from dapo_jax.agents.render import DeltaRenderer, first_difference
from dapo_jax.agents.tools import Tool
from tests.agents.helpers import id_renderer, text
from tests.conftest import shared_path


def calc(expression: str) -> str:
    """Evaluates an arithmetic expression.

    Args:
      expression: e.g. "12+30".
    """
    return expression


@pytest.fixture(scope="module")
def qwen():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(shared_path("tokenizers", "qwen2.5")))
    return tokenizer, DeltaRenderer.from_tokenizer(tokenizer, tools=[Tool.from_function(calc).schema])


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3, 4]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2


def test_concatenating_template_deltas():
    r = id_renderer()
    assert r.delta([{"role": "tool", "content": text([4, 5])}], after_eos=False) == [4, 5]
    assert r.prompt([{"role": "user", "content": text([1, 2])}]) == [1, 2]


@pytest.mark.parametrize("after_eos", [False, True])
def test_qwen25_delta_equals_full_rendering_minus_prefix(qwen, after_eos):
    """A tool-calling turn that stopped at `</tool_call>` (or a turn that ended on `<|im_end|>`
    followed by a user message), then a final answer: the episode's ids, built from the prompt, the
    model's ids verbatim and the deltas, are the full conversation's ids token for token."""
    tokenizer, renderer = qwen
    first = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "What is 12+30?"}]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if after_eos:
        turn1 = tokenizer.encode("Let me think.", add_special_tokens=False) + [im_end]
        observations = [{"role": "user", "content": "Go on."}]
    else:
        turn1 = tokenizer.encode('<tool_call>\n{"name": "calc", "arguments": {"expression": "12+30"}}\n</tool_call>',
                                 add_special_tokens=False)
        assert turn1[-1] == tokenizer.convert_tokens_to_ids("</tool_call>")  # one id: the stop marker
        observations = [{"role": "tool", "content": "42"}, {"role": "tool", "content": "x" * 3}]
    turn2 = tokenizer.encode("The answer is 42.", add_special_tokens=False) + [im_end]
    prompt = renderer.prompt(first)
    delta = renderer.delta(observations, after_eos=after_eos)
    episode = prompt + turn1 + delta + turn2
    messages = renderer.conversation(first, [(turn1, observations), (turn2, [])], eos_ids=[im_end])
    full = renderer.full_ids(messages)
    assert first_difference(episode, full) is None
    assert full[:len(episode)] == episode and tokenizer.decode(full[len(episode):]) == "\n"  # the template's close
    # the delta alone: what the full rendering adds after the turn
    assert full[len(prompt) + len(turn1):len(prompt) + len(turn1) + len(delta)] == delta
    delta_text = tokenizer.decode(delta)
    assert delta_text.endswith("<|im_start|>assistant\n")
    assert delta_text.startswith("\n<|im_start|>user" if after_eos else "<|im_end|>\n<|im_start|>user\n<tool_response>")


def test_the_check_finds_a_non_canonical_model_tokenization(qwen):
    """The model may sample ids that decode to text whose tokenization is different ("hel" + "lo"
    vs "hello"): the training sequence keeps the sampled ids; the check reports where they part."""
    tokenizer, renderer = qwen
    first = [{"role": "user", "content": "Say hello."}]
    pieces = tokenizer.encode("hel", add_special_tokens=False) + tokenizer.encode("lo", add_special_tokens=False)
    assert pieces != tokenizer.encode("hello", add_special_tokens=False)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = renderer.prompt(first)
    episode = prompt + pieces + [im_end]
    full = renderer.full_ids(renderer.conversation(first, [(pieces + [im_end], [])], eos_ids=[im_end]))
    assert first_difference(episode, full) == len(prompt)
