"""A run's rewards together: rule functions (host) and learned reward models (device), weighted.

    pipeline = RewardPipeline([("cot", make_reward("cot"), 0.0), ("reward_model", rm, 1.0)], on_error="wrong")
    batch = pipeline.score(responses, truths, prompts=prompts)   # RewardBatch
    rewards, correct, keys = pipeline(responses, truths, prompts=prompts)

For N responses and K functions, `parts [N, K]` holds each function's reward `r_k` before its
weight and `rewards = Σ_k w_k r_k` (`multi_reward: sum`); `normalize_then_sum` combines the parts on
the device instead (`objectives.advantages.combine_rewards`, with these weights), which is why they
travel with the rollout.

A row that fails in any function (a rule check that raises, a response longer than a reward model's
`max_length`) gets every function's `wrong` value and counts as incorrect under `on_error: wrong`;
`on_error: raise` raises `RuntimeError` naming the row, the function and the (truncated) response.

`correct` (accuracy, DAPO's dynamic sampling on correctness, pass@k) and the answer keys (maj@k)
come from the FIRST RULE function, so that a run trained on a learned reward is still judged by a
rule when one is listed (weight 0 if it should not train); with none, from the first function (a
learned one counts a row correct when `is_correct` says so: logit > 0, or step probability > 1/2).

User functions (`rewards/custom.py`: an import path or a URL) get each row's data columns (`rows=`) and
prompt; their failures (a raise, a timeout, NaN, a wrong-length list) are failed rows like a rule's.
Every batch counts, per function, its failed rows (`RewardBatch.failures`) and the rows whose ground
truth the function cannot read (`RewardBatch.unreadable`: a rule's `truth_readable` says no; such a row
is scored as usual, and is wrong whatever the response). A learned reward that scores a row NaN or
infinite raises `NonFiniteReward` naming it, whatever `on_error`: nothing can be learned from it.

Learned rewards read the prompt as its user asked it: the policy's chat template, if its prompts
carry one, is stripped first (`reward_model.prompt_unwrapper`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from dapo_jax.rewards.custom import CustomReward
from dapo_jax.rewards.functions import _truncate, score_batch
from dapo_jax.rewards.reward_model import LearnedReward, ProcessRewardModel, prompt_unwrapper
from dapo_jax.rewards.steps import make_step_scorer, step_fields, steps_to_arrays, token_pieces

__all__ = ["NonFiniteReward", "RewardBatch", "RewardPipeline"]


class NonFiniteReward(RuntimeError):
    """A learned reward scored a row NaN or infinite."""


class RewardBatch(NamedTuple):
    rewards: np.ndarray  # [N] float32: Σ_k w_k parts[:, k]
    parts: np.ndarray  # [N, K] float32: each function's reward, unweighted
    correct: np.ndarray  # [N] bool
    keys: list  # [N] answer keys (maj@k)
    num_errors: int
    error_rows: tuple[int, ...]
    failures: dict | None = None  # {part name: rows that function failed on}
    unreadable: dict | None = None  # {part name: rows whose ground truth it cannot read} (functions that say)
    scored: dict | None = None  # {part name: rows it neither failed on nor could not read the truth of}


class RewardPipeline:
    """`functions`: `(name, reward function or LearnedReward, weight)` triples, in config order."""

    def __init__(self, functions: Sequence[tuple[str, Any, float]], *, on_error: str = "raise", policy_tokenizer=None):
        if not functions:
            raise ValueError("RewardPipeline needs at least one reward function")
        if on_error not in ("raise", "wrong"):
            raise ValueError(f"on_error must be 'raise' or 'wrong', got {on_error!r}")
        self.functions = tuple(functions)
        self.on_error = on_error
        self.policy_tokenizer = policy_tokenizer
        self._unwrap = prompt_unwrapper(policy_tokenizer)
        self.weights = np.asarray([float(w) for _, _, w in functions], np.float32)
        rules = [i for i, (_, fn, _) in enumerate(functions) if not isinstance(fn, LearnedReward)]
        self.accuracy = rules[0] if rules else 0
        names = [n for n, _, _ in functions]
        self.part_names = tuple(n if names.count(n) == 1 else f"{n}_{i}" for i, n in enumerate(names))

    @property
    def learned(self) -> list[LearnedReward]:
        return [fn for _, fn, _ in self.functions if isinstance(fn, LearnedReward)]

    def replace(self, *, on_error: str | None = None, learned: bool = True) -> "RewardPipeline":
        """The same functions with another `on_error`; `learned=False` keeps the rule functions only."""
        keep = [f for f in self.functions if learned or not isinstance(f[1], LearnedReward)]
        return type(self)(keep, on_error=on_error or self.on_error, policy_tokenizer=self.policy_tokenizer)

    def load(self, mesh=None, *, dtype: str = "float32") -> "RewardPipeline":
        """Puts every learned reward's weights on the device (`mesh`), frozen, in `dtype`."""
        for rm in self.learned:
            rm.load(mesh, dtype=dtype)
        return self

    def score(self, responses: Sequence[str], truths: Sequence[Any], *,
              prompts: Sequence[str] | None = None, rows: Sequence[dict] | None = None) -> RewardBatch:
        """Every function on every row; `prompts` (the policy's rendered prompts, one per row) are
        needed by learned rewards, `rows` (each row's data columns) are what user functions receive."""
        n, k = len(responses), len(self.functions)
        if len(truths) != n:
            raise ValueError(f"{n} responses but {len(truths)} truths")
        parts = np.zeros((n, k), np.float32)
        correct = np.zeros(n, bool)
        errors: dict[int, str] = {}
        failed_by: dict[str, set] = {name: set() for name in self.part_names}
        unreadable_by: dict[str, set] = {}
        users = None
        for j, (name, fn, _) in enumerate(self.functions):
            part = self.part_names[j]
            readable = getattr(fn, "truth_readable", None)
            if readable is not None:
                unreadable_by[part] = {i for i, t in enumerate(truths) if not readable(t)}
            if isinstance(fn, CustomReward):
                parts[:, j], failed = fn.score_rows(responses, truths, rows=rows, prompts=prompts)
                if j == self.accuracy:
                    correct = parts[:, j] > fn.threshold
            elif isinstance(fn, LearnedReward):
                if prompts is None or len(prompts) != n:
                    raise ValueError(f"reward {name!r} is a learned model: it needs the {n} rows' prompts")
                users = users if users is not None else [self._unwrap(p) for p in prompts]
                parts[:, j], failed = fn.score_rows(users, list(responses))
                bad = [i for i in np.flatnonzero(~np.isfinite(parts[:, j])) if i not in failed]
                if bad:
                    first = _truncate(str(responses[bad[0]]))
                    raise NonFiniteReward(f"reward {name!r} scored {len(bad)} of {n} rows {parts[bad[0], j]} (not "
                                          f"finite; first: row {bad[0]}, response {first!r}): check the reward "
                                          f"model's weights and dtype")
                if j == self.accuracy:
                    correct = fn.is_correct(parts[:, j])
            else:
                out = score_batch(fn, responses, truths, on_error=self.on_error)
                parts[:, j] = out.rewards
                if j == self.accuracy:
                    correct = out.correct
                failed = dict.fromkeys(out.error_rows, "the check raised")
            failed_by[part] = set(failed)
            for i, why in sorted(failed.items()):
                if self.on_error == "raise":
                    raise RuntimeError(f"reward {name!r} failed on row {i} ({why}); response: "
                                       f"{_truncate(str(responses[i]))!r}")
                errors.setdefault(i, why)
        failed_rows = sorted(errors)
        if failed_rows:
            parts[failed_rows] = [float(getattr(fn, "wrong", 0.0)) for _, fn, _ in self.functions]
            correct[failed_rows] = False
        acc = self.functions[self.accuracy][1]
        key_fn = getattr(acc, "answer_key", None)
        keys = [key_fn(r) if key_fn is not None else r.strip() for r in responses]
        rewards = (parts * self.weights).sum(axis=1, dtype=np.float32).reshape(n)
        return RewardBatch(rewards, parts, np.asarray(correct, bool).reshape(n), keys, len(failed_rows),
                           tuple(failed_rows), {k: len(v) for k, v in failed_by.items()},
                           {k: len(v) for k, v in unreadable_by.items()},
                           {k: n - len(failed_by[k] | unreadable_by.get(k, set())) for k in self.part_names})

    def __call__(self, responses, truths, *, prompts=None, rows=None):
        """`(rewards [N] float32, correct [N] bool, answer keys [N])`."""
        out = self.score(responses, truths, prompts=prompts, rows=rows)
        return out.rewards, out.correct, out.keys

    # ------------------------------------------------------------------ process supervision
    def step_scorer(self, tokenizer, *, on_error: str | None = None):
        """Process supervision's step rewards (`Groups` step fields `[P, G, T]`), from the process reward
        model when one is listed, else from the first function's rule steps (`rewards.steps`).

        Returns `(response_ids [P, G, T], response_mask [P, G, T], prompts [P], answers [P]) -> dict`."""
        prm = next((fn for _, fn, _ in self.functions if isinstance(fn, ProcessRewardModel)), None)
        if prm is None:
            return make_step_scorer(self.functions[0][0], tokenizer)
        on_error = on_error or self.on_error

        def score(response_ids, response_mask, prompts, answers) -> dict[str, np.ndarray]:
            p, g, t = np.shape(response_ids)
            pieces = token_pieces(tokenizer, np.reshape(response_ids, (p * g, t)), np.reshape(response_mask, (p * g, t)))
            users = [self._unwrap(x) for x in prompts for _ in range(g)]
            steps, failed = prm.step_rows(users, ["".join(row) for row in pieces])
            if failed and on_error == "raise":
                i, why = min(failed.items())
                raise RuntimeError(f"process reward model failed on row {i} ({why}); response: "
                                   f"{_truncate(''.join(pieces[i]))!r}")
            return step_fields(*steps_to_arrays(steps, pieces, max_steps=t), (p, g, t))

        return score
