"""Statistics of comparisons between algorithms: pure functions on numbers.

- Paired tests against a baseline (`paired_test`): the Wilcoxon signed-rank test (exact
  distribution) on the paired differences when there are WILCOXON_MIN_N of them or more, else a
  paired t-test. With n pairs the smallest two-sided p the signed-rank test can give is
  2 / 2^n, which first falls under 0.05 at n = 6: with DomainBed's three trials it could never
  reject anything, so a small n gets the t-test (which assumes roughly normal differences). That
  rule is `auto`; `t` and `wilcoxon` name one test for every n (PAIRED_TESTS). Under Holm's
  adjustment over m tests the signed-rank floor becomes m * 2 / 2^n: at n = 10 no family of 26 or
  more tests can reject, whatever the gains; the t-test has no floor.
- Holm's step-down adjustment of the p-values of one table's comparisons (`holm`).
- Across datasets (Demšar, JMLR 2006): average ranks (`average_ranks`), the Friedman test with
  Iman and Davenport's F statistic and the Nemenyi critical difference (`friedman_nemenyi`).
- Over runs (Agarwal et al., NeurIPS 2021, rliable): the mean and the interquartile mean of all
  runs' scores, with stratified bootstrap percentile intervals (`stratified_bootstrap`): each
  dataset's runs are resampled with replacement on their own, so every replicate keeps every dataset.

The tests and distributions are scipy.stats'; written here are the resampling, Holm's loop and
Friedman's chi2_F from the average ranks (Demšar's formula: scipy's friedmanchisquare corrects for
ties, which Demšar's worked example does not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from domaingen.errors import DomaingenError

WILCOXON_MIN_N = 6  # 2 / 2**6 = 0.031: the fewest pairs whose exact signed-rank test can reach p < 0.05
ALPHA = 0.05
TEST_NAMES = {"wilcoxon": "Wilcoxon signed-rank test (exact, two-sided)", "t": "paired t-test (two-sided)"}
PAIRED_TESTS = ("auto", "t", "wilcoxon")  # auto: wilcoxon with WILCOXON_MIN_N pairs or more, else t
TEST_RULE = (f"two-sided paired test of the differences: the Wilcoxon signed-rank test (exact) with "
             f"{WILCOXON_MIN_N} pairs or more, else a paired t-test (with n pairs the signed-rank test's smallest p "
             f"is 2/2^n, under 0.05 only from n = {WILCOXON_MIN_N}); p adjusted by Holm's step-down method over "
             f"the table's tests; * marks an adjusted p below {ALPHA:g}")


@dataclass(frozen=True)
class PairedTest:
    """A paired test's outcome: `test` ('wilcoxon', 't' or '' when none could be made), its statistic,
    its p-value, the number of pairs, and `reason`, one line on why no test was made."""

    test: str
    statistic: float
    p_value: float
    n: int
    reason: str = ""

    @property
    def made(self) -> bool:
        return bool(self.test)


def check_paired_test(test: str) -> None:
    """One line refusing a paired test that is not one of PAIRED_TESTS."""
    if test not in PAIRED_TESTS:
        raise DomaingenError(f"paired test {test!r} is not one of {', '.join(PAIRED_TESTS)}")


def paired_test(differences: Sequence[float], test: str = "auto") -> PairedTest:
    """The two-sided paired test of `differences` (A - B per pair) against zero: `test` is one of
    PAIRED_TESTS (see the module docstring).

    Fewer than two pairs, or differences with no spread, give no test (`reason` says why)."""
    check_paired_test(test)
    d = np.asarray(differences, dtype=float)
    n = len(d)
    if n < 2:
        return PairedTest("", math.nan, math.nan, n, f"no test: {n} paired trial{'' if n == 1 else 's'}, a paired "
                                                      "test needs 2 or more")
    # differences of accuracies equal up to rounding (0.3 - 0.2 against 0.4 - 0.3) count as equal
    tolerance = 1e-12 * max(1.0, float(np.abs(d).max()))
    d = np.where(np.abs(d) <= tolerance, 0.0, d)
    if np.all(d == 0):
        return PairedTest("", math.nan, math.nan, n, f"no test: all {n} paired differences are 0")
    if test == "wilcoxon" or (test == "auto" and n >= WILCOXON_MIN_N):
        # zsplit: a zero difference's rank counts half for each sign (Demšar 2006, Section 3.1.3)
        result = stats.wilcoxon(d, zero_method="zsplit", method="exact" if np.all(d != 0) else "auto")
        return PairedTest("wilcoxon", float(result.statistic), float(result.pvalue), n)
    if np.ptp(d) <= tolerance:
        return PairedTest("", math.nan, math.nan, n, f"no test: all {n} paired differences are equal, "
                                                      "no spread for a t-test")
    result = stats.ttest_1samp(d, 0.0)
    return PairedTest("t", float(result.statistic), float(result.pvalue), n)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order; NaN stays NaN and counts no test.

    Sorted ascending, the i-th smallest of m p-values (i from 0) is multiplied by m - i; each adjusted
    value is at least the one before it (monotone), and at most 1."""
    p = np.asarray(p_values, dtype=float)
    tested = np.flatnonzero(~np.isnan(p))
    adjusted = np.full(len(p), math.nan)
    m, running = len(tested), 0.0
    for i, at in enumerate(tested[np.argsort(p[tested], kind="stable")]):
        running = max(running, min(1.0, (m - i) * p[at]))
        adjusted[at] = running
    return adjusted.tolist()


