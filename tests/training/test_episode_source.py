"""Episodes as the loop's `Groups`: the masks, lengths and turn steps the Learner reads, and the Learner's
`prepare` on them giving what `agents.update.episode_batch` gives (advantages) and log-probs over the
whole context, zero on tool ids."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from dapo_jax.agents.batch import episode_arrays
from dapo_jax.agents.engine import EngineConfig, TurnEngine
from dapo_jax.agents.episodes import Episode
from dapo_jax.agents.update import episode_batch
from dapo_jax.data.stream import PromptExample
from dapo_jax.objectives.process import StepRewards
from dapo_jax.sampling.config import SamplingConfig
from dapo_jax.training.config.run import load_config
from dapo_jax.training.episode_source import EpisodeSource, episode_turns, tool_call_rate
from dapo_jax.training.update.programs import make_prepare
from dapo_jax.training.update.train_step import make_logprob_fn, policy_logprobs
from tests.agents.helpers import random_decoder

T, S, G = 8, 4, 2


def episode(prompt, parts, status, outcome, rewards):
    """`parts`: (ids, model?) in order; each model part is one turn with the next reward."""
    ep = Episode(messages=[{"role": "user", "content": "x"}], prompt_ids=prompt, status=status, outcome=outcome)
    rng = np.random.default_rng(len(ep.prompt_ids) + sum(len(p) for p, _ in parts))
    for ids, model in parts:
        if model:
            ep.add(ids, model=True, logp=-rng.uniform(0.5, 2.0, len(ids)), entropy=rng.uniform(0, 1, len(ids)))
            ep.turn_ends.append(len(ep.ids) - 1)
            ep.turn_rewards.append(rewards[len(ep.turn_ends) - 1])
            ep.turns.append((list(ids), []))
        else:
            ep.add(ids, model=False)
            ep.turns[-1] = (ep.turns[-1][0], [{"role": "tool", "content": "obs"}])
            ep.metrics["tool_calls"] += 1
    return ep


EPISODES = [
    episode([5, 6], [([7, 8], True), ([9, 10], False), ([11, 3], True)], "done", 1.0, [0.5, 1.0]),
    episode([5, 6], [([4] * 8, True)], "budget", 0.0, [0.0]),
    episode([7, 8, 9], [([12], True), ([13], False), ([14], True)], "done", 0.0, [0.0, 2.0]),
    episode([7, 8, 9], [([15, 16], True)], "done", 1.0, [0.0]),
]


def source(objective="grpo_process"):
    cfg = load_config("tiny_agent_calc", [f"agent.max_episode_tokens={T}", "rollout.max_new_tokens=4",
                                          f"rollout.G={G}", f"data.max_prompt_length={S}", "agent.cache_slots=64",
                                          f"objective.name={objective}", "objective.overlong_buffer=null"])
    model = random_decoder()
    graphdef, params = nnx.split(model)
    engine = TurnEngine(graphdef, EngineConfig(SamplingConfig(max_new_tokens=4, eos_token_ids=(1,)), cache_slots=64,
                                               append_width=2))
    src = EpisodeSource(cfg, engine, policy=None, stream=None, agent=None, tokenizer=None, scorer=None, log=None,
                        key=None)
    return cfg, src, graphdef, params


def test_groups_carry_model_ids_as_loss_and_every_id_as_context():
    cfg, src, _, _ = source()
    examples = [PromptExample((), "", "1", i) for i in range(2)]
    g = src.groups(examples, EPISODES)
    loss = np.array([[1, 1, 0, 0, 1, 1, 0, 0], [1] * 8, [1, 0, 1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]])
    context = np.array([[1] * 6 + [0, 0], [1] * 8, [1, 1, 1] + [0] * 5, [1, 1] + [0] * 6])
    np.testing.assert_array_equal(g.response_mask.reshape(4, T), loss)
    np.testing.assert_array_equal(g.context_mask.reshape(4, T), context)
    np.testing.assert_array_equal(g.response_ids.reshape(4, T)[0, :6], [7, 8, 9, 10, 11, 3])
    np.testing.assert_array_equal(g.prompt_ids, [[0, 0, 5, 6], [0, 7, 8, 9]])
    np.testing.assert_array_equal(g.lengths.reshape(4), [4, 8, 2, 2])  # model ids only
    np.testing.assert_array_equal(g.truncated.reshape(4), [False, True, False, False])
    np.testing.assert_array_equal(g.correct.reshape(4), [True, False, False, True])
    np.testing.assert_array_equal(g.old_logp.reshape(4, T) != 0, loss.astype(bool))  # no log-prob on tool ids
    # the turns are process supervision's steps, the outcome added to the last one
    np.testing.assert_allclose(g.step_rewards.reshape(4, -1)[:, :2], [[0.5, 2.0], [0.0, 0.0], [0.0, 2.0], [1.0, 0.0]])
    np.testing.assert_array_equal(g.step_ends.reshape(4, -1)[:, :2], [[1, 5], [7, 0], [0, 2], [1, 0]])
    assert g.step_rewards.shape[-1] == cfg.agent.max_turns


def test_prepare_on_the_groups_gives_episode_batch_advantages_and_context_logprobs():
    cfg, src, graphdef, params = source()
    objective = cfg.objective_config
    examples = [PromptExample((), "", "1", i) for i in range(2)]
    g = src.groups(examples, EPISODES)
    prepare = make_prepare(objective, make_logprob_fn(graphdef, temperature=1.0), recompute_old_logp=True)
    steps = StepRewards(jnp.asarray(g.step_rewards), jnp.asarray(g.step_ends), jnp.asarray(g.step_mask))
    batch, _ = prepare(params, None, g.prompt_ids, g.prompt_mask, g.response_ids, g.response_mask, g.old_logp,
                       g.rewards, np.ones((2, G), bool), steps=steps, context_mask=g.context_mask)
    arrays = episode_arrays(EPISODES, prompt_width=S, width=T, turns=cfg.agent.max_turns)
    rewards = np.array([ep.outcome for ep in EPISODES], np.float32)
    want = episode_batch(arrays, rewards, objective=objective, group_size=G).batch
    np.testing.assert_allclose(np.asarray(batch.advantages), np.asarray(want.advantages), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(batch.context_mask), g.context_mask)
    # the recomputed log pi_old: the forward over every real id, kept on model ids only
    full, _ = policy_logprobs(graphdef, params, g.prompt_ids, g.prompt_mask, g.response_ids, g.context_mask,
                              temperature=1.0)
    np.testing.assert_allclose(np.asarray(batch.old_logp), np.where(g.response_mask > 0, full, 0.0), rtol=1e-6,
                               atol=1e-6)
    blind, _ = policy_logprobs(graphdef, params, g.prompt_ids, g.prompt_mask, g.response_ids, g.response_mask,
                               temperature=1.0)  # without the tool ids as context the model ids after them differ
    assert abs(float(batch.old_logp[0, 0, 4]) - float(blind[0, 0, 4])) > 1e-4


def test_episode_turns_and_tool_call_rate():
    logged = episode_turns(EPISODES[0], lambda ids: ",".join(map(str, ids)))
    assert logged == {"turns": [{"role": "model", "text": "7,8", "reward": 0.5},
                                {"role": "tool", "text": "obs"},
                                {"role": "model", "text": "11,3", "reward": 1.0}],
                      "status": "done", "outcome": 1.0, "model_ids": 4, "ids": 6}
    assert tool_call_rate(EPISODES) == 0.5


def test_load_agent_applies_the_tool_timeout_default_and_checks_the_prompt_width():
    import pytest

    from dapo_jax.training.build import load_tokenizer
    from dapo_jax.training.config.base import ConfigError
    from dapo_jax.training.sources import make_stream

    def agent_of(*overrides):
        from dapo_jax.training.episode_source import load_agent

        cfg = load_config("tiny_agent_calc", list(overrides))
        tok = load_tokenizer(cfg)
        stream = make_stream(cfg.data.train, tok, max_prompt_length=cfg.data.max_prompt_length, seed=0)
        return load_agent(cfg, stream, tok)

    assert agent_of("agent.tool_timeout=3").make_env().tool_timeout == 2.0  # CalcEnv sets its own
    echo = agent_of("agent.env=tests.training.agent_envs:Echo", "agent.tool_timeout=3").make_env()
    assert echo.tool_timeout == 3.0 and echo.schemas()[0]["function"]["name"] == "echo"
    with pytest.raises(ConfigError, match=r"data.max_prompt_length: 3 is shorter than the first data row's episode"):
        agent_of("data.max_prompt_length=3", "agent.cache_slots=64")
