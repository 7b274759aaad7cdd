"""Episodes as the fixed-shape arrays the update trains on, and the rewards placed on them.

    arrays = episode_arrays(episodes, prompt_width=S, width=T, turns=J, pad_id=0)

For episode `b`, `response_ids[b]` is every id after the prompt in the order the sampler produced
and appended them, right-padded to `T`:

    context_mask  1 on every real id (model and observation): what the forward attends to
    loss_mask     1 on the model's ids only: what the loss, its token count, the entropy and the KL see
    logp          the sampler's log-prob on model ids, 0 elsewhere (the update's `old_logp`)

Turn rewards go to process supervision's step arrays (`rewards/steps.py`): step `j` of episode `b`
ends at its turn's last model id `step_ends[b, j]` with reward `step_rewards[b, j]` (the turn's own;
`with_outcome` adds the episode's outcome reward to its last turn).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from dapo_jax.agents.episodes import Episode

TRUNCATED = ("budget", "context", "max_turns")


def episode_arrays(episodes: Sequence[Episode], *, prompt_width: int, width: int, turns: int,
                   pad_id: int = 0) -> dict[str, np.ndarray]:
    """`[B, ...]` arrays of `B` episodes (see the module docstring)."""
    b = len(episodes)
    out = {
        "prompt_ids": np.full((b, prompt_width), pad_id, np.int32), "prompt_mask": np.zeros((b, prompt_width), np.int32),
        "response_ids": np.full((b, width), pad_id, np.int32), "context_mask": np.zeros((b, width), np.float32),
        "loss_mask": np.zeros((b, width), np.float32), "logp": np.zeros((b, width), np.float32),
        "entropy": np.zeros((b, width), np.float32),
        "step_rewards": np.zeros((b, turns), np.float32), "step_ends": np.zeros((b, turns), np.int32),
        "step_mask": np.zeros((b, turns), np.float32),
        "model_tokens": np.zeros(b, np.int32), "truncated": np.zeros(b, bool), "num_turns": np.zeros(b, np.int32),
    }
    for i, ep in enumerate(episodes):
        n, s = len(ep.ids), len(ep.prompt_ids)
        if n > width or s > prompt_width or len(ep.turn_ends) > turns:
            raise ValueError(f"episode {i}: {n} ids, {s} prompt ids, {len(ep.turn_ends)} turns do not fit "
                             f"width={width}, prompt_width={prompt_width}, turns={turns}")
        out["prompt_ids"][i, prompt_width - s:] = ep.prompt_ids
        out["prompt_mask"][i, prompt_width - s:] = 1
        out["response_ids"][i, :n] = ep.ids
        out["context_mask"][i, :n] = 1
        out["loss_mask"][i, :n] = ep.loss_mask
        out["logp"][i, :n] = ep.logp
        out["entropy"][i, :n] = ep.entropy
        k = len(ep.turn_ends)
        out["step_rewards"][i, :k] = ep.turn_rewards
        out["step_ends"][i, :k] = ep.turn_ends
        out["step_mask"][i, :k] = 1
        out["model_tokens"][i] = ep.model_tokens
        out["truncated"][i] = ep.status in TRUNCATED
        out["num_turns"][i] = k
    return out


def with_outcome(step_rewards: np.ndarray, num_turns: np.ndarray, outcome: np.ndarray) -> np.ndarray:
    """`step_rewards [..., J]` with `outcome [...]` added at each episode's last turn (`num_turns - 1`;
    an episode without a turn gets nothing)."""
    j = np.arange(step_rewards.shape[-1])
    last = (j == (np.asarray(num_turns)[..., None] - 1)).astype(np.float32)
    return (step_rewards + last * np.asarray(outcome, np.float32)[..., None]).astype(np.float32)


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """`agent/...`: turns, model and observation ids per episode, each status's fraction, and the
    environments' counts (tool calls, errors, timeouts, ...) per episode."""
    n = max(len(episodes), 1)
    total = {}
    for ep in episodes:
        for key, value in ep.metrics.items():
            total[key] = total.get(key, 0.0) + float(value)
    metrics = {
        "agent/turns_mean": sum(len(ep.turn_ends) for ep in episodes) / n,
        "agent/model_tokens_mean": sum(ep.model_tokens for ep in episodes) / n,
        "agent/observation_tokens_mean": sum(len(ep.ids) - ep.model_tokens for ep in episodes) / n,
    }
    for status in ("done", "max_turns", "budget", "context", "env_error"):
        metrics[f"agent/status_{status}"] = sum(ep.status == status for ep in episodes) / n
    metrics.update({f"agent/{key}": value / n for key, value in sorted(total.items())})
    return metrics
