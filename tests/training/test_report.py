"""What a step tells the user: the metrics row, the bar's entropy, and once, why the first steps keep nothing."""

import warnings

import numpy as np
import pytest

from dapo_jax.training.config.run import load_config
from dapo_jax.training.report import Progress, entropy_shown, nothing_kept, step_row
from dapo_jax.training.state.run_state import RunState
from dapo_jax.training.step import StepResult
from tests.training.test_rollout import make_groups


def result(metrics=None, **stats):
    groups = make_groups(np.array([[True, False, False, False]]))
    return StepResult(groups, None if metrics is None else np.zeros(1), {"rollout_busy_s": 2.0, **stats},
                      metrics or {}, 3.0, 1.5)


def test_the_bar_shows_the_generated_entropy_when_nothing_was_trained():
    assert entropy_shown(result(entropy_generated=11.9)) == pytest.approx(11.9)  # it used to show 0.00
    assert entropy_shown(result({"entropy": 0.7}, entropy_generated=11.9)) == pytest.approx(0.7)


def test_the_row_has_the_stats_the_metrics_the_counters_and_the_times():
    class Stream:
        num_skipped = 3

    class Scorer:
        part_names = ("cot",)

    run = RunState(step=2, rng=np.zeros(2, np.uint32), steps_skipped=1)
    row = step_row(result({"update_tokens": 30.0}, rollout_tokens=40.0, accuracy=0.5), run, Stream(), Scorer())
    assert row["accuracy"] == 0.5 and row["update_tokens"] == 30.0
    assert row["steps_skipped"] == 1 and row["prompts_dropped_too_long"] == 3
    assert row["rollout_tokens_per_s"] == 20.0 and row["update_tokens_per_s"] == 20.0
    assert (row["rollout_time_s"], row["update_time_s"], row["step_time_s"]) == (3.0, 1.5, 4.5)
    assert isinstance(row["compilations"], int)


def test_nothing_kept_names_the_likely_cause_and_the_knobs(tmp_path):
    cfg = load_config("tiny_dapo")
    wrong = nothing_kept(1, {"all_wrong_fraction": 1.0, "accuracy": 0.0, "gen_rounds": 2.0}, cfg, tmp_path)
    assert wrong.startswith("step 1 kept no group: in 2 generation round(s) per step every response was wrong")
    assert "too weak" in wrong and "format" in wrong and f"dapo-jax show {tmp_path}" in wrong
    for knob in ("model.path", "reward.functions", "rollout.max_gen_batches", "objective.dynamic_sampling_metric"):
        assert knob in wrong
    right = nothing_kept(3, {"all_correct_fraction": 1.0, "accuracy": 1.0}, cfg, tmp_path)
    assert right.startswith("steps 1-3 kept no group") and "too easy" in right
    mixed = nothing_kept(1, {"all_correct_fraction": 0.5, "all_wrong_fraction": 0.25}, cfg, tmp_path)
    assert "differed" in mixed


def test_the_explanation_comes_once_and_only_when_no_step_has_trained_yet(tmp_path):
    cfg = load_config("tiny_dapo", ["train.progress=false"])
    progress = Progress(cfg, 0, enabled=False, run_dir=tmp_path)
    seen = []
    for step in (1, 2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            progress.update(result(all_wrong_fraction=1.0), RunState(step=step, rng=None, steps_skipped=step))
        seen.append([str(w.message) for w in caught])
    assert len(seen[0]) == 2 and "update is skipped" in seen[0][0] and "kept no group:" in seen[0][1]
    assert len(seen[1]) == 1 and "update is skipped" in seen[1][0]
    later = Progress(cfg, 5, enabled=False, run_dir=tmp_path)  # steps 1-5 trained; step 6 keeps nothing
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        later.update(result(all_wrong_fraction=1.0), RunState(step=6, rng=None, steps_skipped=1))
    assert [("kept no group:" in str(w.message)) for w in caught] == [False]
    progress.close()
    later.close()


def test_the_bar_names_each_reward_that_could_not_score():
    from dapo_jax.training.report import reward_unscored

    row = {"reward_failures/gsm8k": 0, "reward_unreadable/gsm8k": 12, "reward_failures/my:acc": 3,
           "reward_failures/format": 0, "reward_mean": 0.5}
    assert reward_unscored(row) == "gsm8k:u12 my:acc:f3"
    assert reward_unscored({**row, "reward_unreadable/my:acc": 1}) == "gsm8k:u12 my:acc:f3,u1"
    assert reward_unscored({"reward_failures/gsm8k": 0, "reward_unreadable/gsm8k": 0}) == ""


def test_the_bar_shows_each_source_s_accuracy_and_the_row_the_data_round(tmp_path):
    cfg = load_config("tiny_dapo")
    progress = Progress(cfg, 0, enabled=True, run_dir=tmp_path)
    progress.update(result({"entropy": 0.5}, accuracy=0.5, **{"source/math/accuracy": 0.25,
                                                             "source/code/accuracy": 0.75}), RunState(step=1, rng=None))
    assert "acc/math=0.25" in progress.bar.postfix and "acc/code=0.75" in progress.bar.postfix
    progress.close()

    class Stream:
        num_skipped = 0

    class Scorer:
        part_names = ("reward",)

    assert "data_round" not in step_row(result(), RunState(step=1, rng=None), Stream(), Scorer())
    assert step_row(result(), RunState(step=1, rng=None, data_round=2), Stream(), Scorer())["data_round"] == 2


def test_progress_is_a_plain_line_per_step_where_the_stream_is_not_a_terminal(tmp_path):
    """A log file or a scheduler's capture: one line per step with the bar's figures, no redrawn bar."""
    import io

    cfg = load_config("tiny_dapo", ["train.progress=true", "train.steps=3"])
    log = io.StringIO()  # not a terminal
    progress = Progress(cfg, 1, enabled=True, run_dir=tmp_path, stream=log)
    for step in (2, 3):
        progress.update(result(reward_mean=0.5, accuracy=0.25, kept_fraction=1.0), RunState(step=step, rng=None))
    progress.close()
    lines = log.getvalue().splitlines()
    assert [ln.rsplit(",", 1)[0] for ln in lines] == [
        f"[dapo-jax] step {s}/3: reward 0.50, acc 0.25, kept 1.00, ent {lines[0].split('ent ')[1].split(',')[0]}"
        for s in (2, 3)]
    assert all(ln.endswith(" s") for ln in lines) and "\r" not in log.getvalue()
    quiet = io.StringIO()
    Progress(load_config("tiny_dapo", ["train.progress=false"]), 0, enabled=True, run_dir=tmp_path, stream=quiet).close()
    assert quiet.getvalue() == ""
