"""Episodes in the RL step: an agent run's rollouts are multi-turn episodes (dapo_jax/agents, docs/agents.md).

    agent = load_agent(cfg, stream, tokenizer)          # the environment, tried on the first data row
    source = EpisodeSource(cfg, programs.engine, policy, stream, agent, tokenizer, scorer, log, key)
    groups, stats, carry = source.collect(step, params, carry)   # in the loop's place of the Actor

A run whose config has an `agent:` section runs the same `train()` and `rl_step` as single-turn RL.
Only the rollout differs. `collect` takes `gen_batch` rows from the training stream per round and plays
`G` episodes of each with `agents.episodes.run_episodes` on the run's `TurnEngine` (built by
`training/update/programs.build_programs`). It scores them: the environment's `reward()`, else the run's
reward functions on the final turn's text. It shapes the rewards on the episodes' MODEL ids
(`agents.update.shape_episodes`: overlong punishment and filtering), and hands `rollout.collect_groups`
the same `Groups` as the Actor does, with `context_mask` (every real id) beside `response_mask` (the
model's ids). Dynamic sampling, its refill rounds, the carry, the `Learner`, the checkpoints and
resume are the run's own. With `advantage: grpo_process` the turns' rewards are the process steps.

Round `i` of step `k` plays with `fold_in(fold_in(key, k), i)` on the rows the stream hands out (its
position is in every checkpoint), so a resumed run plays the same episodes as an uninterrupted one.

The data row an environment's `reset` receives is the source row (every column), or `{"prompt",
"answer"}` for a built-in task. Its first messages, rendered with the tokenizer's chat template and the
generation prompt, must fit `data.max_prompt_length`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import numpy as np

from dapo_jax.agents.batch import episode_arrays, episode_metrics
from dapo_jax.agents.engine import EngineConfig, TurnEngine
from dapo_jax.agents.env import AgentConfigError, Env, ToolEnv, load_env, preflight
from dapo_jax.agents.episodes import AgentLimits, Episode, run_episodes
from dapo_jax.agents.outcome import final_text
from dapo_jax.agents.render import DeltaRenderer
from dapo_jax.agents.update import shape_episodes
from dapo_jax.evaluation.metrics import avg_at_k, pass_at_k
from dapo_jax.objectives.loss import dynamic_sampling_keep
from dapo_jax.parallel.host import to_global
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import RunConfig
from dapo_jax.training.rollout import Groups, collect_groups

TOOL_CALL_END = "</tool_call>"  # Hermes / Qwen2.5's tool-call end marker (agents/parse.py): a turn ends at it


def turn_engine(cfg: RunConfig, graphdef, scfg, stop_sequences=()) -> TurnEngine:
    """The multi-turn engine's programs on `graphdef` at `scfg` (one turn draws at most rollout.max_new_tokens)."""
    a = cfg.agent
    return TurnEngine(graphdef, EngineConfig(scfg, cache_slots=cfg.agent_cache_slots, append_width=a.append_width,
                                             stop_sequences=tuple(tuple(s) for s in stop_sequences)))


def tool_stop_sequences(tokenizer) -> tuple[tuple[int, ...], ...]:
    """The ids of the tool-call end marker as the tokenizer writes it (one id in Qwen2.5's vocabulary)."""
    ids = tuple(int(i) for i in tokenizer.encode(TOOL_CALL_END, add_special_tokens=False))
    return (ids,) if ids else ()


def limits(cfg: RunConfig) -> AgentLimits:
    a = cfg.agent
    return AgentLimits(max_turns=a.max_turns, max_episode_tokens=a.max_episode_tokens,
                       max_tool_tokens=a.max_tool_tokens, truncation_side=a.truncation_side,
                       step_timeout=a.step_timeout)


def episode_row(example) -> dict:
    """What `reset` receives: the source row, or `{"prompt", "answer"}` for a built-in task's problem."""
    return dict(example.row) if example.row else {"prompt": example.text, "answer": example.answer}


@dataclasses.dataclass(frozen=True)
class Agent:
    """The environment of an agent run: how to build one, and the renderer of its messages."""

    make_env: Callable[[], Env]
    renderer: DeltaRenderer
    limits: AgentLimits


