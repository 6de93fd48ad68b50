"""diagnostics.py: the collapse diagnostics of an evaluation, against hand-worked values."""
import math

import pytest

from machinery.datasets.data import Sample
from machinery.eval import diagnostics as dg


def sample(i, answer, task="count", problem_type="numerical", options=()):
    return Sample(id=f"q{i}", video="v.mp4", question="?", options=list(options), answer=answer,
                  problem_type=problem_type, task=task, source="synthetic")


def rec(i, cond, pred, score, task="count"):
    return {"doc_id": f"q{i}", "condition": cond, "task": task, "score": score, "filtered_resps": pred, "error": None}


COUNT = [sample(1, "3"), sample(2, "3"), sample(3, "4"), sample(4, "2")]


def test_best_constant_margin_and_its_standard_error_by_hand():
    # a model right on every clean question; the best constant is "3" (2 of 4)
    recs = [rec(i, "clean", s.answer, 1.0) for i, s in enumerate(COUNT, 1)]
    b = dg.source_diagnostics(recs, COUNT)["tasks"]["count"]["clean"]
    assert b["best_constant"] == "3" and b["constant_accuracy"] == 0.5 and b["accuracy"] == 1.0
    # per-question differences 0, 0, 1, 1: mean 0.5, sample variance 1/3, SE sqrt(1/3 / 4)
    assert b["margin"] == 0.5 and b["se"] == pytest.approx(math.sqrt(1 / 12))
    assert b["collapsed"]   # 0.5 <= 2 x 0.289: four questions cannot tell it from the constant
    assert b["entropy"] == pytest.approx(1.5) and b["entropy_truth"] == pytest.approx(1.5)   # {3: 1/2, 4: 1/4, 2: 1/4}


def test_a_constant_answer_is_flagged_and_a_competent_model_is_not():
    many = [sample(i, "3" if i % 2 else "2" if i % 4 == 0 else "4") for i in range(60)]   # 3 half of the time
    const = [rec(i, "clean", "3", float(s.answer == "3")) for i, s in enumerate(many)]
    b = dg.source_diagnostics(const, many)["tasks"]["count"]["clean"]
    assert b["margin"] == 0.0 and b["se"] == 0.0 and b["collapsed"]
    assert b["entropy"] == 0.0 and b["top_answer"] == "3" and b["top_share"] == 1.0
    good = [rec(i, "clean", s.answer if i % 10 else "9", float(i % 10 != 0)) for i, s in enumerate(many)]
    g = dg.source_diagnostics(good, many)["tasks"]["count"]["clean"]
    assert g["accuracy"] == 0.9 and g["constant_accuracy"] == 0.5 and not g["collapsed"]
    diag = dg.collapse({"synthetic": const}, {"synthetic": many})
    assert len(diag["warnings"]) == 1 and "synthetic/count (clean)" in diag["warnings"][0]
    assert dg.warning_line(diag).startswith("Collapse warning: 1 task") and "'3'" in dg.warning_line(diag)
    assert dg.warning_line(dg.collapse({"synthetic": good}, {"synthetic": many})) == ""


def test_multiple_choice_constants_include_every_option_letter():
    opts = ["A. left", "B. right", "C. up"]
    mc = [sample(i, "B", task="dir", problem_type="multiple choice", options=opts) for i in range(3)]
    mc.append(sample(3, "C", task="dir", problem_type="multiple choice", options=opts))
    letter, scores = dg.best_constant(mc)
    assert letter == "B" and scores == [1.0, 1.0, 1.0, 0.0]
    assert dg.best_constant([sample(0, "a cat", problem_type="free-form")]) is None   # no meaning for text


def test_perturbed_scores_are_a_questions_mean_over_its_subtypes():
    recs = [rec(1, "fog", "3", 1.0), rec(1, "rain", "2", 0.0), rec(2, "fog", "3", 1.0), rec(2, "rain", "3", 1.0)]
    b = dg.task_block(recs, COUNT[:2], perturbed=True)
    assert b["n"] == 2 and b["accuracy"] == 0.75 and b["constant_accuracy"] == 1.0 and b["margin"] == -0.25
    assert dg.task_block(recs, COUNT[:2], perturbed=False) is None   # no clean records


def test_one_answer_share_and_format_rate():
    recs = [rec(1, "clean", "3", 1.0), rec(1, "fog", "3", 1.0),      # the task's top answer, and right: robust
            rec(2, "clean", "3", 1.0), rec(2, "fog", "two", 0.0),    # two answers
            rec(3, "clean", "4", 1.0),                                # asked once: not counted
            rec(4, "clean", "blah", 0.0), rec(4, "fog", "blah", 0.0)]  # one answer, but not the task's top one
    d = dg.source_diagnostics(recs, COUNT)
    assert d["one_answer_share"] == 0.0
    stuck = recs + [rec(5, "clean", "3", 0.0), rec(5, "fog", "3", 0.0)]   # "3" everywhere, the truth is another
    assert dg.source_diagnostics(stuck, COUNT + [sample(5, "2")])["one_answer_share"] == pytest.approx(1 / 4)
    # one answer to every question of a balanced three-way task: the two thirds whose truth differs
    opts = ["A. l", "B. r", "C. s"]
    mc = [sample(i, "ABC"[i % 3], task="dir", problem_type="multiple choice", options=opts) for i in range(30)]
    const = [rec(i, c, "A", float(i % 3 == 0), task="dir") for i in range(30) for c in ("clean", "fog")]
    assert dg.source_diagnostics(const, mc)["one_answer_share"] == pytest.approx(2 / 3)
    assert d["format_rate"] == {"clean": 0.75, "fog": pytest.approx(2 / 3)}   # "two" is a number word
    opts = ["A. x", "B. y"]
    mc = sample(9, "A", problem_type="multiple choice", options=opts)
    assert dg.has_form("b", mc) and not dg.has_form("C", mc) and not dg.has_form(None, mc)
    assert dg.has_form("3.5", COUNT[0]) and not dg.has_form("", COUNT[0])
