"""Observation tokens from the chat template, rendered as a delta: never a re-tokenization of the
model's own tokens.

An episode's ids are the prompt's, then each turn's sampled ids verbatim, then the ids of what the
environment said, and so on. Only the new messages are rendered, against a fixed base conversation
whose last assistant message is a sentinel:

    text  = render([user ".", assistant SENTINEL, *new_messages], add_generation_prompt=True)
    delta = text after SENTINEL                # e.g. "<|im_end|>\n<|im_start|>user\n<tool_response>..."

The delta starts with what the template writes after an assistant message's content (Qwen2.5:
`<|im_end|>\n`). A turn that stopped at the tool-call end marker has not written it, so it is part of
the delta (template tokens: no loss). A turn that ended on the EOS has written `<|im_end|>` itself,
so that prefix is dropped and the delta starts at the `\n` the template puts after it.

`first_difference` is the check mode: the episode's ids against a full re-tokenization of the final
conversation, the first position where they differ.
"""

from __future__ import annotations

from typing import Callable, Sequence

SENTINEL = "\u2063SENTINEL\u2063"  # invisible separators around a word no template alters


class DeltaRenderer:
    """Renders messages to ids through `render(messages, add_generation_prompt) -> text` and `encode`.

    `from_tokenizer(tok, tools=schemas)` uses a transformers tokenizer's chat template."""

    def __init__(self, render: Callable[[list[dict], bool], str], encode: Callable[[str], list[int]],
                 decode: Callable[[Sequence[int]], str], *, eos_text: str = ""):
        self.render, self.encode, self.decode, self.eos_text = render, encode, decode, eos_text

    @classmethod
    def from_tokenizer(cls, tokenizer, *, tools: list[dict] | None = None, eos_text: str | None = None):
        def render(messages, add_generation_prompt):
            return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                 add_generation_prompt=add_generation_prompt)

        if eos_text is None:
            eos_text = tokenizer.eos_token or ""
        return cls(render, lambda text: list(tokenizer.encode(text, add_special_tokens=False)),
                   lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False), eos_text=eos_text)

    def prompt(self, messages: list[dict]) -> list[int]:
        """The first messages with the generation prompt (the assistant's turn opened)."""
        return self.encode(self.render(messages, True))

    def delta_text(self, new_messages: list[dict], *, after_eos: bool) -> str:
        text = self.render([{"role": "user", "content": "."}, {"role": "assistant", "content": SENTINEL},
                            *new_messages], True)
        at = text.find(SENTINEL)
        if at < 0:
            raise ValueError("the chat template does not render an assistant message's content verbatim; "
                             "delta rendering needs it to")
        delta = text[at + len(SENTINEL):]
        if after_eos and self.eos_text and delta.startswith(self.eos_text):
            delta = delta[len(self.eos_text):]
        return delta

    def delta(self, new_messages: list[dict], *, after_eos: bool) -> list[int]:
        """The ids to append after a model turn (ended on the EOS when `after_eos`) for `new_messages`,
        ending with the next assistant turn's opening."""
        return self.encode(self.delta_text(new_messages, after_eos=after_eos))

    def conversation(self, first: list[dict], turns: list[tuple[Sequence[int], list[dict]]],
                     eos_ids: Sequence[int] = ()) -> list[dict]:
        """The final conversation as messages: `first`, then per turn the model's text (its ids decoded,
        a final EOS dropped) as an assistant message and the observations after it."""
        messages = list(first)
        for ids, observations in turns:
            ids = list(ids)
            if ids and ids[-1] in eos_ids:
                ids = ids[:-1]
            messages.append({"role": "assistant", "content": self.decode(ids)})
            messages.extend(observations)
        return messages

    def full_ids(self, messages: list[dict]) -> list[int]:
        """The whole conversation rendered and tokenized at once (what token-in/token-out avoids)."""
        ends_with_model = messages[-1]["role"] == "assistant"
        return self.encode(self.render(messages, not ends_with_model))


def first_difference(episode_ids: Sequence[int], full_ids: Sequence[int]) -> int | None:
    """The first position where the episode's ids and the full re-tokenization differ; None when the
    episode's ids are a prefix of it (the re-rendering may close the last turn with template tokens
    the episode never sampled)."""
    for i, (a, b) in enumerate(zip(episode_ids, full_ids)):
        if a != b:
            return i
    return None if len(episode_ids) <= len(full_ids) else len(full_ids)
