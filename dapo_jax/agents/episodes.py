"""Multi-turn episodes on the JAX sampler: the host loop around `engine.TurnEngine`.

    episodes = run_episodes(engine, state, rows, make_env, renderer, limits, key, group_size=G,
                            tokenizer_decode=decode, prompt_width=S)

For `R` data rows and `G` episodes each (`B = R G` sampler rows, row `r G + g`):

1. `G` environments per data row are reset on it; their first messages must be equal (group
   determinism), and are rendered with the generation prompt into the prompt ids (left-padded to `S`).
2. Turn loop, at most `max_turns` times: the active rows decode until each ends its turn (EOS, the
   tool-call end marker, or the token budget); every row that ended on EOS or the marker is stepped,
   all at once, in its own environment (`contain.run_contained`, `step_timeout` seconds); the new
   messages are rendered as a delta (`render.DeltaRenderer`), tool contents first cut to
   `max_tool_tokens` tokens from `truncation_side`, and appended to the rows' caches in chunks of
   `A` ids; decoding resumes on those rows only.
3. An episode ends when its environment says `done`, when a turn produced no observation, at
   `max_turns`, when its next observation would not leave one model token of the episode budget
   `max_episode_tokens` (model and observation ids together), when the row's own `cache_slots`
   (its prompt width and its episode's ids: each row has its own write index) are full, or when its
   environment fails (raises or times out in `step`: status "env_error", counted).

Every id of an episode is either sampled (loss mask 1, the sampler's log-prob kept) or appended
(loss mask 0, log-prob 0); the training sequence is exactly these ids (`episode_arrays`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Callable, Sequence

import jax
import numpy as np

from dapo_jax.agents.contain import run_contained
from dapo_jax.agents.engine import EngineState, TurnEngine
from dapo_jax.agents.env import AgentConfigError, Env, StepResult, Turn
from dapo_jax.agents.parse import parse_tool_calls
from dapo_jax.agents.render import DeltaRenderer

STATUSES = ("done", "max_turns", "budget", "context", "env_error")


@dataclasses.dataclass(frozen=True)
class AgentLimits:
    max_turns: int = 4  # model turns per episode
    max_episode_tokens: int = 256  # T: model and observation ids after the prompt
    max_tool_tokens: int = 64  # ids of one tool message's content
    truncation_side: str = "right"  # "right" keeps a long tool answer's head, "left" its tail
    step_timeout: float = 30.0  # seconds for one environment step (its tool calls included)

    def __post_init__(self):
        if self.max_turns < 1 or self.max_episode_tokens < 1 or self.max_tool_tokens < 1:
            raise ValueError(f"agent limits must be >= 1: {self}")
        if self.truncation_side not in ("left", "right"):
            raise ValueError(f"truncation_side={self.truncation_side!r}: expected 'left' or 'right'")
        if self.step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0 seconds, got {self.step_timeout}")


@dataclasses.dataclass
class Episode:
    """One episode: the prompt's ids and every later id, each sampled (`loss_mask` 1) or appended (0)."""

    messages: list[dict]  # the first messages (from reset)
    prompt_ids: list[int]
    ids: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[int] = dataclasses.field(default_factory=list)
    logp: list[float] = dataclasses.field(default_factory=list)  # the sampler's; 0 on appended ids
    entropy: list[float] = dataclasses.field(default_factory=list)
    turn_ends: list[int] = dataclasses.field(default_factory=list)  # index in `ids` of each turn's last model id
    turn_rewards: list[float] = dataclasses.field(default_factory=list)
    turns: list[tuple[list[int], list[dict]]] = dataclasses.field(default_factory=list)  # (model ids, observations)
    status: str = ""
    outcome: float | None = None  # env.reward() at the end, when the environment gives one
    metrics: Counter = dataclasses.field(default_factory=Counter)

    def add(self, ids: Sequence[int], *, model: bool, logp=None, entropy=None) -> None:
        n = len(ids)
        self.ids.extend(int(i) for i in ids)
        self.loss_mask.extend([int(model)] * n)
        self.logp.extend([0.0] * n if logp is None else (float(x) for x in logp))
        self.entropy.extend([0.0] * n if entropy is None else (float(x) for x in entropy))

    @property
    def model_tokens(self) -> int:
        return int(sum(self.loss_mask))


def _cut_content(content: str, limit: int, side: str, encode, decode) -> tuple[str, bool]:
    ids = encode(content)
    if len(ids) <= limit:
        return content, False
    kept = ids[:limit] if side == "right" else ids[-limit:]
    return decode(kept), True


def _prompt_arrays(prompts: list[list[int]], width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.full((len(prompts), width), pad_id, np.int32)
    mask = np.zeros((len(prompts), width), np.int32)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):], mask[r, width - len(p):] = p, 1
    return ids, mask


