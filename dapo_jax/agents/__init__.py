"""Agentic RL: multi-turn episodes that call tools and step environments (docs/agents.md).

    env.py       the episode interface (`Env`, `ToolEnv`), loading by import path, the pre-flight check
    tools.py     typed Python functions as tools: schema, argument checks, bounded results
    contain.py   running user code concurrently, with a deadline, never crashing or hanging the run
    parse.py     tool calls in the model's text (Hermes / Qwen2.5 format)
    render.py    observation ids as a delta of the chat template; the re-tokenization check
    engine.py    the device programs: prefill, decode a turn, append ids to the KV cache
    episodes.py  the host loop over turns
    batch.py     episodes as fixed-shape arrays with loss masks and turn rewards
    update.py    the update's Batch from episodes: advantages, shaping, dynamic sampling on model ids
    outcome.py   outcome rewards (the environment's, else a reward function) and evaluation metrics
    train.py     AgentTrainer: one training step on episodes, deterministic per step index
    check.py     `python -m dapo_jax.agents.check ENV DATA.jsonl`: the pre-flight check as a command
    show.py      an episode printed turn by turn
    examples.py  CalcEnv, a calculator environment to copy from
"""

from dapo_jax.agents.env import AgentConfigError, Env, StepResult, ToolEnv, Turn, load_env, preflight
from dapo_jax.agents.tools import Tool, ToolError

__all__ = ["AgentConfigError", "Env", "StepResult", "Tool", "ToolEnv", "ToolError", "Turn", "load_env", "preflight"]
