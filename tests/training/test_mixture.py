"""A data mixture's config, data and scorer: keyed errors, each source scored by its own reward functions."""

import json

import numpy as np
import pytest

from dapo_jax.data.char_tokenizer import build_char_tokenizer
from dapo_jax.data.mixture import MixtureStream
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.reward import RewardSection
from dapo_jax.training.config.run import load_config
from dapo_jax.training.mixture import MixtureScorer
from dapo_jax.training.sources import DataError, make_scorer
from dapo_jax.training.run_data import make_data

TOK = build_char_tokenizer()
SOURCES = ("{arith: {weight: 3, train: {name: synthetic, options: {max_operand: 9, heldout_size: 20}}}, "
           "cot: {train: {name: cot, options: {min_terms: 2, max_terms: 2, heldout_size: 10, train_size: 40}}, "
           "reward: {functions: [{name: cot}], right: 2.0, wrong: 0.0}}}")


def mixture_config(*extra, sources=SOURCES):
    return load_config(None, ["data.train=null", f"data.sources={sources}", "data.max_prompt_length=8",
                              "data.eval.options={max_operand: 9, heldout_size: 20}", *extra])


def test_the_sources_load_in_order_with_their_weights_and_rewards():
    cfg = mixture_config()
    assert list(cfg.data.sources) == ["arith", "cot"]
    assert cfg.data.sources["arith"].weight == 3.0 and cfg.data.sources["arith"].reward is None
    assert cfg.data.sources["cot"].reward.functions[0].name == "cot"
    # the saved config reloads to the same mixture (data.train stays at its default)
    from dapo_jax.training.config.run import config_from_dict
    import yaml

    assert config_from_dict(yaml.safe_load(cfg.to_yaml())).data.sources == cfg.data.sources


@pytest.mark.parametrize("overrides, message", [
    (["data.sources={a: {weight: 1}}"], "data.train: a mixture reads data.sources: remove data.train or set it to null"),
    (["data.train=null", "data.sources={}"], "data.sources: an empty mixture"),
    (["data.train=null", "data.sources={a.b: {}}"], "data.sources.a.b: a source's name is letters"),
    (["data.train=null", "data.sources={a: {weight: -1}}"], "data.sources.a.weight: Input should be greater than 0"),
    (["data.train=null", "data.sources={a: {wieght: 1}}"], "data.sources.a.wieght: unknown key"),
    (["data.train=null", "data.sources={a: {}}", "objective.multi_reward=normalize_then_sum",
      "objective.overlong_buffer=null"], "data.sources: objective.multi_reward=normalize_then_sum"),
    (["data.train=null", "data.sources={a: {}}", "objective.name=grpo_process", "objective.overlong_buffer=null",
      "reward.functions=[{name: cot}]"], "data.sources: advantage="),
    (["data.difficulty={visits: 0}"], "data.difficulty.visits: Input should be greater than 0"),
    (["data.difficulty={drop: solved}"], "data.difficulty.drop: Input should be"),
])
def test_config_errors_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")) as e:
        load_config(None, overrides)
    assert "\n" not in str(e.value)


def test_a_relative_source_file_is_found_beside_the_config(tmp_path):
    (tmp_path / "math.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    (tmp_path / "run.yaml").write_text("data:\n  sources:\n    math: {train: {name: math.jsonl, format: gsm8k}}\n"
                                       "objective: {overlong_buffer: null}\n")
    cfg = load_config(tmp_path / "run.yaml")
    assert cfg.data.sources["math"].train.name == str((tmp_path / "math.jsonl").resolve())


def test_make_data_gives_a_mixture_stream_and_scores_each_source_by_its_functions():
    cfg = mixture_config()
    stream, eval_stream, scorer = make_data(cfg, TOK, cfg.objective_config)
    assert isinstance(stream, MixtureStream) and stream.names == ("arith", "cot")
    assert isinstance(scorer, MixtureScorer) and scorer.for_eval is scorer.default
    assert len(stream.streams[1]) == 40 and stream.streams[1].source["key"] == "data.sources.cot"
    # arith: the default reward (synthetic: the whole response is the integer; +1 / -1, the objective's);
    # cot: its own (the last line "Answer: N"; right 2, wrong 0)
    responses = ["5", "Answer: 5", "5", "Answer: 5", "Answer: 4"]
    truths = ["5", "5", "5", "5", "5"]
    out = scorer.score(responses, truths, sources=[0, 0, 1, 1, 1])
    np.testing.assert_array_equal(out.rewards, [1.0, -1.0, 0.0, 2.0, 0.0])
    np.testing.assert_array_equal(out.correct, [True, False, False, True, False])
    assert out.parts.shape == (5, 1) and out.num_errors == 0
    assert scorer.part_names == ("reward",) and scorer.weights.tolist() == [1.0]
    with pytest.raises(ValueError, match="each of the 5 rows' source"):
        scorer.score(responses, truths)
    # held-out evaluation is scored by the run's reward section
    np.testing.assert_array_equal(scorer.for_eval.score(responses, truths).rewards, [1, -1, 1, -1, -1])


def test_a_source_s_bad_reward_names_its_key():
    cfg = mixture_config(sources="{a: {reward: {functions: [{name: synthetic, options: {nope: 1}}]}}}")
    with pytest.raises(DataError, match=r"^data.sources.a.reward.functions.0 \('synthetic'\)"):
        make_data(cfg, TOK, cfg.objective_config)


def test_difficulty_alone_reads_data_train_as_one_source():
    cfg = load_config(None, ["data.difficulty={visits: 2}", "data.max_prompt_length=8",
                             "data.train.options={max_operand: 9, heldout_size: 20}"])
    stream, _, scorer = make_data(cfg, TOK, cfg.objective_config)
    assert isinstance(stream, MixtureStream) and stream.names == ("train",)
    assert stream.streams[0].source["key"] == "data.train"
    assert scorer.for_eval is scorer  # the run's own reward section: no mixture scorer


def test_mixture_scorer_counts_each_source_s_failures_in_row_order():
    boom = make_scorer(RewardSection(functions=[{"name": "synthetic"}]), load_config(None).objective_config)

    class Failing:
        learned = []

        def score(self, responses, truths, *, prompts=None, rows=None):
            out = boom.score(responses, truths)
            return out._replace(num_errors=1, error_rows=(len(responses) - 1,))

    scorer = MixtureScorer([boom, Failing()], ["a", "b"], default=boom)
    out = scorer.score(["1", "2", "3", "4"], ["1", "2", "3", "4"], sources=[1, 0, 1, 0])
    assert out.num_errors == 1 and out.error_rows == (2,)  # b's second row is row 2 of the batch
