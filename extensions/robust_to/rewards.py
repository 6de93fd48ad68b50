"""Robust-TO's confidence-cost reward for one agent rollout (extensions/robust_to/train.py)."""
from __future__ import annotations

import re

from machinery.datasets import answers
from grpo import accuracy_reward

def _option_text(answer: str, options) -> str:
    """An option letter's text ("B" with options ["A. left", "B. Turn right"] -> "turn right")."""
    for o in options or []:
        m = re.match(r"\s*\(?([A-Za-z])[.):]\s*(.*)", str(o))
        if m and m.group(1).upper() == str(answer).strip().upper():
            return m.group(2).strip().lower()
    return ""


def supports(prediction: str, answer, problem_type: str, options=None) -> bool:
    """Whether a tool's prediction states the given answer (ours; Robust-TO: "the evidence the answer
    rests on"): numeric answers when a number in the prediction equals it; multiple choice when the
    prediction contains the option's text (case-insensitive) or is the bare letter; else the answer text
    is contained in the prediction."""
    pred = str(prediction or "").lower()
    ans = str(answer or "").strip()
    if not pred or not ans:
        return False
    if problem_type in ("numerical", "regression"):
        try:
            target = float(ans)
        except ValueError:
            return False
        return any(abs(float(x) - target) < 1e-9 for x in re.findall(r"-?\d+(?:\.\d+)?", pred))
    if problem_type == "multiple choice":
        text = _option_text(ans, options)
        return bool(text and text in pred) or pred.strip(" .()") == ans.lower()
    return ans.lower() in pred


def confidence_cost_reward(answer_text: str, gt: str, problem_type: str, evidence, n_subqueries: int,
                           n_expected: int | None, options=None, source: str | None = None,
                           w_acc: float = 1.0, w_rel: float = 0.5, w_cost: float = 0.1) -> dict:
    """Robust-TO's confidence-cost GRPO reward for one agent rollout (the paper names its terms, not its
    formula; this is our reading):

        R = w_acc r^Acc + w_rel r^Rel - w_cost max(0, n_subqueries - n_expected)

    r^Acc: Eq. 10's accuracy of the synthesised answer; r^Rel: the reliability of the evidence the
    answer rests on, max over the evidence records that state the rollout's own answer (:func:`supports`)
    of confidence x (1 - disturbance), 0 when none does (an answer no evidence backs earns nothing here,
    right or wrong); the cost charges each sub-query beyond what the frozen estimator expected
    (``n_expected`` None: no cost). ``evidence``: orchestrate.Evidence records (or dicts with the same
    fields). Returns the total and its parts."""
    acc = accuracy_reward(answer_text, gt, problem_type, source)
    own = answers.extract_answer(answer_text, source, problem_type=problem_type, strict=True)
    rel = 0.0
    for e in evidence or []:
        get = e.get if isinstance(e, dict) else (lambda k, e=e: getattr(e, k))
        if own is not None and supports(get("prediction"), own, problem_type, options):
            rel = max(rel, float(get("confidence")) * (1.0 - float(get("disturbance"))))
    extra = max(0, int(n_subqueries) - int(n_expected)) if n_expected is not None else 0
    total = w_acc * acc + w_rel * rel - w_cost * extra
    return {"total": total, "accuracy": acc, "reliability": rel, "extra_subqueries": extra}
