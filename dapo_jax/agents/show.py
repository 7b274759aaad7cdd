"""An episode printed turn by turn: the model's text, what the environment answered, the turn's reward."""

from __future__ import annotations

from typing import Callable, Sequence

from dapo_jax.agents.episodes import Episode


def format_episode(episode: Episode, decode: Callable[[Sequence[int]], str], *, width: int = 400) -> str:
    """Plain text, one block per turn; each text cut to `width` characters."""
    cut = lambda s: s if len(s) <= width else s[:width] + f"... [{len(s) - width} more characters]"
    lines = [f"prompt: {cut(decode(episode.prompt_ids))!r}"]
    for j, (ids, observations) in enumerate(episode.turns):
        reward = episode.turn_rewards[j] if j < len(episode.turn_rewards) else 0.0
        lines.append(f"turn {j + 1} model ({len(ids)} ids, reward {reward:g}): {cut(decode(ids))!r}")
        for message in observations:
            lines.append(f"turn {j + 1} {message['role']}: {cut(message['content'])!r}")
    outcome = "none" if episode.outcome is None else f"{episode.outcome:g}"
    lines.append(f"end: {episode.status}, outcome reward {outcome}, "
                 f"{episode.model_tokens} model ids of {len(episode.ids)}")
    return "\n".join(lines)
