"""A reward model beside rule rewards: weights, the parts that normalise-then-sum combines, correctness
from the rule, on_error, and the run config's checks and errors."""

import numpy as np
import pytest

from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.objectives.loss import compute_advantages
from dapo_jax.rewards import make_reward
from dapo_jax.rewards.pipeline import RewardPipeline
from dapo_jax.rewards.reward_model import make_learned_reward

PROMPTS = ["a1+b2=", "a1+b2=", "a5+b7=", "a5+b7="]
TRUTHS = ["3", "3", "12", "12"]
RESPONSES = ["a1+b2=3\nAnswer: 3", "a1+b2=4\nAnswer: 4", "a5+b7=12\nAnswer: 12", "a5+b7=12\nAnswer: 13"]


@pytest.fixture(scope="module")
def rm(orm_dir):
    return make_learned_reward("reward_model", orm_dir, {"batch_size": 4}, max_length=48, wrong=-2.0)


def test_weighted_sum_parts_and_correctness_from_the_rule(rm):
    cot = make_reward("cot", right=1.0, wrong=0.0)
    pipe = RewardPipeline([("reward_model", rm, 2.0), ("cot", cot, 0.5)], on_error="wrong")
    out = pipe.score(RESPONSES, TRUTHS, prompts=PROMPTS)
    alone, _ = rm.score_rows(PROMPTS, RESPONSES)
    np.testing.assert_allclose(out.parts[:, 0], alone, atol=1e-6)
    assert out.parts[:, 1].tolist() == [1.0, 0.0, 1.0, 0.0]
    np.testing.assert_allclose(out.rewards, 2.0 * alone + 0.5 * out.parts[:, 1], atol=1e-5)
    # the rule judges correctness and gives maj@k's keys, though the reward model is listed first
    assert out.correct.tolist() == [True, False, True, False] and out.keys == ["3", "4", "12", "13"]
    assert pipe.part_names == ("reward_model", "cot") and out.num_errors == 0
    rewards, correct, keys = pipe(RESPONSES, TRUTHS, prompts=PROMPTS)
    np.testing.assert_array_equal(rewards, out.rewards)
    # a reward model alone: a row is "correct" when its logit is > 0 (P(good) > 1/2)
    only = RewardPipeline([("reward_model", rm, 1.0)]).score(RESPONSES, TRUTHS, prompts=PROMPTS)
    assert only.correct.tolist() == (alone > 0).tolist() and only.keys == [r.strip() for r in RESPONSES]
    with pytest.raises(ValueError, match="needs the 4 rows' prompts"):
        pipe.score(RESPONSES, TRUTHS)


