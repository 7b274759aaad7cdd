"""From a YAML file and command-line overrides to the tree a `RunConfig` validates.

    parse_overrides(["rollout.G=8", "objective=grpo"])   # [("rollout.G", 8), ("objective", {"name": "grpo"})]

Values are parsed as YAML; relative paths written in a config file are anchored beside that file; an
override that points a data source at a file drops the built-in task's options.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.paths import BUILT_IN_TASKS

_PATH_KEYS = (("model", "path"), ("data", "train", "name"), ("data", "eval", "name"))


def set_dotted(tree: dict, dotted: str, value: Any, source: str) -> None:
    """Sets `tree[a][b][c] = value` for `dotted` = "a.b.c", making the missing sections; `source` names the
    config file in the error when a key on the way is not a section."""
    keys = dotted.split(".")
    node = tree
    for i, k in enumerate(keys[:-1]):
        child = node.get(k)
        if child is None:
            child = node[k] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: override {dotted!r}: {'.'.join(keys[:i + 1])} is not a section")
        node = child
    node[keys[-1]] = value


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> list[tuple[str, Any]]:
    """`["a.b=3", "c=[1, 2]"]` -> [("a.b", 3), ("c", [1, 2])]; values parsed by `yaml.safe_load`.

    `objective=NAME` is the section `{name: NAME}`: that objective's recipe as shipped, the config file's
    objective keys dropped (they were tuned for the file's objective: DAPO's overlong punishment must not
    ride along into a GRPO run). `objective.name=NAME` keeps them, as overrides of NAME's recipe."""
    parsed = []
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as e:
            where = f" (line {e.problem_mark.line + 1}, column {e.problem_mark.column + 1})" if getattr(
                e, "problem_mark", None) else ""
            raise ConfigError(f"override {item!r}: the value is not valid YAML{where}: "
                              f"{getattr(e, 'problem', None) or e} (check its brackets and quotes)") from None
        if key.strip() == "objective" and isinstance(value, str):  # `objective=grpo`: the recipe by name
            value = {"name": value}
        parsed.append((key.strip(), value))
    return parsed


def anchor_paths(data: dict, config_dir: Path) -> None:
    """A relative model/data path written in a config file means a path beside that file when one
    exists there (made absolute, so the run dir's copy of the config still finds it); otherwise it
    stays as written and `resolve_path` looks in the working directory, then the repository root."""
    rewards = (data.get("reward") or {}).get("functions") if isinstance(data.get("reward"), dict) else None
    for f in rewards if isinstance(rewards, list) else []:  # a learned reward model's folder
        value = f.get("path") if isinstance(f, dict) else None
        if isinstance(value, str) and not Path(value).expanduser().is_absolute() and (config_dir / value).exists():
            f["path"] = str((config_dir / value).resolve())
        name = f.get("name") if isinstance(f, dict) else None  # a user reward's file: path/to/file.py:function
        file, _, attr = name.rpartition(":") if isinstance(name, str) and ".py:" in name else ("", "", "")
        if file and not Path(file).expanduser().is_absolute() and (config_dir / file).is_file():
            f["name"] = f"{(config_dir / file).resolve()}:{attr}"
    agent = data.get("agent") if isinstance(data.get("agent"), dict) else {}
    env = agent.get("env")  # an environment's file: path/to/file.py:Name
    file, _, attr = env.rpartition(":") if isinstance(env, str) and ".py:" in env else ("", "", "")
    if file and not Path(file).expanduser().is_absolute() and (config_dir / file).is_file():
        agent["env"] = f"{(config_dir / file).resolve()}:{attr}"
    sources = (data.get("data") or {}).get("sources") if isinstance(data.get("data"), dict) else None
    for name in sources if isinstance(sources, dict) else []:  # a mixture's files (data.sources.NAME.train.name)
        node = sources[name].get("train") if isinstance(sources[name], dict) else None
        value = node.get("name") if isinstance(node, dict) else None
        if isinstance(value, str) and value not in BUILT_IN_TASKS and not Path(value).expanduser().is_absolute() \
                and (config_dir / value).exists():
            node["name"] = str((config_dir / value).resolve())
    for keys in _PATH_KEYS:
        node = data
        for k in keys[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        value = node.get(keys[-1]) if isinstance(node, dict) else None
        if not isinstance(value, str) or value in BUILT_IN_TASKS or Path(value).expanduser().is_absolute():
            continue
        beside = config_dir / value
        if beside.exists():
            node[keys[-1]] = str(beside.resolve())


def drop_stale_options(data: dict, overridden: set[str]) -> None:
    """An override that points `data.X.name` at a file drops the config file's `data.X.options`
    (they belong to the built-in task it replaces), unless the options are overridden too."""
    for src in ("train", "eval"):
        node = (data.get("data") or {}).get(src)
        if (f"data.{src}.name" in overridden and f"data.{src}.options" not in overridden
                and isinstance(node, dict) and node.get("name") not in BUILT_IN_TASKS):
            node.pop("options", None)
