"""Multi-turn episodes: hand-built episodes id for id, masks, turn rewards, the trainer's log-probs
equal to the sampler's on every model id, group determinism, contained environment failures and
one compilation whatever the turns."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax.agents.batch import episode_arrays, episode_metrics, with_outcome
from dapo_jax.agents.engine import EngineConfig, TurnEngine
from dapo_jax.agents.env import AgentConfigError, Env, StepResult
from dapo_jax.agents.episodes import AgentLimits, run_episodes
from dapo_jax.models.logprobs import response_logprobs
from dapo_jax.sampling.config import SamplingConfig
from dapo_jax.training.metrics import compile_count
from tests.agents.helpers import chain_decoder, id_renderer, random_decoder, text


class Echo(Env):
    """Answers every turn with the ids `[10, 11]` and reward 0.5; done once a turn has more than 5 ids."""

    def reset(self, row):
        return [{"role": "user", "content": text(row["ids"])}]

    def step(self, turn):
        return StepResult([{"role": "tool", "content": text([10, 11])}], reward=0.5, done=len(turn.token_ids) > 5)

    def reward(self):
        return 2.0


@pytest.fixture(scope="module")
def chain_engine():
    graphdef, state = nnx.split(chain_decoder())
    config = EngineConfig(SamplingConfig(max_new_tokens=16, eos_token_ids=(20,)), cache_slots=64, append_width=4,
                          stop_sequences=((5,),))
    return TurnEngine(graphdef, config), state


def run_chain(chain_engine, rows, env=Echo, group_size=2, **limits):
    """Episodes of the chain model; always 4 sampler rows (one compilation for the whole file)."""
    engine, state = chain_engine
    rows = rows + [{"ids": [1, 2], "kind": "fine"}] * (4 // group_size - len(rows))
    limits = AgentLimits(**{"max_turns": 3, "max_episode_tokens": 16, **limits})
    return run_episodes(engine, state, rows, env, id_renderer(), limits, jax.random.key(0), group_size=group_size,
                        prompt_width=4)


def test_hand_built_episodes_id_for_id(chain_engine):
    # prompt 1 2 -> 3 4 5 (stop id 5) | tool 10 11 | 12 .. 20 (EOS, 9 ids > 5: done)
    # prompt 14  -> 15 .. 20 (EOS, 6 ids: done)
    eps = run_chain(chain_engine, [{"ids": [1, 2]}, {"ids": [14]}])
    assert [ep.prompt_ids for ep in eps] == [[1, 2], [1, 2], [14], [14]]
    first, second = eps[0], eps[2]
    assert first.ids == [3, 4, 5, 10, 11, *range(12, 21)]
    assert first.loss_mask == [1, 1, 1, 0, 0] + [1] * 9
    assert first.turn_ends == [2, 13] and first.turn_rewards == [0.5, 0.5] and first.status == "done"
    assert first.turns[0] == ([3, 4, 5], [{"role": "tool", "content": text([10, 11])}])
    assert second.ids == list(range(15, 21)) and second.loss_mask == [1] * 6 and second.turn_ends == [5]
    assert first.outcome == 2.0
    assert [e.ids for e in eps[:2]] == [first.ids] * 2  # greedy-like chain: the group agrees

    arrays = episode_arrays(eps, prompt_width=4, width=16, turns=3)
    np.testing.assert_array_equal(arrays["prompt_mask"][0], [0, 0, 1, 1])
    np.testing.assert_array_equal(arrays["context_mask"][0], [1] * 14 + [0] * 2)
    np.testing.assert_array_equal(arrays["loss_mask"][0], [1, 1, 1, 0, 0] + [1] * 9 + [0, 0])
    # observation ids carry no log-prob; the chain's margin makes every model id's log-prob ~0
    assert np.all(arrays["logp"][0, 3:5] == 0)
    np.testing.assert_array_equal(arrays["step_ends"][0], [2, 13, 0])
    np.testing.assert_allclose(arrays["step_rewards"][0], [0.5, 0.5, 0.0])
    outcomes = np.array([ep.outcome for ep in eps])
    steps = with_outcome(arrays["step_rewards"], arrays["num_turns"], outcomes)
    np.testing.assert_allclose(steps[0], [0.5, 0.5 + 2.0, 0.0])  # the outcome on the last turn
    np.testing.assert_allclose(steps[2], [0.5 + 2.0, 0.0, 0.0])
    np.testing.assert_array_equal(arrays["step_mask"][0], [1, 1, 0])
    assert arrays["model_tokens"].tolist() == [12, 12, 6, 6]
    metrics = episode_metrics(eps)
    assert metrics["agent/turns_mean"] == 1.5 and metrics["agent/status_done"] == 1.0
    assert metrics["agent/observation_tokens_mean"] == 1.0


def test_budgets_end_episodes(chain_engine):
    # the episode budget: 3 ids + 2 observation ids + ... 8 ids in all
    eps = run_chain(chain_engine, [{"ids": [1, 2]}], max_episode_tokens=8)
    assert eps[0].ids == [3, 4, 5, 10, 11, 12, 13, 14] and eps[0].status == "budget"
    # an observation that would leave no room for a model id ends the episode before it is appended
    eps = run_chain(chain_engine, [{"ids": [1, 2]}], max_episode_tokens=5)
    assert eps[0].ids == [3, 4, 5] and eps[0].status == "budget"
    # max_turns=1: the first turn's observation is never appended
    eps = run_chain(chain_engine, [{"ids": [1, 2]}], max_turns=1)
    assert eps[0].ids == [3, 4, 5] and eps[0].status == "max_turns"


class LongTool(Echo):
    def step(self, turn):
        return StepResult([{"role": "tool", "content": text(range(6, 16))}], done=len(turn.token_ids) > 5)


@pytest.mark.parametrize("side, kept", [("right", [6, 7, 8]), ("left", [13, 14, 15])])
def test_a_long_tool_answer_is_cut_from_its_side(chain_engine, side, kept):
    eps = run_chain(chain_engine, [{"ids": [1, 2]}], env=LongTool, max_tool_tokens=3, truncation_side=side)
    assert eps[0].ids[3:6] == kept and eps[0].ids[6] == kept[-1] + 1
    assert eps[0].metrics["tool_tokens_truncated"] == sum(bool(obs) for _, obs in eps[0].turns) >= 1


class Flaky(Echo):
    """Row 0's env raises in step, row 1's hangs, row 2's returns garbage."""

    def reset(self, row):
        self.kind = row["kind"]
        return super().reset(row)

    def step(self, turn):
        if self.kind == "raise":
            raise RuntimeError("boom")
        if self.kind == "hang":
            time.sleep(3600)
        if self.kind == "garbage":
            return "not a StepResult"
        return super().step(turn)


