"""Host side of GFPO (docs/objectives.md#gfpo-gdpo, math in `objectives/gfpo.py`): which responses of each
generated group are trained on, and the streaming difficulty statistic of adaptive GFPO.

    group_filter = GroupFilter(objective, group_size=G)       # built only when objective.gfpo
    selected = group_filter.select(rewards, lengths)          # [N, G] bool, per generation round
    row.update(selection_stats(batch, group_filter))          # gfpo/* metrics of the trained batch
    meta["group_filter"] = group_filter.state_dict()          # checkpointed, restored on resume

The selection is made when a round is scored and stored in `Groups.selected`, so dynamic sampling,
the carried surplus and the update all see the same subset. Dynamic sampling judges the KEPT subset:
a group whose generated responses differ but whose kept ones do not (with "length", the k shortest
of a group are often all right or all wrong) has advantages of exactly 0 and is refilled like any
zero-spread group. (`all_correct_fraction`, `zero_adv_fraction`, `response_length_mean` of the
round stats still describe all generated responses.)

Streaming quartiles: the mean rewards of the last `gfpo_window` prompts generated (every round's
groups, kept or not), at most `gfpo_window` float32 values (4 KiB at 1024): exact
quartiles of a moving window, which also follows the policy as it improves. Each round's prompt
means enter the window before its k values are read, so the first round has quartiles too.
"""

from __future__ import annotations

import numpy as np

from dapo_jax.objectives import gfpo
from dapo_jax.objectives.config import ObjectiveConfig

QUARTILES = (0.25, 0.5, 0.75)


class GroupFilter:
    """GFPO's per-round selection and its (small, resumable) state."""

    def __init__(self, cfg: ObjectiveConfig, *, group_size: int):
        if not cfg.gfpo:
            raise ValueError("GroupFilter needs an objective with gfpo_keep or gfpo_adaptive set")
        ks = cfg.gfpo_adaptive if cfg.gfpo_adaptive is not None else (cfg.gfpo_keep,)
        if max(ks) > group_size:
            field = "gfpo_adaptive" if cfg.gfpo_adaptive is not None else "gfpo_keep"
            raise ValueError(f"objective.{field}: keeps up to {max(ks)} responses per prompt but rollout.G="
                             f"{group_size} are generated; GFPO samples G' > k (raise rollout.G)")
        self.cfg = cfg
        self.group_size = group_size
        self._recent = np.zeros((0,), np.float32)  # prompt mean rewards, oldest first

    @property
    def adaptive(self) -> bool:
        return self.cfg.gfpo_adaptive is not None

    def thresholds(self) -> np.ndarray:
        """The window's quartiles (q1, q2, q3) float32; zeros while the window is empty."""
        if not self._recent.size:
            return np.zeros(len(QUARTILES), np.float32)
        return np.quantile(self._recent.astype(np.float64), QUARTILES).astype(np.float32)

    def observe(self, prompt_mean: np.ndarray) -> None:
        """Adds prompt mean rewards `[N]` to the window (the oldest leave past `gfpo_window`)."""
        joined = np.concatenate([self._recent, np.asarray(prompt_mean, np.float32).ravel()])
        self._recent = joined[-self.cfg.gfpo_window:]

    def keep_counts(self, rewards: np.ndarray) -> np.ndarray:
        """k per prompt `[N]` int32 (the window is not updated here)."""
        r = np.asarray(rewards, np.float32)
        if not self.adaptive:
            return np.full(r.shape[0], self.cfg.gfpo_keep, np.int32)
        return np.asarray(gfpo.difficulty_keep(r.mean(axis=1), self.thresholds(), self.cfg.gfpo_adaptive), np.int32)

    def select(self, rewards: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """One scored round's keep mask `[N, G]` bool (updates the window first when adaptive)."""
        r = np.asarray(rewards, np.float32)
        if r.ndim != 2 or r.shape[1] != self.group_size:
            raise ValueError(f"rewards must be [N, G={self.group_size}], got shape {r.shape}")
        if self.adaptive:
            self.observe(r.mean(axis=1))
        k = self.keep_counts(r)
        return np.array(gfpo.keep_mask(r, lengths, k, metric=self.cfg.gfpo_metric), bool)

    def state_dict(self) -> dict:
        """JSON-able: the window's values (exact float32 round trip)."""
        return {"recent": [float(x) for x in self._recent]}

    def load_state_dict(self, state: dict | None) -> None:
        recent = np.asarray((state or {}).get("recent", []), np.float32)
        self._recent = recent[-self.cfg.gfpo_window:]


def selection_stats(batch, group_filter: GroupFilter | None = None) -> dict:
    """`gfpo/*` metrics of a training batch (`rollout.Groups` with `selected`): over its real groups,
    the mean length of the kept responses and of all generated ones, their accuracies and rewards,
    responses kept per group, and (adaptive) the difficulty quartiles. Empty when no group is real."""
    real = np.asarray(batch.valid, bool)
    if not real.any():
        return {}
    gen = np.broadcast_to(real[:, None], batch.rewards.shape)
    kept = gen & np.asarray(batch.selected, bool)
    lengths = np.asarray(batch.lengths, np.float64)

    def mean(x, where):
        return float(x[where].mean()) if where.any() else 0.0

    out = {
        "gfpo/kept_length_mean": mean(lengths, kept),
        "gfpo/generated_length_mean": mean(lengths, gen),
        "gfpo/kept_accuracy": mean(np.asarray(batch.correct, np.float64), kept),
        "gfpo/generated_accuracy": mean(np.asarray(batch.correct, np.float64), gen),
        "gfpo/kept_reward_mean": mean(np.asarray(batch.rewards, np.float64), kept),
        "gfpo/kept_per_group": float(kept.sum() / real.sum()),
    }
    if group_filter is not None and group_filter.adaptive:
        for name, q in zip(("q1", "q2", "q3"), group_filter.thresholds()):
            out[f"gfpo/difficulty_{name}"] = float(q)
    return out
