"""Reward functions over decoded responses (host-side), a registry by name, and a combiner.

A reward function is called as ``fn(response, ground_truth) -> float`` and also offers
``fn.score(response, ground_truth) -> (reward, correct)`` (one pass for both),
``fn.is_correct(...) -> bool`` (what accuracy metrics count, independent of the reward values) and
``fn.wrong`` (the value an unscorable response gets).

Rule rewards (docs/objectives.md#rewards-and-shaping): ``right`` if the check passes else ``wrong``; DAPO's ``+1 / -1``
is the default, GRPO-style recipes use ``right=1.0, wrong=0.0``.

================ ======================================================================
:func:`combine` makes a weighted sum ``r = Σ_i w_i r_i(response, truth)`` (e.g. R1's accuracy +
format); its ``is_correct`` is the one of its ``accuracy`` component (the first by default).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol

import numpy as np

from dapo_jax.data import cot, synthetic
from dapo_jax.rewards import check
from dapo_jax.rewards.code import make_code_reward
from dapo_jax.rewards.countdown import make_countdown_reward
from dapo_jax.rewards.language import LanguageReward
from dapo_jax.rewards.length import make_cosine_reward

__all__ = [
    "RewardFn",
    "RuleReward",
    "FormatReward",
    "WeightedSum",
    "REWARDS",
    "make_reward",
    "combine",
    "is_correct",
    "BatchScores",
    "score_batch",
]

# DAPO's layout: a final line "Answer: <something>" (trailing blank lines allowed).
DAPO_FORMAT_PATTERN = r"(?:^|\n)[ \t]*Answer[ \t]*:[ \t]*\S[^\n]*\s*\Z"
# R1's layout: one <think> block, then one non-blank <answer> block, nothing around them but whitespace (and
# no nested or repeated tags). re.DOTALL: the reasoning spans lines. Linear time: one anchored start, and
# the non-blank answer is a lookahead (a `.*\S.*` would backtrack quadratically on a long unclosed answer).
THINK_ANSWER_PATTERN = (r"(?s)\A\s*<think>(?:(?!</?think>|</?answer>).)*</think>\s*"
                        r"<answer>(?!\s*</answer>)(?:(?!</?think>|</?answer>).)*</answer>\s*\Z")


class RewardFn(Protocol):
    wrong: float

    def __call__(self, response: str, ground_truth: Any) -> float: ...

    def score(self, response: str, ground_truth: Any) -> tuple[float, bool]: ...

    def is_correct(self, response: str, ground_truth: Any) -> bool: ...


@dataclasses.dataclass(frozen=True)
class RuleReward:
    """``right`` when ``check(response, ground_truth)`` holds, else ``wrong``.

    ``answer_key(response)`` is the canonical answer the check compared (maj@k votes on it).
    """

    name: str
    check: Callable[[str, Any], bool]
    answer_key: Callable[[str], str | None]
    right: float = 1.0
    wrong: float = -1.0
    read_truth: Callable[[Any], bool] | None = None  # whether the check can read a ground truth at all

    def truth_readable(self, ground_truth: Any) -> bool:
        """False for a truth no response can match ("n/a" where a number is expected)."""
        return self.read_truth is None or bool(self.read_truth(ground_truth))

    def is_correct(self, response: str, ground_truth: Any) -> bool:
        return bool(self.check(response, ground_truth))

    def score(self, response: str, ground_truth: Any) -> tuple[float, bool]:
        ok = self.is_correct(response, ground_truth)
        return (self.right if ok else self.wrong), ok

    def __call__(self, response: str, ground_truth: Any) -> float:
        return self.score(response, ground_truth)[0]


@dataclasses.dataclass(frozen=True)
class FormatReward:
    """``bonus`` when ``re.search(pattern, response)`` matches, else ``missing``.

    The default pattern is DAPO's layout: the last non-blank line is ``Answer: <something>``.
    ``is_correct`` means "has the layout"; the ground truth is ignored.
    """

    bonus: float = 0.5
    missing: float = 0.0
    pattern: str = DAPO_FORMAT_PATTERN
    name: str = "format"

    def __post_init__(self):
        try:
            re.compile(self.pattern)
        except re.error as e:
            raise ValueError(f"FormatReward: bad regex pattern {self.pattern!r}: {e}") from e

    @property
    def wrong(self) -> float:
        return self.missing

    def is_correct(self, response: str, ground_truth: Any = None) -> bool:
        return re.search(self.pattern, response) is not None

    def score(self, response: str, ground_truth: Any = None) -> tuple[float, bool]:
        ok = self.is_correct(response, ground_truth)
        return (self.bonus if ok else self.missing), ok

    def __call__(self, response: str, ground_truth: Any = None) -> float:
        return self.score(response, ground_truth)[0]


@dataclasses.dataclass(frozen=True)
class WeightedSum:
    """``r = Σ_i weights[i] * components[i](response, truth)``; correctness from ``accuracy``."""

    components: tuple[RewardFn, ...]
    weights: tuple[float, ...]
    accuracy: int = 0

    def __post_init__(self):
        if len(self.components) != len(self.weights) or not self.components:
            raise ValueError(
                f"WeightedSum: {len(self.components)} components vs {len(self.weights)} weights"
            )
        if not 0 <= self.accuracy < len(self.components):
            raise ValueError(f"WeightedSum: accuracy index {self.accuracy} out of range")

    @property
    def wrong(self) -> float:
        return float(sum(w * c.wrong for w, c in zip(self.weights, self.components)))

    def score(self, response: str, ground_truth: Any) -> tuple[float, bool]:
        total, correct = 0.0, False
        for i, (w, c) in enumerate(zip(self.weights, self.components)):
            r, ok = c.score(response, ground_truth)
            total += w * r
            if i == self.accuracy:
                correct = ok
        return total, correct

    def is_correct(self, response: str, ground_truth: Any) -> bool:
        return self.components[self.accuracy].is_correct(response, ground_truth)

    def __call__(self, response: str, ground_truth: Any) -> float:
        return self.score(response, ground_truth)[0]


# name -> (check, answer_key); options of the check are keyword-only arguments of it.
_RULES: dict[str, tuple[Callable[..., bool], Callable[..., str | None]]] = {
    "dapo_answer": (check.dapo_answer_correct, check.dapo_answer_key),
    "boxed": (check.boxed_correct, check.boxed_key),
    "gsm8k": (check.gsm8k_correct, check.gsm8k_key),
    "integer": (check.integer_correct, check.integer_key),
    "math_verify": (check.math_verify_correct, check.math_verify_key),
    # the embedded default task: the whole response is the answer's integer
    "synthetic": (synthetic.is_correct, synthetic.extract_answer),
    # the chain-of-thought task (dapo_jax.data.cot): stricter than dapo_answer, the response must END
    # with its Answer line (an unfinished or still-rambling response is wrong)
    "cot": (cot.is_correct, cot.extract_answer),
}
# rewards that run the response in the sandbox (rewards/sandbox.py): name -> builder(right=, wrong=, **options)
_SANDBOXED: dict[str, Callable[..., RewardFn]] = {"code": make_code_reward, "countdown": make_countdown_reward}
REWARDS: tuple[str, ...] = (*_RULES, "format", "think_format", "cosine", "language", *_SANDBOXED)


def make_reward(name: str, *, right: float = 1.0, wrong: float = -1.0, **options) -> RewardFn:
    """The reward function registered as ``name`` (see the module table).

    ``options`` are the check's keyword options (``numeric`` for dapo_answer/boxed, ``flexible``
    for gsm8k, ``timeout_s``/``max_chars`` for math_verify) or, for ``format``, ``bonus``,
    ``missing``, ``pattern`` (``right``/``wrong`` do not apply to it).
    """
    if name == "format":
        return FormatReward(**options)
    if name == "think_format":
        return FormatReward(**{"bonus": 1.0, "pattern": THINK_ANSWER_PATTERN, "name": "think_format", **options})
    if name == "cosine":
        return make_cosine_reward(rule=lambda check_name: make_reward(check_name), **options)
    if name == "language":
        return LanguageReward(**options)
    if name in _SANDBOXED:
        return _SANDBOXED[name](right=right, wrong=wrong, **options)
    if name not in _RULES:
        raise KeyError(f"unknown reward {name!r}; known: {', '.join(REWARDS)}")
    fn, key = _RULES[name]
    allowed = {
        p.name for p in inspect.signature(fn).parameters.values() if p.kind == p.KEYWORD_ONLY
    }
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise TypeError(f"reward {name!r}: unknown option(s) {unknown}; allowed: {sorted(allowed)}")
    bound_check = (lambda r, t: fn(r, t, **options)) if options else fn
    return RuleReward(name=name, check=bound_check, answer_key=key, right=right, wrong=wrong,
                      read_truth=check.TRUTH_READERS.get(name))


def combine(
    rewards: Mapping[str, float] | Sequence[tuple[RewardFn, float]],
    *,
    accuracy: int | str = 0,
) -> WeightedSum:
    """Weighted sum of rewards: ``{"dapo_answer": 1.0, "format": 1.0}`` (registry names with
    default options) or ``[(fn, weight), ...]``. ``accuracy`` picks the component whose
    correctness counts as the combination's (index, or name for the mapping form)."""
    if isinstance(rewards, Mapping):
        names = list(rewards)
        if isinstance(accuracy, str):
            if accuracy not in rewards:
                raise KeyError(f"combine: accuracy reward {accuracy!r} not in {names}")
            accuracy = names.index(accuracy)
        pairs = [(make_reward(n), float(w)) for n, w in rewards.items()]
    else:
        pairs = [(fn, float(w)) for fn, w in rewards]
    return WeightedSum(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs), int(accuracy))


