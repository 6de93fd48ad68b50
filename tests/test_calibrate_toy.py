"""experiments/calibrate_toy.py: the next-action oracle reads the turn off the pixels, and the rule that picks each
subtype's intensity, by hand."""
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import calibrate_toy as ct  # noqa: E402


@pytest.fixture(scope="module")
def bench(synthetic_factory):
    return synthetic_factory(n=24, seed=0, num_frames=8, size=56, eval_fraction=0.5, families=["next_action"])


def test_the_next_action_oracle_reads_the_turn_off_the_pixels(bench):
    samples, train = ct.load(bench, ["route_planning"])
    threshold = ct.fit_threshold(bench, train)
    assert 0.1 < threshold < 3.0   # between a straight walk's ~0 px/frame and a turn's few px/frame
    scores = [ct.oracle_score(s, ct.read(s.video)[0], threshold) for s in samples]
    assert np.mean(scores) >= 0.9
    # mirrored clips turn the other way: the oracle's answer flips (Go ahead stays)
    s = next(s for s in samples if "Turn" in dict(o.split(". ", 1) for o in s.options)[s.answer])
    frames = ct.read(s.video)[0]
    assert ct.next_action(frames, threshold) != ct.next_action(frames[:, :, ::-1].copy(), threshold)


def test_the_rule_picks_the_largest_intensity_that_keeps_oracle_format_and_drop():
    etas = [0.2, 0.5, 0.8]
    oracle = {"clean": {"t": 1.0}, "fog@0.2": {"t": 1.0}, "fog@0.5": {"t": 0.9}, "fog@0.8": {"t": 0.7},
              "rain@0.2": {"t": 1.0}, "rain@0.5": {"t": 1.0}, "rain@0.8": {"t": 1.0}}
    model = {"clean": {"format": 1.0, "t": 0.8},
             "fog@0.2": {"format": 1.0, "t": 0.7}, "fog@0.5": {"format": 0.95, "t": 0.5},
             "fog@0.8": {"format": 0.95, "t": 0.5},                   # the oracle fails here (0.7 < 0.8)
             "rain@0.2": {"format": 0.95, "t": 0.7}, "rain@0.5": {"format": 0.85, "t": 0.7},   # format < 0.9
             "rain@0.8": {"format": 0.99, "t": 0.3}}                  # drop 62.5% > 45%
    chosen = ct.choose(oracle, model, etas, ["fog", "rain"], ["t"], oracle["clean"])
    assert chosen == {"fog": 0.5, "rain": 0.2}
    model["rain@0.2"]["format"] = 0.5
    assert ct.choose(oracle, model, etas, ["rain"], ["t"], oracle["clean"]) == {"rain": None}


def test_a_validation_rendering_without_training_clips_takes_its_threshold_from_another(bench, synthetic_factory):
    # every clip held out, as reproduce_v5.py renders its validation split
    val = synthetic_factory(n=8, seed=1, num_frames=8, size=56, eval_fraction=1.0, families=["next_action"])
    with pytest.raises(SystemExit, match="--fit-on"):
        ct.oracles(val, [0.5], ["fog"], ["route_planning"])
    table, threshold = ct.oracles(val, [0.5], ["fog"], ["route_planning"], fit_on=bench)
    assert threshold == ct.fit_threshold(bench, ct.load(bench, ["route_planning"])[1])
    assert table["clean"]["route_planning"] >= 0.75
