"""Every README snippet works as written: the ```python blocks run in order as one script (from a
directory where `dapo_jax/assets/tiny_base` resolves, with 2 virtual CPU devices for the mesh), and
every `dapo-jax ...` command line parses."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dapo_jax.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README, flags=re.S | re.M)


def command_lines() -> list[str]:
    """`dapo-jax ...` commands of the indented shell blocks, continuation lines joined."""
    lines, out, pending = README.splitlines(), [], ""
    for line in lines:
        if not line.startswith("    "):
            pending = ""
            continue
        text = pending + line.strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        if not re.match(r"([A-Z_]+=\S*\s+)*dapo-jax\b", text):
            continue
        words = shlex.split(text, comments=True)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # WANDB_MODE=offline dapo-jax ...
            words = words[1:]
        out.append(words[1:])
    return out


def test_readme_has_the_snippets_it_documents():
    blocks = python_blocks()
    assert len(blocks) >= 4 and any("make_mesh" in b for b in blocks)
    assert 'path = "dapo_jax/assets/tiny_base"' in "".join(blocks)
    subcommands = {words[0] for words in command_lines()}
    assert {"train", "eval", "show", "export", "plot"} <= subcommands


def test_readme_python_snippets_run_as_written(tmp_path):
    (tmp_path / "dapo_jax").symlink_to(REPO / "dapo_jax")  # `path` is relative to the checkout's root
    script = tmp_path / "readme_snippets.py"
    script.write_text("\n\n".join(python_blocks()))
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu",
           "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "out" / "tiny" / "generation_config.json").exists()


@pytest.mark.parametrize("words", command_lines(), ids=lambda w: " ".join(w)[:60])
def test_readme_commands_parse(words):
    build_parser().parse_args(words)