def is_correct(fn: RewardFn | str, response: str, ground_truth: Any) -> bool:
    """Whether ``response`` is right under ``fn`` (a reward function or a registry name)."""
    if isinstance(fn, str):
        fn = make_reward(fn)
    return bool(fn.is_correct(response, ground_truth))


class BatchScores(NamedTuple):
    rewards: np.ndarray  # [N] float32
    correct: np.ndarray  # [N] bool
    num_errors: int  # rows whose scoring raised (scored as fn.wrong, incorrect)
    error_rows: tuple[int, ...]


def _truncate(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text)} chars]"


def _score_many(fn, responses, truths, *, on_error: str, wrong_value: float) -> BatchScores:
    """``fn.score_many(responses, truths) -> (rewards [N], correct [N], failed {row: why})``: rows that
    failed (or the whole batch, when the call raises) are scored ``wrong_value`` and counted, or raise."""
    n = len(responses)
    try:
        rewards, correct, failed = fn.score_many(responses, truths)
    except Exception as e:
        rewards, correct, failed = [wrong_value] * n, [False] * n, dict.fromkeys(range(n), f"{type(e).__name__}: {e}")
    rewards = np.asarray(rewards, np.float32).reshape(n)
    correct = np.asarray(correct, bool).reshape(n)
    rows = tuple(sorted(failed))
    if rows and on_error == "raise":
        i = rows[0]
        raise RuntimeError(f"reward failed on row {i} ({failed[i]}); response: {_truncate(str(responses[i]))!r}")
    rewards[list(rows)], correct[list(rows)] = wrong_value, False
    return BatchScores(rewards, correct, len(rows), rows)


