"""The official style scores every output as the official scorers do; the reasoning style and the training rewards
depart from them only where answers.EXTENSIONS says so.

tests/data/official_scores/expected.json holds adversarial model outputs (hundreds per benchmark: whitespace,
tags closed and not, number words, missing-value strings, odd numbers, a ground truth of 0, ...) with the scores
the official code gave them: lmms-eval 0.7.2's and 0.7.3's and thinking-in-space's VSI-Bench utils.py,
UrbanVideo-Bench's eval.py run on a CSV as its run.py writes one, Video-R1's eval_bench.py and grpo.py. Its
generate.py, beside it, says at which commits and how; this test only reads the file.
"""
import functools
import json
import math
from collections import Counter
from pathlib import Path

import pytest

from machinery.datasets import answers, data
import eval_pvrbench as ev
import grpo

EXPECTED = Path(__file__).parent / "data" / "official_scores" / "expected.json"
VSI_PEERS = ("lmms-eval-0.7.2", "thinking-in-space", "lmms-eval-0.7.3")
# The departures each peer shows in the reasoning style (evaluation) or in the training rewards: answers.EXTENSIONS'
# names; every difference must carry one of its peer's, and every one listed must occur.
REASON_DIFFERENCES = {
    "lmms-eval-0.7.2": {"answer_tag", "unclosed_tag", "number_words", "ground_truth_zero"},   # (lmms-eval strips
    "thinking-in-space": {"answer_tag", "unclosed_tag", "number_words", "ground_truth_zero"},  # every output first:
    "lmms-eval-0.7.3": {"answer_tag", "unclosed_tag"},                                        # no "whitespace")
    "urbanvideo-eval.py": {"answer_tag", "unclosed_tag", "whitespace"},
    "video-r1-eval_bench": {"unclosed_tag", "number_words", "text_types", "ground_truth_zero"},
}
TRAINING_DIFFERENCES = {
    "video-r1-grpo": {"number_words", "ground_truth_zero", "non_finite"},
    "video-r1-grpo format": {"format_whitespace"},
}


@functools.cache
def expected():
    return json.loads(EXPECTED.read_text())


def sample(source, problem_type, answer, task="t"):
    mc = problem_type == "multiple choice"
    return data.Sample(id="q", video="v.mp4", question="Q?", options=["A. a", "B. b"] if mc else [], answer=answer,
                       problem_type=problem_type, task=task, source=source)


def vsi_sample(case):
    mc = case["question_type"] in data.VSI_MC_TYPES
    return sample("vsibench", "multiple choice" if mc else "regression", case["ground_truth"], case["question_type"])


def scoring_of(peer):
    return "lmms-eval-0.7.3" if peer == "lmms-eval-0.7.3" else "lmms-eval-0.7.2"


def vsi_score(case, peer, style):
    return answers.score_sample(case["output"], vsi_sample(case), style=style, scoring=scoring_of(peer))


def urban_score(case, style):
    return answers.score_sample(case["output"], sample("urbanvideo", "multiple choice", case["answer"]), style=style)


def r1_score(case, style):
    return answers.score_sample(case["output"], sample("video-r1", case["problem_type"], case["ground_truth"]),
                             style=style)


# ----------------------------------------------------------------------------- the data and where it came from
def test_the_expected_scores_name_the_official_code_they_came_from():
    d = expected()
    for name, pin in d["official"].items():
        assert len(pin["commit"]) == 40 and len(pin["sha256"]) == 64 and pin["path"] and pin["repo"], name
    assert set(d["official"]) == {*VSI_PEERS, "urbanvideo-eval.py", "video-r1-eval_bench", "video-r1-grpo"}
    assert {"python", "pandas", "numpy", "torch"} <= set(d["environment"])
    counts = (len(d["vsibench"]["cases"]), len(d["urbanvideo"]["cases"]), len(d["video-r1"]["cases"]))
    assert min(counts) >= 300, counts   # a few hundred adversarial outputs per benchmark


