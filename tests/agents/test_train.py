"""Agentic training steps: they update the policy on episodes, and a run resumed from a checkpoint
mid-run ends bit for bit where the uninterrupted run ends."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.agents.engine import EngineConfig
from dapo_jax.agents.episodes import AgentLimits
from dapo_jax.agents.train import AgentTrainer
from dapo_jax.objectives.registry import load_objective
from dapo_jax.sampling.config import SamplingConfig
from dapo_jax.training.state.checkpoint import Checkpointer, abstract_like
from tests.agents.helpers import id_renderer, random_decoder
from tests.agents.test_episodes import Stochastic

ROWS = [{"ids": [6, 7, 8]}, {"ids": [9, 2]}, {"ids": [11]}, {"ids": [5, 5]}]


class Parity(Stochastic):
    """Outcome 1 when the model's ids of the whole episode sum to an even number."""

    def reset(self, row):
        self.total = 0
        return super().reset(row)

    def step(self, turn):
        self.total += sum(turn.token_ids)
        return super().step(turn)

    def reward(self):
        return float(self.total % 2 == 0)


def trainer(seed=0):
    engine = EngineConfig(SamplingConfig(max_new_tokens=16, temperature=1.0, eos_token_ids=(1,)), cache_slots=96,
                          append_width=3, stop_sequences=((3,), (4,), (7,)))
    return AgentTrainer(random_decoder(), id_renderer(), Parity, ROWS, objective=load_objective("grpo", kl_beta=0.0),
                        group_size=2, rows_per_step=2, limits=AgentLimits(max_turns=3, max_episode_tokens=16),
                        engine=engine, prompt_width=4, learning_rate=1e-2, seed=seed)


def leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def test_steps_update_the_policy_and_resume_mid_run_is_bit_exact(tmp_path):
    run = trainer()  # one trainer (one set of compiled programs), its state set back between runs
    initial = jax.tree.map(jnp.copy, run.state)
    metrics = [run.step(i) for i in range(3)]
    whole, whole_ids = leaves(run.state), [e.ids for e in run.episodes]
    assert any(np.abs(a - b).max() > 0 for a, b in zip(leaves(initial), whole))
    assert all(np.isfinite(m["loss"]) for m in metrics)
    assert metrics[0]["agent/turns_mean"] > 1.0 and 0 < metrics[0]["reward_mean"] < 1
    assert run.step_rows(1) == ROWS[2:] and run.step_rows(2) == ROWS[:2]

    run.state = jax.tree.map(jnp.copy, initial)
    for i in range(2):
        run.step(i)
    with Checkpointer(tmp_path / "ckpt", async_save=False) as ckpt:
        ckpt.save(2, run.state, meta={"next_step": 2})
    run.state = jax.tree.map(jnp.copy, initial)  # a fresh process: nothing of the first two steps is left
    with Checkpointer(tmp_path / "ckpt", async_save=False) as ckpt:
        restored = ckpt.restore(2, abstract_like(run.state))
    run.state = restored.state
    run.step(restored.meta["next_step"])
    for a, b in zip(whole, leaves(run.state)):
        np.testing.assert_array_equal(a, b)
    assert [e.ids for e in run.episodes] == whole_ids


def test_a_turn_must_be_allowed_the_whole_budget():
    with pytest.raises(ValueError, match="max_new_tokens=8 must be >= limits.max_episode_tokens=16"):
        AgentTrainer(random_decoder(), id_renderer(), Parity, ROWS, objective=load_objective("grpo"), group_size=2,
                     rows_per_step=2, limits=AgentLimits(max_episode_tokens=16),
                     engine=EngineConfig(SamplingConfig(max_new_tokens=8), cache_slots=64, append_width=2),
                     prompt_width=4, learning_rate=1e-3)


def test_an_overlong_band_needs_its_length():
    engine = EngineConfig(SamplingConfig(max_new_tokens=16), cache_slots=64, append_width=2)
    with pytest.raises(ValueError, match="overlong_buffer needs max_response_length"):
        AgentTrainer(random_decoder(), id_renderer(), Parity, ROWS, objective=load_objective("dapo"), group_size=2,
                     rows_per_step=2, limits=AgentLimits(max_episode_tokens=16), engine=engine, prompt_width=4,
                     learning_rate=1e-3)
