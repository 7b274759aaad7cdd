"""Difficulty filtering: prompts every response of which was right (or wrong) in each of their last k
visits are drawn no more (`data.difficulty`, docs/mixtures.md).

    difficulty = DifficultyFilter(visits=2, drop="all_right", names=("arith", "cot"))
    stream.set_skip(difficulty.dropped, difficulty.why)     # data/mixture.py: the stream passes over them
    difficulty.record(groups)                               # each scored round: one visit per group
    meta["difficulty"] = difficulty.state_dict()            # checkpointed, restored on resume

A visit is one generated group of the prompt (G responses), kept by dynamic sampling or not. Its
outcome is `+1` when all G responses are right, `-1` when all are wrong, `0` otherwise. A prompt is
dropped once it has at least `visits` outcomes and the last `visits` are all `+1` (`drop: all_right`:
solved, nothing left to learn; DAPO's dynamic sampling would discard those groups after generating
them anyway), all `-1` (`all_wrong`: out of reach for now), or either (`both`). A dropped prompt is
never drawn again, so it stays dropped for the rest of the run (unless a visit drawn before it was
dropped, the same prompt twice in one round, says otherwise: whether a prompt is dropped is a
function of its history alone); a new round (`data.new_round`) starts with no history.

The state is the outcome history of every prompt visited (at most `visits` small integers each), saved
in the checkpoint: a resumed run drops the same prompts at the same draws as an uninterrupted one.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

RIGHT, MIXED, WRONG = 1, 0, -1
DROPS = {"all_right": (RIGHT,), "all_wrong": (WRONG,), "both": (RIGHT, WRONG)}


class DifficultyFilter:
    """The visit history of the prompts of the sources `names`, and which of them are dropped."""

    def __init__(self, *, visits: int, drop: str, names: Sequence[str]):
        if visits < 1:
            raise ValueError(f"visits must be >= 1, got {visits}")
        if drop not in DROPS:
            raise ValueError(f"drop must be one of {sorted(DROPS)}, got {drop!r}")
        self.visits, self.drop, self.names = visits, drop, tuple(names)
        self.history: dict[tuple[int, int], tuple[int, ...]] = {}  # (source, index) -> last outcomes, oldest first
        self._dropped: set[tuple[int, int]] = set()

    @property
    def why(self) -> str:
        """The end of the error of a source left with no prompt (data/mixture.py)."""
        what = {"all_right": "all right", "all_wrong": "all wrong", "both": "all right or all wrong"}[self.drop]
        return (f": difficulty filtering dropped each one after {self.visits} visit(s) in a row whose responses "
                f"were {what} (data.difficulty): nothing is left to learn from it at this setting; stop here, start a "
                f"new round on other data (data.new_round=true), or raise data.difficulty.visits")

    def outcome(self, correct: np.ndarray) -> np.ndarray:
        """`[N, G]` bool -> `[N]` int: +1 all right, -1 all wrong, 0 mixed."""
        correct = np.asarray(correct, bool)
        return np.where(correct.all(axis=1), RIGHT, np.where(~correct.any(axis=1), WRONG, MIXED))

    def record(self, groups) -> None:
        """One visit for each valid group of a scored round (`Groups.source`, `.prompt_index`, `.correct`)."""
        outcomes = self.outcome(groups.correct)
        for s, i, o, v in zip(groups.source.tolist(), groups.prompt_index.tolist(), outcomes.tolist(),
                              np.asarray(groups.valid, bool).tolist()):
            if v:
                self._add((s, i), o)

    def _add(self, key: tuple[int, int], outcome: int) -> None:
        h = (self.history.get(key, ()) + (outcome,))[-self.visits:]
        self.history[key] = h
        if len(h) == self.visits and h[0] in DROPS[self.drop] and all(x == h[0] for x in h):
            self._dropped.add(key)
        else:  # a visit already under way when it was dropped (the same prompt twice in a round)
            self._dropped.discard(key)

    def dropped(self, source: int, example) -> bool:
        """Whether the prompt `example` (a `PromptExample`) of source `source` is dropped."""
        return (source, example.index) in self._dropped

    def stats(self) -> dict[str, float]:
        """`difficulty/dropped` (prompts dropped so far) and, with several sources, `source/NAME/dropped`."""
        counts = np.bincount([s for s, _ in self._dropped], minlength=len(self.names))
        out = {"difficulty/dropped": float(counts.sum())}
        if len(self.names) > 1:
            out.update({f"source/{n}/dropped": float(c) for n, c in zip(self.names, counts)})
        return out

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        """JSON-ready: `{"visits", "drop", "history": {source name: {prompt index: [outcomes]}}}`."""
        history: dict[str, dict[str, list[int]]] = {n: {} for n in self.names}
        for (s, i), h in sorted(self.history.items()):
            history[self.names[s]][str(i)] = list(h)
        return {"visits": self.visits, "drop": self.drop, "history": history}

    def load_state_dict(self, state: dict | None) -> None:
        """Restores a saved history (None: a checkpoint without one, nothing visited)."""
        self.history, self._dropped = {}, set()
        if state is None:
            return
        unknown = sorted(set(state.get("history", {})) - set(self.names))
        if unknown:
            raise ValueError(f"the checkpoint's difficulty history names sources {unknown} this run does not have "
                             f"({list(self.names)})")
        visits = int(state.get("visits", self.visits))
        for name, prompts in state.get("history", {}).items():
            s = self.names.index(name)
            for i, h in prompts.items():
                for o in list(h)[-visits:]:
                    self._add((s, int(i)), int(o))


def build_difficulty(cfg, stream) -> DifficultyFilter | None:
    """The run's filter (`data.difficulty`), attached to the training stream (a `MixtureStream`); None when off."""
    d = cfg.data.difficulty
    if d is None:
        return None
    difficulty = DifficultyFilter(visits=d.visits, drop=d.drop, names=stream.names)
    stream.set_skip(difficulty.dropped, difficulty.why)
    return difficulty


__all__ = ["DifficultyFilter", "build_difficulty"]
