"""The CLI's entry point (dapo_jax/cli/__init__.py): config errors and other trainers' spellings are one line and
exit 2; transformers' no-torch banner is dropped and nothing else."""

import pytest

from dapo_jax.cli import main


def test_config_errors_exit_2_naming_the_key(tmp_path, capsys):
    assert main(["train", "tiny_dapo", "rollout.G=1", f"train.run_dir={tmp_path}"]) == 2
    assert "rollout.G" in capsys.readouterr().err
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_transformers_torch_banner_is_dropped_and_nothing_else():
    """The filter sits on the logger transformers' __init__ announces a missing torch on (the wheel test,
    tests/test_packaging.py, sees the whole command's stderr without torch)."""
    import logging

    from dapo_jax.cli import _NoTorchBanner

    (banner,) = [f for f in logging.getLogger("transformers").filters if isinstance(f, _NoTorchBanner)]

    def record(msg):
        return logging.LogRecord("transformers", logging.WARNING, __file__, 1, msg, None, None)

    assert not banner.filter(record("PyTorch was not found. Models won't be available and only tokenizers, "
                                    "configuration and file/data utilities can be used."))
    assert banner.filter(record("PyTorch was found lacking something else"))
    assert banner.filter(record("Special tokens have been added in the vocabulary"))


@pytest.mark.parametrize("argv, line", [
    (["train", "tiny_dapo", "rollout.num_generations=8"],
     "rollout.num_generations: unknown key (did you mean 'rollout.G'? 'num_generations' is what other trainers call it)"),
    (["train", "--config", "my.yaml"], "dapo-jax: ConfigError: --config: the config is the first argument, as a recipe "
                                       "name or a path: dapo-jax train CONFIG.yaml key.sub=value ..."),
    (["train", "tiny_dapo", "reward.functions=[{name: gsm8k}"], "dapo-jax: ConfigError: override "
     "'reward.functions=[{name: gsm8k}': the value is not valid YAML (line 1, column 15)"),
])
def test_other_trainers_spellings_and_yaml_slips_are_one_line_with_a_hint(argv, line, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dapo-jax: ConfigError: ") and line in err[0], err


def test_importing_the_main_module_runs_nothing():
    # tools that import every module (pkgutil.walk_packages in tests/test_packaging.py, API doc builders)
    # must not start the CLI: `python -m dapo_jax.cli` alone does
    import importlib
    import subprocess
    import sys

    importlib.import_module("dapo_jax.cli.__main__")  # raised SystemExit(2) before the guard
    out = subprocess.run([sys.executable, "-m", "dapo_jax.cli"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "required: command" in out.stderr
