"""An embedded tool-use task: sums of two 5-digit numbers, with or without a `calc` tool.

    python scripts/agent_calc_task.py [--seeds 0 1 2] [--steps 30] [--out runs/agent_calc]
    python scripts/agent_calc_task.py --report-only --out results/agent_calc    # summary + figure again

Character-level, vocabulary of 18 ids. A prompt is `12345+67890=`. The model either answers at once
(`80235` then EOS), or calls the tool, `[12345+67890]` (the turn stops at `]`), reads the tool's
answer appended to its context (`80235`, no loss) and writes the answer. Without tools the same
call gets `?` back: same model, same budget, same turns, no help.

1. Warm-up (supervised, loss on model ids only): one fresh 2-layer model on correct transcripts, a
   fraction `--tool-demos` of them calling the tool, shared by every run. Short enough that it copies
   but adds five digits in its head poorly; sampled, it calls the tool on about that fraction.
2. RL (`agents.train.AgentTrainer`, DAPO's objective) from that model, once with the tool and once
   without, per seed (the seed draws the RL training rows, their order and the sampling).
   Every `--eval-every` steps: held-out accuracy and tool-call rate, greedy, on `--heldout` sums that
   no warm-up or training row repeats (one fixed set for every run).

Writes `results.json.gz` (every curve, the training steps' own metrics, timings, the summary with
Welch's test of the final held-out accuracies) and `agent_calc.png` into `--out`.
Status (2026-11-27): measured with `--warm-steps 600 --tool-demos 0.25`, 3 seeds per arm, at lr 1e-3 (the
default) and 3e-4 (better: 0.78 held-out accuracy with the tool against 0.38 without, Welch p = 1.4e-05);
the numbers and figures are in docs/agent_calc.md, the runs in
results/agent_calc/ and results/agent_calc_lr3e-4/.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import re
import subprocess
import sys
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from significance import welch  # noqa: E402  (scripts/significance.py, beside this script)

PAD, EOS = 0, 1
CHARS = "0123456789+=[]?"
VOCAB = {c: i + 2 for i, c in enumerate(CHARS)}
INVERSE = {i: c for c, i in VOCAB.items()}
STOP = VOCAB["]"]
DIGITS = 5
PROMPT_WIDTH = 2 * DIGITS + 2
EPISODE = 32  # model and tool ids after the prompt
WARM_WIDTH = (2 * DIGITS + 3) + 2 * (DIGITS + 1) + 1  # the longest transcript: call, result, answer, EOS
ARMS = ("tool", "no_tool")


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


def problems(n: int, seed: int, exclude: list[dict] = ()) -> list[dict]:
    """`n` random sums of two `DIGITS`-digit numbers, none of them a problem of `exclude`."""
    rng = np.random.default_rng(seed)
    lo, hi = 10 ** (DIGITS - 1), 10 ** DIGITS
    banned = {r["problem"] for r in exclude}
    rows = []
    while len(rows) < n:
        a, b = rng.integers(lo, hi, n), rng.integers(lo, hi, n)
        rows += [{"problem": f"{x}+{y}", "answer": str(x + y)} for x, y in zip(a, b) if f"{x}+{y}" not in banned]
    return rows[:n]


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


def warm_up(seed: int, steps: int, tool_demos: float, exclude: list[dict], batch: int = 128,
            lr: float = 3e-3) -> Decoder:
    """The supervised base: `steps` Adam steps of `batch` transcripts, a `tool_demos` fraction calling the tool."""
    model = Decoder(model_config(), rngs=nnx.Rngs(seed))
    graphdef, params = nnx.split(model)
    tx = optax.adamw(lr)
    opt = tx.init(params)
    rows = problems(steps * batch, seed + 1000, exclude)
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
        response = np.zeros((batch, WARM_WIDTH), np.int32)
        context = np.zeros((batch, WARM_WIDTH), np.int32)
        loss_mask = np.zeros((batch, WARM_WIDTH), np.float32)
        for i, row in enumerate(chunk):
            ids, mask = transcript(row, rng.random() < tool_demos)
            response[i, :len(ids)], context[i, :len(ids)], loss_mask[i, :len(ids)] = ids, 1, mask
        params, opt, loss = update(params, opt, prompt, response, context, loss_mask)
        if step % 200 == 0 or step == steps - 1:
            print(f"  warm-up step {step}: loss {float(loss):.3f}", flush=True)
    return nnx.merge(graphdef, params)


def load_or_warm_up(args, heldout: list[dict]) -> Decoder:
    """The base from `--out/base.npz` when a run with the same warm-up settings left it, else a fresh warm-up."""
    path = args.base or args.out / "base.npz"
    key = f"{args.warm_seed}/{args.warm_steps}/{args.tool_demos}/{args.heldout}"
    model = Decoder(model_config(), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    if path.exists():
        saved = np.load(path)
        if str(saved["key"]) == key:
            print(f"warm-up: the base from {path}", flush=True)
            return nnx.merge(graphdef, jax.tree.unflatten(treedef, [jnp.asarray(saved[f"p{i}"]) for i in range(len(leaves))]))
    base = warm_up(args.warm_seed, args.warm_steps, args.tool_demos, heldout)
    leaves = jax.tree.leaves(nnx.split(base)[1])
    np.savez(path, key=key, **{f"p{i}": np.asarray(x) for i, x in enumerate(leaves)})
    return base


def engine_config(greedy: bool) -> EngineConfig:
    sampling = SamplingConfig(max_new_tokens=EPISODE, temperature=1.0, greedy=greedy, eos_token_ids=(EOS,),
                              pad_token_id=PAD)
    return EngineConfig(sampling, cache_slots=PROMPT_WIDTH + 2 * EPISODE + 8, append_width=8,
                        stop_sequences=((STOP,),))


# DAPO's recipe; its soft overlong band is the last 8 of the episode's 32 ids, counted on model ids
OBJECTIVE = load_objective("dapo", max_response_length=EPISODE, overlong_buffer=8)
LIMITS = AgentLimits(max_turns=2, max_episode_tokens=EPISODE, max_tool_tokens=8, step_timeout=10.0)


def evaluate(engine: TurnEngine, params, env, rows, greedy: bool = True) -> dict:
    eps = run_episodes(engine, params, rows, env, RENDERER, LIMITS, jax.random.key(0), group_size=1,
                       prompt_width=PROMPT_WIDTH)
    _, correct = outcome_rewards(eps, rows, group_size=1)
    return evaluation_metrics(eps, correct)


def base_metrics(base: Decoder, heldout: list[dict]) -> dict:
    """The warmed-up model on the held-out set, greedy and sampled (temperature 1), with and without the tool."""
    graphdef, state = nnx.split(base)
    out = {}
    for mode, greedy in (("greedy", True), ("sampled", False)):
        engine = TurnEngine(graphdef, engine_config(greedy=greedy))
        for arm, env in zip(ARMS, (SumTask, NoToolTask)):
            out[f"{mode}_{arm}"] = evaluate(engine, state, env, heldout)
    return out


def run_arm(base: Decoder, env, seed: int, heldout: list[dict], args) -> dict:
    """One RL run from the base: its held-out curve and every training step's own metrics."""
    train_rows = problems(args.train_rows, 20_000 + seed, heldout)
    graphdef, state = nnx.split(base)
    model = nnx.merge(graphdef, jax.tree.map(jnp.copy, state))  # a copy: the update donates its state
    trainer = AgentTrainer(model, RENDERER, env, train_rows, objective=OBJECTIVE, group_size=args.group_size,
                           rows_per_step=args.rows_per_step, limits=LIMITS, engine=engine_config(greedy=False),
                           prompt_width=PROMPT_WIDTH, learning_rate=args.lr, seed=seed)
    evaluator = TurnEngine(trainer.graphdef, engine_config(greedy=True))
    curve, train = [], []
    t0, c0 = time.time(), time.process_time()
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            metrics = evaluate(evaluator, trainer.state.params, env, heldout)
            curve.append({"step": step, **metrics})
            print(f"seed {seed} {env.__name__} step {step}: held-out {metrics}", flush=True)
        if step < args.steps:
            m = trainer.step(step)
            calls = [ep.metrics.get("tool_calls", 0.0) > 0 for ep in trainer.episodes]
            train.append({"step": step, "accuracy": m["accuracy"], "tool_call_rate": float(np.mean(calls)),
                          "kept_groups": m["kept_groups"], "loss": m.get("loss")})
    return {"heldout": curve, "train": train, "wall_s": time.time() - t0, "cpu_s": time.process_time() - c0}


