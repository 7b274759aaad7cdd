"""Reward functions as a user writes them, loaded by the tests as `tests/rewards/user_rewards.py:NAME`
and `user_rewards:NAME` (all forms, sync and async, and each way of failing)."""

import asyncio
import math
import time


def exact(response, ground_truth, **row):
    """1 when the response is the truth, plus the row's bonus column."""
    return float(response.strip() == str(ground_truth)) + row.get("bonus", 0.0)


def exact_narrow(response, ground_truth):  # no **row: the row's columns are not passed
    return float(response.strip() == str(ground_truth))


def exact_level(completion, ground_truth, level):  # one named column
    return float(completion.strip() == str(ground_truth)) * level


async def exact_async(response, ground_truth, **row):
    await asyncio.sleep(0)
    return float(response.strip() == str(ground_truth))


def lengths(responses, rows):
    """len(response) + the row's level, and -1 where the truth is "x"."""
    return [-1.0 if row["ground_truth"] == "x" else len(r) + row["level"] for r, row in zip(responses, rows)]


async def lengths_async(responses, rows):
    await asyncio.sleep(0)
    return [len(r) + row["level"] for r, row in zip(responses, rows)]


def trl_style(prompts, completions, ground_truth, level, **kwargs):
    """TRL's form: 10 * (completion == truth) + level + len(prompt)."""
    return [10.0 * (c.strip() == str(t)) + lv + len(p) for p, c, t, lv in zip(prompts, completions, ground_truth, level)]


async def trl_async(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


def raises_on_b(response, ground_truth, **row):
    if response == "b":
        raise ZeroDivisionError("b is not allowed")
    return 1.0


def nan_on_b(response, ground_truth, **row):
    return math.nan if response == "b" else 2.0


def none_on_b(response, ground_truth, **row):
    return None if response == "b" else 2.0


def text_result(response, ground_truth, **row):
    return "1.0"


def sleeps_on_b(response, ground_truth, **row):
    if response == "b":
        time.sleep(3600)  # stuck: the pool must give up on it
    return 1.0


async def sleeps_async(response, ground_truth, **row):
    await asyncio.sleep(3600)


def one_too_many(responses, rows):
    return [1.0] * (len(responses) + 1)


def not_a_list(responses, rows):
    return 1.0


def unclear(a, b):
    return 0.0


def takes_nothing():
    return 0.0


NOT_CALLABLE = 3


def fails_on_level_2(response, ground_truth, level, **row):
    if level == 2:
        raise ValueError("level 2 is not supported")
    return float(response.strip() == str(ground_truth))


def always_raises(response, ground_truth, **row):
    raise KeyError("missing_column")


_calls = []


def fails_after_first_call(response, ground_truth, **row):
    """Passes the start-up's dry call, then fails on everything (a verifier that breaks)."""
    _calls.append(1)
    if len(_calls) > 1:
        raise ConnectionError("the verifier went away")
    return 1.0