def test_an_environment_that_raises_hangs_or_returns_garbage_ends_only_its_episode(chain_engine):
    rows = [{"ids": [1, 2], "kind": k} for k in ("raise", "hang", "garbage", "fine")]
    eps = run_chain(chain_engine, rows, env=Flaky, group_size=1, step_timeout=0.5)
    assert [ep.status for ep in eps] == ["env_error", "env_error", "env_error", "done"]
    assert eps[0].metrics["env_error"] == 1 and eps[1].metrics["env_timeout"] == 1
    assert eps[2].metrics["env_bad_result"] == 1
    assert eps[3].ids == [3, 4, 5, 10, 11, *range(12, 21)]  # the healthy row is untouched


class Drifting(Echo):
    count = 0

    def reset(self, row):
        Drifting.count += 1
        return [{"role": "user", "content": text(row["ids"] + [Drifting.count % 2])}]


def test_a_group_whose_episodes_start_apart_is_refused(chain_engine):
    with pytest.raises(AgentConfigError, match="data row 0.*different first messages"):
        run_chain(chain_engine, [{"ids": [1, 2]}, {"ids": [3]}], env=Drifting)


def test_a_prompt_over_the_width_is_refused(chain_engine):
    with pytest.raises(AgentConfigError, match="data row 1's first messages are 5 ids"):
        run_chain(chain_engine, [{"ids": [1]}, {"ids": [1, 2, 3, 4, 5]}])


