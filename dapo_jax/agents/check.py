"""`python -m dapo_jax.agents.check ENV DATA.jsonl`: the agent pre-flight check alone, before any model loads.

    python -m dapo_jax.agents.check dapo_jax.agents.examples:CalcEnv rows.jsonl [--kwargs '{"k": 1}']

Imports `ENV` (`package.module:Name`), builds an instance, checks its tools' signatures, resets it
on the first row of `DATA.jsonl` and steps it once with an empty answer (`env.preflight`). Prints
`ok: ...` and exits 0, or prints one line naming what is wrong and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dapo_jax.agents.env import AgentConfigError, ToolEnv, load_env, preflight


def first_row(path: str) -> dict:
    """The first JSON object of a JSON-lines file; AgentConfigError (one line) otherwise."""
    file = Path(path)
    if not file.is_file():
        raise AgentConfigError(f"{path}: no such data file")
    with file.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise AgentConfigError(f"{path}:{number}: not JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise AgentConfigError(f"{path}:{number}: a row must be a JSON object, got {type(row).__name__}")
            return row
    raise AgentConfigError(f"{path}: no rows")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dapo_jax.agents.check", description=__doc__.splitlines()[0])
    parser.add_argument("env", help="package.module:Name of the environment")
    parser.add_argument("data", help="a JSON-lines file of rows")
    parser.add_argument("--kwargs", default="{}", help="JSON object of the environment's constructor arguments")
    args = parser.parse_args(argv)
    try:
        kwargs = json.loads(args.kwargs)
        if not isinstance(kwargs, dict):
            raise AgentConfigError(f"--kwargs must be a JSON object, got {type(kwargs).__name__}")
        env = preflight(load_env(args.env), first_row(args.data), kwargs=kwargs, path=args.env)
    except json.JSONDecodeError as exc:
        print(f"error: --kwargs is not JSON ({exc.msg})", file=sys.stderr)
        return 2
    except AgentConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tools = list(env.tool_table()) if isinstance(env, ToolEnv) else []
    print(f"ok: {args.env} ran one dry episode on the first row of {args.data}; tools: {', '.join(tools) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