# ----------------------------------------------------------------------------- the official style: 100%
@pytest.mark.parametrize("peer", VSI_PEERS)
def test_official_style_equals_vsibench_scorer_on_every_output(peer):
    cases = [c for c in expected()["vsibench"]["cases"] if peer in c.get("expected", {})]
    wrong = [(c["output"], c["ground_truth"], vsi_score(c, peer, "official"), c["expected"][peer]) for c in cases
             if vsi_score(c, peer, "official") != c["expected"][peer]]
    assert len(cases) >= 700 and wrong == []


def test_a_ground_truth_of_0_where_lmms_eval_raises_scores_our_limit():
    """lmms-eval's MRA divides by the ground truth: ZeroDivisionError, no score. Ours (ground_truth_zero): 1 for a
    prediction of 0, else 0."""
    raising = [c for c in expected()["vsibench"]["cases"] if c.get("raises")]
    assert raising and all(set(c["raises"].values()) == {"ZeroDivisionError"} for c in raising)
    assert all(c["ground_truth"] == "0" for c in raising)
    for c in raising:
        for peer in c["raises"]:
            pred = answers.extract_answer(c["output"], "vsibench", problem_type="regression", style="official",
                                       scoring=scoring_of(peer))
            assert vsi_score(c, peer, "official") == float(float(pred) == 0), (c["output"], peer)


def test_official_style_equals_urbanvideo_eval_py_on_every_output():
    """Per output: whether eval.py drops it, the letter it reads, and whether that letter is right."""
    cases = expected()["urbanvideo"]["cases"]
    for c in cases:
        letter = c["expected"]["letter"]
        assert answers.urban_dropped(c["output"]) == (letter is None), c["output"]
        if letter is not None:
            assert answers.extract_answer(c["output"], "urbanvideo", style="official") == letter, c["output"]
            assert urban_score(c, "official") == c["expected"]["correct"], c["output"]
    assert sum(c["expected"]["letter"] is None for c in cases) >= 20   # every missing-value string and ""


def urban_records(rows, style):
    return [{"task": r["question_category"], "response": r["output"], "error": None, "score": urban_score(r, style)}
            for r in rows]


@pytest.mark.parametrize("part", ["cases", "mix"])
def test_official_style_gives_eval_py_total_and_per_category_figures(part):
    block = expected()["urbanvideo"]
    rows, agg = (block["cases"], block["aggregate"]) if part == "cases" else (block["mix"]["rows"],
                                                                             block["mix"]["aggregate"])
    got = answers.condition_score(urban_records(rows, "official"), "urbanvideo", style="official")
    assert got["overall"] == pytest.approx(agg["total"], rel=1e-12)
    assert got["tasks"] == pytest.approx({k: v["accuracy"] for k, v in agg["categories"].items()}, rel=1e-12)
    assert got["overall_official_rule"] == got["overall"] and got["tasks_official_rule"] == got["tasks"]
    assert got["n"] - got["n_dropped"] == agg["kept"] == sum(v["num"] for v in agg["categories"].values())


def test_the_mix_of_empty_missing_and_whitespace_outputs_in_both_styles():
    """200 answers (120 right), 6 empty, 4 'N/A', 2 whitespace-only: eval.py 120/202. The reasoning style counts
    every output (120/212) and gives eval.py's figure beside it."""
    mix = expected()["urbanvideo"]["mix"]
    assert mix["aggregate"]["total"] == pytest.approx(120 / 202, rel=1e-12)
    got = answers.condition_score(urban_records(mix["rows"], "reason"), "urbanvideo")
    assert got["overall"] == pytest.approx(120 / 212) and got["n_dropped"] == 10
    assert got["overall_official_rule"] == pytest.approx(120 / 202, rel=1e-12)
    assert got["tasks_official_rule"] == pytest.approx({k: v["accuracy"] for k, v in
                                                        mix["aggregate"]["categories"].items()}, rel=1e-12)


