"""Prompt templates: how a bare problem becomes the text the policy is conditioned on.

| name | text |
|---|---|
| ``raw`` | the problem as is |
| ``dapo`` | DAPO's instruction around the problem (asks for a last line ``Answer: $Answer``) |
| ``chat`` | the tokenizer's chat template over one user message holding the problem |
| ``dapo_chat`` | the chat template over the DAPO instruction (what the DAPO recipe feeds a chat model) |
| ``r1_zero`` | R1-Zero's plain-text conversation: think in ``<think>``, answer in ``<answer>``; ends ``Assistant:`` |
| ``r1_zero_chat`` | the chat template over the same instruction and problem |
"""

from __future__ import annotations

# DAPO's prompt, verbatim from the DAPO-Math-17k recipe (see shared/data/SOURCES.md).
DAPO_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    "{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
# DeepSeek-R1-Zero's template (DeepSeek-AI, 2025, Table 1), for a base model: the model continues after
# "Assistant:" and is rewarded for <think>...</think><answer>...</answer> (rewards: think_format).
R1_ZERO_TEMPLATE = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
    "assistant first thinks about the reasoning process in the mind and then provides the user with the answer. "
    "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, "
    "respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>. "
    "User: {problem}. Assistant:"
)
TEMPLATES = ("raw", "dapo", "chat", "dapo_chat", "r1_zero", "r1_zero_chat")
_TEXT = {"dapo": DAPO_TEMPLATE, "dapo_chat": DAPO_TEMPLATE, "r1_zero": R1_ZERO_TEMPLATE,
         "r1_zero_chat": R1_ZERO_TEMPLATE}


def uses_chat_template(template: str) -> bool:
    """Whether the template's text already holds the tokenizer's special tokens (BOS, role markers)."""
    return template in ("chat", "dapo_chat", "r1_zero_chat")


def render_prompt(problem: str, *, template: str = "raw", tokenizer=None, system: str | None = None) -> str:
    """The prompt text for one problem.

    Args:
      problem: the bare problem statement.
      template: one of ``TEMPLATES``.
      tokenizer: a ``transformers`` tokenizer with a chat template (chat-based templates only).
      system: an optional system message (chat-based templates only).
    """
    if template not in TEMPLATES:
        raise ValueError(f"template={template!r}: expected one of {TEMPLATES}")
    text = _TEXT[template].format(problem=problem) if template in _TEXT else problem
    if not uses_chat_template(template):
        if system is not None:
            raise ValueError(f"system= is only used by the chat-based templates, not template={template!r}")
        return text
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"template={template!r} needs a tokenizer with a chat_template")
    messages = ([{"role": "system", "content": system}] if system is not None else [])
    messages.append({"role": "user", "content": text})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
