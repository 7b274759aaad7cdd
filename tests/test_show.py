"""`dapo-jax show`: a run's logged rollouts, readable with and without rich; a missing step exits 2."""

import pytest

from dapo_jax.cli import main
from dapo_jax.show import show_rollouts
from dapo_jax.tables import have_rich


@pytest.mark.parametrize("plain", [True, False])
def test_show_prints_prompts_verdicts_and_responses(tiny_dapo_run, capsys, plain):
    if not plain and not have_rich():
        pytest.skip("rich is not installed")
    run_dir, _ = tiny_dapo_run
    assert show_rollouts(run_dir, groups=2, plain=plain) == 2
    out = capsys.readouterr().out
    assert "step 2, 2 of 6 logged groups" in out and "prompt: " in out and "advantage" in out
    assert "kept" in out or "dropped" in out


def test_show_cli_and_missing_step(tiny_dapo_run, capsys):
    run_dir, _ = tiny_dapo_run
    assert main(["show", str(run_dir), "1", "--plain", "--width", "2"]) == 0
    assert "step 1" in capsys.readouterr().out
    assert main(["show", str(run_dir), "7"]) == 2
    assert "logged steps: [1, 2]" in capsys.readouterr().err


def test_show_of_a_path_that_does_not_exist_says_so(tmp_path, capsys):
    missing = tmp_path / "no_such_run"
    assert main(["show", str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dapo-jax: ConfigError: show: {missing} does not exist: name a run directory (train.run_dir)"]