def score_batch(
    fn: RewardFn | Callable[[str, Any], float],
    responses: Sequence[str],
    truths: Sequence[Any],
    *,
    on_error: str = "raise",
    max_workers: int = 1,
) -> BatchScores:
    """Score ``responses[i]`` against ``truths[i]`` for every row ``i``.

    Args:
      fn: a reward function (``score_many`` is used when it has one: the whole batch at once, as the
        sandboxed rewards do; else ``score``; a bare callable's row counts as correct when its
        reward is > 0).
      responses, truths: equal-length sequences (a ``[P, G]`` batch flattened, truths repeated).
      on_error: ``"raise"``: an exception in row ``i`` raises ``RuntimeError`` naming ``i`` and
        the (truncated) response; ``"wrong"``: that row gets ``fn.wrong`` (``0.0`` for a bare
        callable), counts as incorrect and is counted in ``num_errors``/``error_rows``.
      max_workers: > 1 scores rows in a thread pool (the symbolic check is thread-safe).

    Returns:
      ``BatchScores(rewards [N] float32, correct [N] bool, num_errors, error_rows)``.
    """
    if on_error not in ("raise", "wrong"):
        raise ValueError(f"on_error must be 'raise' or 'wrong', got {on_error!r}")
    if len(responses) != len(truths):
        raise ValueError(f"score_batch: {len(responses)} responses but {len(truths)} truths")
    scorer = getattr(fn, "score", None)
    wrong_value = float(getattr(fn, "wrong", 0.0))
    if getattr(fn, "score_many", None) is not None:  # the sandboxed rewards: a whole batch at once
        return _score_many(fn, responses, truths, on_error=on_error, wrong_value=wrong_value)

    def one(i: int) -> tuple[float, bool, bool]:
        try:
            if scorer is not None:
                reward, ok = scorer(responses[i], truths[i])
            else:
                reward = fn(responses[i], truths[i])
                ok = reward > 0
            if not math.isfinite(float(reward)):
                raise ValueError(f"the reward is {float(reward)}, not a finite number")
            return float(reward), bool(ok), False
        except Exception as e:
            if on_error == "raise":
                raise RuntimeError(
                    f"reward failed on row {i} ({type(e).__name__}: {e}); "
                    f"response: {_truncate(str(responses[i]))!r}"
                ) from e
            return wrong_value, False, True

    if max_workers > 1 and len(responses) > 1:
        with ThreadPoolExecutor(max_workers=max_workers) as pool:
            results = list(pool.map(one, range(len(responses))))
    else:
        results = [one(i) for i in range(len(responses))]
    rewards = np.asarray([r[0] for r in results], dtype=np.float32).reshape(len(results))
    correct = np.asarray([r[1] for r in results], dtype=bool).reshape(len(results))
    error_rows = tuple(i for i, r in enumerate(results) if r[2])
    return BatchScores(rewards, correct, len(error_rows), error_rows)
