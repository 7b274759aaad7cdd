"""Rewards that cannot score, met as users meet them (issue 47 item 3) and user rewards in a real run
(issue 42 item 1): failures and unreadable ground truths counted per function in metrics.jsonl, a reward
that never reads a ground truth or never scores a row stopped with exit 2 naming it, a learned reward
that scores inf stopped naming it, a NaN reward option refused, and stdout's JSON strict."""

import json
from pathlib import Path

import pytest

from dapo_jax.cli import main
from dapo_jax.cli.commands import json_line
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import load_config
from dapo_jax.training.metrics import read_metrics

USER = Path(__file__).resolve().parents[1] / "rewards" / "user_rewards.py"


def train_rc(overrides, capsys):
    """`dapo-jax train` in-process: (exit code, the last `dapo-jax:` line of stderr, stdout, stderr)."""
    capsys.readouterr()
    rc = main(["train", "tiny_dapo", *overrides])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("dapo-jax:")]
    return rc, (lines[-1] if lines else ""), out, err


def write_rows(path: Path, n: int = 24, *, unreadable_every: int | None = 3, all_unreadable: bool = False) -> Path:
    """`{question, answer, level}` rows; every `unreadable_every`-th answer (from row 1) is "n/a"."""
    rows = []
    for i in range(n):
        a, b = i % 7, (2 * i) % 5
        bad = all_unreadable or (unreadable_every is not None and i % unreadable_every == 1)
        rows.append({"question": f"{a}+{b}=", "answer": "n/a" if bad else str(a + b), "level": i % 3})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def overrides(overrides_for, model_dir, run_dir, data, rewards: str, **extra):
    return overrides_for(model_dir, run_dir, **{
        "data.train": f"{{name: {data}, format: custom, prompt_field: question, answer_field: answer}}",
        "data.eval": "null", "reward.functions": rewards, **extra})


def test_a_user_reward_trains_and_every_unscorable_row_is_counted(tiny_model_dir, tmp_path, overrides_for, capsys):
    data = write_rows(tmp_path / "rows.jsonl")
    rewards = f"[{{name: integer}}, {{name: '{USER}:fails_on_level_2', weight: 0.5}}]"
    with pytest.warns(RuntimeWarning, match=r"data.train: 8 of 24 ground truths cannot be read by reward 'integer' "
                                            r"\(first: row 1, 'n/a'\)"):
        rc, err, out, stderr = train_rc(overrides(overrides_for, tiny_model_dir, tmp_path / "run", data, rewards),
                                        capsys)
    assert rc == 0, err
    rows = [r for r in read_metrics(tmp_path / "run") if "grad_norm" in r or "reward_mean" in r]
    assert len(rows) == 2
    name = "user_rewards.py:fails_on_level_2"
    for r in rows:
        assert r["reward_failures/integer"] == 0
        # rows 1, 4, 7, ... are "n/a" (1 in 3) and rows 2, 5, 8, ... have level 2 (1 in 3): never all, never none
        assert 0 < r["reward_unreadable/integer"] < r["reward_unreadable/integer"] + r[f"reward_failures/{name}"]
        assert r[f"reward_failures/{name}"] > 0 and "reward_unreadable/" + name not in r
    # the first failure's traceback, once for the whole run
    assert stderr.count(f"reward '{name}' failed on row") == 1 and "ValueError: level 2 is not supported" in stderr
    json.loads(out.strip().splitlines()[-1])  # stdout's summary is strict JSON


def test_a_reward_that_reads_no_ground_truth_stops_before_the_model(tiny_model_dir, tmp_path, overrides_for, capsys):
    data = write_rows(tmp_path / "rows.jsonl", all_unreadable=True)
    rc, err, _, _ = train_rc(overrides(overrides_for, tiny_model_dir, tmp_path / "run", data, "[{name: integer}]"),
                             capsys)
    assert rc == 2 and "reward.functions.0 ('integer') cannot read any of the 24 ground truths" in err
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_a_user_reward_that_cannot_be_called_stops_before_the_model(tiny_model_dir, tmp_path, overrides_for, capsys):
    data = write_rows(tmp_path / "rows.jsonl", unreadable_every=None)
    for rewards, says in ((f"[{{name: '{USER}:always_raises'}}]", "a dry call failed: KeyError: 'missing_column'"),
                          ("[{name: 'no_such_module_q:fn'}]", "no module 'no_such_module_q'"),
                          (f"[{{name: '{USER}:unclear'}}]", "cannot tell the form of unclear(a, b)")):
        rc, err, _, _ = train_rc(overrides(overrides_for, tiny_model_dir, tmp_path / "run", data, rewards), capsys)
        assert rc == 2 and "reward.functions.0" in err and says in err, err
        assert not (tmp_path / "run" / "config.yaml").exists()


