"""experiments/powered.py: reproduction v5's statistics against values worked by hand."""
import math
import random
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import powered  # noqa: E402


def test_two_way_se_by_hand():
    # rows (seeds) 1 and 3, columns (clips) 1 and 3: V_seed = var(1, 3) / 2 = 1, V_clip = 1, V_cell = var(0, 2, 2, 4)
    # / 4 = (8 / 3) / 4 = 2 / 3, V = 1 + 1 - 2 / 3 = 4 / 3
    mean, se = powered.two_way_se([[0, 2], [2, 4]])
    assert mean == 2 and se == pytest.approx(math.sqrt(4 / 3))
    # only the seeds differ: V = 0.25 + 0 - 1 / 6 is below the seed term, which is kept (never below a one-way term)
    mean, se = powered.two_way_se([[1, 2], [3, 2]])
    assert mean == 2 and se == pytest.approx(0.5)
    with pytest.raises(ValueError):
        powered.two_way_se([[1, 2], [3]])


def test_clustering_by_clip_is_wider_than_items_taken_as_independent():
    """Questions of one clip share its video: 40 clips x 12 items whose scores move together per clip."""
    rng = random.Random(0)
    clip_effects = [rng.gauss(0, 0.05) for _ in range(40)]
    items = [[e + rng.gauss(0, 0.01) for _ in range(12)] for e in clip_effects]
    per_clip = [[statistics.fmean(row) for row in items]] * 2   # two seeds alike: the clip term alone
    _, clustered = powered.two_way_se(per_clip)
    flat = [x for row in items for x in row]
    naive = statistics.stdev(flat) / math.sqrt(len(flat))
    assert clustered > 2.5 * naive


def test_mde_and_seeds_needed_by_hand():
    assert powered.mde(1.0) == pytest.approx(2.8015852)
    # seed means +0.01 and -0.01 (variance 0.0002), clips alike: MDE(S) = 2.8016 sqrt(0.0002 / S) <= 0.01 first at
    # S = 16 (0.009905; at 15: 0.01023)
    seeds, planned = powered.seeds_needed([[0.01, 0.01], [-0.01, -0.01]])
    assert seeds == 16 and planned == pytest.approx(2.8015852 * math.sqrt(0.0002 / 16))
    # a clip term of its own above the target: no number of seeds reaches it
    seeds, planned = powered.seeds_needed([[0.05, -0.05], [0.05, -0.05]])
    assert seeds is None and planned > 0.01


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04: 3 x 0.01 = 0.03, 2 x 0.03 = 0.06, max(0.06, 0.04) = 0.06
    rejected, adjusted = powered.holm([0.01, 0.04, 0.03])
    assert rejected == [True, False, False] and adjusted == pytest.approx([0.03, 0.06, 0.06])
    assert powered.holm([0.5, 0.9])[1] == [1.0, 1.0]


def test_p_value_and_verdicts():
    assert powered.p_value(1.959964, 1.0) == pytest.approx(0.05, abs=1e-6)
    assert powered.p_value(0.0, 0.0) == 1.0
    assert powered.verdict(0.02, 0.005, significant=True) == "holds"
    assert powered.verdict(-0.02, 0.005, significant=True) == "does not hold"
    assert powered.verdict(0.001, 0.003, significant=False) == "does not hold"     # MDE 0.0084: powered null
    assert powered.verdict(0.001, 0.004, significant=False) == "inconclusive"      # MDE 0.0112
    assert powered.verdict(0.02, 0.005, significant=True, informative=False) == "uninformative"


def test_t_based_p_and_mde_with_three_seeds_by_hand():
    """Three seeds, one value each (a run's cost): 1, 2, 3. Mean 2, sd 1, SE 1 / sqrt(3), t = 2 sqrt(3) = 3.464 at
    G - 1 = 2 degrees of freedom. Student's t with 2 df has the closed form F(t) = 1/2 + t / (2 sqrt(2 + t^2)), so
    the two-sided p = 1 - t / sqrt(2 + t^2) = 1 - sqrt(12 / 14) = 0.07418: not significant at 5%, where the normal
    approximation's p = erfc(3.464 / sqrt(2)) = 0.00053 is."""
    m = [[1.0], [2.0], [3.0]]
    mean, se = powered.two_way_se(m)
    assert (mean, se) == (2.0, pytest.approx(1 / math.sqrt(3)))
    assert powered.degrees_of_freedom(m) == 2
    assert powered.p_value_t(mean, se, 2) == pytest.approx(1 - math.sqrt(6 / 7), rel=1e-9)   # 0.07418
    assert powered.p_value(mean, se) == pytest.approx(0.000532, abs=1e-6)
    # the MDE: t_{0.975, 2} from F(t) = 0.975: t^2 = 0.9025 (2 + t^2), t = sqrt(1.805 / 0.0975) = 4.3027; t_{0.8, 2}:
    # t^2 = 0.36 (2 + t^2), t = sqrt(1.125) = 1.0607: 5.3633 SE against the normal's 2.8016 SE
    assert powered.mde_t(1.0, 2) == pytest.approx(math.sqrt(1.805 / 0.0975) + math.sqrt(1.125), rel=1e-9)
    # the same verdict rule: with t the claim is not significant, and the MDE 5.3633 / sqrt(3) = 3.10 is above a
    # target of 1: inconclusive; the normal approximation calls it significant: holds
    assert powered.verdict(mean, se, significant=powered.p_value_t(mean, se, 2) < 0.05, target=1.0, df=2) == \
        "inconclusive"
    assert powered.verdict(mean, se, significant=powered.p_value(mean, se) < 0.05, target=1.0) == "holds"
    # a target the t-based MDE reaches: not significant, yet detectable -> does not hold
    assert powered.verdict(0.1, se, significant=False, target=3.2, df=2) == "does not hold"


def test_degrees_of_freedom_are_the_smaller_cluster_count_less_one():
    assert powered.degrees_of_freedom([[0.0] * 120] * 6) == 5     # 6 seeds x 120 clips: G = 6
    assert powered.degrees_of_freedom([[0.0, 1.0]] * 3) == 1      # 3 seeds x 2 clips: G = 2
    assert powered.degrees_of_freedom([[0.0]] * 6) == 5           # a cost per seed: not clustered by clip
    assert powered.p_value_t(1.0, 0.1, 0) == 1.0 and powered.mde_t(1.0, 0) is None   # one seed: nothing to test
