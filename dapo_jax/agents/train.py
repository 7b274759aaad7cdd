"""An agentic training step: episodes, rewards, advantages, one update. Deterministic per step index.

    trainer = AgentTrainer(model, renderer, make_env, rows, objective=load_objective("dapo"), group_size=G,
                           rows_per_step=R, limits=AgentLimits(...), engine=EngineConfig(...),
                           prompt_width=S, learning_rate=1e-3, seed=0)
    metrics = trainer.step(i)            # rows (i R .. i R + R - 1) mod len(rows), key fold_in(seed, i)

Step `i` reads only the step index, the parameters and the optimizer state: the rows it plays and
the randomness of its episodes are functions of `i`. A run resumed from a checkpoint of `(state, i)`
(`training/state/checkpoint.Checkpointer`, the same files as `dapo-jax train`'s) therefore continues
exactly as the uninterrupted run (the test compares the parameters bit for bit).

The outcome reward of an episode is its environment's `reward()`, else `reward_fn` (a reward function
of the run, `rewards/functions.make_reward`) on its final turn against the row's `answer_key`, else 0
(`agents/outcome.py`). With dynamic sampling the groups whose rewards have no spread are masked
out of the update (their advantages are 0 anyway); the step does not draw more episodes to replace
them (`collect_groups`' refill is not wired here yet).
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import numpy as np
import optax
from flax import nnx

from dapo_jax.agents.batch import episode_arrays, episode_metrics
from dapo_jax.agents.engine import EngineConfig, TurnEngine
from dapo_jax.agents.env import Env, preflight
from dapo_jax.agents.episodes import AgentLimits, Episode, run_episodes
from dapo_jax.agents.outcome import outcome_rewards
from dapo_jax.agents.render import DeltaRenderer
from dapo_jax.agents.update import episode_batch
from dapo_jax.training.update.train_step import TrainState, init_train_state, make_train_step


class AgentTrainer:
    """The policy's state, its compiled programs and the step function (see the module docstring)."""

    def __init__(self, model, renderer: DeltaRenderer, make_env: Callable[[], Env], rows: Sequence[dict], *,
                 objective, group_size: int, rows_per_step: int, limits: AgentLimits, engine: EngineConfig,
                 prompt_width: int, learning_rate: float, seed: int = 0, reward_fn=None, answer_key: str = "answer"):
        if engine.sampling.max_new_tokens < 1 or limits.max_episode_tokens > engine.sampling.max_new_tokens:
            raise ValueError(f"engine.sampling.max_new_tokens={engine.sampling.max_new_tokens} must be >= "
                             f"limits.max_episode_tokens={limits.max_episode_tokens}: a turn may use the whole budget")
        preflight(make_env, rows[0])  # import, signature, one dry episode: before anything compiles
        if objective.overlong_buffer is not None and objective.max_response_length is None:
            raise ValueError("the objective's overlong_buffer needs max_response_length (L_max, in model ids)")
        self.graphdef, params = nnx.split(model)
        self.renderer, self.make_env, self.rows = renderer, make_env, list(rows)
        self.objective, self.group_size, self.rows_per_step = objective, group_size, rows_per_step
        self.limits, self.prompt_width, self.seed = limits, prompt_width, seed
        self.reward_fn, self.answer_key = reward_fn, answer_key
        self.engine = TurnEngine(self.graphdef, engine)
        optim = optax.adamw(learning_rate)
        self.update = make_train_step(self.graphdef, optim, optax.constant_schedule(learning_rate),
                                      objective=objective, temperature=engine.sampling.logprob_temperature)
        self.state: TrainState = init_train_state(params, optim)
        self.episodes: list[Episode] = []  # the last step's, for inspection

    def step_rows(self, i: int) -> list[dict]:
        n = self.rows_per_step
        return [self.rows[(i * n + k) % len(self.rows)] for k in range(n)]

    def step(self, i: int) -> dict[str, float]:
        """Plays step `i`'s episodes with the current parameters and applies one update."""
        key = jax.random.fold_in(jax.random.key(self.seed), i)
        rows = self.step_rows(i)
        self.episodes = run_episodes(self.engine, self.state.params, rows, self.make_env, self.renderer,
                                     self.limits, key, group_size=self.group_size, prompt_width=self.prompt_width)
        arrays = episode_arrays(self.episodes, prompt_width=self.prompt_width, width=self.limits.max_episode_tokens,
                                turns=self.limits.max_turns, pad_id=self.engine.config.sampling.pad_token_id)
        rewards, correct = outcome_rewards(self.episodes, rows, group_size=self.group_size, reward_fn=self.reward_fn,
                                           decode=self.renderer.decode, answer_key=self.answer_key,
                                           eos_ids=self.engine.config.sampling.eos_token_ids)
        out = episode_batch(arrays, rewards, objective=self.objective, group_size=self.group_size, correct=correct)
        batch = out.batch
        if not out.keep.all():  # dynamic sampling: the groups without spread leave the loss
            keep = jax.numpy.asarray(out.keep, jax.numpy.float32)[:, None, None]
            batch = batch._replace(response_mask=batch.response_mask * keep)
        self.state, update_metrics = self.update(self.state, batch)
        metrics = {"reward_mean": float(rewards.mean()), "accuracy": float(correct.mean()),
                   "kept_groups": float(out.keep.sum()), **out.stats,
                   **episode_metrics(self.episodes)}
        metrics.update({k: float(np.asarray(v)) for k, v in update_metrics.items() if np.ndim(v) == 0})
        return metrics
