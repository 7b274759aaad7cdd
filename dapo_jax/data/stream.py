"""A resumable, seeded stream of tokenised prompts, batched into left-padded fixed shapes.

    stream = PromptStream(problems, tokenizer, template="dapo", max_prompt_length=512, seed=0)
    batch = stream.next_batch(32)          # PromptBatch: input_ids [32, bucket], attention_mask, answers, ...
    state = stream.state_dict()            # {"epoch", "index", "seed", "num_examples"}
    PromptStream(problems, tokenizer, ...).load_state_dict(state)   # continues exactly where it stopped

Epoch ``e`` visits the kept examples in the order ``np.random.default_rng([seed, e]).permutation(n)``
(the identity when ``shuffle=False``), so the position ``(epoch, index)`` alone fixes what comes next:
a resumed run neither repeats nor skips a prompt, across epoch boundaries too. Prompts longer than
``max_prompt_length`` tokens are skipped (never truncated: a cut problem has a wrong answer) and counted.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Sequence

import numpy as np

from dapo_jax.data.batching import default_buckets, left_pad
from dapo_jax.data.datasets import Problem
from dapo_jax.data.templates import render_prompt, uses_chat_template


@dataclasses.dataclass(frozen=True)
class PromptExample:
    """One tokenised prompt: ``ids`` (no padding), the rendered ``text``, its ``answer``, and source ``index``."""

    ids: tuple[int, ...]
    text: str
    answer: str
    index: int


@dataclasses.dataclass(frozen=True)
class PromptBatch:
    """``n`` prompts left-padded to one bucket: ``input_ids``/``attention_mask`` ``[n, bucket]`` int32."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    examples: tuple[PromptExample, ...]

    @property
    def answers(self) -> list[str]:
        return [e.answer for e in self.examples]

    @property
    def texts(self) -> list[str]:
        return [e.text for e in self.examples]

    @property
    def indices(self) -> list[int]:
        return [e.index for e in self.examples]


def tokenize_problems(problems: Sequence[Problem], tokenizer, *, template: str = "raw",
                      max_prompt_length: int, system: str | None = None) -> tuple[list[PromptExample], list[int]]:
    """Renders and tokenises every problem; returns (kept examples, source indices of skipped long prompts)."""
    texts = [render_prompt(p.problem, template=template, tokenizer=tokenizer, system=system) for p in problems]
    # Chat templates already spell out BOS and role tokens; adding them again would double BOS.
    encoded = tokenizer(texts, add_special_tokens=not uses_chat_template(template))["input_ids"]
    kept, skipped = [], []
    for p, text, ids in zip(problems, texts, encoded):
        if len(ids) > max_prompt_length:
            skipped.append(p.index)
        else:
            kept.append(PromptExample(ids=tuple(ids), text=text, answer=p.answer, index=p.index))
    return kept, skipped


class PromptStream:
    """Endless seeded iteration over tokenised prompts, with an explicit resumable position."""

    def __init__(self, problems: Sequence[Problem], tokenizer, *, max_prompt_length: int, template: str = "raw",
                 seed: int = 0, shuffle: bool = True, buckets: Sequence[int] | None = None,
                 system: str | None = None):
        self.examples, self.skipped = tokenize_problems(
            problems, tokenizer, template=template, max_prompt_length=max_prompt_length, system=system)
        if not self.examples:
            raise ValueError(f"every one of the {len(problems)} prompts is longer than "
                             f"max_prompt_length={max_prompt_length} tokens")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_id is None:
            raise ValueError("the tokenizer has neither a pad_token_id nor an eos_token_id to pad with")
        self.buckets = tuple(buckets) if buckets else default_buckets(max_prompt_length)
        if max(self.buckets) < max_prompt_length:
            raise ValueError(f"buckets={self.buckets} do not reach max_prompt_length={max_prompt_length}")
        self.seed, self.shuffle = seed, shuffle
        self.epoch, self.index = 0, 0
        self._order_epoch, self._order = None, None

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The visiting order of epoch ``epoch`` (a permutation of ``range(len(self))``)."""
        if self._order_epoch != epoch:
            n = len(self.examples)
            self._order = (np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle
                           else np.arange(n))
            self._order_epoch = epoch
        return self._order

    def next_examples(self, n: int) -> list[PromptExample]:
        """The next ``n`` examples (continuing into the next epoch when this one runs out); advances the position."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        out = []
        while len(out) < n:
            order = self.epoch_order(self.epoch)
            take = min(n - len(out), len(order) - self.index)
            out.extend(self.examples[i] for i in order[self.index:self.index + take])
            self.index += take
            if self.index == len(order):
                self.epoch, self.index = self.epoch + 1, 0
        return out

    def next_batch(self, n: int) -> PromptBatch:
        """The next ``n`` prompts, left-padded to the smallest bucket that holds the longest; advances the position."""
        return self.pad(self.next_examples(n))

    def pad(self, examples: Sequence[PromptExample]) -> PromptBatch:
        ids, mask = left_pad([e.ids for e in examples], pad_id=self.pad_id, buckets=self.buckets)
        return PromptBatch(input_ids=ids, attention_mask=mask, examples=tuple(examples))

    def iterate_once(self, batch_size: int) -> Iterator[PromptBatch]:
        """Every example once, in source order, for evaluation; leaves the stream's position alone."""
        for start in range(0, len(self.examples), batch_size):
            yield self.pad(self.examples[start:start + batch_size])

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed, "num_examples": len(self.examples)}

    def load_state_dict(self, state: dict) -> "PromptStream":
        for key in ("epoch", "index", "seed", "num_examples"):
            if key not in state:
                raise KeyError(f"stream state is missing {key!r}: got {sorted(state)}")
        if state["seed"] != self.seed or state["num_examples"] != len(self.examples):
            raise ValueError(
                f"stream state was saved for seed={state['seed']}, {state['num_examples']} examples; this stream "
                f"has seed={self.seed}, {len(self.examples)} examples (different data, template or max length)")
        if not 0 <= state["index"] < len(self.examples) or state["epoch"] < 0:
            raise ValueError(f"stream state position (epoch={state['epoch']}, index={state['index']}) is out of range")
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        return self
