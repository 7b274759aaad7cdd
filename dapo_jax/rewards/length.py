"""The cosine length reward of Yeo et al. (2025), "Demystifying Long Chain-of-Thought Reasoning in LLMs".

A correctness check decides which of two cosine curves a response's length ``L`` (of at most
``L_max``) is read on::

    CosFn(t, T, η_min, η_max) = η_min + ½ (η_max - η_min) (1 + cos(t π / T))

    r(L) = CosFn(L, L_max, r_L^c, r_0^c)   a right response (shorter is better: r_0^c at L=0 down to r_L^c)
         = CosFn(L, L_max, r_L^w, r_0^w)   a wrong one (longer is less bad: r_0^w at L=0 up to r_L^w)
         = r_exceed                        L >= L_max (it did not finish)

The paper's values are the defaults: ``r_0^c = 2, r_L^c = 1, r_0^w = -10, r_L^w = 0, r_exceed = -10``.
``L`` is counted in the policy's tokens (``unit="tokens"``, the run passes its tokenizer; ``L_max`` is
then ``rollout.max_new_tokens``, so a response cut at the limit gets ``r_exceed``) or in characters
(``unit="chars"``).

    cosine = make_reward("cosine", check="boxed", max_length=512, unit="chars")
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

__all__ = ["CosineLengthReward", "cosine_interpolation", "make_cosine_reward"]


def cosine_interpolation(t: float, horizon: float, low: float, high: float) -> float:
    """``CosFn(t, T, η_min, η_max) = η_min + ½ (η_max - η_min)(1 + cos(t π / T))``: ``high`` at ``t = 0``,
    ``low`` at ``t = T``."""
    return low + 0.5 * (high - low) * (1.0 + math.cos(t * math.pi / horizon))


@dataclasses.dataclass(frozen=True)
class CosineLengthReward:
    """``r(L)`` of the module docstring; correctness and answer keys are ``rule``'s."""

    rule: Any  # a RewardFn: is_correct decides the curve
    max_length: int
    length: Callable[[str], int] = len
    r0_correct: float = 2.0
    rL_correct: float = 1.0
    r0_wrong: float = -10.0
    rL_wrong: float = 0.0
    r_exceed: float = -10.0
    name: str = "cosine"

    def __post_init__(self):
        if not isinstance(self.max_length, int) or self.max_length < 1:
            raise ValueError(f"cosine: max_length must be a positive integer, got {self.max_length!r}")
        values = (self.r0_correct, self.rL_correct, self.r0_wrong, self.rL_wrong, self.r_exceed)
        if not all(math.isfinite(float(v)) for v in values):
            raise ValueError(f"cosine: the reward values must be finite, got {values}")

    @property
    def wrong(self) -> float:
        return float(min(self.r0_wrong, self.rL_wrong, self.r_exceed))

    def answer_key(self, response: str):
        key = getattr(self.rule, "answer_key", None)
        return key(response) if key is not None else response.strip()

    def truth_readable(self, ground_truth: Any) -> bool:
        read = getattr(self.rule, "truth_readable", None)
        return True if read is None else read(ground_truth)

    def score(self, response: str, ground_truth: Any) -> tuple[float, bool]:
        ok = bool(self.rule.is_correct(response, ground_truth))
        n = self.length(response)
        if n >= self.max_length:
            return float(self.r_exceed), ok
        if ok:
            return cosine_interpolation(n, self.max_length, self.rL_correct, self.r0_correct), ok
        return cosine_interpolation(n, self.max_length, self.rL_wrong, self.r0_wrong), ok

    def is_correct(self, response: str, ground_truth: Any) -> bool:
        return bool(self.rule.is_correct(response, ground_truth))

    def __call__(self, response: str, ground_truth: Any) -> float:
        return self.score(response, ground_truth)[0]


def make_cosine_reward(*, rule: Callable[[str], Any], check: str = "math_verify", max_length: int | None = None,
                       unit: str = "tokens", tokenizer=None, **values) -> CosineLengthReward:
    """The ``cosine`` reward: ``check`` names the correctness rule (built by ``rule(check)``), ``values``
    the curve's ends (``r0_correct``, ``rL_correct``, ``r0_wrong``, ``rL_wrong``, ``r_exceed``)."""
    if max_length is None:
        raise ValueError("cosine: set options.max_length (L_max; rollout.max_new_tokens for unit=tokens)")
    if unit == "chars":
        length = len
    elif unit == "tokens":
        if tokenizer is None:
            raise ValueError("cosine: unit='tokens' counts the policy's tokens and needs its tokenizer; "
                             "use unit='chars' outside a run")

        def length(text: str) -> int:
            return len(tokenizer.encode(text, add_special_tokens=False))
    else:
        raise ValueError(f"cosine: unit={unit!r}; expected 'tokens' or 'chars'")
    allowed = {"r0_correct", "rL_correct", "r0_wrong", "rL_wrong", "r_exceed"}
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise TypeError(f"reward 'cosine': unknown option(s) {unknown}; allowed: "
                        f"{sorted(allowed | {'check', 'max_length', 'unit'})}")
    return CosineLengthReward(rule=rule(check), max_length=max_length, length=length,
                              **{k: float(v) for k, v in values.items()})