def test_normalize_then_sum_combines_the_parts_with_the_weights(rm):
    """The parts [P, G, K] through the objectives' normalize_then_sum, against the formula in NumPy:
    each reward GRPO-normalised in its group, weighted, summed, then normalised over the batch."""
    cot = make_reward("cot", right=1.0, wrong=0.0)
    w = (0.5, 2.0)
    parts = RewardPipeline([("cot", cot, w[0]), ("reward_model", rm, w[1])]).score(
        RESPONSES, TRUTHS, prompts=PROMPTS).parts.reshape(2, 2, 2)  # 2 prompts x G=2
    mask = np.ones((2, 2, 3), np.float32)
    adv = np.asarray(compute_advantages(ObjectiveConfig(multi_reward="normalize_then_sum", reward_weights=w),
                                        parts, mask))

    def grpo(r):  # (r - mean_g) / (std_g unbiased + 1e-6); a group of equal rewards gives 0
        sd = r.std(axis=1, ddof=1, keepdims=True)
        return np.where(sd > 0, (r - r.mean(axis=1, keepdims=True)) / (sd + 1e-6), 0.0)

    s = w[0] * grpo(parts[..., 0]) + w[1] * grpo(parts[..., 1])
    want = (s - s.mean()) / (s.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(adv, want, atol=1e-5)
    assert np.abs(adv).max() > 0.1


@pytest.mark.parametrize("on_error", ["wrong", "raise"])
def test_on_error_a_row_the_reward_model_cannot_read(rm, on_error):
    cot = make_reward("cot", right=1.0, wrong=0.0)
    long = "a5+b7=12\n" * 6 + "Answer: 12"  # 72 tokens with the prompt and template: past max_length=64 (48 + 2, rounded up to 16)
    responses = [RESPONSES[0], long, RESPONSES[2]]
    pipe = RewardPipeline([("cot", cot, 1.0), ("reward_model", rm, 1.0)], on_error=on_error)
    if on_error == "raise":
        with pytest.raises(RuntimeError, match=r"reward 'reward_model' failed on row 1 \(72 tokens > max_length=64"):
            pipe.score(responses, TRUTHS[1:], prompts=PROMPTS[1:])
        return
    out = pipe.score(responses, TRUTHS[1:], prompts=PROMPTS[1:])
    assert out.num_errors == 1 and out.error_rows == (1,)
    assert out.parts[1].tolist() == [0.0, -2.0] and out.rewards[1] == -2.0  # every function's wrong value
    assert out.correct.tolist() == [True, False, True]  # row 1 failed: incorrect, whatever the rule says
    good = RewardPipeline([("cot", cot, 1.0), ("reward_model", rm, 1.0)]).score(
        [responses[0], responses[2]], [TRUTHS[1], TRUTHS[3]], prompts=[PROMPTS[1], PROMPTS[3]])
    np.testing.assert_allclose(out.parts[[0, 2]], good.parts, atol=1e-6)  # the other rows are untouched


def test_run_config_checks_and_one_line_errors(orm_dir, tmp_path):
    from dapo_jax.data.datasets import DataError
    from dapo_jax.training.config.base import ConfigError
    from dapo_jax.training.config.run import config_from_dict
    from dapo_jax.training.sources import make_scorer

    def cfg(functions, **objective):
        return config_from_dict({"reward": {"functions": functions}, "objective": {"name": "grpo", **objective}})

    with pytest.raises(ConfigError, match=r"reward\.functions\.1\.path: 'reward_model' is a learned reward model"):
        cfg([{"name": "cot"}, {"name": "reward_model"}])
    with pytest.raises(ConfigError, match=r"reward\.functions\.0\.path: 'cot' is a rule reward"):
        cfg([{"name": "cot", "path": str(orm_dir)}])
    with pytest.raises(ConfigError, match="overlong_buffer"):
        cfg([{"name": "cot"}], multi_reward="normalize_then_sum", overlong_buffer=4, max_response_length=16)
    with pytest.raises(ConfigError, match=r"objective\.reward_weights"):
        cfg([{"name": "cot"}, {"name": "reward_model", "path": str(orm_dir), "weight": 2.0}],
            multi_reward="normalize_then_sum", reward_weights=[1.0, 1.0])
    with pytest.raises(ConfigError, match="multi-process"):
        config_from_dict({"reward": {"functions": [{"name": "reward_model", "path": str(orm_dir)}]},
                          "mesh": {"distributed": {"num_processes": 2, "process_id": 0, "coordinator": "h:1"}}})
    ok = cfg([{"name": "cot", "weight": 0.0}, {"name": "reward_model", "path": str(orm_dir)}])
    scorer = make_scorer(ok.reward, ok.objective_config, max_length=64)
    assert [n for n, _, _ in scorer.functions] == ["cot", "reward_model"] and scorer.weights.tolist() == [0.0, 1.0]
    for options, match in (({"batch_size": 0}, "batch_size"), ({"colour": 1}, "unknown option")):
        bad = cfg([{"name": "reward_model", "path": str(orm_dir), "options": options}])
        with pytest.raises(DataError) as e:
            make_scorer(bad.reward, bad.objective_config)
        assert str(e.value).startswith("reward.functions.0 ('reward_model'): ") and match in str(e.value)
        assert "\n" not in str(e.value)
    missing = cfg([{"name": "reward_model", "path": str(tmp_path / "nowhere")}])
    with pytest.raises(DataError, match="no reward model at"):
        make_scorer(missing.reward, missing.objective_config)