class Stochastic(Env):
    """Observations of 1-3 ids that depend on the turn's ids; 1-3 turns."""

    def reset(self, row):
        return [{"role": "user", "content": text(row["ids"])}]

    def step(self, turn):
        n = 1 + sum(turn.token_ids) % 3
        return StepResult([{"role": "tool", "content": text([(7 + i + sum(turn.token_ids)) % 20 + 2
                                                               for i in range(n)])}], reward=float(n), done=n == 3)


@pytest.fixture(scope="module")
def random_episodes():
    model = random_decoder()
    graphdef, state = nnx.split(model)
    config = EngineConfig(SamplingConfig(max_new_tokens=12, temperature=1.0, eos_token_ids=(1,)), cache_slots=120,
                          append_width=3, stop_sequences=((3,), (4,), (7,), (8, 9)))
    engine = TurnEngine(graphdef, config)
    limits = AgentLimits(max_turns=4, max_episode_tokens=24)
    rows = [{"ids": [6, 7, 8]}, {"ids": [9, 2]}, {"ids": [11]}]

    def run(seed):
        return run_episodes(engine, state, rows, Stochastic, id_renderer(), limits, jax.random.key(seed),
                            group_size=2, prompt_width=4)

    return model, engine, run


def test_trainer_logprobs_equal_the_samplers_on_every_model_id(random_episodes):
    model, _, run = random_episodes
    eps = run(0)
    assert max(len(ep.turn_ends) for ep in eps) >= 2  # several turns, observations between them
    a = episode_arrays(eps, prompt_width=4, width=24, turns=4)
    logp, _ = response_logprobs(model, jnp.asarray(a["prompt_ids"]), jnp.asarray(a["prompt_mask"]),
                                jnp.asarray(a["response_ids"]), jnp.asarray(a["context_mask"]), temperature=1.0)
    model_ids = a["loss_mask"].astype(bool)
    assert model_ids.sum() > 20 and (a["context_mask"].astype(bool) & ~model_ids).sum() >= 5
    gap = np.abs(np.asarray(logp) - a["logp"])[model_ids]
    assert gap.max() <= 2e-6, gap.max()  # float32 rounding: 9.5e-7 measured compiled with LLVM optimisation, 1.4e-6 without (tests/conftest.py)
    assert np.all(a["logp"][~model_ids] == 0)


def test_same_key_same_episodes_and_no_recompilation_across_turn_counts(random_episodes):
    _, engine, run = random_episodes
    first = run(0)
    before = compile_count()
    again = run(0)
    assert [e.ids for e in again] == [e.ids for e in first] and [e.logp for e in again] == [e.logp for e in first]
    turn_counts = {len(e.turn_ends) for e in first}
    for seed in (1, 2, 3):
        turn_counts |= {len(e.turn_ends) for e in run(seed)}
    assert len(turn_counts) >= 2  # the runs differ in their numbers of turns
    assert compile_count() == before
    for fn in (engine.prefill, engine.decode, engine.append):
        assert fn._cache_size() == 1


@pytest.mark.parametrize("slots, ids, turn_ends", [(9, [3, 4, 5, 10, 11], [2]), (10, [3, 4, 5, 10, 11, 12], [2, 5])])
def test_a_full_cache_ends_episodes_without_an_empty_turn(slots, ids, turn_ends):
    """The row's 4 prompt slots, its first turn's 3 ids and its 2 appended ids fill 9 slots (an append
    takes the row's real ids only, not the chunk's width): with 9 the second turn cannot draw at all
    (no turn is recorded), with 10 it draws one id, then the row's cache is full."""
    graphdef, state = nnx.split(chain_decoder())
    config = EngineConfig(SamplingConfig(max_new_tokens=16, eos_token_ids=(20,)), cache_slots=slots, append_width=4,
                          stop_sequences=((5,),))
    eps = run_episodes(TurnEngine(graphdef, config), state, [{"ids": [1, 2]}], Echo, id_renderer(),
                       AgentLimits(max_turns=4, max_episode_tokens=16), jax.random.key(0), group_size=1,
                       prompt_width=4)
    assert eps[0].ids == ids and eps[0].status == "context" and eps[0].turn_ends == turn_ends
    assert eps[0].loss_mask == [1, 1, 1, 0, 0] + [1] * (len(ids) - 5)


class SlowTools(Echo):
    tool_timeout = 30.0


