"""Outcome rewards: the environment's own, else the run's reward function on the final turn."""

import numpy as np
import pytest

from dapo_jax.agents.episodes import Episode
from dapo_jax.agents.outcome import evaluation_metrics, final_text, outcome_rewards
from dapo_jax.rewards.functions import make_reward

DIGITS = lambda ids: "".join(str(i - 2) for i in ids)  # ids 2..11 are the digits 0..9; 1 is the EOS


def episode(turns, outcome=None, calls=0.0):
    ep = Episode(messages=[], prompt_ids=[3])
    ep.turns = [(ids, []) for ids in turns]
    ep.turn_ends = list(range(len(turns)))
    ep.outcome = outcome
    ep.metrics["tool_calls"] = calls
    return ep


def test_final_text_drops_the_eos_and_reads_the_last_turn():
    assert final_text(episode([[3, 4], [6, 5, 1]]), DIGITS, eos_ids=(1,)) == "43"
    assert final_text(episode([]), DIGITS) == ""


def test_env_outcome_first_then_the_reward_function():
    rows = [{"answer": "43"}, {"answer": "7"}]
    eps = [episode([[6, 5, 1]]), episode([[6, 6, 1]], outcome=0.5), episode([[9, 1]]), episode([[9]], outcome=0.0)]
    fn = make_reward("synthetic", right=1.0, wrong=-1.0)
    rewards, correct = outcome_rewards(eps, rows, group_size=2, reward_fn=fn, decode=DIGITS, eos_ids=(1,))
    np.testing.assert_array_equal(rewards, [1.0, 0.5, 1.0, 0.0])
    np.testing.assert_array_equal(correct, [True, True, True, False])
    none, _ = outcome_rewards(eps[:2], rows[:1], group_size=2)
    np.testing.assert_array_equal(none, [0.0, 0.5])
    with pytest.raises(KeyError, match="data row 0 has no 'answer'"):
        outcome_rewards(eps[:2], [{}], group_size=2, reward_fn=fn, decode=DIGITS)


def test_evaluation_metrics():
    eps = [episode([[3], [4]], calls=1.0), episode([[3]]), episode([[3], [4], [5]], calls=2.0), episode([[3]])]
    m = evaluation_metrics(eps, np.array([True, False, True, True]))
    assert m == {"accuracy": 0.75, "tool_call_rate": 0.5, "tool_calls_mean": 0.75, "turns_mean": 1.75}
