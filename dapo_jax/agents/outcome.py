"""Outcome rewards of finished episodes, and the evaluation metrics of a set of them.

    rewards, correct = outcome_rewards(episodes, rows, group_size=G, reward_fn=make_reward("gsm8k"),
                                       decode=tokenizer_decode, eos_ids=(eos,), answer_key="answer")

An episode's outcome is its environment's `reward()` when that gives one (correct: reward > 0);
otherwise the run's reward function scores the final model turn's text (its trailing EOS dropped)
against the row's answer, `reward_fn.score(text, answer) -> (reward, correct)` as for single turns
(`rewards/functions.py`). Without either, the outcome is 0 and not correct.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from dapo_jax.agents.episodes import Episode


def final_text(episode: Episode, decode: Callable[[Sequence[int]], str], eos_ids: Sequence[int] = ()) -> str:
    """The last model turn decoded, without its EOS ("" for an episode without a turn)."""
    if not episode.turns:
        return ""
    ids = list(episode.turns[-1][0])
    if ids and ids[-1] in eos_ids:
        ids = ids[:-1]
    return decode(ids)


def outcome_rewards(episodes: Sequence[Episode], rows: Sequence[dict], *, group_size: int, reward_fn=None,
                    decode: Callable[[Sequence[int]], str] | None = None, eos_ids: Sequence[int] = (),
                    answer_key: str = "answer") -> tuple[np.ndarray, np.ndarray]:
    """`(rewards [B] float32, correct [B] bool)` for the `B = len(rows) * group_size` episodes."""
    if len(episodes) != len(rows) * group_size:
        raise ValueError(f"{len(episodes)} episodes for {len(rows)} rows x {group_size}")
    rewards, correct = np.zeros(len(episodes), np.float32), np.zeros(len(episodes), bool)
    for i, ep in enumerate(episodes):
        if ep.outcome is not None:
            rewards[i], correct[i] = ep.outcome, ep.outcome > 0
        elif reward_fn is not None:
            row = rows[i // group_size]
            if answer_key not in row:
                raise KeyError(f"data row {i // group_size} has no {answer_key!r} for the reward function")
            rewards[i], correct[i] = reward_fn.score(final_text(ep, decode, eos_ids), row[answer_key])
    return rewards, correct


def evaluation_metrics(episodes: Sequence[Episode], correct: np.ndarray) -> dict[str, float]:
    """`accuracy`, `tool_call_rate` (episodes with at least one tool call), `tool_calls_mean` and
    `turns_mean` of a set of episodes (from the environments' `tool_calls` counts)."""
    n = max(len(episodes), 1)
    calls = np.array([ep.metrics.get("tool_calls", 0.0) for ep in episodes], np.float64)
    return {
        "accuracy": float(np.mean(correct)) if len(episodes) else 0.0,
        "tool_call_rate": float(np.sum(calls > 0) / n),
        "tool_calls_mean": float(calls.sum() / n),
        "turns_mean": sum(len(ep.turn_ends) for ep in episodes) / n,
    }
