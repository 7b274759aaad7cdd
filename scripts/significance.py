"""Whether a difference between two rows of an experiment is real: Welch's and the paired t-test, a
bootstrap 95% interval of the difference of means, and Holm's correction over a table of comparisons.

    c = compare(with_values, without_values)                  # Welch; paired=True for seed-paired runs
    p_adj = holm([c.p for c in comparisons])                  # the table's family of m comparisons
    cell(c, p_adj[i])  ->  "+0.052 [-0.031, +0.140] p=0.21"   # ** only where the Holm-adjusted p < alpha

A mark is made only by the Holm-adjusted p-value, so over a table of m comparisons with no true effect
the chance of one or more marks is at most alpha (family-wise). The rule it replaces, "|Δ| larger than
the larger seed sd", fires about one time in five with 3 seeds against 3 and no effect at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from scipy import stats

ALPHA = 0.05
BOOTSTRAP_SAMPLES = 10_000


@dataclasses.dataclass(frozen=True)
class Comparison:
    delta: float  # mean(a) - mean(b)
    low: float | None  # bootstrap interval of delta (None: a side with one value)
    high: float | None
    p: float | None  # two-sided; None where the test is undefined (one value a side, or no spread at all)
    test: str  # "welch" or "paired"
    n_a: int
    n_b: int


def welch(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p of Welch's t-test (unequal variances); None below 2 values a side or with no spread."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or len(b) < 2 or (a.var() == 0 and b.var() == 0):
        return None
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def paired(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p of the paired t-test over same-seed pairs; None below 2 pairs or with no spread."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) != len(b):
        raise ValueError(f"a paired test needs as many values a side ({len(a)} against {len(b)})")
    d = a - b
    if len(d) < 2 or d.var() == 0:
        return None
    return float(stats.ttest_rel(a, b).pvalue)


def bootstrap_interval(a: Sequence[float], b: Sequence[float], *, is_paired: bool = False, level: float = 0.95,
                       samples: int = BOOTSTRAP_SAMPLES, seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap interval of mean(a) - mean(b): each side resampled with replacement on its own
    (or the pairs together when `is_paired`). None below 2 values a side. Deterministic in `seed`."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or len(b) < 2:
        return None
    rng = np.random.default_rng(seed)
    if is_paired:
        d = a - b
        deltas = d[rng.integers(0, len(d), (samples, len(d)))].mean(1)
    else:
        deltas = (a[rng.integers(0, len(a), (samples, len(a)))].mean(1)
                  - b[rng.integers(0, len(b), (samples, len(b)))].mean(1))
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(deltas, [tail, 100 - tail])
    return float(low), float(high)


def compare(a: Sequence[float], b: Sequence[float], *, is_paired: bool = False) -> Comparison:
    """Δ = mean(a) - mean(b), its bootstrap interval and the test's p (paired needs same-seed pairs)."""
    interval = bootstrap_interval(a, b, is_paired=is_paired)
    p = paired(a, b) if is_paired else welch(a, b)
    low, high = interval if interval else (None, None)
    return Comparison(float(np.mean(a) - np.mean(b)), low, high, p, "paired" if is_paired else "welch", len(a), len(b))


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values over the family (None entries are not tests and are left out of m).

    Sorted ascending p_(1..m): p_adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))."""
    present = [(p, i) for i, p in enumerate(pvalues) if p is not None]
    m = len(present)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(present)):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def family_size(pvalues: Sequence[float | None]) -> int:
    return sum(p is not None for p in pvalues)


def cell(c: Comparison, p_adjusted: float | None, *, digits: int = 3, alpha: float = ALPHA) -> str:
    """'+0.052 [-0.031, +0.140] p=0.21' with ' **' where the Holm-adjusted p is below alpha."""
    text = f"{c.delta:+.{digits}f}"
    if c.low is not None:
        text += f" [{c.low:+.{digits}f}, {c.high:+.{digits}f}]"
    if c.p is None:
        return text + " (no test)"
    text += f" p{_p(c.p)}"
    return text + (" **" if p_adjusted is not None and p_adjusted < alpha else "")


def tested_cells(c: Comparison, p_adjusted: float | None, digits: int = 3) -> str:
    """A comparison's table cells 'Δ [95% interval] | p | Holm p | verdict' (the experiment pages' tables)."""
    interval = f" [{c.low:+.{digits}f}, {c.high:+.{digits}f}]" if c.low is not None else ""
    p = "–" if c.p is None else f"{c.p:.3f}"
    holm_p = "–" if p_adjusted is None else f"{p_adjusted:.3f}"
    return f"{c.delta:+.{digits}f}{interval} | {p} | {holm_p} | {verdict(c, p_adjusted)}"


def verdict(c: Comparison, p_adjusted: float | None, alpha: float = ALPHA) -> str:
    if p_adjusted is None:
        return "no test"
    return "separable" if p_adjusted < alpha else "not separable"


def legend(m: int, alpha: float = ALPHA) -> str:
    """The sentence under a table: what a mark means and how many chance would give."""
    return (f"Δ [bootstrap 95% interval] and the two-sided p of Welch's t-test; ** marks a Holm-adjusted p < {alpha} "
            f"over this table's {m} tests (without the correction, chance alone would mark about {m * alpha:.1f} "
            f"of them); every unmarked cell is not separable at these seeds.")


def _p(p: float) -> str:
    """'<0.001', '=0.004', '=0.21': the comparison and the value, to write after 'p'."""
    if p < 0.001:
        return "<0.001"
    return f"={p:.3f}" if p < 0.01 else f"={p:.2f}"



def welch_from_summary(mean_a: float, sd_a: float, n_a: int, mean_b: float, sd_b: float, n_b: int) -> float | None:
    """Welch's two-sided p from each side's mean, sample sd and count alone (a published mean ± sd table whose
    runs are gone): the same test as `welch` on the values behind them."""
    if n_a < 2 or n_b < 2 or (sd_a == 0 and sd_b == 0):
        return None
    return float(stats.ttest_ind_from_stats(mean_a, sd_a, n_a, mean_b, sd_b, n_b, equal_var=False).pvalue)
