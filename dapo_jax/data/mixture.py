"""A data mixture: several prompt streams drawn from in seeded proportions, and resumed exactly.

    mix = MixtureStream({"arith": s1, "cot": s2}, weights={"arith": 0.7, "cot": 0.3}, seed=0)
    batch = mix.next_batch(16)      # PromptBatch; batch.examples[i].source: 0 (arith) or 1 (cot)
    state = mix.state_dict()        # {"drawn", "seed", "names", "weights", "sources": {name: stream state}}
    MixtureStream(...).load_state_dict(state)   # continues exactly where it stopped

Prompt ``i`` of the run (counting every prompt drawn since it started) comes from source ``c_i``,
where block ``b = i // BLOCK`` of ``c`` is ``np.random.default_rng([seed, MIX_SALT, b]).choice(S, BLOCK,
p=w / Σw)``: each prompt is source ``s``'s with probability ``w_s / Σ w`` (the sampling proportion),
independently. It is then the next prompt of that source's own `PromptStream` (its seeded epochs,
data/stream.py). The position is ``drawn`` and each stream's ``(epoch, index)``, so a resumed run
draws the prompts an uninterrupted one would have.

`set_skip(skip, why)` passes over the prompts `skip(source, example)` names (difficulty filtering,
training/difficulty.py): the next one of the same source is drawn instead. A source whose every
prompt is skipped raises `SourceExhausted` (one line naming it), never an endless search.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np

from dapo_jax.data.datasets import DataError
from dapo_jax.data.stream import PromptBatch, PromptExample, PromptStream, StreamMismatch

MIX_SALT = 7_919  # folded into the draw's seed: the source choices are a stream apart from the epochs' orders
BLOCK = 4096  # source choices drawn at a time


class SourceExhausted(DataError):
    """Every prompt of a source is skipped: the mixture cannot draw from it."""


class MixtureStream:
    """Seeded draws from named `PromptStream`s (one tokenizer, one `max_prompt_length`), by weight."""

    def __init__(self, streams: Mapping[str, PromptStream], weights: Mapping[str, float], *, seed: int = 0):
        if not streams:
            raise ValueError("a mixture needs at least one stream")
        self.names = tuple(streams)
        self.streams = tuple(streams[n] for n in self.names)
        w = np.asarray([float(weights[n]) for n in self.names], np.float64)
        if not (np.all(np.isfinite(w)) and np.all(w > 0)):
            raise ValueError(f"mixture weights must be finite and > 0, got {dict(zip(self.names, w.tolist()))}")
        self.weights = w
        self.p = w / w.sum()
        if len({s.buckets for s in self.streams}) != 1 or len({s.pad_id for s in self.streams}) != 1:
            raise ValueError("a mixture's streams must share their buckets and pad id (one tokenizer, one "
                             "max_prompt_length)")
        for s, stream in enumerate(self.streams):  # each example says which source it is from
            stream.examples = [e if e.source == s else dataclasses.replace(e, source=s)
                               for e in stream.examples]
        self.seed = seed
        self.drawn = 0
        self.source = {"key": "data.sources"}
        self._block, self._choices = None, None
        self._skip: Callable[[int, PromptExample], bool] | None = None
        self._why = ""

    # ------------------------------------------------------------------ the PromptStream interface
    def __len__(self) -> int:
        return sum(len(s) for s in self.streams)

    @property
    def examples(self) -> list[PromptExample]:
        return [e for s in self.streams for e in s.examples]

    @property
    def num_skipped(self) -> int:
        """Prompts left out as longer than `max_prompt_length`, over every source."""
        return sum(s.num_skipped for s in self.streams)

    @property
    def buckets(self) -> tuple[int, ...]:
        return self.streams[0].buckets

    @property
    def pad_id(self) -> int:
        return self.streams[0].pad_id

    def pad(self, examples: Sequence[PromptExample]) -> PromptBatch:
        return self.streams[0].pad(examples)

    def next_batch(self, n: int) -> PromptBatch:
        return self.pad(self.next_examples(n))

    def next_examples(self, n: int) -> list[PromptExample]:
        """The next `n` prompts, each from the source its draw names; advances the position."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        out = []
        for _ in range(n):
            out.append(self._next_from(self.choice(self.drawn)))
            self.drawn += 1
        return out

    def choice(self, i: int) -> int:
        """The source of draw `i` (module docstring)."""
        block = i // BLOCK
        if self._block != block:
            rng = np.random.default_rng([self.seed, MIX_SALT, block])
            self._choices, self._block = rng.choice(len(self.names), size=BLOCK, p=self.p), block
        return int(self._choices[i % BLOCK])

    # ------------------------------------------------------------------ skipping
    def set_skip(self, skip: Callable[[int, PromptExample], bool] | None, why: str = "") -> None:
        """`skip(source, example) -> True` for a prompt not to be drawn; `why` ends the error of a source
        whose every prompt is skipped."""
        self._skip, self._why = skip, why

    def _next_from(self, s: int) -> PromptExample:
        stream = self.streams[s]
        passed = 0
        while True:
            e = stream.next_examples(1)[0]
            if self._skip is None or not self._skip(s, e):
                return e
            passed += 1
            if passed % len(stream) == 0 and all(self._skip(s, x) for x in stream.examples):
                key = stream.source.get("key", f"data.sources.{self.names[s]}")
                raise SourceExhausted(f"{key}: every one of its {len(stream)} prompts is skipped{self._why}")

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        return {"drawn": self.drawn, "seed": self.seed, "names": list(self.names),
                "weights": [float(w) for w in self.weights],
                "sources": {n: s.state_dict() for n, s in zip(self.names, self.streams)}}

    def load_state_dict(self, state: dict, *, accept_changed: bool = False) -> list[str]:
        """Continues from a saved position; returns what changed (PromptStream.load_state_dict, for each
        source, and the mixture's seed and weights). Raises `StreamMismatch` (one line) when the saved
        state is not this mixture's, or changed and not `accept_changed`."""
        if not isinstance(state, dict) or "sources" not in state or "drawn" not in state:
            raise StreamMismatch(f"data.sources: the checkpoint's stream state is not a mixture's (it has "
                                 f"{sorted(state) if isinstance(state, dict) else type(state).__name__}): the run "
                                 f"started with another data section; set data.new_round=true to start a new round "
                                 f"on this one")
        if list(state["sources"]) != list(self.names):
            raise StreamMismatch(f"data.sources: the run started with the sources {list(state['sources'])}, now "
                                 f"{list(self.names)}; set data.new_round=true to start a new round on these")
        changed = []
        if state.get("seed") != self.seed:
            changed.append(f"data.sources drawn with data.seed={state.get('seed')} when the run started, "
                           f"{self.seed} now")
        if state.get("weights") is not None and [float(w) for w in state["weights"]] != self.weights.tolist():
            changed.append(f"data.sources weights {state['weights']} when the run started, "
                           f"{[float(w) for w in self.weights]} now")
        if changed and not accept_changed:
            raise StreamMismatch(f"data.sources: {'; '.join(changed)}: resuming would draw another prompt "
                                 f"stream than the run's: restore them, use a new train.run_dir, or set "
                                 f"data.accept_changed=true to resume anyway")
        for name, stream in zip(self.names, self.streams):
            changed += stream.load_state_dict(state["sources"][name], accept_changed=accept_changed)
        if int(state["drawn"]) < 0:
            raise StreamMismatch(f"data.sources: the checkpoint's position drawn={state['drawn']} is negative")
        self.drawn = int(state["drawn"])
        return changed


__all__ = ["BLOCK", "MIX_SALT", "MixtureStream", "SourceExhausted"]
