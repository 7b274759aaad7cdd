"""Difficulty filtering: the visit history, which prompts it drops in each mode, its state and its stream hook."""

import json

import numpy as np
import pytest

from dapo_jax.data.stream import PromptExample
from dapo_jax.training.difficulty import DifficultyFilter
from dapo_jax.training.rollout import Groups


def groups(source, index, correct, valid=None):
    """Scored groups with only the fields the filter reads."""
    correct = np.asarray(correct, bool)
    n, g = correct.shape
    z = np.zeros((n, 1), np.int32)
    return Groups(z, z, np.zeros((n, g, 1), np.int32), np.zeros((n, g, 1), np.float32),
                  np.zeros((n, g, 1), np.float32), np.zeros((n, g), np.float32), correct, np.zeros((n, g), np.int32),
                  np.zeros((n, g), bool), np.ones(n, bool) if valid is None else np.asarray(valid), np.zeros(n, np.int32),
                  source=np.asarray(source, np.int32), prompt_index=np.asarray(index, np.int32))


def ex(index):
    return PromptExample(ids=(1,), text="t", answer="a", index=index)


RIGHT, WRONG, MIXED = [True, True, True], [False, False, False], [True, False, True]


def test_outcome_of_a_group():
    f = DifficultyFilter(visits=1, drop="both", names=["a"])
    np.testing.assert_array_equal(f.outcome(np.array([RIGHT, WRONG, MIXED])), [1, -1, 0])


@pytest.mark.parametrize("drop, dropped", [("all_right", {(0, 1)}), ("all_wrong", {(0, 2), (1, 2)}),
                                           ("both", {(0, 1), (0, 2), (1, 2)})])
def test_a_prompt_is_dropped_after_k_agreeing_visits_in_a_row(drop, dropped):
    f = DifficultyFilter(visits=2, drop=drop, names=["a", "b"])
    # prompt (0,1): right, right -> solved; (0,2): wrong, wrong; (0,3): right, wrong; (0,4) right once;
    # (1,2): mixed then wrong, wrong (the last two agree); (1,1): wrong, right
    f.record(groups([0, 0, 0, 0, 1, 1], [1, 2, 3, 4, 2, 1], [RIGHT, WRONG, RIGHT, RIGHT, MIXED, WRONG]))
    assert not any(f.dropped(s, ex(i)) for s in (0, 1) for i in range(5))  # one visit is not enough
    f.record(groups([0, 0, 0, 1, 1], [1, 2, 3, 2, 1], [RIGHT, WRONG, WRONG, WRONG, RIGHT]))
    f.record(groups([1], [2], [WRONG]))
    got = {(s, i) for s in (0, 1) for i in range(5) if f.dropped(s, ex(i))}
    assert got == dropped
    assert f.history[(1, 2)] == (-1, -1) and f.history[(0, 4)] == (1,)  # the last k outcomes only
    assert f.stats()["difficulty/dropped"] == len(dropped)
    assert f.stats()["source/b/dropped"] == sum(s == 1 for s, _ in dropped)


def test_padding_groups_are_no_visit():
    f = DifficultyFilter(visits=1, drop="all_wrong", names=["a"])
    f.record(groups([0, 0], [5, 6], [WRONG, WRONG], valid=[True, False]))
    assert f.dropped(0, ex(5)) and not f.dropped(0, ex(6)) and (0, 6) not in f.history


def test_state_round_trips_through_json_and_drops_the_same():
    f = DifficultyFilter(visits=3, drop="all_right", names=["a", "b"])
    rng = np.random.default_rng(0)
    for _ in range(12):
        f.record(groups(rng.integers(0, 2, 8), rng.integers(0, 6, 8), rng.random((8, 3)) < 0.8))
    g = DifficultyFilter(visits=3, drop="all_right", names=["a", "b"])
    g.load_state_dict(json.loads(json.dumps(f.state_dict())))
    assert g.history == f.history
    assert [g.dropped(s, ex(i)) for s in (0, 1) for i in range(6)] == [f.dropped(s, ex(i)) for s in (0, 1) for i in range(6)]
    assert any(f.dropped(s, ex(i)) for s in (0, 1) for i in range(6))
    g.load_state_dict(None)
    assert g.history == {} and not g.dropped(0, ex(0))
    with pytest.raises(ValueError, match=r"sources \['c'\]"):
        g.load_state_dict({"visits": 3, "drop": "all_right", "history": {"c": {"1": [1]}}})


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="visits"):
        DifficultyFilter(visits=0, drop="both", names=["a"])
    with pytest.raises(ValueError, match="drop"):
        DifficultyFilter(visits=1, drop="solved", names=["a"])


def test_attached_to_a_mixture_the_filter_skips_its_prompts_and_names_an_exhausted_source():
    from dapo_jax.data.char_tokenizer import build_char_tokenizer
    from dapo_jax.data.datasets import Problem
    from dapo_jax.data.mixture import MixtureStream, SourceExhausted
    from dapo_jax.data.stream import PromptStream
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.difficulty import build_difficulty

    tok = build_char_tokenizer()
    stream = PromptStream([Problem(problem=f"p{i}", answer=str(i), index=i) for i in range(4)], tok,
                          max_prompt_length=4, source={"key": "data.train"})
    mix = MixtureStream({"train": stream}, {"train": 1.0})
    f = build_difficulty(load_config(None, ["data.difficulty={visits: 1, drop: all_wrong}"]), mix)
    assert build_difficulty(load_config(None), mix) is None
    f.record(groups([0, 0], [1, 2], [WRONG, MIXED]))
    assert {e.index for e in mix.next_examples(12)} == {0, 2, 3}
    f.record(groups([0, 0, 0], [0, 2, 3], [WRONG, WRONG, WRONG]))
    with pytest.raises(SourceExhausted, match=r"^data.train: every one of its 4 prompts is skipped: difficulty "
                                              r"filtering dropped each one after 1 visit\(s\) in a row whose "
                                              r"responses were all wrong \(data.difficulty\)"):
        mix.next_examples(1)
