"""Collapse diagnostics of an evaluation: is the model still looking at the video?

A model can score above chance without using the clip at all, by answering each task's most rewarding constant
("4" to every counting question). RL started from such a model, or trained on clips it cannot read, converges to
that constant (App. H.3: alignment tells nothing until the model solves the clean task). Accuracy alone does not
show it; these figures do. Written into results.json (`diagnostics`) by eval_pvrbench.py, one warning line under
the table when a task is within noise of its constant.

Per source and task, on the clean condition and on the perturbed conditions pooled:
- `best_constant`: the answer that, given to every question of the task, scores best, and its accuracy. The
  candidates are the task's distinct ground truths and, for multiple choice, every option letter. Only for
  multiple choice, numerical and regression tasks (a constant text has no meaning for OCR or free-form).
- `margin`, `se`: the model's mean score minus the constant's, paired per question (a question's perturbed score
  is its mean over the subtypes it was asked under), and the standard error of that mean difference. `collapsed`:
  margin <= 2 SE, i.e. not distinguishable from answering the constant.
- `entropy`: Shannon entropy (bits) of the model's extracted answers, beside the ground truths' (`entropy_truth`);
  `top_answer`, `top_share`: its most frequent answer and how often it gave it.
Per source:
- `one_answer_share`: of the questions asked under two or more conditions, the share given their task's most
  frequent answer under all of them (clean and every subtype) although their ground truth is another: the
  questions on which the model answers one thing whatever the video. 0 for a model that is right everywhere
  (answering the truth under every condition is robustness, not collapse); 1 - p(truth = that answer) for one
  that gives one answer to everything (2/3 for a balanced three-way choice).
- `format_rate`: per condition, the share of outputs whose extracted answer has the task's form (an option
  letter of the question, a number, or any text for OCR / free-form).
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict

from machinery.datasets import answers, data

CONSTANT_TYPES = ("multiple choice", "numerical", "regression")
NOISE_SE = 2.0   # a margin within this many standard errors of 0 is "within noise"


def _letters(sample) -> list[str]:
    return [chr(ord("A") + i) for i in range(len(sample.options))]


def has_form(pred, sample) -> bool:
    """Whether an extracted answer has the task's form: one of the question's option letters (multiple choice;
    any non-empty text when it has no options), a number (numerical, regression), any text (OCR, free-form)."""
    p = "" if pred is None else str(pred).strip()
    if sample.problem_type == "multiple choice":
        return p.upper() in _letters(sample) if sample.options else bool(p)
    if sample.problem_type in ("numerical", "regression"):
        return data.to_float(answers._numberize(p).replace(",", "")) is not None
    return bool(p)


def best_constant(samples) -> tuple[str, list[float]] | None:
    """(answer, per-question scores) of the constant answer that scores best on `samples` (ties: the first in
    sorted order); None for tasks where a constant has no meaning."""
    if not samples or samples[0].problem_type not in CONSTANT_TYPES:
        return None
    candidates = {s.answer for s in samples}
    for s in samples:
        if s.problem_type == "multiple choice":
            candidates |= set(_letters(s))
    best = None
    for c in sorted(candidates):
        scores = [answers.score(c, s.answer, s.problem_type, s.source) for s in samples]
        if best is None or sum(scores) > sum(best[1]):
            best = (c, scores)
    return best


def entropy(values) -> float:
    """Shannon entropy in bits of the empirical distribution of `values`."""
    counts = Counter(values)
    n = sum(counts.values())
    return max(0.0, -sum(k / n * math.log2(k / n) for k in counts.values())) if n else 0.0   # (never -0.0)


def paired_margin(model_scores, constant_scores) -> tuple[float, float | None]:
    """(mean of model - constant, its standard error; None below 2 questions)."""
    d = [m - c for m, c in zip(model_scores, constant_scores)]
    n = len(d)
    mean = sum(d) / n
    if n < 2:
        return mean, None
    var = sum((x - mean) ** 2 for x in d) / (n - 1)
    return mean, math.sqrt(var / n)


def _per_question(records, perturbed: bool):
    """{doc id: (mean score, [extracted answers])} of the clean records (perturbed=False) or of the perturbed ones
    (each question's mean over its subtypes)."""
    scores, answers = defaultdict(list), defaultdict(list)
    for r in records:
        if r.get("error") is None and (r["condition"] != "clean") == perturbed:
            scores[r["doc_id"]].append(r["score"])
            answers[r["doc_id"]].append(r.get("filtered_resps"))
    return {q: (sum(v) / len(v), answers[q]) for q, v in scores.items()}


def task_block(records, samples, perturbed: bool):
    """One task's figures on the clean (or the pooled perturbed) condition; None when it has no such records."""
    per_q = _per_question(records, perturbed)
    asked = [s for s in samples if s.id in per_q]
    if not asked:
        return None
    scores = [per_q[s.id][0] for s in asked]
    answers = [a for s in asked for a in per_q[s.id][1]]
    top, top_n = Counter(answers).most_common(1)[0]
    return {"n": len(asked), "accuracy": sum(scores) / len(asked), "entropy": entropy(answers),
            "entropy_truth": entropy(s.answer for s in asked), "top_answer": top, "top_share": top_n / len(answers),
            **constant_margin(asked, scores)}


def constant_margin(samples, scores) -> dict:
    """The best constant of `samples` and the paired margin of the model's per-question `scores` over it ({} for
    a task without constants)."""
    const = best_constant(samples)
    if const is None:
        return {}
    margin, se = paired_margin(scores, const[1])
    return {"best_constant": const[0], "constant_accuracy": sum(const[1]) / len(samples), "margin": margin,
            "se": se, "collapsed": se is not None and margin <= NOISE_SE * se}


def one_answer_share(records, samples_by_id) -> float | None:
    """Of the questions asked under two or more conditions, the share given their task's most frequent answer
    under all of them although their ground truth is another (the module docstring)."""
    given, by_task = defaultdict(list), defaultdict(Counter)
    for r in records:
        if r.get("error") is None:
            given[r["doc_id"]].append(r.get("filtered_resps"))
            by_task[r["task"]][r.get("filtered_resps")] += 1
    multi = {doc: a for doc, a in given.items() if len(a) >= 2}
    if not multi:
        return None
    top = {task: counts.most_common(1)[0][0] for task, counts in by_task.items()}

    def stuck(doc, a):
        s = samples_by_id[doc]
        return set(a) == {top[s.task]} and answers.score(top[s.task], s.answer, s.problem_type, s.source) < 1.0
    return sum(stuck(doc, a) for doc, a in multi.items()) / len(multi)


def format_rates(records, samples_by_id) -> dict:
    """{condition: share of its outputs with an answer in the task's form (has_form)}."""
    hits = defaultdict(list)
    for r in records:
        if r.get("error") is None:
            hits[r["condition"]].append(has_form(r.get("filtered_resps"), samples_by_id[r["doc_id"]]))
    return {c: sum(v) / len(v) for c, v in hits.items()}


def source_diagnostics(records, samples) -> dict:
    """The figures of one source's records ({doc_id, condition, task, score, filtered_resps, error})."""
    by_id = {s.id: s for s in samples}
    by_task, recs_by_task = defaultdict(list), defaultdict(list)
    for s in samples:
        by_task[s.task].append(s)
    for r in records:
        recs_by_task[r["task"]].append(r)
    tasks = {}
    for task, recs in sorted(recs_by_task.items()):
        tasks[task] = {"clean": task_block(recs, by_task[task], False),
                       "perturbed": task_block(recs, by_task[task], True)}
    return {"tasks": tasks, "one_answer_share": one_answer_share(records, by_id),
            "format_rate": format_rates(records, by_id)}


def collapse(records_by_source, samples_by_source) -> dict:
    """{source: source_diagnostics}, plus `warnings`: one line per (source, task, condition) within noise of its
    best constant."""
    out = {src: source_diagnostics(recs, samples_by_source[src]) for src, recs in records_by_source.items()}
    warnings = [f"{src}/{task} ({cond}): {_f(b['accuracy'])} vs {_f(b['constant_accuracy'])} for answering "
                f"{b['best_constant']!r} to all {b['n']} (margin {b['margin']:+.3f} ± {b['se']:.3f} SE)"
                for src, d in out.items() for task, conds in d["tasks"].items()
                for cond, b in conds.items() if b and b.get("collapsed")]
    return {"sources": out, "warnings": warnings}


def warning_line(diag) -> str:
    """One line for the printed table's notes ("" when no task is within noise of its best constant)."""
    w = diag["warnings"]
    if not w:
        return ""
    return (f"Collapse warning: {len(w)} task condition(s) within {NOISE_SE:g} SE of answering one constant (does the "
            f"model still look at the video?): " + "; ".join(w[:4]) + (f"; +{len(w) - 4} more" if len(w) > 4 else "")
            + ". See results.json's diagnostics.\n")


def _f(x) -> str:
    return f"{x:.3f}"
