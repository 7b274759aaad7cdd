"""Cache slots and decode steps of the multi-turn engine: one shared write index (the engine of
commit c0dacf7, read with `git show`) against a write index per row (today's `agents/engine.py`).

    PYTHONPATH=. python scripts/agent_slots.py [--turns 8] [--rows 8]

1. Same episodes: a random float32 decoder, an environment of 1-3 turns, 4 keys, an ample cache:
   both engines must give the same ids, masks and statuses (log-probs to float32 rounding).
2. Slots: row 0 takes `--turns` turns of 3 ids (the chain model, greedy) with one id appended
   between them; the other rows end on EOS after one turn of 6. For each engine, the statuses,
   decode steps and calls at the slot counts around what each needs, and the median wall time of
   5 episode batches (timings are the host's: they include the environments' contained steps).
3. Device time: one decode turn of 32 steps and 10 append calls of 4 ids, all 8 rows active, a cache
   of 160 slots, the random decoder; the engines alternate, median of 7.
Run from the repository root (it imports the tests' tiny decoders)."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from dapo_jax.agents import engine as engine_new, episodes as episodes_new
from dapo_jax.agents.env import Env, StepResult
from dapo_jax.agents.episodes import AgentLimits
from dapo_jax.sampling.config import SamplingConfig
from tests.agents.helpers import chain_decoder, id_renderer, random_decoder, text

OLD = "c0dacf7"


def old_modules():
    """The shared-index engine and its driver as modules `engine_old`, `episodes_old`."""
    root = Path(tempfile.mkdtemp())
    show = lambda path: subprocess.run(["git", "show", f"{OLD}:{path}"], check=True, capture_output=True,
                                       text=True).stdout
    (root / "engine_old.py").write_text(show("dapo_jax/agents/engine.py"))
    (root / "episodes_old.py").write_text(show("dapo_jax/agents/episodes.py").replace(
        "from dapo_jax.agents.engine import", "from engine_old import"))
    sys.path.insert(0, str(root))
    return importlib.import_module("engine_old"), importlib.import_module("episodes_old")


class Stochastic(Env):
    def reset(self, row):
        return [{"role": "user", "content": text(row["ids"])}]

    def step(self, turn):
        n = 1 + sum(turn.token_ids) % 3
        ids = [(7 + i + sum(turn.token_ids)) % 20 + 2 for i in range(n)]
        return StepResult([{"role": "tool", "content": text(ids)}],
                          reward=float(n), done=n == 3)


class Turns(Env):
    def reset(self, row):
        self.left = row["turns"]
        return [{"role": "user", "content": text(row["ids"])}]

    def step(self, turn):
        self.left -= 1
        return StepResult([{"role": "tool", "content": text([2])}], reward=0.0, done=self.left == 0)


def counted(engine):
    counts = {"steps": 0, "decode": 0, "append": 0}
    decode, append = engine.decode, engine.append

    def dec(*a):
        es, out = decode(*a)
        counts["steps"] += int(out.steps)
        counts["decode"] += 1
        return es, out

    def app(*a):
        counts["append"] += 1
        return append(*a)

    engine.decode, engine.append = dec, app
    return engine, counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--rows", type=int, default=8)
    args = parser.parse_args()
    engine_old, episodes_old = old_modules()
    both = (("shared index", engine_old, episodes_old), ("per-row index", engine_new, episodes_new))

    graphdef, state = nnx.split(random_decoder())
    sampling = SamplingConfig(max_new_tokens=12, temperature=1.0, eos_token_ids=(1,))
    rows = [{"ids": [6, 7, 8]}, {"ids": [9, 2]}, {"ids": [3]}]
    for seed in range(4):
        runs = [ep.run_episodes(mod.TurnEngine(graphdef, mod.EngineConfig(sampling, cache_slots=200, append_width=3,
                                                                         stop_sequences=((3,),))),
                                state, rows, Stochastic, id_renderer(), AgentLimits(max_turns=4, max_episode_tokens=40),
                                jax.random.key(seed), group_size=4, prompt_width=4) for _, mod, ep in both]
        same = all(a.ids == b.ids and a.loss_mask == b.loss_mask and a.status == b.status for a, b in zip(*runs))
        dlogp = max(float(np.max(np.abs(np.subtract(a.logp, b.logp)))) for a, b in zip(*runs))
        print(f"key {seed}: same ids, masks and statuses: {same}; max |logp difference| {dlogp:.2e}; "
              f"turns {sorted(len(e.turn_ends) for e in runs[0])}")

    graphdef, state = nnx.split(chain_decoder())
    sampling = SamplingConfig(max_new_tokens=16, eos_token_ids=(20,))
    rows = [{"ids": [1, 2], "turns": args.turns}] + [{"ids": [14], "turns": 1}] * (args.rows - 1)
    limits = AgentLimits(max_turns=args.turns + 1, max_episode_tokens=64)
    per_row = 4 + 3 + 4 * (args.turns - 1)  # prompt width + row 0's ids
    shared = 4 + 6 + (args.turns - 1) * (4 + 3)  # + each turn's longest row + one chunk of A=4 per append
    print(f"B={args.rows}, prompt width 4, append_width 4; row 0: {args.turns} turns of 3 ids, one id appended "
          f"between; rows 1..: one turn of 6 ids")
    for name, mod, ep in both:
        for slots in (per_row - 1, per_row, shared - 1, shared):
            config = mod.EngineConfig(sampling, cache_slots=slots, append_width=4, stop_sequences=((5,),))
            engine, counts = counted(mod.TurnEngine(graphdef, config))
            go = lambda: ep.run_episodes(engine, state, rows, Turns, id_renderer(), limits, jax.random.key(0),
                                         group_size=1, prompt_width=4)
            eps, times = go(), []
            for _ in range(5):
                counts.update(steps=0, decode=0, append=0)
                start = time.perf_counter()
                go()
                times.append(time.perf_counter() - start)
            print(f"{name}, cache_slots={slots}: row 0 {eps[0].status} after {len(eps[0].ids)} ids, others "
                  f"{sorted({e.status for e in eps[1:]})}; {counts['steps']} decode steps in {counts['decode']} calls, "
                  f"{counts['append']} append calls; median {np.median(times) * 1e3:.1f} ms per batch")

    graphdef, state = nnx.split(random_decoder())
    sampling = SamplingConfig(max_new_tokens=32, temperature=1.0, eos_token_ids=(99,))
    b, width, slots = 8, 4, 160
    ids, mask = np.full((b, width), 5, np.int32), np.ones((b, width), np.int32)
    engines = [mod.TurnEngine(graphdef, mod.EngineConfig(sampling, cache_slots=slots, append_width=4))
               for _, mod, _ in both]
    chunk, n_new = np.zeros((b, 4), np.int32), np.full(b, 4, np.int32)
    for engine in engines:  # compile
        es = engine.prefill(state, ids, mask)
        jax.block_until_ready(engine.decode(state, es, np.ones(b, bool), np.full(b, 32, np.int32), jax.random.key(0)))
        jax.block_until_ready(engine.append(state, es, chunk, n_new))
    times = [[] for _ in engines]
    for rep in range(7):
        for engine, out_times in zip(engines, times):
            es = engine.prefill(state, ids, mask)
            start = time.perf_counter()
            es, out = engine.decode(state, es, np.ones(b, bool), np.full(b, 32, np.int32), jax.random.key(rep))
            jax.block_until_ready(out)
            middle = time.perf_counter()
            for _ in range(10):
                es = engine.append(state, es, chunk, n_new)
            jax.block_until_ready(es)
            out_times.append(((middle - start) / int(out.steps), (time.perf_counter() - middle) / 10))
    for (name, _, _), out_times in zip(both, times):
        step, append = np.median(np.asarray(out_times), axis=0) * 1e3
        print(f"{name}: {step:.3f} ms per decode step, {append:.3f} ms per append call (B={b}, C={slots}, median of 7)")


if __name__ == "__main__":
    main()
