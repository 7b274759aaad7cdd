"""Supervised data: (prompt, response) pairs and chat conversations as tokenised training examples.

    examples, skipped = supervised_examples(rows, tokenizer, format="sft", stop_ids=(eos,), ...)
    stream = SupervisedStream(examples, tokenizer, max_prompt_length=S, seed=0, source={...})
    batch = stream.next_examples(n)       # each one's prompt `ids` and `response_ids`, resumable

Two row formats (docs/stages.md#sft-data):

| format | row | examples |
|---|---|---|
| ``sft`` | ``{"prompt": ..., "response": ...}`` (fields: ``prompt_field`` / ``answer_field``) | one |
| ``messages`` | ``{"messages": [{"role": ..., "content": ...}, ...]}`` (field: ``prompt_field``) | one per assistant turn |

A ``sft`` row's prompt is rendered with the source's template (data/templates.py) as the RL side
renders it; with a chat template the response is the assistant turn the template writes after it.
A conversation becomes one example per assistant turn: the prompt is every message before the turn
(rendered by the tokenizer's chat template with the generation prompt), the response is the turn.
Only the response tokens are trained (the loss mask), so the model learns the assistant's turns and
never the user's or the system's; a causal model's log-probs of a turn given its context are the
same whether the context is its own sequence or the start of a longer one, so the loss equals the
whole conversation's with a mask on the assistant tokens.

A response ends at its first stop token (inclusive: the model learns to stop there); a response
without one gets the first stop id appended. Examples whose prompt is longer than the run's prompt
budget or whose response is longer than its response budget are left out and counted, never cut.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from dapo_jax.data.datasets import DataError
from dapo_jax.data.stream import PromptExample, PromptStream
from dapo_jax.data.templates import render_prompt, uses_chat_template

SUPERVISED_FORMATS = ("sft", "messages")
ROLES = ("system", "user", "assistant", "tool")


@dataclasses.dataclass(frozen=True)
class SupervisedExample(PromptExample):
    """A prompt (`ids`, `text`) and the response to train on: `response_ids` (stop token included),
    its text in `answer`; `index` is the source row (several examples share a conversation's row)."""

    response_ids: tuple[int, ...] = ()


def _field(row: dict, dotted: str):
    value = row
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _end(ids: list[int], stop_ids: Sequence[int]) -> tuple[int, ...]:
    """`ids` up to and including its first stop token, or with `stop_ids[0]` appended when it has none."""
    for i, t in enumerate(ids):
        if t in stop_ids:
            return tuple(ids[: i + 1])
    return (*ids, int(stop_ids[0]))


def _chat_turns(messages: list[dict], tokenizer, stop_ids, where: str) -> list[tuple[str, list[int], str, tuple]]:
    """`(prompt text, prompt ids, response text, response ids)` for each assistant turn of a conversation."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{where}: chat rows need a tokenizer with a chat_template (model.path's has none)")
    out = []
    for j, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(messages[:j], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(messages[: j + 1], tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
        if full_ids[: len(prompt_ids)] != prompt_ids or len(full_ids) == len(prompt_ids):
            raise DataError(f"{where}: the chat template does not render message {j} (assistant) as a continuation "
                            f"of the messages before it, so its tokens cannot be told apart from the context")
        out.append((prompt, prompt_ids, message["content"], _end(full_ids[len(prompt_ids):], stop_ids)))
    return out


def _messages(value, where: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: expected a non-empty list of messages, got {type(value).__name__}")
    for j, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: message {j} must be {{'role': one of {ROLES}, 'content': a string}}, got {m!r}"[:300])
    if not any(m["role"] == "assistant" for m in value):
        raise DataError(f"{where}: no message with role 'assistant' (nothing to train on)")
    return value


def supervised_examples(rows: list[dict], tokenizer, *, format: str, template: str = "raw", stop_ids: Sequence[int],
                        prompt_field: str | None = None, response_field: str | None = None,
                        max_prompt_length: int, max_response_length: int,
                        source: str = "<rows>") -> tuple[list[SupervisedExample], dict[str, int]]:
    """Tokenised examples of `rows`, and the counts left out: `{"prompt": n, "response": n}` too long.

    A row without its field, with an empty response, or a malformed conversation raises `DataError`
    naming the source, the row and the field."""
    if format not in SUPERVISED_FORMATS:
        raise DataError(f"{source}: format {format!r} is not a supervised format; use one of {SUPERVISED_FORMATS}")
    if not stop_ids:
        raise DataError(f"{source}: the model has no stop token (eos_token_id) to end the responses with")
    stop_ids = tuple(int(i) for i in stop_ids)
    examples, skipped = [], {"prompt": 0, "response": 0}
    for i, row in enumerate(rows):
        if format == "messages":
            name = prompt_field or "messages"
            where = f"{source}: row {i}, field {name!r}"
            turns = _chat_turns(_messages(_field(row, name), where), tokenizer, stop_ids, where)
        else:
            names = {"prompt": prompt_field or "prompt", "response": response_field or "response"}
            values = {role: _field(row, name) for role, name in names.items()}
            for role, value in values.items():
                if not isinstance(value, str) or not value.strip():
                    raise DataError(f"{source}: row {i} has no {role} field {names[role]!r} (a non-empty string; "
                                    f"row keys: {sorted(row)})")
            if uses_chat_template(template):  # the assistant turn the template writes after the prompt
                user = render_prompt(values["prompt"], template="dapo" if template == "dapo_chat" else "raw")
                turns = _chat_turns([{"role": "user", "content": user},
                                     {"role": "assistant", "content": values["response"]}],
                                    tokenizer, stop_ids, f"{source}: row {i}")
            else:
                text = render_prompt(values["prompt"], template=template)
                ids = tokenizer(text, add_special_tokens=True)["input_ids"]
                response = tokenizer(values["response"], add_special_tokens=False)["input_ids"]
                turns = [(text, ids, values["response"], _end(response, stop_ids))]
        for text, ids, answer, response_ids in turns:
            if len(ids) > max_prompt_length:
                skipped["prompt"] += 1
            elif len(response_ids) > max_response_length:
                skipped["response"] += 1
            else:
                examples.append(SupervisedExample(tuple(ids), text, answer, i, response_ids=tuple(response_ids)))
    return examples, skipped


class SupervisedStream(PromptStream):
    """A `PromptStream` over supervised examples: the same seeded, resumable order and identity checks
    (its SHA-256 covers the responses' text too), each example carrying its `response_ids`."""

    def __init__(self, examples: Sequence[SupervisedExample], tokenizer, *, max_prompt_length: int, seed: int = 0,
                 shuffle: bool = True, skipped: dict[str, int] | None = None, source: dict | None = None):
        if not examples:
            raise ValueError("no example is left (every prompt or response is longer than the budget)")
        self.examples = list(examples)
        self.skipped = [None] * (skipped or {}).get("prompt", 0)  # the loop's `num_skipped`: prompts too long
        self.skipped_responses = (skipped or {}).get("response", 0)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_id is None:
            raise ValueError("the tokenizer has neither a pad_token_id nor an eos_token_id to pad with")
        self.buckets = (max_prompt_length,)
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.index = 0, 0
        self._order_epoch, self._order = None, None
        self.source = dict(source or {})
        self._sha256 = None


__all__ = ["ROLES", "SUPERVISED_FORMATS", "SupervisedExample", "SupervisedStream", "supervised_examples"]
