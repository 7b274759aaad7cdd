"""Agentic RL: multi-turn episodes that call tools and step environments (docs/agents.md).

    env.py       the episode interface (`Env`, `ToolEnv`), loading by import path, the pre-flight check
    tools.py     typed Python functions as tools: schema, argument checks, bounded results
    contain.py   running user code concurrently, with a deadline, never crashing or hanging the run
    parse.py     tool calls in the model's text (Hermes / Qwen2.5 format)
    render.py    observation ids as a delta of the chat template; the re-tokenization check
    engine.py    the device programs: prefill, decode a turn, append ids to the KV cache
    episodes.py  the host loop over turns
    batch.py     episodes as fixed-shape arrays with loss masks and turn rewards
"""

from dapo_jax.agents.env import AgentConfigError, Env, StepResult, ToolEnv, Turn, load_env, preflight
from dapo_jax.agents.tools import Tool, ToolError

__all__ = ["AgentConfigError", "Env", "StepResult", "Tool", "ToolEnv", "ToolError", "Turn", "load_env", "preflight"]
