"""--data arguments: the format and reward follow from the name or path; the real data sets load and
their own answers score as right under the reward chosen for them."""

import pytest

from dapo_jax.eval_command.sets import FORMAT_REWARDS, default_name, infer_format, parse_data
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.sources import load_source, make_scorer


@pytest.mark.parametrize("path, name, fmt", [
    ("data/gsm8k/test.jsonl", "gsm8k", "gsm8k"), ("x/math500/test.jsonl", "math500", "math500"),
    ("MATH-500.jsonl", "MATH-500", "math500"), ("aime2024/test.jsonl", "aime2024", "aime"),
    ("amc23.parquet", "amc23", "amc"), ("dapo_math_17k/dapo_math_17k.parquet", "dapo_math_17k", "dapo_math")])
def test_name_and_format_come_from_the_path(path, name, fmt):
    assert default_name(path) == name and infer_format(path) == fmt
    spec = parse_data(path)
    assert spec.name == name and spec.source.format == fmt
    assert [f.name for f in spec.reward.functions] == [FORMAT_REWARDS[fmt]]


def test_explicit_name_format_reward_and_unknown_format():
    spec = parse_data("mine=q/a.jsonl", format="custom", reward="boxed", template="dapo", limit=5)
    assert (spec.name, spec.source.name, spec.source.format, spec.source.template, spec.limit) == \
        ("mine", "q/a.jsonl", "custom", "dapo", 5)
    assert spec.reward.functions[0].name == "boxed"
    with pytest.raises(ConfigError, match="pass --format"):
        parse_data("questions.jsonl")
    with pytest.raises(ConfigError, match="unknown"):
        parse_data("q.jsonl", format="nope")


@pytest.mark.parametrize("parts", [("gsm8k", "test.jsonl"), ("math500", "test.jsonl"), ("aime2024", "test.jsonl"),
                                   ("aime2025", "test.jsonl"), ("amc23", "test.jsonl")])
def test_real_sets_load_and_their_answers_score_right(shared, parts):
    from dapo_jax.objectives.registry import load_objective

    spec = parse_data(str(shared("data", *parts)))
    problems = load_source(spec.source)
    assert len(problems) >= 30
    score = make_scorer(spec.reward, load_objective("dapo"))
    # what a model that states the right answer in the usual way writes
    responses = [f"The answer is \\boxed{{{p.answer}}}.\n#### {p.answer}" for p in problems[:30]]
    _, correct, _ = score(responses, [p.answer for p in problems[:30]])
    assert correct.all(), [p.answer for p, c in zip(problems, correct) if not c]


def test_check_exists_refuses_a_missing_file_and_passes_tasks_hub_names_and_real_files(tmp_path):
    from dapo_jax.eval_command.sets import check_exists

    real = tmp_path / "q.jsonl"
    real.write_text("{}\n")
    for arg in ("synthetic", "openai/gsm8k", str(real), f"mine={real}"):
        check_exists(arg)
    for arg in (str(tmp_path / "nope.jsonl"), f"mine={tmp_path}/nope.parquet", "./nope"):
        with pytest.raises(ConfigError, match="does not exist$"):
            check_exists(arg)
