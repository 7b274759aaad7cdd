"""The package as a user installs it: a wheel built from the checkout, installed into a fresh venv with
the runtime dependencies only (no test extra, so no torch and nothing it drags in), works from a
directory that is not the checkout: every module imports, the packaged recipes are found by name, a
chat template renders (jinja2 is a dependency of ours, not an accident of torch's), and
`dapo-jax train tiny_dapo train.steps=2` trains without transformers' "PyTorch was not found" line.

`uv` (the test extra) makes the fresh venv in seconds from its cache; without it pip does the same in
about three minutes."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

IN_VENV = r"""
import importlib, importlib.util, json, pkgutil, sys
import dapo_jax
from dapo_jax.data.templates import render_prompt
from dapo_jax.training.config.paths import PACKAGE_DIR
from dapo_jax.training.config.run import load_config
from transformers import AutoTokenizer

modules = [m.name for m in pkgutil.walk_packages(dapo_jax.__path__, "dapo_jax.")]
for name in modules:
    importlib.import_module(name)
tok = AutoTokenizer.from_pretrained(PACKAGE_DIR / "assets" / "tiny_base")
print(json.dumps({
    "package": dapo_jax.__file__, "modules": len(modules), "torch": importlib.util.find_spec("torch") is not None,
    "chat": render_prompt("12+7=", template="chat", tokenizer=tok, system="S:"),
    "objective": load_config("configs/cot_dapo.yaml").objective_config.name,
}))
"""


def _run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def _source_copy(dest: Path) -> Path:
    """The checkout's files that a clone has (tracked, or new and not ignored), so the wheel holds what a
    user's would and the build leaves nothing in the checkout."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: cannot tell which files a clone would have")
    for rel in filter(None, listed.stdout.split("\0")):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _fresh_venv(venv: Path, wheel: Path, env: dict) -> Path:
    python = venv / "bin" / "python"
    if importlib.util.find_spec("uv") is not None:
        uv = [sys.executable, "-m", "uv"]
        _run([*uv, "venv", "--quiet", "--python", sys.executable, str(venv)], env=env)
        _run([*uv, "pip", "install", "--quiet", "--python", str(python), str(wheel)], env=env, timeout=600)
    else:
        _run([sys.executable, "-m", "venv", str(venv)], env=env)
        _run([str(python), "-m", "pip", "install", "--quiet", str(wheel)], env=env, timeout=900)
    return python


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv_and_trains_from_anywhere(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    src = _source_copy(tmp_path / "src")
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp_path / "dist")]
    if importlib.util.find_spec("setuptools") is not None:
        build.append("--no-build-isolation")  # the installed setuptools: no download, no isolated env
    _run([*build, str(src)], env=env, cwd=tmp_path, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("dapo_jax-*.whl")
    venv = tmp_path / "venv"
    python = _fresh_venv(venv, wheel, env)

    elsewhere = tmp_path / "elsewhere"  # neither the checkout nor the wheel's folder
    elsewhere.mkdir()
    out = json.loads(_run([str(python), "-c", IN_VENV], cwd=elsewhere, env=env, timeout=300).stdout.splitlines()[-1])
    assert Path(out["package"]).is_relative_to(venv), out  # the installed copy, not the checkout
    assert not out["torch"], "the fresh venv has torch: it would hide a dependency that only torch brings"
    assert out["modules"] >= 80
    assert out["chat"] == "S:12+7="  # the tiny model's template joins the messages' contents
    assert out["objective"] == "dapo"

    train = _run([str(venv / "bin" / "dapo-jax"), "train", "tiny_dapo", "train.steps=2", "train.progress=false"],
                 cwd=elsewhere, env=env, timeout=600)
    final = json.loads(train.stdout.splitlines()[-1])
    assert final["step"] == 2 and 0.0 <= final["eval/accuracy"] <= 1.0
    assert (elsewhere / "runs" / "tiny_dapo" / "metrics.jsonl").exists()
    assert "PyTorch was not found" not in train.stderr