def test_a_reward_that_scores_no_row_of_the_run_stops_naming_it(tiny_model_dir, tmp_path, overrides_for, capsys):
    data = write_rows(tmp_path / "rows.jsonl", unreadable_every=None)
    rewards = f"[{{name: '{USER}:fails_after_first_call'}}]"  # passes the dry call, then the verifier is gone
    rc, err, _, stderr = train_rc(overrides(overrides_for, tiny_model_dir, tmp_path / "run", data, rewards), capsys)
    assert rc == 2, stderr
    assert "reward.functions.0 ('user_rewards.py:fails_after_first_call') has not scored a single row" in err
    assert "ConnectionError: the verifier went away" in stderr  # the first failure's traceback


def test_a_learned_reward_scoring_inf_stops_naming_it(tiny_model_dir, tmp_path, overrides_for, capsys):
    import torch
    import transformers

    from tests.rewards.conftest import make_rm

    rm = make_rm(tmp_path / "rm", "sequence")
    model = transformers.Qwen2ForSequenceClassification.from_pretrained(rm)
    with torch.no_grad():
        model.score.weight.fill_(3e38)  # finite weights whose scores overflow float32
    model.save_pretrained(rm)
    rc, err, _, _ = train_rc(overrides_for(tiny_model_dir, tmp_path / "run", **{
        "reward.functions": f"[{{name: reward_model, path: '{rm}'}}, {{name: synthetic, weight: 0.0}}]"}), capsys)
    assert rc == 2 and "reward 'reward_model' scored" in err and "not finite" in err, err


@pytest.mark.parametrize("option", ["{bonus: .nan}", "{bonus: .inf}", "{nested: {deep: [1.0, -.inf]}}"])
def test_a_non_finite_reward_option_is_refused_by_the_config(option):
    key = r"reward\.functions\.1\.options\.(bonus|nested\.deep\.1)"
    with pytest.raises(ConfigError, match=key + ".*not a finite number"):
        load_config(None, [f"reward.functions=[{{name: synthetic}}, {{name: format, options: {option}}}]"])
    with pytest.raises(ConfigError, match=r"reward\.functions\.0\.weight"):
        load_config(None, ["reward.functions=[{name: synthetic, weight: .nan}]"])
    for key, value in (("objective.reward_correct", ".nan"), ("objective.reward_wrong", "-.inf"),
                       ("reward.right", ".nan"), ("objective.reward_weights", "[1.0, .nan]")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(None, [f"{key}={value}"])


def test_a_user_reward_name_passes_the_config_and_an_unknown_one_does_not():
    cfg = load_config(None, ["reward.functions=[{name: 'my_rewards:accuracy'}, {name: 'http://127.0.0.1:9/x'}]"])
    assert [f.name for f in cfg.reward.functions] == ["my_rewards:accuracy", "http://127.0.0.1:9/x"]
    with pytest.raises(ConfigError, match="unknown reward 'gsm9k'.*module:function"):
        load_config(None, ["reward.functions=[{name: gsm9k}]"])


def test_json_line_never_prints_a_bare_nan():
    line = json_line({"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5], "c": {"d": 2}})
    assert line == '{"a": null, "b": [null, null, 1.5], "c": {"d": 2}}'
    json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c}"))


def test_a_reward_that_reads_no_response_stops_after_three_skipped_steps(tiny_model_dir, tmp_path, overrides_for,
                                                                          capsys):
    # the synthetic task's integer answers are readable by `boxed`, but no response of a 4-token random model
    # holds a \boxed{}: every group all wrong, every step skipped
    rc, err, _, _ = train_rc(overrides_for(tiny_model_dir, tmp_path / "run", **{
        "reward.functions": "[{name: boxed}]", "objective.dynamic_sampling_metric": "correct",
        "objective.overlong_buffer": "null", "train.steps": 5, "data.eval": "null"}), capsys)
    assert rc == 2 and "reward.functions.0 ('boxed') has read no answer in any response of steps 1-3" in err, err
