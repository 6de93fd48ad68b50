"""experiments/measure_v5.py against values worked by hand: Table 2's figures per clip, the drop's pseudo-values,
the curriculum per window, the re-evaluation outcomes."""
import json
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import measure_v5 as m  # noqa: E402


def test_table2_per_clip_and_whole(tmp_path):
    # clip a: clean 1; dusk 0 and night 1 (lighting .5), fog 1 (weather 1) -> Avg .75
    # clip b: clean 0; dusk 1, night 1 (lighting 1), fog 0 (weather 0)   -> Avg .5
    rows = [("a", "clean", 1), ("a", "dusk", 0), ("a", "night", 1), ("a", "fog", 1),
            ("b", "clean", 0), ("b", "dusk", 1), ("b", "night", 1), ("b", "fog", None)]
    (tmp_path / "20260101_000000_samples_pvrbench_synthetic.jsonl").write_text(
        "".join(json.dumps({"video_id": v, "condition": c, "score": s}) + "\n" for v, c, s in rows))
    e = m.evaluation(tmp_path)
    assert e["clips"] == {"a": [1.0, 0.75], "b": [0.0, 0.5]}
    # whole: clean .5; lighting (dusk .5, night 1) .75, weather .5 -> Avg .625, drop 1 - .625 / .5 = -.25
    assert e["orig"] == 0.5 and e["avg"] == 0.625 and e["drop"] == pytest.approx(-0.25)
    assert e["avg"] == statistics.fmean(a for _, a in e["clips"].values())


def test_drop_pseudo_values_average_to_the_drop():
    clips = {"a": [0.9, 0.6], "b": [0.8, 0.7], "c": [1.0, 0.5]}
    pseudo = m.drop_pseudo(clips)
    orig, avg = statistics.fmean(o for o, _ in clips.values()), statistics.fmean(a for _, a in clips.values())
    assert statistics.fmean(pseudo.values()) == pytest.approx(1 - avg / orig)   # 1 - .6 / .9
    # clip a: r = 2/3, 1 - (2/3 + (.6 - 2/3 * .9) / .9) = 1/3
    assert pseudo["a"] == pytest.approx(1 / 3)


def test_curriculum_windows_and_reevaluation_by_hand():
    recs = [{"step": i + 1, "samples": s, "discarded": d, "deferred": f, "selected": s - d - f, "buffer_size": b}
            for i, (s, d, f, b) in enumerate([(5, 1, 0, 0), (4, 0, 0, 2), (6, 1, 1, 1), (4, 0, 0, 3)])]
    w = m.curriculum(recs, window=2)   # the buffer: its mean size over the window's steps
    assert w[0] == {"steps": [1, 2], "easy_discarded": 1 / 9, "hard_deferred": 0.0, "rho": 8 / 9, "buffer": 1}
    assert w[1] == {"steps": [3, 4], "easy_discarded": 0.1, "hard_deferred": 0.1, "rho": 0.8, "buffer": 2}
    out = m.reevaluation({"reevaluations": 10, "promoted": 2, "evicted_easy": 3, "evicted_n_max": 1})
    assert out == {"promoted": 2, "evicted_easy": 3, "evicted_nmax": 1, "kept": 4, "reevaluations": 10}


def test_rho_counts_fresh_samples_in_both_record_formats():
    # one step: 5 fresh samples (1 discarded, 1 deferred, 3 trained) and 2 promotions from the buffer, trained
    new = {"step": 1, "samples": 5, "selected": 3, "trained": 5, "promoted_trained": 2, "discarded": 1, "deferred": 1,
           "buffer_size": 4}
    # the same step as v5's runs logged it: the promotions among the samples and the selected, no `trained`
    old = {"step": 1, "samples": 7, "selected": 5, "promoted_trained": 2, "discarded": 1, "deferred": 1,
           "buffer_size": 4}
    for rec in (new, old):
        assert m.counts(rec) == (5, 3, 2)
        assert m.curriculum([rec], window=1)[0] == {"steps": [1, 1], "easy_discarded": 0.2, "hard_deferred": 0.2,
                                                    "rho": 0.6, "buffer": 4}   # (old reading: 5 / 7 = 0.714)


def test_training_reads_rho_both_ways(tmp_path):
    recs = [{"stage": "rl", "step": 1, "samples": 4, "selected": 2, "trained": 2, "promoted_trained": 0, "updates": 1,
             "sec_step": 1.0, "flat_groups": 0},
            {"stage": "rl", "step": 2, "samples": 2, "selected": 1, "trained": 3, "promoted_trained": 2, "updates": 2,
             "sec_step": 3.0, "flat_groups": 1}]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "summary.json").write_text(json.dumps({"buffer": {"reevaluations": 2, "promoted": 2}}))
    t = m.training(tmp_path, window=2)
    # seen: 6 fresh + 2 promotions; trained 3 fresh + 2; rho (v5's reading) 5 / 8, rho_fresh 3 / 6
    assert (t["samples_seen"], t["trained_groups"], t["promoted_trained"]) == (8, 5, 2)
    assert t["rho"] == 5 / 8 and t["rho_fresh"] == 0.5 and t["curriculum"][0]["rho"] == 0.5
    assert t["zero_variance_share"] == 1 / 5 and t["sec_step"] == 2.0 and t["updates"] == 2
