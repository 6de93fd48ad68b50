"""benchmarks/powered.py: reproduction v5's statistics against values worked by hand."""
import math
import random
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
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
