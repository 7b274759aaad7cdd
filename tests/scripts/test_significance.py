"""scripts/significance.py against references written here: Welch's t and its Welch-Satterthwaite
degrees of freedom in NumPy, Holm's correction by hand, the bootstrap interval against the exact
resampling distribution, and the false-mark rate of a rule against the one it replaces."""

import numpy as np
import pytest
from scipy import stats

from tests.conftest import load_script

significance = load_script("significance")


def welch_reference(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    t = (a.mean() - b.mean()) / np.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return 2 * stats.t.sf(abs(t), df)


def test_welch_matches_the_formula():
    a, b = [0.40, 0.42, 0.47, 0.39], [0.10, 0.20, 0.30]
    assert significance.welch(a, b) == pytest.approx(welch_reference(a, b), rel=1e-10)
    assert significance.welch([0.3], [0.1, 0.2]) is None  # one value a side: no test
    assert significance.welch([0.3, 0.3], [0.1, 0.1]) is None  # no spread at all: no test


def test_paired_matches_the_formula():
    a, b = np.array([0.5, 0.6, 0.4, 0.7]), np.array([0.45, 0.5, 0.41, 0.6])
    d = a - b
    t = d.mean() / (d.std(ddof=1) / np.sqrt(len(d)))
    assert significance.paired(a, b) == pytest.approx(2 * stats.t.sf(abs(t), len(d) - 1), rel=1e-10)
    with pytest.raises(ValueError, match="as many values"):
        significance.paired([1, 2], [1, 2, 3])


def test_holm_by_hand():
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> kept monotone at 0.06)
    assert significance.holm([0.01, 0.04, 0.03, 0.005, None]) == pytest.approx([0.03, 0.06, 0.06, 0.02, None])
    assert significance.holm([0.9, 0.8]) == [1.0, 1.0]  # capped at 1
    assert significance.family_size([0.1, None, 0.2]) == 2


def test_bootstrap_interval_is_the_resampling_distributions_quantiles():
    # a = [0, 1] resampled: its mean is 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4; b has no spread
    low, high = significance.bootstrap_interval([0.0, 1.0], [0.0, 0.0])
    assert (low, high) == (0.0, 1.0)
    low, high = significance.bootstrap_interval([0.0, 1.0], [0.0, 0.0], level=0.4)  # 30th-70th percentile
    assert (low, high) == (0.5, 0.5)
    assert significance.bootstrap_interval([1.0], [0.0, 1.0]) is None
    c = significance.compare([0.40, 0.42, 0.44], [0.10, 0.20, 0.30])
    assert c.delta == pytest.approx(0.22) and c.low <= c.delta <= c.high and c.test == "welch"


def test_a_mark_needs_the_adjusted_p_and_chance_alone_rarely_gives_one():
    """With no true effect, 3 seeds against 3: the old rule (|Δ| > the larger sd) marks about one
    comparison in five; Welch at 0.05 about one in twenty, and Holm over a family of 5 rarely any.
    The 20,000 Welch p-values come from one vectorised scipy call (one by one they took 40 s), once
    `significance.welch` is shown to give the same p on the first 1,000 of them."""
    rng = np.random.default_rng(0)
    trials = 4000
    a, b = rng.normal(size=(2, trials, 5, 3))  # 4000 families of 5 comparisons, 3 seeds a side
    old = np.abs(a.mean(-1) - b.mean(-1)) > np.maximum(a.std(-1, ddof=1), b.std(-1, ddof=1))
    p = stats.ttest_ind(a, b, axis=-1, equal_var=False).pvalue
    for i in range(200):
        for j in range(5):
            assert significance.welch(a[i, j], b[i, j]) == pytest.approx(p[i, j], rel=1e-12, abs=1e-300)
    family_marks = sum(any(q < 0.05 for q in significance.holm(list(family))) for family in p)
    assert old.mean() > 0.15
    assert (p < 0.05).mean() < 0.06
    assert family_marks / trials <= 0.06  # family-wise, over 5 tests


def test_cells_and_legend_say_not_separable():
    c = significance.compare([0.40, 0.42, 0.44], [0.10, 0.20, 0.30])
    assert significance.cell(c, 0.01).endswith(" **") and not significance.cell(c, 0.2).endswith("**")
    assert significance.verdict(c, 0.2) == "not separable" and significance.verdict(c, 0.01) == "separable"
    assert significance.cell(significance.compare([0.4], [0.2, 0.3]), None).endswith("(no test)")
    assert "12 tests" in significance.legend(12) and "0.6" in significance.legend(12)


def test_welch_from_a_mean_sd_table_equals_the_test_on_the_values():
    a, b = np.array([0.40, 0.47, 0.39]), np.array([0.10, 0.20, 0.35])
    p = significance.welch_from_summary(a.mean(), a.std(ddof=1), 3, b.mean(), b.std(ddof=1), 3)
    assert p == pytest.approx(welch_reference(a, b), rel=1e-10)
    assert significance.welch_from_summary(0.1, 0.0, 3, 0.2, 0.0, 3) is None
