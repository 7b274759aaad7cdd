"""An embedded tool-use task: sums of two 5-digit numbers, with or without a `calc` tool.

    python scripts/agent_calc_task.py [--seeds 0 1 2] [--steps 30] [--out runs/agent_calc]

Character-level, vocabulary of 18 ids. A prompt is `12345+67890=`. The model either answers at once
(`80235` then EOS), or calls the tool, `[12345+67890]` (the turn stops at `]`), reads the tool's
answer appended to its context (`80235`, no loss) and writes the answer. Without tools the same
call gets `?` back: same budget, same turns, no help.

1. Warm-up (supervised, loss on model ids only): a fresh 2-layer model on correct transcripts, a
   fraction `--tool-demos` of them calling the tool. The intent: a model that copies, calls the tool
   sometimes, and cannot add five digits in its head.
2. RL (`agents.train.AgentTrainer`, DAPO's objective) from that model, once with the tool and once
   without, per seed; held-out accuracy and tool-call rate (greedy, 128 problems) every few steps.

Writes `results.json` (every curve) and `agent_calc.png` into `--out`. Status (2026-11-27): run end to
end at smoke scale only (60 warm-up steps, 2 RL steps, one seed); the warm-up length and the task's
difficulty are not tuned, and no result of it is reported (docs/agents.md, "Not done yet").
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dapo_jax.agents.engine import EngineConfig, TurnEngine
from dapo_jax.agents.env import Env, StepResult
from dapo_jax.agents.episodes import AgentLimits, run_episodes
from dapo_jax.agents.examples import calc
from dapo_jax.agents.outcome import evaluation_metrics, outcome_rewards
from dapo_jax.agents.render import DeltaRenderer
from dapo_jax.agents.tools import Tool, call_tools
from dapo_jax.agents.train import AgentTrainer
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder
from dapo_jax.models.logprobs import response_logprobs
from dapo_jax.objectives.registry import load_objective
from dapo_jax.sampling.config import SamplingConfig

PAD, EOS = 0, 1
CHARS = "0123456789+=[]?"
VOCAB = {c: i + 2 for i, c in enumerate(CHARS)}
INVERSE = {i: c for c, i in VOCAB.items()}
STOP = VOCAB["]"]
DIGITS = 5
PROMPT_WIDTH = 2 * DIGITS + 2
EPISODE = 32  # model and tool ids after the prompt


def encode(text: str) -> list[int]:
    return [VOCAB.get(c, VOCAB["?"]) for c in text]


def decode(ids) -> str:
    return "".join(INVERSE.get(int(i), "") for i in ids)


RENDERER = DeltaRenderer(lambda messages, gen: "".join(m["content"] for m in messages), encode, decode)
CALC = Tool.from_function(calc)


class SumTask(Env):
    """One sum; a turn that ends with `]` is a call of `calc` on what follows its last `[`."""

    use_tool = True

    def reset(self, row):
        self.answer, self.final = row["answer"], ""
        return [{"role": "user", "content": row["problem"] + "="}]

    def step(self, turn):
        if turn.stopped == "eos":
            self.final = turn.text
            return StepResult([], done=True)
        expression = turn.text.rsplit("[", 1)[-1].rstrip("]")
        answer = "?"
        if self.use_tool:
            result = call_tools([(CALC, {"expression": expression})], timeout=2.0, max_chars=16)[0]
            answer = result.text if result.status == "ok" else "?"
        return StepResult([{"role": "tool", "content": answer}], metrics={"tool_calls": 1.0})

    def reward(self):
        return float(re.fullmatch(r"\d+", self.final or "x") is not None and self.final == self.answer)


class NoToolTask(SumTask):
    use_tool = False


def problems(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    lo, hi = 10 ** (DIGITS - 1), 10 ** DIGITS
    a, b = rng.integers(lo, hi, n), rng.integers(lo, hi, n)
    return [{"problem": f"{x}+{y}", "answer": str(x + y)} for x, y in zip(a, b)]


def model_config() -> ModelConfig:
    return ModelConfig(model_type="qwen2", vocab_size=len(CHARS) + 2, hidden_size=64, intermediate_size=192,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       attention_bias=True, tie_word_embeddings=True, max_position_embeddings=64)


def transcript(row: dict, tool: bool) -> tuple[list[int], list[int]]:
    """The episode ids after the prompt and their loss mask, as the sampler would produce them."""
    if not tool:
        ids = encode(row["answer"]) + [EOS]
        return ids, [1] * len(ids)
    call, result, final = encode(f"[{row['problem']}]"), encode(row["answer"]), encode(row["answer"]) + [EOS]
    return call + result + final, [1] * len(call) + [0] * len(result) + [1] * len(final)


def warm_up(seed: int, steps: int, tool_demos: float, batch: int = 128) -> Decoder:
    model = Decoder(model_config(), rngs=nnx.Rngs(seed))
    graphdef, params = nnx.split(model)
    tx = optax.adamw(3e-3)
    opt = tx.init(params)
    rows = problems(steps * batch, seed + 1000)
    rng = np.random.default_rng(seed)

    def loss_fn(params, prompt, response, context, loss_mask):
        m = nnx.merge(graphdef, params)
        logp, _ = response_logprobs(m, prompt, jnp.ones_like(prompt), response, context)
        return -jnp.sum(logp * loss_mask) / jnp.sum(loss_mask)

    @jax.jit
    def update(params, opt, *arrays):
        loss, grads = jax.value_and_grad(loss_fn)(params, *arrays)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    for step in range(steps):
        chunk = rows[step * batch:(step + 1) * batch]
        prompt = np.array([encode(r["problem"] + "=") for r in chunk], np.int32)
        response = np.zeros((batch, EPISODE), np.int32)
        context = np.zeros((batch, EPISODE), np.int32)
        loss_mask = np.zeros((batch, EPISODE), np.float32)
        for i, row in enumerate(chunk):
            ids, mask = transcript(row, rng.random() < tool_demos)
            response[i, :len(ids)], context[i, :len(ids)], loss_mask[i, :len(ids)] = ids, 1, mask
        params, opt, loss = update(params, opt, prompt, response, context, loss_mask)
        if step % 200 == 0:
            print(f"  warm-up step {step}: loss {float(loss):.3f}", flush=True)
    return nnx.merge(graphdef, params)


def engine_config(greedy: bool) -> EngineConfig:
    sampling = SamplingConfig(max_new_tokens=EPISODE, temperature=1.0, greedy=greedy, eos_token_ids=(EOS,),
                              pad_token_id=PAD)
    return EngineConfig(sampling, cache_slots=PROMPT_WIDTH + 2 * EPISODE + 8, append_width=8,
                        stop_sequences=((STOP,),))


# DAPO's recipe; its soft overlong band is the last 8 of the episode's 32 ids, counted on model ids
OBJECTIVE = load_objective("dapo", max_response_length=EPISODE, overlong_buffer=8)
LIMITS = AgentLimits(max_turns=2, max_episode_tokens=EPISODE, max_tool_tokens=8, step_timeout=10.0)


def evaluate(engine: TurnEngine, params, env, rows) -> dict:
    eps = run_episodes(engine, params, rows, env, RENDERER, LIMITS, jax.random.key(0), group_size=1,
                       prompt_width=PROMPT_WIDTH)
    _, correct = outcome_rewards(eps, rows, group_size=1)
    return evaluation_metrics(eps, correct)


def run(seed: int, steps: int, warm_steps: int, tool_demos: float, eval_every: int) -> dict:
    t0 = time.time()
    base = warm_up(seed, warm_steps, tool_demos)
    print(f"seed {seed}: warm-up done in {time.time() - t0:.0f} s", flush=True)
    heldout = problems(128, 10_000 + seed)
    train_rows = problems(4096, 20_000 + seed)
    curves = {}
    for name, env in (("tool", SumTask), ("no_tool", NoToolTask)):
        graphdef, state = nnx.split(base)
        model = nnx.merge(graphdef, jax.tree.map(jnp.copy, state))  # the same warmed-up weights for both (copied:
        # the update donates its state)
        trainer = AgentTrainer(model, RENDERER, env, train_rows, objective=OBJECTIVE, group_size=8,
                               rows_per_step=16, limits=LIMITS, engine=engine_config(greedy=False),
                               prompt_width=PROMPT_WIDTH, learning_rate=1e-3, seed=seed)
        evaluator = TurnEngine(trainer.graphdef, engine_config(greedy=True))
        curve = []
        for step in range(steps + 1):
            if step % eval_every == 0:
                metrics = evaluate(evaluator, trainer.state.params, env, heldout)
                curve.append({"step": step, **metrics})
                print(f"seed {seed} {name} step {step}: {metrics}", flush=True)
            if step < steps:
                trainer.step(step)
        curves[name] = curve
    return curves


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, color in (("tool", "tab:blue"), ("no_tool", "tab:orange")):
        for seed, curves in results["seeds"].items():
            c = curves[name]
            steps = [p["step"] for p in c]
            axes[0].plot(steps, [p["accuracy"] for p in c], color=color, alpha=0.8,
                         label=f"{name}" if seed == next(iter(results["seeds"])) else None)
            axes[1].plot(steps, [p["tool_call_rate"] for p in c], color=color, alpha=0.8)
    axes[0].set(xlabel="DAPO step", ylabel="held-out accuracy (greedy)", ylim=(0, 1))
    axes[1].set(xlabel="DAPO step", ylabel="tool-call rate (greedy)", ylim=(0, 1))
    axes[0].legend()
    fig.suptitle(results["caption"], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warm-steps", type=int, default=1500)
    parser.add_argument("--tool-demos", type=float, default=0.2)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("runs/agent_calc"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"args": {k: str(v) for k, v in vars(args).items()}, "seeds": {}}
    for seed in args.seeds:
        results["seeds"][str(seed)] = run(seed, args.steps, args.warm_steps, args.tool_demos, args.eval_every)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    results["caption"] = f"scripts/agent_calc_task.py {' '.join(f'--{k} {v}' for k, v in results['args'].items())}"
    plot(results, args.out / "agent_calc.png")
    print(f"wrote {args.out}/results.json and agent_calc.png")


if __name__ == "__main__":
    main()