def average_ranks(scores: pd.DataFrame) -> pd.Series:
    """Rows: datasets; columns: algorithms; higher is better. Each dataset ranks its algorithms 1 (best)
    to k, ties sharing the average of their ranks; the mean rank of each algorithm over datasets."""
    return scores.rank(axis=1, ascending=False, method="average").mean(axis=0)


@dataclass(frozen=True)
class Friedman:
    """Demšar's omnibus test and post-hoc critical difference for k algorithms on N datasets."""

    ranks: pd.Series  # average rank per algorithm
    n_datasets: int
    chi2: float  # Friedman's chi-square statistic chi2_F (Demšar's equation, no tie correction)
    p_chi2: float
    f_statistic: float  # Iman and Davenport's F_F = (N-1) chi2 / (N(k-1) - chi2)
    p_f: float  # against F with k-1 and (k-1)(N-1) degrees of freedom
    q_alpha: float  # the Nemenyi test's critical value: studentized range quantile / sqrt(2)
    critical_difference: float  # CD = q_alpha sqrt(k(k+1) / (6N))
    alpha: float = ALPHA
    groups: list[list[str]] = field(default_factory=list)  # maximal sets of algorithms no further apart than CD


def friedman_nemenyi(scores: pd.DataFrame, alpha: float = ALPHA) -> Friedman:
    """Friedman's test of `scores` (rows: datasets, columns: algorithms, higher is better), Iman and
    Davenport's F and the Nemenyi critical difference at `alpha` (Demšar 2006, Section 3.2.2).

    Needs at least two datasets and three algorithms (scipy's Friedman test needs k >= 3); the caller
    checks and says so."""
    n, k = scores.shape
    ranks = average_ranks(scores)
    # Demšar's chi2_F from the average ranks, without the correction for ties that
    # scipy.stats.friedmanchisquare applies (the two agree when no dataset ties two algorithms)
    chi2 = 12 * n / (k * (k + 1)) * (float((ranks ** 2).sum()) - k * (k + 1) ** 2 / 4)
    p_chi2 = float(stats.chi2.sf(chi2, k - 1))
    denominator = n * (k - 1) - chi2
    f_stat = (n - 1) * chi2 / denominator if denominator > 0 else math.inf
    p_f = float(stats.f.sf(f_stat, k - 1, (k - 1) * (n - 1))) if math.isfinite(f_stat) else 0.0
    q_alpha = float(stats.studentized_range.ppf(1 - alpha, k, np.inf) / math.sqrt(2))
    cd = q_alpha * math.sqrt(k * (k + 1) / (6 * n))
    return Friedman(ranks, n, float(chi2), float(p_chi2), float(f_stat), p_f, q_alpha, cd, alpha,
                    cliques(ranks, cd))


def cliques(ranks: pd.Series, cd: float) -> list[list[str]]:
    """The maximal runs of algorithms, in rank order, whose average ranks lie within `cd` of each other
    (the bars of a critical-difference diagram); single algorithms are left out."""
    ordered = ranks.sort_values(kind="stable")
    names, values = list(ordered.index), ordered.to_numpy()
    runs: list[tuple[int, int]] = []
    for i in range(len(values)):
        j = i
        while j + 1 < len(values) and values[j + 1] - values[i] <= cd + 1e-12:
            j += 1
        if j > i and not any(a <= i and j <= b for a, b in runs):
            runs.append((i, j))
    return [names[a:b + 1] for a, b in runs]


def iqm(scores: np.ndarray) -> float:
    """The interquartile mean of all scores: the mean of the middle half (scipy's 25% trimmed mean), as rliable."""
    return float(stats.trim_mean(np.asarray(scores, dtype=float).ravel(), proportiontocut=0.25))


AGGREGATES: dict[str, Callable[[np.ndarray], float]] = {"mean": lambda s: float(np.mean(s)), "IQM": iqm}


@dataclass(frozen=True)
class Interval:
    """A point estimate of an aggregate over runs and its bootstrap percentile interval."""

    estimate: float
    low: float
    high: float


def stratified_bootstrap(runs: Mapping[str, Sequence[float]], aggregate: Callable[[np.ndarray], float],
                         reps: int = 2000, confidence: float = 0.95, seed: int = 0) -> Interval:
    """`aggregate` of every run's score pooled over the strata (datasets), with a percentile interval
    from `reps` stratified bootstrap replicates: each stratum's runs resampled with replacement, as many
    as it has (rliable's StratifiedBootstrap, whose runs may differ in number between strata here)."""
    strata = [np.asarray(v, dtype=float) for v in runs.values() if len(v)]
    pooled = np.concatenate(strata)
    rng = np.random.default_rng(seed)
    replicates = np.empty(reps)
    for r in range(reps):
        replicates[r] = aggregate(np.concatenate([s[rng.integers(0, len(s), len(s))] for s in strata]))
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return Interval(aggregate(pooled), float(low), float(high))
