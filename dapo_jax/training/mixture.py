"""The trainer's side of a data mixture (`data.sources`, docs/mixtures.md): the sources' prompt streams
drawn by weight (data/mixture.py), each scored by its own reward functions.

    stream, scorer, checks = make_mixture(cfg, tokenizer, objective, default=make_scorer(cfg.reward, ...))
    batch = stream.next_batch(n)                      # examples[i].source: the source's position in data.sources
    out = scorer.score(responses, truths, prompts=prompts, sources=ids)   # each row by its source's functions

A run with `data.difficulty` and no `data.sources` reads `data.train` as a mixture of one source
(named `train`), so that difficulty filtering has one way to pass over prompts.

A mixture's reward is one number per response: `MixtureScorer.score` returns `parts [N, 1]` (the
total), since the sources' functions differ (the config refuses `multi_reward: normalize_then_sum`
with a mixture). Held-out evaluation (`data.eval`) is scored by the run's `reward` section
(`scorer.for_eval`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from dapo_jax.data.mixture import MixtureStream
from dapo_jax.rewards.pipeline import RewardBatch
from dapo_jax.training.sources import make_scorer, make_stream


class MixtureScorer:
    """Each row scored by its source's `RunScorer` (training/sources.py); `default`: the run's `reward`
    section's, for held-out evaluation."""

    def __init__(self, scorers: Sequence, names: Sequence[str], *, default):
        if len(scorers) != len(names):
            raise ValueError(f"{len(scorers)} scorers for {len(names)} sources")
        self.scorers, self.names, self.default = tuple(scorers), tuple(names), default
        self.weights = np.ones(1, np.float32)  # parts [N, 1]: the total reward
        self.part_names = ("reward",)

    @property
    def for_eval(self):
        return self.default

    @property
    def learned(self) -> list:
        unique = {id(s): s for s in (*self.scorers, self.default)}
        return [rm for s in unique.values() for rm in s.learned]

    def load(self, mesh=None, *, dtype: str = "float32") -> "MixtureScorer":
        for s in {id(s): s for s in (*self.scorers, self.default)}.values():
            s.load(mesh, dtype=dtype)
        return self

    @property
    def _unique(self) -> list:
        return list({id(s): s for s in (*self.scorers, self.default)}.values())

    @property
    def answers_read(self) -> int | None:
        """Responses whose answer a source's accuracy function read (None: none of them has an extractor)."""
        counts = [s.answers_read for s in self._unique if getattr(s, "answers_read", None) is not None]
        return sum(counts) if counts else None

    def take_counts(self) -> dict[str, int]:
        """Every source scorer's `reward_failures/NAME` and `reward_unreadable/NAME`, summed by name."""
        total: dict[str, int] = {}
        for s in self._unique:
            for k, v in (s.take_counts() if hasattr(s, "take_counts") else {}).items():
                total[k] = total.get(k, 0) + v
        return total

    def score(self, responses: Sequence[str], truths: Sequence, *, prompts: Sequence[str] | None = None,
              rows: Sequence | None = None, sources: Sequence[int] | None = None) -> RewardBatch:
        """Every row by its source's functions; `sources [N]`: each row's source (`PromptExample.source`);
        `rows [N]`: the data rows (for user reward functions)."""
        n = len(responses)
        if sources is None or len(sources) != n:
            raise ValueError(f"a mixture's scorer needs each of the {n} rows' source, got "
                             f"{None if sources is None else len(sources)}")
        sources = np.asarray(sources)
        rewards, correct = np.zeros(n, np.float32), np.zeros(n, bool)
        keys: list = [None] * n
        errors: list[int] = []
        for s, scorer in enumerate(self.scorers):
            mine = np.flatnonzero(sources == s)
            if not mine.size:
                continue
            out = scorer.score([responses[i] for i in mine], [truths[i] for i in mine],
                               prompts=None if prompts is None else [prompts[i] for i in mine],
                               rows=None if rows is None else [rows[i] for i in mine])
            rewards[mine], correct[mine] = out.rewards, out.correct
            for j, i in enumerate(mine):
                keys[i] = out.keys[j]
            errors += [int(mine[j]) for j in out.error_rows]
        return RewardBatch(rewards, rewards[:, None].copy(), correct, keys, len(errors), tuple(sorted(errors)))

    def __call__(self, responses, truths, *, prompts=None, rows=None, sources=None):
        out = self.score(responses, truths, prompts=prompts, rows=rows, sources=sources)
        return out.rewards, out.correct, out.keys


def make_mixture(cfg, tokenizer, objective, *, default) -> tuple[MixtureStream, object, list]:
    """`(stream, scorer, checks)`: the training `MixtureStream` of `data.sources` (or of `data.train` alone,
    named `train`, for difficulty filtering), its scorer (a `MixtureScorer`; `default` itself with one
    source and no reward of its own), and `(config key, PromptStream, scorer)` for `make_data` to
    check each source's answers with its own reward functions."""
    d = cfg.data
    max_len, seed = d.max_prompt_length, d.seed
    if d.sources is None:
        stream = make_stream(d.train, tokenizer, max_prompt_length=max_len, seed=seed, order_seed=d.order_seed)
        return MixtureStream({"train": stream}, {"train": 1.0}, seed=seed), default, [("data.train", stream, default)]
    streams, scorers, checks = {}, [], []
    for name, src in d.sources.items():
        key = f"data.sources.{name}"
        streams[name] = make_stream(src.train, tokenizer, max_prompt_length=max_len, seed=seed, key=key)
        scorer = default if src.reward is None else make_scorer(
            src.reward, objective, tokenizer=tokenizer, max_length=max_len + cfg.rollout.max_new_tokens,
            key=f"{key}.reward")
        scorers.append(scorer)
        checks.append((key, streams[name], scorer))
    mixture = MixtureStream(streams, {n: s.weight for n, s in d.sources.items()}, seed=seed)
    return mixture, MixtureScorer(scorers, list(d.sources), default=default), checks


__all__ = ["MixtureScorer", "make_mixture"]
