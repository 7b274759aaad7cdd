"""Where a run's files are: the packaged recipes, and the relative paths a config names.

    find_config("tiny_dapo")          # dapo_jax/configs/tiny_dapo.yaml, from any directory and any install
    resolve_path("dapo_jax/assets/tiny_base")   # as given if it exists, else beside the installed package
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2]
# The folder holding the package: the checkout in a clone or an editable install, site-packages in a
# wheel install. Relative paths the packaged recipes name (`dapo_jax/assets/tiny_base`) resolve there.
REPO_ROOT = PACKAGE_DIR.parent
CONFIG_DIR = PACKAGE_DIR / "configs"  # the recipes ship inside the package, so any install finds them
DEFAULT_CONFIG = CONFIG_DIR / "tiny_dapo.yaml"
BUILT_IN_TASKS = ("synthetic", "cot", "countdown")  # data sources generated in code; `options` are theirs alone


def recipes() -> list[str]:
    """The packaged run recipes (`dapo_jax/configs/*.yaml`) by name, sorted."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def find_config(name_or_path: str | Path) -> Path:
    """Where a run config is: an existing file (or run dir) as given; else a packaged recipe, named
    (`tiny_dapo`) or by the checkout path it used to have (`configs/tiny_dapo.yaml`), so the commands of
    older docs and scripts work from any directory and any install."""
    path = Path(name_or_path).expanduser()
    if path.exists() or path.is_absolute():
        return path
    parts = path.parts[1:] if path.parts[:1] == ("configs",) else path.parts
    if parts:
        rel = Path(*parts)
        for candidate in (CONFIG_DIR / rel, CONFIG_DIR / f"{rel}.yaml"):
            if candidate.is_file():
                return candidate
    return path


def resolve_path(path: str | Path) -> Path:
    """A path as given if it exists (or is absolute), else relative to the repository root."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    candidate = REPO_ROOT / p
    return candidate if candidate.exists() else p