@pytest.mark.parametrize("peer", VSI_PEERS)
def test_official_style_gives_lmms_eval_vsibench_aggregation(peer):
    """Per task means, the three rel_direction levels merged unweighted, the unweighted overall: lmms-eval's
    _compute_all_subscores (thinking-in-space's in percent); the outputs it raises on are not in its results."""
    cases = [c for c in expected()["vsibench"]["cases"] if peer in c.get("expected", {})]
    recs = [{"task": c["question_type"], "error": None, "score": vsi_score(c, peer, "official")} for c in cases]
    got = answers.condition_score(recs, "vsibench", style="official")
    agg = expected()["vsibench"]["aggregate"][peer]
    scale = 100.0 if peer == "thinking-in-space" else 1.0
    for task, value in got["tasks"].items():
        metric = "accuracy" if task in data.VSI_MC_TYPES or task == "object_rel_direction" else "MRA:.5:.95:.05"
        assert value * scale == pytest.approx(agg[f"{task}_{metric}"], rel=1e-12), task
    assert got["overall"] * scale == pytest.approx(agg["overall"], rel=1e-12)
    assert len(got["tasks"]) == 8


def test_official_style_equals_video_r1_eval_bench_on_every_output():
    cases = expected()["video-r1"]["cases"]
    wrong = [(c["output"], c["problem_type"], c["ground_truth"], r1_score(c, "official"),
              c["expected"]["video-r1-eval_bench"]) for c in cases
             if r1_score(c, "official") != c["expected"]["video-r1-eval_bench"]]
    assert len(cases) >= 600 and wrong == []


# ----------------------------------------------------------------------------- the documented departures
def explained(rows, allowed):
    """rows: (agrees, classes). The differences each carry a documented departure; the departures that occur."""
    unexplained, seen = [], Counter()
    for agrees, classes, what in rows:
        if agrees:
            continue
        why = set(classes) & allowed
        seen.update(why)
        if not why:
            unexplained.append(what)
    return unexplained, set(seen)


def reason_rows(peer):
    d = expected()
    if peer in VSI_PEERS:
        return [(vsi_score(c, peer, "reason") == c["expected"][peer], c["classes"], c["output"])
                for c in d["vsibench"]["cases"] if peer in c.get("expected", {})]
    if peer == "urbanvideo-eval.py":
        return [(urban_score(c, "reason") == c["expected"]["correct"], c["classes"], c["output"])
                for c in d["urbanvideo"]["cases"] if c["expected"]["letter"] is not None]
    return [(r1_score(c, "reason") == c["expected"][peer], c["classes"], c["output"]) for c in d["video-r1"]["cases"]]


@pytest.mark.parametrize("peer", sorted(REASON_DIFFERENCES))
def test_reasoning_style_departs_only_where_documented(peer):
    allowed = REASON_DIFFERENCES[peer]
    assert all("reason" in answers.EXTENSIONS[name][0] for name in allowed)
    unexplained, seen = explained(reason_rows(peer), allowed)
    assert unexplained == [] and seen == allowed


def test_training_rewards_depart_from_grpo_py_only_where_documented():
    cases = expected()["video-r1"]["cases"]
    rows = [(grpo.accuracy_reward(c["output"], c["ground_truth"], c["problem_type"], "video-r1")
             == c["expected"]["video-r1-grpo"], c["classes"], c["output"]) for c in cases]
    fmt = [(grpo.format_reward(c["output"]) == c["expected"]["video-r1-grpo"], c["classes"], c["output"])
           for c in expected()["video-r1"]["format"]]
    for name, got in (("video-r1-grpo", rows), ("video-r1-grpo format", fmt)):
        allowed = TRAINING_DIFFERENCES[name]
        assert all("training" in answers.EXTENSIONS[k][0] for k in allowed)
        unexplained, seen = explained(got, allowed)
        assert unexplained == [] and seen == allowed, name


def test_urbanvideo_dropped_outputs_count_in_the_reasoning_styles_overall_only():
    """urbanvideo_dropped: the same outputs are dropped by eval.py's rule in both styles; only the reasoning style's
    `overall` also counts them (as 0)."""
    rows = expected()["urbanvideo"]["cases"]
    reason = answers.condition_score(urban_records(rows, "reason"), "urbanvideo")
    official = answers.condition_score(urban_records(rows, "official"), "urbanvideo", style="official")
    assert reason["n_dropped"] == official["n_dropped"] == len(rows) - expected()["urbanvideo"]["aggregate"]["kept"]
    kept = len(rows) - reason["n_dropped"]
    assert reason["overall"] == pytest.approx(reason["overall_official_rule"] * kept / len(rows))
    assert "urbanvideo_dropped" in ev.scoring_block("reason")["extensions"]
    assert not math.isclose(reason["overall"], official["overall"])
