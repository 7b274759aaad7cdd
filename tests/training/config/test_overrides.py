"""From a file and the command line to the tree a RunConfig validates: dotted keys set, relative paths in a
file anchored beside it, a built-in task's options dropped when a source is pointed at a file."""

import pytest

from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.overrides import anchor_paths, drop_stale_options, parse_overrides, set_dotted


def test_set_dotted_makes_the_missing_sections_and_refuses_to_descend_into_a_value():
    tree = {"rollout": {"G": 8}, "train": None}
    set_dotted(tree, "rollout.G", 4, "f.yaml")
    set_dotted(tree, "optim.lr", 1e-4, "f.yaml")
    set_dotted(tree, "train.wandb.project", "p", "f.yaml")  # a null section is a section
    assert tree == {"rollout": {"G": 4}, "optim": {"lr": 1e-4}, "train": {"wandb": {"project": "p"}}}
    with pytest.raises(ConfigError, match=r"^f.yaml: override 'rollout.G.x': rollout.G is not a section$"):
        set_dotted(tree, "rollout.G.x", 1, "f.yaml")


def test_parse_overrides_reads_values_as_yaml_and_an_empty_one_as_null():
    assert parse_overrides(["a=", " b = [1, x]", "objective=grpo", "objective.name=gspo"]) == [
        ("a", None), ("b", [1, "x"]), ("objective", {"name": "grpo"}), ("objective.name", "gspo")]
    with pytest.raises(ConfigError, match="must look like key.sub=value"):
        parse_overrides(["=3"])


def test_relative_paths_in_a_file_are_anchored_beside_it_when_they_exist_there(tmp_path):
    for rel in ("model", "data/train.jsonl", "rm", "my_rewards.py", "envs.py", "mix/a.jsonl"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("") if "." in rel else (tmp_path / rel).mkdir()
    tree = {"model": {"path": "model"},
            "data": {"train": {"name": "data/train.jsonl"}, "eval": {"name": "synthetic"},
                     "sources": {"a": {"train": {"name": "mix/a.jsonl"}}, "b": {"train": {"name": "cot"}}}},
            "reward": {"functions": [{"name": "reward_model", "path": "rm"}, {"name": "my_rewards.py:score"},
                                     {"name": "pkg.mod:fn"}, {"name": "integer", "path": "/abs/rm"}]},
            "agent": {"env": "envs.py:CalcEnv"}}
    anchor_paths(tree, tmp_path)
    beside = str(tmp_path.resolve())
    assert tree["model"]["path"] == f"{beside}/model"
    assert tree["data"]["train"]["name"] == f"{beside}/data/train.jsonl"
    assert tree["data"]["eval"]["name"] == "synthetic"  # a built-in task is not a path
    assert tree["data"]["sources"]["a"]["train"]["name"] == f"{beside}/mix/a.jsonl"
    assert tree["data"]["sources"]["b"]["train"]["name"] == "cot"
    fns = tree["reward"]["functions"]
    assert fns[0]["path"] == f"{beside}/rm" and fns[1]["name"] == f"{beside}/my_rewards.py:score"
    assert fns[2]["name"] == "pkg.mod:fn" and fns[3]["path"] == "/abs/rm"  # a module, an absolute path: as written
    assert tree["agent"]["env"] == f"{beside}/envs.py:CalcEnv"
    missing = {"model": {"path": "not_here"}}
    anchor_paths(missing, tmp_path)
    assert missing == {"model": {"path": "not_here"}}  # left to the working directory, then the repository


def test_a_source_pointed_at_a_file_drops_the_files_task_options_unless_they_are_overridden_too():
    tree = {"data": {"train": {"name": "x.jsonl", "options": {"max_operand": 9}},
                     "eval": {"name": "y.jsonl", "options": {"max_operand": 9}}}}
    drop_stale_options(tree, {"data.train.name", "data.eval.name", "data.eval.options"})
    assert tree == {"data": {"train": {"name": "x.jsonl"}, "eval": {"name": "y.jsonl", "options": {"max_operand": 9}}}}
    builtin = {"data": {"train": {"name": "cot", "options": {"a": 1}}}}
    drop_stale_options(builtin, {"data.train.name"})
    assert builtin == {"data": {"train": {"name": "cot", "options": {"a": 1}}}}  # a built-in task keeps its options