def run_episodes(
    engine: TurnEngine, state, rows: Sequence[dict], make_env: Callable[[], Env], renderer: DeltaRenderer,
    limits: AgentLimits, key: jax.Array, *, group_size: int, prompt_width: int,
) -> list[Episode]:
    """`len(rows) * group_size` episodes (row `r G + g`); see the module docstring."""
    g_size, t_max = group_size, limits.max_episode_tokens
    cfg = engine.config
    envs = [make_env() for _ in range(len(rows) * g_size)]
    tool_timeout = getattr(envs[0], "tool_timeout", None) if envs else None
    if tool_timeout is not None and tool_timeout >= limits.step_timeout:
        # the step's deadline would fire first: a slow tool would end the episode instead of answering
        raise AgentConfigError(f"agent: the environment's tool_timeout={tool_timeout:g} s must be under "
                               f"step_timeout={limits.step_timeout:g} s")
    resets = run_contained([(env.reset, (dict(rows[i // g_size]),), {}) for i, env in enumerate(envs)],
                           timeout=limits.step_timeout)
    episodes: list[Episode] = []
    for i, outcome in enumerate(resets):
        if outcome.status != "ok":
            raise AgentConfigError(f"agent.env: reset() of data row {i // g_size} failed: {outcome.error}")
        if i % g_size and outcome.value != episodes[i - i % g_size].messages:
            raise AgentConfigError(
                f"agent.env: reset() gave the {g_size} episodes of data row {i // g_size} different first messages; "
                "reset must depend on the row alone (seed any randomness from the row)")
        episodes.append(Episode(messages=outcome.value, prompt_ids=renderer.prompt(outcome.value)))
    for i, ep in enumerate(episodes):
        if len(ep.prompt_ids) > prompt_width:
            raise AgentConfigError(f"agent: data row {i // g_size}'s first messages are {len(ep.prompt_ids)} ids, "
                                   f"over the prompt width {prompt_width}")
    ids, mask = _prompt_arrays([ep.prompt_ids for ep in episodes], prompt_width, cfg.sampling.pad_token_id)
    b = len(episodes)
    es: EngineState = engine.prefill(state, ids, mask)
    active = np.ones(b, bool)
    eos_ids = set(cfg.sampling.eos_token_ids)

    def finish(r: int, status: str) -> None:
        episodes[r].status = status
        active[r] = False

    for turn_index in range(limits.max_turns):
        if not active.any():
            break
        used = np.array([len(ep.ids) for ep in episodes])
        budget = np.minimum(t_max - used, cfg.sampling.max_new_tokens).astype(np.int32)
        es, out = engine.decode(state, es, active, budget, jax.random.fold_in(key, turn_index))
        out = jax.device_get(out)
        stepping = []
        for r in np.flatnonzero(active):
            n, reason = int(out.count[r]), int(out.reason[r])
            if n == 0:  # the cache was already full: no turn at all (a turn's end must be a model id)
                finish(r, "context")
                continue
            toks = out.tokens[r, :n]
            ep = episodes[r]
            ep.add(toks, model=True, logp=out.logp[r, :n], entropy=out.entropy[r, :n])
            ep.turn_ends.append(len(ep.ids) - 1)
            ep.turn_rewards.append(0.0)
            ep.turns.append((toks.tolist(), []))
            if reason == 3:
                finish(r, "budget")
            elif reason == 4:
                finish(r, "context")
            else:
                text = renderer.decode(toks)
                parsed = parse_tool_calls(text)
                stepping.append((r, Turn(text, toks.tolist(), parsed.calls, parsed.errors,
                                         "eos" if reason == 1 else "tool_call")))
        results = run_contained([(envs[r].step, (turn,), {}) for r, turn in stepping],
                                timeout=limits.step_timeout)
        appends: dict[int, list[int]] = {}
        for (r, turn), outcome in zip(stepping, results):
            ep = episodes[r]
            result = outcome.value
            if outcome.status != "ok" or not isinstance(result, StepResult):
                ep.metrics[f"env_{outcome.status if outcome.status != 'ok' else 'bad_result'}"] += 1
                finish(r, "env_error")
                continue
            ep.turn_rewards[-1] = float(result.reward)
            ep.metrics.update({k: float(v) for k, v in result.metrics.items()})
            if result.done or not result.observations:
                finish(r, "done")
                continue
            if turn_index == limits.max_turns - 1:
                finish(r, "max_turns")
                continue
            observations = []
            for message in result.observations:
                content, cut = _cut_content(message["content"], limits.max_tool_tokens, limits.truncation_side,
                                            renderer.encode, renderer.decode)
                ep.metrics["tool_tokens_truncated"] += cut
                observations.append({**message, "content": content})
            ep.turns[-1] = (ep.turns[-1][0], observations)
            delta = renderer.delta(observations, after_eos=turn.stopped == "eos" and int(turn.token_ids[-1]) in eos_ids)
            if len(ep.ids) + len(delta) >= t_max:
                finish(r, "budget")
                continue
            if prompt_width + len(ep.ids) + len(delta) > cfg.cache_slots:  # the row's own slots: prompt + its ids
                finish(r, "context")
                continue
            appends[r] = delta
        width = cfg.append_width
        start = 0
        while appends and any(len(d) > start for d in appends.values()):
            chunk = np.full((b, width), cfg.sampling.pad_token_id, np.int32)
            n_new = np.zeros(b, np.int32)
            for r, delta in appends.items():
                part = delta[start:start + width]
                chunk[r, :len(part)], n_new[r] = part, len(part)
            es = engine.append(state, es, chunk, n_new)
            start += width
        for r, delta in appends.items():
            episodes[r].add(delta, model=False)
        active[:] = False
        for r in appends:
            active[r] = True
    for ep in episodes:
        if not ep.status:
            ep.status = "max_turns"
    rewards = run_contained([(env.reward, (), {}) for env in envs], timeout=limits.step_timeout)
    for ep, outcome in zip(episodes, rewards):
        if outcome.status == "ok" and outcome.value is not None:
            ep.outcome = float(outcome.value)
        elif outcome.status != "ok":
            ep.metrics[f"env_reward_{outcome.status}"] += 1
    return episodes