def test_a_tool_timeout_over_the_step_timeout_is_refused(chain_engine):
    with pytest.raises(AgentConfigError, match="tool_timeout=30 s must be under step_timeout=5 s"):
        run_chain(chain_engine, [{"ids": [1, 2]}], env=SlowTools, step_timeout=5.0)


class Turns(Env):
    """Answers each turn with the id `[2]` (the chain model then writes 3 4 5 again); done after the row's `turns`."""

    def reset(self, row):
        self.left = row["turns"]
        return [{"role": "user", "content": text(row["ids"])}]

    def step(self, turn):
        self.left -= 1
        return StepResult([{"role": "tool", "content": text([2])}], reward=0.0, done=self.left == 0)


def test_one_long_episode_fits_a_cache_of_its_own_length_beside_rows_that_finish_at_once():
    """Row 0 takes 5 turns of 3 ids with an id appended between them (19 ids); rows 1-3 end on EOS after
    one turn of 6. Each row writes only its own ids, so row 0 needs its prompt width 4 + 19 = 23 slots,
    whatever the others do: 23 completes every episode, 22 ends row 0 with status `context`. A single
    write index for all rows would take a slot from every row at each decode step (the widest row's)
    and `append_width` slots at each append chunk: 4 + 6 + 4 + 4 x (3 + 4) - 4 = 38 here."""
    graphdef, state = nnx.split(chain_decoder())
    rows = [{"ids": [1, 2], "turns": 5}] + [{"ids": [14], "turns": 1}] * 3

    def run(slots):
        config = EngineConfig(SamplingConfig(max_new_tokens=16, eos_token_ids=(20,)), cache_slots=slots,
                              append_width=4, stop_sequences=((5,),))
        return run_episodes(TurnEngine(graphdef, config), state, rows, Turns, id_renderer(),
                            AgentLimits(max_turns=6, max_episode_tokens=32), jax.random.key(0), group_size=1,
                            prompt_width=4)

    eps = run(23)
    assert [ep.status for ep in eps] == ["done"] * 4
    assert eps[0].ids == [3, 4, 5] + [2, 3, 4, 5] * 4 and eps[0].turn_ends == [2, 6, 10, 14, 18]
    assert all(ep.ids == list(range(15, 21)) for ep in eps[1:])
    # what one shared index would have used: per turn, the longest row's steps and A slots per append chunk
    def appended(ep, t):  # ids between turn t's last model id and turn t + 1's first
        return ep.turn_ends[t + 1] - len(ep.turns[t + 1][0]) - ep.turn_ends[t]

    width, shared = 4, 4
    for t in range(5):
        shared += max(len(ep.turns[t][0]) for ep in eps if len(ep.turns) > t)
        shared += width * max((-(-appended(ep, t) // width) for ep in eps if len(ep.turns) > t + 1), default=0)
    assert shared == 38 > 23
    short = run(22)
    assert short[0].status == "context" and short[0].ids == eps[0].ids[:-1]  # its last id found no slot
    assert [ep.status for ep in short[1:]] == ["done"] * 3


def test_the_engines_declared_programs_take_what_the_episodes_give_them(chain_engine):
    """`TurnEngine.programs` (what `dapo-jax plan` lowers) declares each program's inputs: they are the
    shapes and dtypes `run_episodes` calls it with (recorded on a real run), and the same programs."""
    engine, state = chain_engine
    seen = {}

    def described(args):
        leaves, tree = jax.tree.flatten(args)
        return tree, [(tuple(jnp.shape(x)), str(x.dtype) if hasattr(x, "dtype") else str(jnp.result_type(x)))
                      for x in leaves]

    class Recording:
        config = engine.config

        def __getattr__(self, name):
            fn = getattr(engine, name)

            def call(*args):
                seen.setdefault(name, described(args[1:]))
                return fn(*args)
            return call

    run_chain((Recording(), state), [{"ids": [1, 2]}, {"ids": [14]}])
    assert set(seen) == {"prefill", "decode", "append"}
    declared = engine.programs(state, 4, 4, jax.random.key(0))
    assert [(name, fn) for name, fn, _ in declared] == [(n, getattr(engine, n)) for n in ("prefill", "decode", "append")]
    for name, _, args in declared:
        assert described(args[1:]) == seen[name], name
