"""Rule-based rewards: answer extraction, normalisation, correctness checks, reward functions; the user's own
functions by import path or URL (`custom.py`)."""

from dapo_jax.rewards.check import answer_key, answers_equal
from dapo_jax.rewards.custom import CustomReward, make_custom_reward
from dapo_jax.rewards.extract import (
    extract_answer_tag,
    extract_boxed,
    extract_dapo_answer,
    extract_final_answer,
    extract_gsm8k,
    extract_last_number,
)
from dapo_jax.rewards.functions import (
    REWARDS,
    BatchScores,
    FormatReward,
    RewardFn,
    RuleReward,
    WeightedSum,
    combine,
    is_correct,
    make_reward,
    score_batch,
)
from dapo_jax.rewards.normalize import normalize_final_answer, numbers_equal, parse_number
from dapo_jax.rewards.symbolic import SymbolicTimeout, math_verify_equal

__all__ = [
    "REWARDS",
    "BatchScores",
    "CustomReward",
    "FormatReward",
    "RewardFn",
    "RuleReward",
    "SymbolicTimeout",
    "WeightedSum",
    "answer_key",
    "answers_equal",
    "combine",
    "extract_answer_tag",
    "extract_boxed",
    "extract_dapo_answer",
    "extract_final_answer",
    "extract_gsm8k",
    "extract_last_number",
    "is_correct",
    "make_custom_reward",
    "make_reward",
    "math_verify_equal",
    "normalize_final_answer",
    "numbers_equal",
    "parse_number",
    "score_batch",
]
