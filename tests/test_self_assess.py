"""buffer.self_assess (Eq. 3, Sec. 3.2 selection) at each App. D threshold, and the YES/NO confidence."""
import math

import numpy as np
import pytest

import buffer


def assess(acc, p_yes, pert=None, clean=None):
    return buffer.self_assess(acc, p_yes, pert, clean, tau=0.8, a_min=0.3, a_max=0.85)


@pytest.mark.parametrize("acc,p_yes,agree,want_d,want_decision", [
    (0.875, 0.9, True, "easy", "discard"),           # mastered with confidence > tau: pruned (Alg. 2 l.9-10)
    (0.85, 0.81, True, "easy", "discard"),           # a_max is inclusive
    (0.875, 0.8, True, "easy", "train"),             # c = tau is not > tau: a low-confidence easy sample is trained
    (0.875, 0.9, False, "informative", "train"),     # correct but inconsistent with the clean branch
    (0.84, 0.99, True, "informative", "train"),      # just below a_max
    (0.3, 0.9, True, "informative", "train"),        # a_min is inclusive for informative
    (0.29, 0.9, True, "difficult", "defer"),         # below a_min: to the buffer (Alg. 2 l.7-8)
    (1.0, 0.49, True, "difficult", "defer"),         # judged unanswerable from the masked video (Fig. 10)
    (1.0, 0.5, True, "easy", "train"),
])
def test_decisions_at_the_thresholds(acc, p_yes, agree, want_d, want_decision):
    pert = ["A"] * 8
    clean = ["A"] * 8 if agree else ["B"] * 8
    a = assess([acc], p_yes, pert, clean)
    assert (a.difficulty, a.decision) == (want_d, want_decision)
    assert a.confidence == p_yes and a.accuracy == pytest.approx(acc)


def test_accuracy_is_the_mean_over_rollouts_and_agreement_uses_majorities():
    a = assess([1, 1, 1, 1, 1, 1, 1, 0], 0.95, ["A"] * 7 + ["C"], ["a", "A ", "B", "A"])
    assert a.accuracy == pytest.approx(0.875) and a.agreement is True and a.decision == "discard"
    # buffer re-assessment (Eq. 5) has no clean rollouts: agreement is not required
    r = assess([1, 1, 1, 1], 0.9)
    assert r.agreement is None and r.difficulty == "easy"
    with pytest.raises(ValueError):
        assess([], 0.5)
    with pytest.raises(ValueError, match="probability"):
        assess([1.0], 1.5)


@pytest.mark.parametrize("p_yes, want_d, want_decision", [
    (0.0, "difficult", "defer"),      # NO: the masked video does not answer the question (App. C.2: the buffer)
    (0.49, "difficult", "defer"),
    (0.5, "informative", "train"),    # YES (the argmax), not confident: trained
    (0.8, "informative", "train"),    # c = tau is not above it
    (0.81, "easy", "discard"),        # YES with c > tau: "the confidence score controls the discard rate"
    (1.0, "easy", "discard"),
])
def test_the_verdict_rule_of_app_c2_at_its_thresholds(p_yes, want_d, want_decision):
    from buffer import self_assess_verdict
    a = self_assess_verdict(p_yes, tau=0.8)
    assert (a.difficulty, a.decision, a.confidence, a.accuracy) == (want_d, want_decision, p_yes, None)
    assert self_assess_verdict(0.7, tau=0.6).decision == "discard"   # tau moves the discard line only
    with pytest.raises(ValueError, match="probability"):
        self_assess_verdict(-0.1)


def test_answerability_confidence_normalises_over_yes_and_no():
    logits = np.full(10, -5.0)
    logits[[1, 2]] = [2.0, 1.0]   # two YES spellings
    logits[3] = 0.5               # one NO spelling
    want = (math.exp(2) + math.exp(1)) / (math.exp(2) + math.exp(1) + math.exp(0.5))
    assert buffer.answerability_confidence(logits, [1, 2], [3]) == pytest.approx(want)
    assert buffer.answerability_confidence(np.zeros(5), [0], [1]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        buffer.answerability_confidence(logits, [], [3])


def test_answerability_token_ids_on_the_tiny_tokenizer(tiny_policy):
    from machinery.model import policy
    _, processor = tiny_policy
    yes, no = policy.yes_no_token_ids(processor.tokenizer)
    assert yes and no and not set(yes) & set(no)
    decode = processor.tokenizer.decode
    assert all(decode([i]).strip().upper().startswith("Y") for i in yes)
    assert all(decode([i]).strip().upper().startswith("N") for i in no)
