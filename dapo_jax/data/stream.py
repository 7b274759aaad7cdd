"""A resumable, seeded stream of tokenised prompts, batched into left-padded fixed shapes.

    stream = PromptStream(problems, tokenizer, template="dapo", max_prompt_length=512, seed=0)
    batch = stream.next_batch(32)          # PromptBatch: input_ids [32, bucket], attention_mask, answers, ...
    state = stream.state_dict()            # {"epoch", "index", "seed", "num_examples", "sha256", "source"}
    PromptStream(problems, tokenizer, ...).load_state_dict(state)   # continues exactly where it stopped

Epoch ``e`` visits the kept examples in the order ``np.random.default_rng([seed, e]).permutation(n)``
(the identity when ``shuffle=False``), so the position ``(epoch, index)`` alone fixes what comes next:
a resumed run neither repeats nor skips a prompt, across epoch boundaries too. Prompts longer than
``max_prompt_length`` tokens are skipped (never truncated: a cut problem has a wrong answer) and counted.

The position means something only over the same prompts: the state also holds a SHA-256 of the
prompts the stream reads (each kept example's source index, rendered text and answer, in order) and
``source`` (where they came from: the config key, the name and the resolved absolute path, given by
the caller). ``load_state_dict`` refuses a stream whose prompts, count, seed or source path differ
with a `StreamMismatch` (a `DataError`: one line, exit 2) naming the source and what changed; a
file edited in place with the same number of rows, or a relative path resolved from another working
directory, would otherwise resume silently on a different prompt stream. ``accept_changed=True``
resumes anyway and returns what changed, for the caller to log.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Iterator, Sequence

import numpy as np

from dapo_jax.data.batching import default_buckets, left_pad
from dapo_jax.data.datasets import DataError, Problem
from dapo_jax.data.templates import render_prompt, uses_chat_template


@dataclasses.dataclass(frozen=True)
class PromptExample:
    """One tokenised prompt: ``ids`` (no padding), the rendered ``text``, its ``answer``, and source ``index``;
    ``row``: the source row's columns (for user reward functions), outside equality; ``source``: which
    source of a data mixture it comes from (data/mixture.py; 0 without one)."""

    ids: tuple[int, ...]
    text: str
    answer: str
    index: int
    row: dict | None = dataclasses.field(default=None, compare=False, repr=False)
    source: int = 0


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

    @property
    def rows(self) -> list[dict]:
        """Each prompt's source row (``{}`` where none is known)."""
        return [e.row or {} for e in self.examples]


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
            kept.append(PromptExample(ids=tuple(ids), text=text, answer=p.answer, index=p.index, row=p.row))
    return kept, skipped


class StreamMismatch(DataError):
    """A saved stream position that does not belong to this stream's prompts."""


class PromptStream:
    """Endless seeded iteration over tokenised prompts, with an explicit resumable position.

    `source`: where the problems came from, saved with the position and compared on resume:
    `{"key": "data.train", "name": ..., "path": absolute path or None (a built-in task, a hub name)}`."""

    def __init__(self, problems: Sequence[Problem], tokenizer, *, max_prompt_length: int, template: str = "raw",
                 seed: int = 0, shuffle: bool = True, buckets: Sequence[int] | None = None,
                 system: str | None = None, source: dict | None = None):
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
        self.source = dict(source or {})
        self._sha256: str | None = None

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
    @property
    def sha256(self) -> str:
        """SHA-256 of the prompts the stream reads: each kept example's source index, rendered text and
        answer, in source order (computed once)."""
        if self._sha256 is None:
            h = hashlib.sha256()
            for e in self.examples:
                h.update(json.dumps([e.index, e.text, e.answer], ensure_ascii=False).encode())
                h.update(b"\n")
            self._sha256 = h.hexdigest()
        return self._sha256

    def state_dict(self) -> dict:
        state = {"epoch": self.epoch, "index": self.index, "seed": self.seed, "num_examples": len(self.examples),
                 "sha256": self.sha256}
        if self.source:
            state["source"] = dict(self.source)
        return state

    def load_state_dict(self, state: dict, *, accept_changed: bool = False) -> list[str]:
        """Continues from a saved position; returns what changed in the prompts (empty: nothing, or a
        state saved before the identity was recorded). Raises StreamMismatch, one line naming the
        source and what changed, unless `accept_changed` (then only a position that cannot apply to
        these prompts, or a damaged state, raises)."""
        name = self._name(state)
        missing = [k for k in ("epoch", "index", "seed", "num_examples") if k not in state]
        if missing:
            raise StreamMismatch(f"{name}: the checkpoint's stream state is damaged: it lacks {missing} "
                                 f"(it has {sorted(state)})")
        changed = []
        if state["seed"] != self.seed:
            changed.append(f"shuffled with data.seed={state['seed']} when the run started, {self.seed} now")
        old_path, new_path = (state.get("source") or {}).get("path"), self.source.get("path")
        if "source" in state and old_path != new_path:
            changed.append(f"read from {old_path or 'a built-in task or hub name'} when the run started, from "
                           f"{new_path or 'a built-in task or hub name'} now")
        if state["num_examples"] != len(self.examples):
            changed.append(f"{state['num_examples']} prompts kept when the run started, {len(self.examples)} now "
                           f"(different rows, template or max length)")
        elif "sha256" in state and state["sha256"] != self.sha256:
            changed.append(f"the same {len(self.examples)} prompts in number but not in content (sha256 "
                           f"{state['sha256'][:12]}... when the run started, {self.sha256[:12]}... now)")
        if changed and not accept_changed:
            raise StreamMismatch(f"{name}: the data changed since the run started: {'; '.join(changed)}. Resuming "
                                 f"would read another prompt stream than the run's: restore the data, use a new "
                                 f"train.run_dir, or set data.accept_changed=true to resume on it anyway")
        if not 0 <= state["index"] < len(self.examples) or state["epoch"] < 0:
            raise StreamMismatch(f"{name}: the checkpoint's stream position (epoch={state['epoch']}, "
                                 f"index={state['index']}) does not fit its {len(self.examples)} prompts")
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        return changed

    def _name(self, state: dict) -> str:
        src = self.source or state.get("source") or {}
        key, where = src.get("key", "prompt stream"), src.get("path") or src.get("name")
        return f"{key} ({where})" if where else key
