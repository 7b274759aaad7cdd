"""avg@k, unbiased pass@k and maj@k against brute-force enumeration and hand cases."""

import itertools
from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_jax.evaluation import metrics as M


def _brute_pass_at_k(row, k):
    """Fraction of all k-subsets of the n samples that contain at least one correct sample."""
    subsets = list(itertools.combinations(range(len(row)), k))
    return sum(any(row[j] for j in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration_on_all_small_cases():
    for n in range(1, 8):
        for bits in itertools.product([False, True], repeat=n):
            row = np.array(bits)
            for k in range(1, n + 1):
                got = M.pass_at_k(row[None], k)
                assert got == pytest.approx(_brute_pass_at_k(row, k), abs=1e-12), (bits, k)
                c = int(row.sum())
                assert got == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_pass_at_k_large_n_is_stable():
    # C(1024, 512) overflows float64; the product form does not.
    correct = np.zeros((2, 1024), bool)
    correct[0, :3] = True
    got = M.pass_at_k(correct, 512, per_problem=True)
    expected0 = 1 - np.prod([(1024 - 3 - i) / (1024 - i) for i in range(512)])
    np.testing.assert_allclose(got, [expected0, 0.0], rtol=1e-12)
    assert M.pass_at_k(np.ones((1, 1024), bool), 1024) == 1.0


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=6, max_size=6), min_size=1, max_size=5))
def test_pass_at_k_monotone_in_k_and_pass1_is_avg(rows):
    correct = np.array(rows, bool)
    values = [M.pass_at_k(correct, k) for k in range(1, 7)]
    assert all(a <= b + 1e-12 for a, b in zip(values, values[1:]))
    assert values[0] == pytest.approx(M.avg_at_k(correct), abs=1e-12)
    np.testing.assert_allclose(M.pass_at_k(correct, 1, per_problem=True), correct.mean(1), atol=1e-12)


def test_avg_at_k():
    correct = np.array([[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
    assert M.avg_at_k(correct) == pytest.approx(0.5)
    np.testing.assert_allclose(M.avg_at_k(correct, per_problem=True), [0.5, 0.0, 1.0])
    # Mean over all n == mean over every 2-subset's mean (the unbiased avg@2).
    subsets = list(itertools.combinations(range(4), 2))
    brute = np.mean([correct[:, list(s)].mean() for s in subsets])
    assert M.avg_at_k(correct, 2) == pytest.approx(brute)
    assert M.avg_at_k(np.array([[1, 0]])) == 0.5  # 0/1 ints accepted


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="k=5, n=4"):
        M.pass_at_k(np.ones((2, 4), bool), 5)
    with pytest.raises(ValueError, match="shape"):
        M.avg_at_k(np.ones(4, bool))
    with pytest.raises(ValueError, match="dtype"):
        M.avg_at_k(np.full((2, 2), 0.5))
    with pytest.raises(ValueError, match="row 1"):
        M.maj_at_k([["a", "b"], ["a"]], np.ones((2, 2), bool), 2)
    with pytest.raises(ValueError, match="3 answer rows"):
        M.maj_at_k([["a"]] * 3, np.ones((2, 1), bool), 1)


def test_maj_at_k_hand_cases():
    answers = [
        ["5", "3", "5", "3"],  # tie 2-2: "5" seen first wins -> correct
        ["3", "5", "5", "3"],  # tie 2-2: "3" seen first wins -> wrong
        ["1", "2", "2", "4"],  # clear majority "2" -> wrong
        [None, None, "7", None],  # None abstains: "7" wins -> correct
        [None, None, None, None],  # no answer at all -> wrong
        ["9", "8", "8", "8"],  # with k=1 only "9" votes
    ]
    truth = ["5", "5", "1", "7", "7", "9"]
    correct = np.array([[a == t for a in row] for row, t in zip(answers, truth)])
    np.testing.assert_array_equal(
        M.maj_at_k(answers, correct, 4, per_problem=True), [True, False, False, True, False, False]
    )
    np.testing.assert_array_equal(
        M.maj_at_k(answers, correct, 1, per_problem=True), [True, False, True, False, False, True]
    )
    assert M.maj_at_k(answers, correct, 4) == pytest.approx(2 / 6)
    assert M.majority_index(["b", "a", "a", "b", "c"]) == 0
    assert M.majority_index([]) is None


def test_maj_at_k_matches_counter_reference():
    rng = np.random.default_rng(0)
    answers = rng.integers(0, 3, size=(50, 7)).astype(str).tolist()
    correct = np.array([[a == "1" for a in row] for row in answers])
    for k in (1, 3, 7):
        expected = []
        for row in answers:
            window = row[:k]
            counts = {a: window.count(a) for a in window}
            top = max(counts.values())
            winner = next(a for a in window if counts[a] == top)  # earliest among the tied
            expected.append(winner == "1")
        np.testing.assert_array_equal(M.maj_at_k(answers, correct, k, per_problem=True), expected)


def test_summarize():
    correct = np.array([[1, 0, 0, 1], [1, 1, 1, 1]], bool)
    answers = [["1", "2", "2", "1"], ["3", "3", "3", "3"]]
    out = M.summarize(correct, ks=(1, 2), answers=answers)
    assert out == pytest.approx({"avg@4": 0.75, "pass@1": 0.75, "pass@2": (5 / 6 + 1) / 2, "maj@1": 1.0, "maj@2": 1.0})
    assert "maj@1" not in M.summarize(correct)