def load_agent(cfg: RunConfig, stream, tokenizer) -> Agent:
    """Imports `agent.env`, runs one dry episode on the stream's first row (`agents.env.preflight`) and checks
    that its first messages fit `data.max_prompt_length`: before the model loads. `ConfigError` (one line)."""
    a = cfg.agent
    try:
        factory = load_env(a.env)
        own_timeout = isinstance(factory, type) and issubclass(factory, ToolEnv) and any(
            "tool_timeout" in vars(c) for c in factory.__mro__ if c is not ToolEnv and issubclass(c, ToolEnv))

        def make_env() -> Env:
            env = factory(**a.options)
            if isinstance(env, ToolEnv) and not own_timeout:
                env.tool_timeout = a.tool_timeout  # agent.tool_timeout: the default of a class without its own
            return env

        row = episode_row(stream.examples[0])
        env = preflight(make_env, row, path=f"agent.env ({a.env})")
    except AgentConfigError as exc:
        raise ConfigError(str(exc)) from None
    tools = env.schemas() if isinstance(env, ToolEnv) else None
    renderer = DeltaRenderer.from_tokenizer(tokenizer, tools=tools)
    try:
        first = renderer.prompt(env.reset(row))
    except Exception as exc:  # noqa: BLE001 - the chat template is the user's model's
        raise ConfigError(f"agent.env ({a.env}): rendering its first messages with {cfg.model.path}'s chat template "
                          f"failed ({type(exc).__name__}: {exc})") from None
    if len(first) > cfg.data.max_prompt_length:
        raise ConfigError(f"data.max_prompt_length: {cfg.data.max_prompt_length} is shorter than the first data row's "
                          f"episode prompt ({len(first)} ids, the environment's first messages in the chat template)")
    return Agent(make_env, renderer, limits(cfg))


