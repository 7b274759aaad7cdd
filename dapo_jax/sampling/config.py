"""The sampler's frozen, hashable settings (a static argument of the jitted rollout)."""

from __future__ import annotations

import dataclasses


class SamplingConfigError(ValueError):
    """Sampling settings that cannot produce a rollout."""


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How each response token is drawn.

    Order of the logit transforms (as in transformers' `generate`): divide by `temperature`, keep the
    `top_k` largest (0 = off), then keep the smallest set whose cumulative probability is >= `top_p`
    (1.0 = off; the most likely token is always kept). `greedy=True` or `temperature == 0` takes the
    argmax instead of sampling.

    The log-probs a rollout reports are under the *tempered full* distribution
    `log_softmax(logits / temperature)`, the trainer's quantity; in greedy mode with `temperature == 0`
    they are under the untempered distribution (temperature 1).

    `compaction=True` drops finished rows from the decode batch once at most half of them are
    unfinished (stages B, B/2, ... >= `compaction_min_rows`; see `compaction.py`): same tokens and
    log-probs for the same key, fewer padded forwards when lengths are ragged.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    compaction: bool = False
    compaction_min_rows: int = 8

    def __post_init__(self):
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise SamplingConfigError(f"max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        if not self.temperature >= 0.0:
            raise SamplingConfigError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise SamplingConfigError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if isinstance(self.eos_token_ids, int):
            # a single id is a common slip; normalise so the dataclass stays hashable and uniform
            object.__setattr__(self, "eos_token_ids", (self.eos_token_ids,))
        object.__setattr__(self, "eos_token_ids", tuple(int(e) for e in self.eos_token_ids))
        if any(e < 0 for e in self.eos_token_ids):
            raise SamplingConfigError(f"eos_token_ids must be >= 0, got {self.eos_token_ids!r}")
        if not isinstance(self.pad_token_id, int) or self.pad_token_id < 0:
            raise SamplingConfigError(f"pad_token_id must be an int >= 0, got {self.pad_token_id!r}")
        if not isinstance(self.compaction, bool):
            raise SamplingConfigError(f"compaction must be a bool, got {self.compaction!r}")
        if not isinstance(self.compaction_min_rows, int) or self.compaction_min_rows < 1:
            raise SamplingConfigError(f"compaction_min_rows must be an int >= 1, got {self.compaction_min_rows!r}")

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the reported log-probs (1.0 when greedy with temperature 0)."""
        return self.temperature if self.temperature > 0.0 else 1.0

    @property
    def truncates(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0

    def replace(self, **changes) -> "SamplingConfig":
        return dataclasses.replace(self, **changes)