def summarize(results: dict) -> dict:
    """Final held-out accuracy and tool-call rate per arm (mean, sample sd, values) and Welch's p on accuracy."""
    out = {}
    for arm in ARMS:
        for key in ("accuracy", "tool_call_rate"):
            values = [results["runs"][s][arm]["heldout"][-1][key] for s in sorted(results["runs"])]
            out[f"{arm}_{key}"] = {"values": values, "mean": float(np.mean(values)),
                                   "sd": float(np.std(values, ddof=1)) if len(values) > 1 else None}
    out["welch_p_accuracy"] = welch(out["tool_accuracy"]["values"], out["no_tool_accuracy"]["values"])
    return out


def machine() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores visible"
    return platform.processor() or platform.machine()


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    seeds = sorted(results["runs"])
    for arm, color, label in (("tool", "tab:blue", "with calc"), ("no_tool", "tab:orange", "without (call gets ?)")):
        for ax, key in zip(axes, ("accuracy", "tool_call_rate")):
            steps = [p["step"] for p in results["runs"][seeds[0]][arm]["heldout"]]
            v = np.array([[p[key] for p in results["runs"][s][arm]["heldout"]] for s in seeds])
            ax.plot(steps, v.mean(0), color=color, marker="o", ms=3, label=f"{label}, held-out greedy")
            ax.fill_between(steps, v.min(0), v.max(0), color=color, alpha=0.2)
            if key == "tool_call_rate":
                t = np.array([[p[key] for p in results["runs"][s][arm]["train"]] for s in seeds])
                tsteps = [p["step"] for p in results["runs"][seeds[0]][arm]["train"]]
                ax.plot(tsteps, t.mean(0), color=color, ls=":", label=f"{label}, training episodes (sampled)")
    axes[0].set(xlabel="DAPO step", ylabel="held-out accuracy", ylim=(0, 1.02))
    axes[1].set(xlabel="DAPO step", ylabel="tool-call rate (episodes with a call)", ylim=(0, 1.02))
    axes[0].legend(fontsize=7, loc="center right")
    axes[1].legend(fontsize=7, loc="center right")
    m = results["meta"]
    commands = m["command"].replace(" ; ", "\n")
    fig.suptitle(f"mean over seeds {', '.join(seeds)} (band: min to max); {m['date']}, commit {m['commit']}, "
                 f"{m['machine']}\n{commands}", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def read_results(out: Path) -> dict:
    return json.loads(gzip.decompress((out / "results.json.gz").read_bytes()))


def write_results(results: dict, out: Path) -> None:
    # mtime 0: the same results give the same bytes
    (out / "results.json.gz").write_bytes(gzip.compress(json.dumps(results, indent=1).encode(), mtime=0))


def merge(parts: list[dict]) -> dict:
    """One experiment from processes that ran its seeds side by side on the same base: every run, each
    part's command, and the CPU seconds of the warm-up (once) and of every run."""
    results = {**parts[0], "runs": {}}
    results["meta"] = {**parts[0]["meta"], "command": " ; ".join(p["meta"]["command"] for p in parts),
                       "commit": ", ".join(dict.fromkeys(p["meta"]["commit"] for p in parts))}
    for part in parts:
        if part["base"] != parts[0]["base"]:
            raise ValueError("the parts' bases differ: merge runs of one warm-up only")
        results["runs"].update(part["runs"])
    results.pop("total", None)
    results["cpu_s"] = results["warm_up"]["cpu_s"] + sum(r[a]["cpu_s"] for r in results["runs"].values() for a in ARMS)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warm-steps", type=int, default=600)
    parser.add_argument("--warm-seed", type=int, default=0)
    parser.add_argument("--tool-demos", type=float, default=0.25)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--rows-per-step", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--train-rows", type=int, default=4096)
    parser.add_argument("--heldout", type=int, default=256)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("runs/agent_calc"))
    parser.add_argument("--base", type=Path, help="the warmed-up base's file (default --out/base.npz): made if absent")
    parser.add_argument("--report-only", action="store_true", help="the summary and figure from --out's results")
    parser.add_argument("--merge", type=Path, nargs="+", help="runs folders of the same experiment (one seed each, "
                        "run side by side) merged into --out")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        results = merge([read_results(folder) for folder in args.merge])
    elif args.report_only:
        results = read_results(args.out)
    else:
        command = "python scripts/agent_calc_task.py " + " ".join(sys.argv[1:])
        results = {"meta": {"command": command.strip(), "commit": commit(), "machine": machine(),
                            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")},
                   "args": {k: str(v) for k, v in vars(args).items()}, "runs": {}}
        heldout = problems(args.heldout, 10_000)
        t0, c0 = time.time(), time.process_time()
        base = load_or_warm_up(args, heldout)
        results["base"] = base_metrics(base, heldout)
        results["warm_up"] = {"wall_s": time.time() - t0, "cpu_s": time.process_time() - c0}
        print(f"warm-up: {results['warm_up']}, base: {results['base']}", flush=True)
        for seed in args.seeds:
            results["runs"][str(seed)] = {arm: run_arm(base, env, seed, heldout, args)
                                          for arm, env in zip(ARMS, (SumTask, NoToolTask))}
            write_results(results, args.out)
        results["total"] = {"wall_s": time.time() - t0, "cpu_s": time.process_time() - c0}
    results["summary"] = summarize(results)
    write_results(results, args.out)
    plot(results, args.out / "agent_calc.png")
    print(json.dumps(results["summary"], indent=1))
    print(f"wrote {args.out}/results.json.gz and agent_calc.png")


if __name__ == "__main__":
    main()
