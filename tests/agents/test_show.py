"""An episode printed turn by turn."""

from dapo_jax.agents.episodes import Episode
from dapo_jax.agents.show import format_episode
from tests.agents.helpers import text


def test_format_episode_turn_by_turn():
    ep = Episode(messages=[], prompt_ids=[1, 2])
    ep.add([3, 4], model=True)
    ep.add([10], model=False)
    ep.add([5], model=True)
    ep.turns = [([3, 4], [{"role": "tool", "content": "K"}]), ([5], [])]
    ep.turn_rewards = [0.5, 0.0]
    ep.status, ep.outcome = "done", 1.0
    assert format_episode(ep, text, width=1).splitlines() == [
        "prompt: 'B... [1 more characters]'",
        "turn 1 model (2 ids, reward 0.5): 'D... [1 more characters]'",
        "turn 1 tool: 'K'",
        "turn 2 model (1 ids, reward 0): 'F'",
        "end: done, outcome reward 1, 3 model ids of 4",
    ]
