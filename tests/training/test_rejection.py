"""Rejection sampling (training/rejection.py): keep a model's correct answers, deduplicated and capped per
prompt, as an SFT file that `dapo-jax sft` reads back."""

import json

import pytest

from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.rejection import run_rft, select_kept


def rec(index, *responses):
    return {"index": index, "responses": [{"text": t, "correct": c, "reward": 1.0 if c else -1.0} for t, c in responses]}


def test_select_keeps_correct_distinct_responses_up_to_the_cap():
    records = [rec(0, ("a", False), ("b", True), (" b ", True), ("c", True), ("d", True)),  # " b " repeats "b"
               rec(1, ("x", False), ("y", False)),  # nothing right: nothing kept
               rec(2, ("", True), ("z", True))]  # an empty answer is never kept
    kept = select_kept(records, per_prompt=2)
    assert [(k["index"], k["response"]) for k in kept] == [(0, "b"), (0, "c"), (2, "z")]
    assert [(k["index"], k["response"]) for k in select_kept(records, per_prompt=1)] == [(0, "b"), (2, "z")]
    with pytest.raises(ConfigError, match="--per-prompt 0"):
        select_kept(records, per_prompt=0)


def test_rft_writes_an_inspectable_sft_file(tmp_path):
    """The shipped tiny base answers about a third of its synthetic problems right: every kept row must be one
    the reward accepts, at most per_prompt per problem, none repeated, with the bare problem as its prompt."""
    from dapo_jax.data.synthetic import is_correct, synthetic_rows

    out = tmp_path / "kept.jsonl"
    stats = run_rft("tiny_dapo", out=out, k=4, per_prompt=2, limit=16, overrides=["train.run_dir=" + str(tmp_path)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert stats["prompts"] == 16 and stats["sampled"] == 64 and stats["kept"] == len(rows) > 0
    assert stats["correct"] >= len(rows)
    problems = synthetic_rows("train")
    per = {}
    for r in rows:
        assert set(r) == {"prompt", "response", "answer", "index", "reward"}
        assert r["prompt"] == problems[r["index"]]["prompt"] and r["answer"] == problems[r["index"]]["answer"]
        assert is_correct(r["response"], r["answer"])  # the rule itself, not the pipeline that kept it
        per.setdefault(r["index"], []).append(r["response"].strip())
    assert all(len(v) <= 2 and len(set(v)) == len(v) for v in per.values())
