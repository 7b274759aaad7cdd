"""The `dapo-jax` argument parser (dapo_jax/cli/parser.py): each sub-command runs its own function; `key=value`
words after the options join the config overrides, anything else left over is argparse's exit 2."""

import pytest

from dapo_jax.cli import commands, plan
from dapo_jax.cli.parser import build_parser


@pytest.mark.parametrize("argv, fn", [
    (["train"], commands.cmd_train), (["sft"], commands.cmd_sft), (["rft", "m", "--out", "f"], commands.cmd_rft),
    (["stages", "s.yaml"], commands.cmd_stages), (["eval", "r"], commands.cmd_eval),
    (["export", "c", "o"], commands.cmd_export), (["show", "r"], commands.cmd_show), (["plot", "r"], commands.cmd_plot),
    (["plan"], plan.cmd_plan),
])
def test_each_command_runs_its_function(argv, fn):
    ns = build_parser().parse_args(argv)
    assert ns.command == argv[0] and ns.fn is fn


def test_overrides_may_follow_options_and_other_leftovers_exit_2(capsys):
    ns = build_parser().parse_args(["plan", "tiny_dapo", "--topology", "v5p-64", "mesh.fsdp=32", "rollout.G=4"])
    assert ns.items == ["tiny_dapo", "mesh.fsdp=32", "rollout.G=4"] and ns.topology == "v5p-64"
    for argv, left in [(["plan", "tiny_dapo", "--topology", "v5p-64", "stray"], "stray"),
                       (["plan", "tiny_dapo", "--bogus=1"], "--bogus=1"),
                       (["export", "ckpt", "out", "a.b=1"], "a.b=1")]:  # export takes no overrides
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(argv)
        assert e.value.code == 2
        assert f"unrecognized arguments: {left}" in capsys.readouterr().err
