"""The run dir: a lock that names its holder, and resumes only with the same trajectory config."""

import pytest

from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import load_config
from dapo_jax.training.state.run_dir import RunDir


def cfg(run_dir, *extra):
    return load_config(None, [f"train.run_dir={run_dir}", *extra])


def test_lock_is_exclusive_and_released(tmp_path):
    first = RunDir(cfg(tmp_path / "r")).__enter__()
    holder = (tmp_path / "r" / ".lock.holder").read_text()
    assert holder.startswith("pid ")
    # A second lock object on the same path: refused at once, naming the holder.
    with pytest.raises(ConfigError, match="in use by pid"):
        RunDir(cfg(tmp_path / "r")).__enter__()
    first.__exit__(None, None, None)
    with RunDir(cfg(tmp_path / "r")):
        pass


def test_run_dir_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        RunDir(cfg(tmp_path / "f"))


def test_config_changes_that_alter_the_trajectory_are_refused(tmp_path):
    rd = RunDir(cfg(tmp_path / "r"))
    rd.save_config()
    RunDir(cfg(tmp_path / "r", "train.steps=5000", "train.fresh_start=true")).check_same_config()
    with pytest.raises(ConfigError, match=r"optim.lr: 0.0003 -> 0.1"):
        RunDir(cfg(tmp_path / "r", "optim.lr=0.1")).check_same_config()


def test_a_run_saved_before_a_field_existed_resumes_while_the_field_keeps_its_default(tmp_path):
    """A config.yaml written by an older version lacks the fields added since (e.g. objective.nll_coef,
    rollout.sampler_dtype): at their defaults the run is the same run; set otherwise, it is not."""
    import yaml

    run = tmp_path / "r"
    RunDir(cfg(run)).save_config()
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["objective"].pop("nll_coef")
    saved["objective"].pop("high_entropy_quantile")
    saved["optim"].pop("lr")
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(ConfigError, match="optim.lr"):  # tiny_dapo sets 3e-4: not the default 1e-6
        RunDir(cfg(run)).check_same_config()
    saved["optim"]["lr"] = load_config(None).optim.lr
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    RunDir(cfg(run)).check_same_config()  # nll_coef 0 and no high-entropy mask: the defaults
    with pytest.raises(ConfigError, match="objective.high_entropy_quantile: None -> 0.2"):
        RunDir(cfg(run, "objective.high_entropy_quantile=0.2")).check_same_config()


def test_a_field_added_to_an_optional_section_keeps_its_default_on_resume(tmp_path):
    """`critic` may be absent (`CriticSection | None`); a run saved before `critic.epochs` existed resumes."""
    import yaml

    run = tmp_path / "r"
    RunDir(cfg(run, "critic.lr=1e-4")).save_config()
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["critic"].pop("epochs")
    saved["optim"].pop("epochs")
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    RunDir(cfg(run, "critic.lr=1e-4")).check_same_config()
    with pytest.raises(ConfigError, match="optim.epochs: None -> 2"):
        RunDir(cfg(run, "critic.lr=1e-4", "optim.epochs=2")).check_same_config()


def test_recompute_old_logp_false_saved_by_an_older_version_equals_unset_when_it_resolves_to_false(tmp_path):
    import yaml

    run = tmp_path / "r"
    RunDir(cfg(run)).save_config()
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["rollout"]["recompute_old_logp"] is None  # unset: follow the precision
    saved["rollout"]["recompute_old_logp"] = False  # what the older version saved
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    RunDir(cfg(run)).check_same_config()  # same dtypes, no correction: resolves to False
    with pytest.raises(ConfigError, match="recompute_old_logp"):  # a bfloat16 sampler would recompute
        RunDir(cfg(run, "rollout.sampler_dtype=bfloat16")).check_same_config()


def test_a_new_round_may_change_the_data_and_the_reward_only_when_asked(tmp_path):
    import json

    run = tmp_path / "r"
    RunDir(cfg(run)).save_config()
    change = ["data.train.options={max_operand: 9, heldout_size: 20}", "reward.functions=[{name: integer}]"]
    with pytest.raises(ConfigError, match=r"different config \(data.train.options.*set data.new_round=true$"):
        RunDir(cfg(run, *change)).check_same_config()
    plain = RunDir(cfg(run, "data.new_round=true"))  # nothing changed: a plain resume, the flag does nothing
    plain.check_same_config()
    assert plain.round_changes is None
    with pytest.raises(ConfigError, match=r"other keys changed too \(optim.lr: 0.0003 -> 0.1\)"):
        RunDir(cfg(run, *change, "data.new_round=true", "optim.lr=0.1")).check_same_config()
    new = RunDir(cfg(run, *change, "data.new_round=true"))
    new.check_same_config()
    assert new.round_changes["data.train.options.max_operand"] == (99, 9)
    assert new.round_changes["reward.functions"][1] == [{"name": "integer", "weight": 1.0, "options": {}, "path": None}]
    new.record_round(step=40, data_round=1)
    row = json.loads((run / "rounds.jsonl").read_text())
    assert row["round"] == 1 and row["after_step"] == 40 and row["changed"]["data.train.options.heldout_size"] == [400, 20]
    assert (run / "config.round-0.yaml").read_text() == (run / "config.yaml").read_text()