def score_episodes(episodes: list[Episode], examples, group_size: int, *, scorer, tokenizer, eos_ids):
    """`(rewards [B] float32, correct [B] bool)`: the environment's outcome where it gives one (correct:
    reward > 0), else the run's reward functions on the final turn's text against the row's answer."""
    rewards, correct = np.zeros(len(episodes), np.float32), np.zeros(len(episodes), bool)
    rest = []
    for i, ep in enumerate(episodes):
        if ep.outcome is not None:
            rewards[i], correct[i] = ep.outcome, ep.outcome > 0
        else:
            rest.append(i)
    if rest:
        decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)
        rows = [examples[i // group_size] for i in rest]
        scored = scorer.score([final_text(episodes[i], decode, eos_ids) for i in rest], [e.answer for e in rows],
                              prompts=[e.text for e in rows], rows=[e.row or {} for e in rows])
        rewards[rest], correct[rest] = scored.rewards, scored.correct
    return rewards, correct


def episode_turns(ep: Episode, decode) -> dict:
    """An episode for the rollout log: each turn's model text with its reward, then what the environment said."""
    turns = []
    for j, (ids, observations) in enumerate(ep.turns):
        reward = ep.turn_rewards[j] if j < len(ep.turn_rewards) else 0.0
        turns.append({"role": "model", "text": decode(ids), "reward": float(reward)})
        turns += [{"role": m.get("role", "tool"), **({"name": m["name"]} if "name" in m else {}),
                   "text": m["content"]} for m in observations]
    return {"turns": turns, "status": ep.status, "outcome": ep.outcome, "model_ids": ep.model_tokens,
            "ids": len(ep.ids)}


def play(engine: TurnEngine, state, agent: Agent, examples, key, *, group_size: int, prompt_width: int):
    """`G` episodes of each example's row (row `r G + g`)."""
    return run_episodes(engine, state, [episode_row(e) for e in examples], agent.make_env, agent.renderer,
                        agent.limits, key, group_size=group_size, prompt_width=prompt_width)


def tool_call_rate(episodes: list[Episode]) -> float:
    """The fraction of episodes with at least one tool call."""
    return float(np.mean([ep.metrics.get("tool_calls", 0.0) > 0 for ep in episodes])) if episodes else 0.0


def evaluate_episodes(engine: TurnEngine, state, agent: Agent, stream, *, tokenizer, scorer, key, batch_size: int,
                      k: int, prompt_width: int, limit: int | None = None,
                      records: list | None = None) -> dict[str, float]:
    """The held-out evaluation of an agent run: `k` episodes of each of the stream's first `limit` rows, in
    fixed batches of `batch_size` rows (the last padded with repeats whose results are dropped), batch `b`
    played with `fold_in(key, its first row's index)` as `training/evaluate.py` samples. `eval/accuracy`
    (avg@k), pass@k, `eval/tool_call_rate` (episodes with a call), tool calls and turns per episode.
    `records`, when given, receives each row's episodes (`episode_turns`)."""
    examples = list(stream.examples[:limit] if limit else stream.examples)
    n = len(examples)
    correct = np.zeros((n, k), bool)
    kept: list[Episode] = []
    decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)
    for start in range(0, n, batch_size):
        chunk = examples[start:start + batch_size]
        batch = chunk + [chunk[-1]] * (batch_size - len(chunk))
        episodes = play(engine, state, agent, batch, jax.random.fold_in(key, start), group_size=k,
                        prompt_width=prompt_width)[:len(chunk) * k]
        _, ok = score_episodes(episodes, chunk, k, scorer=scorer, tokenizer=tokenizer,
                               eos_ids=engine.config.sampling.eos_token_ids)
        correct[start:start + len(chunk)] = ok.reshape(len(chunk), k)
        kept += episodes
        if records is not None:
            records.extend({"index": int(e.index), "answer": e.answer, "accuracy": float(ok[i * k:(i + 1) * k].mean()),
                            "episodes": [episode_turns(ep, decode) for ep in episodes[i * k:(i + 1) * k]]}
                           for i, e in enumerate(chunk))
    calls = np.array([ep.metrics.get("tool_calls", 0.0) for ep in kept], np.float64)
    return {
        "eval/accuracy": avg_at_k(correct), f"eval/avg@{k}": avg_at_k(correct), f"eval/pass@{k}": pass_at_k(correct, k),
        "eval/problems": float(n), "eval/tool_call_rate": tool_call_rate(kept),
        "eval/tool_calls_mean": float(calls.mean()) if len(calls) else 0.0,
        "eval/turns_mean": float(np.mean([len(ep.turn_ends) for ep in kept])) if kept else 0.0,
    }


@dataclasses.dataclass(frozen=True)
class EpisodeSource:
    """The step's groups from episodes (the loop's `Actor` in an agent run)."""

    cfg: RunConfig
    engine: TurnEngine
    policy: Any  # training.update.lora.PolicyWeights
    stream: Any  # data.PromptStream of the training rows
    agent: Agent
    tokenizer: Any
    scorer: Any  # the run's reward functions, for episodes whose environment gives no outcome
    log: Any  # training.rollout_log.RolloutLog
    key: jax.Array  # the run's raw PRNG key
    rows: Any = None  # the batch's sharding over the mesh (VAPO's value pre-training batches), or None: on the host

    def collect(self, step: int, params, carry: Groups | None) -> tuple[Groups, dict, Groups | None]:
        """Rounds of `gen_batch` rows x G episodes until `train_batch` groups are kept (with dynamic sampling:
        groups whose outcomes differ), as `Actor.collect`; the stats add the episodes' `agent/*` metrics."""
        r, objective = self.cfg.rollout, self.cfg.objective_config
        played: list[Episode] = []
        t_play = [0.0]

        def sample(i: int) -> Groups:
            t0 = time.perf_counter()
            groups, episodes = self.sample_round(step, i, params)
            t_play[0] += time.perf_counter() - t0
            played.extend(episodes)
            decode = lambda ids: self.tokenizer.decode(list(ids), skip_special_tokens=False)
            self.log.add_episodes(step, i, [episode_turns(ep, decode) for ep in episodes], r.G)
            return groups

        keep = self.keep if objective.dynamic_sampling else None
        groups, stats, carry = collect_groups(*self.log.watch(step, sample, keep), train_batch=r.train_batch,
                                              max_gen_batches=r.max_gen_batches, on_starvation=r.on_starvation,
                                              carry=carry, carry_surplus=r.carry_surplus)
        stats.update(episode_metrics(played))
        stats["agent/tool_call_rate"] = tool_call_rate(played)
        stats["agent/play_time_s"] = t_play[0]
        return groups, stats, carry

    def initial_batch(self, params, round_idx: int) -> tuple:
        """VAPO's value pre-training batch `round_idx` (training/update/critic.py), as `Actor.initial_batch`: one
        round of the initial policy's episodes, `(prompt_ids, prompt_mask, response_ids, response_mask, rewards,
        valid, context_mask)`; the critic's forward sees the tool ids as context, its loss the model's ids."""
        g = collect_groups(lambda j: self.sample_round(0, round_idx, params)[0], None,
                           train_batch=self.cfg.rollout.train_batch, max_gen_batches=1,
                           on_starvation="train_on_kept")[0]
        host = (g.prompt_ids, g.prompt_mask, g.response_ids, g.response_mask, g.rewards,
                np.broadcast_to(g.valid[:, None], g.rewards.shape), g.context_mask)
        return host if self.rows is None else to_global(host, self.rows)

    def keep(self, groups: Groups) -> np.ndarray:
        k, _ = dynamic_sampling_keep(self.cfg.objective_config, correct=groups.correct, rewards=groups.rewards)
        return np.asarray(k, bool)

    def sample_round(self, step: int, round_idx: int, params) -> tuple[Groups, list[Episode]]:
        """One round: the stream's next `gen_batch` rows, `G` episodes each, scored and shaped."""
        cfg = self.cfg
        examples = self.stream.next_examples(cfg.rollout.gen_batch)
        key = jax.random.fold_in(jax.random.fold_in(self.key, step), round_idx)
        try:
            episodes = play(self.engine, self.policy.sampler(params), self.agent, examples, key,
                            group_size=cfg.rollout.G, prompt_width=cfg.data.max_prompt_length)
        except AgentConfigError as exc:  # a reset that fails on a later row, a prompt too long: one line
            raise ConfigError(str(exc)) from None
        return self.groups(examples, episodes), episodes

    def groups(self, examples, episodes: list[Episode]) -> Groups:
        """The scored, shaped `Groups` of `len(examples)` rows' episodes (what `Actor.score` gives for single turns)."""
        cfg, g = self.cfg, self.cfg.rollout.G
        objective, sampling = cfg.objective_config, self.engine.config.sampling
        rewards, correct = score_episodes(episodes, examples, g, scorer=self.scorer, tokenizer=self.tokenizer,
                                          eos_ids=sampling.eos_token_ids)
        arrays = episode_arrays(episodes, prompt_width=cfg.data.max_prompt_length, width=cfg.response_tokens,
                                turns=cfg.agent.max_turns, pad_id=sampling.pad_token_id)
        shaped, loss_mask, target = shape_episodes(arrays, rewards, objective=objective, group_size=g)
        p = len(examples)
        grouped = lambda x: np.asarray(x).reshape(p, g, *np.shape(x)[1:])
        steps = {} if not objective.needs_step_rewards else {
            "step_rewards": np.asarray(target.rewards, np.float32), "step_ends": np.asarray(target.ends, np.int32),
            "step_mask": np.asarray(target.mask, np.float32)}
        return Groups(
            arrays["prompt_ids"][::g], arrays["prompt_mask"][::g], grouped(arrays["response_ids"]),
            np.asarray(loss_mask, np.float32), grouped(arrays["logp"]), np.asarray(shaped, np.float32),
            grouped(correct), grouped(arrays["model_tokens"]), grouped(arrays["truncated"]), np.ones(p, bool),
            np.zeros(p, np.int32), entropy=grouped(arrays["entropy"]),
            prompt_index=np.asarray([e.index for e in examples], np.int32),
            context_mask=grouped(arrays["context_mask"]), **steps)

    def precompile(self, sampler, programs) -> None:
        """The engine's programs compile when the first round plays (their shapes need the prompts' renders)."""


__all__ = ["Agent", "EpisodeSource", "episode_row", "episode_turns", "evaluate_episodes", "load_agent", "play", "score_episodes",
           "tool_call_rate", "tool_stop_sequences", "turn_engine"]
