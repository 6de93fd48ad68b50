"""Reproduction v5's statistics, fixed before its first run: a claim is a difference between two rows of the
table, paired by seed (every row of a seed shares its data order and corruption specs) and by question (every
row is evaluated on the same questions).

- **Standard error, clustered two ways.** The difference of two rows' Avg. is the mean over a seeds x clips
  matrix D (each cell: that seed's difference on that clip's questions, Table 2's Avg. restricted to the clip).
  Seeds (training randomness) and clips (the benchmark's draw) are both samples, and the items of one clip are
  not independent (they share a video). The variance of the mean is clustered by seed and by clip (Cameron,
  Gelbach and Miller 2011): V = V_seed + V_clip - V_cell, each the one-way cluster-robust variance with the
  small-sample factor G / (G - 1), and never below the larger one-way term.
- **Minimum detectable difference** at a two-sided 5% test and 80% power: (z_0.975 + z_0.8) x SE = 2.80 SE.
- **Seeds from a pilot.** The seed term shrinks as 1 / seeds, the clip term does not: the number of seeds is the
  smallest whose planned MDE, sqrt(var(seed means) / S + V_clip) x 2.80, is at most the target.
- **Holm's step-down correction** over the secondary claims' two-sided p-values (normal approximation).
- **Verdicts.** holds: significant with the predicted sign; does not hold: significant with the other sign, or
  not significant although the design could detect the target difference (MDE <= target); inconclusive: not
  significant and the MDE above the target; uninformative: the setup cannot fail the check (set by the claim).

The rules above (committed before v5's first run) take p and the MDE from the normal distribution. With few
clusters that is anti-conservative: a cluster-robust t statistic is referred to Student's t with G - 1 degrees of
freedom, G the smaller number of clusters (Cameron and Miller 2015, "A Practitioner's Guide to Cluster-Robust
Inference"); here G is the number of seeds (a seeds x clips matrix has far more clips than seeds), so
v5's 6 seeds give 5 degrees of freedom and its ablations' 3 seeds 2. `degrees_of_freedom`, `p_value_t` and `mde_t`
are that reading (added after v5's runs; scipy's t distribution); the normal ones stay, as pre-registered.

Every function has a hand-worked test (tests/test_powered.py).
"""
from __future__ import annotations

import math
import statistics

Z_ALPHA = 1.959963984540054   # two-sided 5%
Z_POWER = 0.8416212335729143  # 80% power
ALPHA = 0.05
TARGET_MDE = 0.01             # one point of Avg. (issue: the primary claim decided at an MDE <= 1 point)


def _var(xs):
    return statistics.variance(xs) if len(xs) > 1 else 0.0


def two_way_se(matrix):
    """(mean, SE) of the mean of `matrix` (a list of rows: seeds x clips, no missing cells), clustered by row
    and by column."""
    s, c = len(matrix), len(matrix[0])
    if s == 0 or c == 0 or any(len(row) != c for row in matrix):
        raise ValueError("two_way_se wants a full seeds x clips matrix")
    cells = [x for row in matrix for x in row]
    mean = statistics.fmean(cells)
    v_seed = _var([statistics.fmean(row) for row in matrix]) / s
    v_clip = _var([statistics.fmean(row[j] for row in matrix) for j in range(c)]) / c
    v_cell = _var(cells) / (s * c)
    return mean, math.sqrt(max(v_seed + v_clip - v_cell, v_seed, v_clip))


def mde(se):
    """The smallest true difference a two-sided 5% test detects with 80% power, given its SE."""
    return (Z_ALPHA + Z_POWER) * se


def seeds_needed(pilot, target=TARGET_MDE, most=40):
    """The smallest number of seeds whose planned MDE is at most `target`, from a pilot's seeds x clips matrix of
    differences: V(S) = var(seed means) / S + V_clip (the clip term as the pilot measured it, which does not shrink
    with seeds). Returns (seeds, the planned MDE at that number); (None, the MDE at `most`) if none up to `most`
    reaches the target."""
    s, c = len(pilot), len(pilot[0])
    between = _var([statistics.fmean(row) for row in pilot])
    v_clip = _var([statistics.fmean(row[j] for row in pilot) for j in range(c)]) / c
    for n in range(2, most + 1):
        planned = mde(math.sqrt(between / n + v_clip))
        if planned <= target:
            return n, planned
    return None, mde(math.sqrt(between / most + v_clip))


def p_value(difference, se):
    """Two-sided p of a difference and its SE (normal approximation); 1 when the SE is 0 and the difference 0."""
    if se <= 0:
        return 0.0 if difference else 1.0
    return math.erfc(abs(difference) / se / math.sqrt(2))


def degrees_of_freedom(matrix):
    """G - 1 for a seeds x clips matrix, G the smaller number of clusters: min(seeds, clips), or the seeds alone
    when there is one column (a run's cost: not clustered by clip)."""
    s, c = len(matrix), len(matrix[0])
    return (min(s, c) if c > 1 else s) - 1


def p_value_t(difference, se, df):
    """Two-sided p of a difference and its cluster-robust SE from Student's t with `df` degrees of freedom; 1 when
    df < 1 (one cluster: no variance to test against) or when the SE and the difference are 0."""
    if df < 1:
        return 1.0
    if se <= 0:
        return 0.0 if difference else 1.0
    from scipy import stats
    return float(2 * stats.t.sf(abs(difference) / se, df))


def mde_t(se, df):
    """mde() with Student's t quantiles at `df` degrees of freedom: (t_{0.975, df} + t_{0.8, df}) x SE; None when
    df < 1."""
    if df < 1:
        return None
    from scipy import stats
    return float((stats.t.ppf(1 - ALPHA / 2, df) + stats.t.ppf(0.8, df)) * se)


def holm(pvalues, alpha=ALPHA):
    """Holm's step-down procedure: whether each hypothesis is rejected at family-wise level `alpha`, and each
    adjusted p-value (monotone; capped at 1), in the order given."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return [a <= alpha for a in adjusted], adjusted


def verdict(difference, se, *, significant, target=TARGET_MDE, informative=True, df=None):
    """holds / does not hold / inconclusive / uninformative for a claim predicting difference > 0 (module
    docstring); `significant`: the test's decision (Holm's for a secondary claim); `df`: the MDE from Student's t
    at these degrees of freedom (mde_t) instead of the normal distribution."""
    if not informative:
        return "uninformative"
    if significant:
        return "holds" if difference > 0 else "does not hold"
    detectable = mde(se) if df is None else mde_t(se, df)
    return "does not hold" if detectable is not None and detectable <= target else "inconclusive"
