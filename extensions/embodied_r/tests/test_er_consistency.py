"""Embodied-R's logical-consistency reward (Embodied-R Sec. 2.3) and its staged reward weights:
er.consistency_reward / total_reward(w_consistency=...) with a scripted judge, reward_weights and
parse_reward_weights against hand-computed values, judging.answer_from_reasoning on the core judges (the
prompt judge through a scripted completion backend, LocalJudge's heuristic)."""
from __future__ import annotations

import pytest

import grpo
import judge
from extensions.embodied_r import judging
from extensions.embodied_r import rewards as er

Q = "Which way does the agent turn?"
OPTS = ["A. Turn left", "B. Turn right", "C. Go straight"]


def out(think, answer):
    return f"<think>{think}</think>\n<answer>{answer}</answer>"


class ScriptedJudge:
    """A judge of one's own: answer_from_reasoning(_batch) returning scripted answers by reasoning text
    (default: echo the letter after "answer "); records every item asked."""

    def __init__(self, script=None, batch=True, fail=False):
        self.script, self.asked, self.fail = dict(script or {}), [], fail
        if not batch:
            self.answer_from_reasoning_batch = None

    def answer_from_reasoning(self, question, reasoning, options=None):
        self.asked.append((question, reasoning, options))
        if self.fail:
            raise TimeoutError("judge timed out")
        if reasoning in self.script:
            return self.script[reasoning]
        return reasoning.rsplit(" ", 1)[-1]

    def answer_from_reasoning_batch(self, items):
        return [self.answer_from_reasoning(*it) for it in items]


# ----------------------------------------------------------------------------- consistency_reward

@pytest.mark.parametrize("batch", [True, False])
def test_consistency_reward_hand_worked(batch):
    texts = [out("slides right so answer B", "B"),        # correct, judge reads B: 1
             out("slides right so answer A", "B"),        # correct, judge reads A: 0
             out("slides left so answer A", "A"),         # wrong answer: 0, judge not asked
             out("", "B"),                                # empty <think>: 0, not asked
             "<answer>B</answer>",                        # no <think> at all: 0, not asked
             out("unclear", "B")]                         # correct, judge gives None: 0, missing
    j = ScriptedJudge({"unclear": None}, batch=batch)
    rewards, missing = er.consistency_reward(texts, Q, "B", "multiple choice", j, options=OPTS)
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0] and missing == 1
    assert [r for _, r, _ in j.asked] == ["slides right so answer B", "slides right so answer A", "unclear"]
    assert all(q == Q and o == OPTS for q, _, o in j.asked)   # question + options, never the answer


def test_consistency_reward_letter_forms_and_failures():
    texts = [out("so answer (b)", "B"), out("so answer B. Turn right", "B")]
    scripted = ScriptedJudge({"so answer B. Turn right": "B. Turn right"})   # "(b)" and "B. Turn right" are B
    assert er.consistency_reward(texts, Q, "B", "multiple choice", scripted)[0] == [1.0, 1.0]
    # a judge that raises: every asked item missing, scored 0, no crash
    j = ScriptedJudge(fail=True)
    assert er.consistency_reward(texts, Q, "B", "multiple choice", j) == ([0.0, 0.0], 2)
    assert er.consistency_reward([], Q, "B", "multiple choice", j) == ([], 0)


def test_consistency_reward_numeric():
    texts = [out("2 red and 1 blue so 3", "3"),          # correct, judge reads 3: 1
             out("I count 3.0", "3"),                     # judge says "3.0": the same number: 1
             out("I think 4", "3"),                       # judge reads 4: 0
             out("so 4", "4")]                            # wrong: not asked
    j = ScriptedJudge()
    rewards, missing = er.consistency_reward(texts, "How many cubes?", "3", "numerical", j)
    assert rewards == [1.0, 1.0, 0.0, 0.0] and missing == 0 and len(j.asked) == 3
    # regression: correct when the training accuracy is > 0.5 (|3.5 - 3| / 3 = 0.17 -> 0.83)
    texts = [out("about 3.5", "3.5"), out("about 9", "9")]
    j = ScriptedJudge()
    rewards, _ = er.consistency_reward(texts, "How far?", "3", "regression", j)
    assert rewards == [1.0, 0.0] and len(j.asked) == 1     # 9 m: accuracy 0 -> not asked


def test_total_reward_with_and_without_consistency():
    texts = [out("so answer B", "B"), out("so answer A", "B"), out("so answer A", "A"), "<answer>B</answer>"]
    old, comp0 = grpo.total_reward(texts, "B", "multiple choice")
    assert old == [2.0, 2.0, 1.0, 1.0] and "consistency" not in comp0
    j = ScriptedJudge()
    same, r_c, missing = er.with_consistency(old, texts, Q, "B", "multiple choice", j, 0.0)
    assert same == old and r_c is None and missing == 0 and j.asked == []   # w = 0: nothing asked, nothing changes
    new, r_c, missing = er.with_consistency(old, texts, Q, "B", "multiple choice", j, 2.0, options=OPTS)
    assert r_c == [1.0, 0.0, 0.0, 0.0] and missing == 0
    assert new == [o + 2.0 * c for o, c in zip(old, r_c)] == [4.0, 2.0, 1.0, 1.0]
    _, r_c, missing = er.with_consistency(old, texts, Q, "B", "multiple choice", ScriptedJudge({"so answer B": None}),
                                          1.0)
    assert missing == 1 and r_c == [0.0] * 4
    with pytest.raises(ValueError, match="judge and the question"):
        er.with_consistency(old, texts, Q, "B", "multiple choice", None, 1.0)
    with pytest.raises(ValueError, match="judge and the question"):
        er.with_consistency(old, texts, None, "B", "multiple choice", j, 1.0)


# ----------------------------------------------------------------------------- staged weights

@pytest.mark.parametrize("epoch, want", [
    (1, (0.7, 0.3, 0.0)), (2, (0.7, 0.3, 0.0)),           # 7:3:0 / 10
    (3, (0.3, 0.7, 0.0)), (4, (0.3, 0.7, 0.0)),           # 3:7:0 / 10
    (5, (0.1, 0.7, 0.2)), (12, (0.1, 0.7, 0.2)),          # 1:7:2 / 10, open end
])
def test_reward_weights_embodied_r(epoch, want):
    assert er.reward_weights(epoch) == pytest.approx(want)
    assert sum(er.reward_weights(epoch)) == pytest.approx(1.0)


def test_reward_weights_options_and_errors():
    assert er.reward_weights(5, normalize=False) == (1.0, 7.0, 2.0)
    assert er.reward_weights(2, ((1, 3, (1, 1, 2)),)) == pytest.approx((0.25, 0.25, 0.5))
    with pytest.raises(ValueError, match="epoch 0"):
        er.reward_weights(0)
    with pytest.raises(ValueError, match="epoch 4"):
        er.reward_weights(4, ((1, 3, (1, 1, 0)),))
    with pytest.raises(ValueError, match="sum to 0"):
        er.reward_weights(1, ((1, None, (0, 0, 0)),))
    with pytest.raises(ValueError, match="overlap"):
        er.reward_weights(1, ((1, 3, (1, 1, 0)), (3, None, (1, 1, 1))))


def test_parse_reward_weights():
    assert er.parse_reward_weights("7:3:0") == ((1, None, (7.0, 3.0, 0.0)),)
    fixed = er.parse_reward_weights("1:1:0:1")                  # 4th number: the alignment weight
    assert er.reward_weights(9, fixed) == pytest.approx((1 / 3, 1 / 3, 0.0, 1 / 3))
    assert er.parse_reward_weights("embodied-r") == er.EMBODIED_R_SCHEDULE
    assert er.parse_reward_weights(" Embodied_R ") == er.EMBODIED_R_SCHEDULE
    sched = er.parse_reward_weights("1-2=7:3:0,3-4=3:7:0,5-=1:7:2")
    assert sched == ((1, 2, (7.0, 3.0, 0.0)), (3, 4, (3.0, 7.0, 0.0)), (5, None, (1.0, 7.0, 2.0)))
    for e in (1, 2, 3, 4, 5, 12):
        assert er.reward_weights(e, sched) == pytest.approx(er.reward_weights(e))
    assert er.parse_reward_weights("1=1:0:0, 2-=0:1:0") == ((1, 1, (1.0, 0.0, 0.0)), (2, None, (0.0, 1.0, 0.0)))


@pytest.mark.parametrize("spec, match", [
    ("", "empty"), ("7:3", "'7:3' must be 3 or 4 numbers"), ("7:x:0", "'7:x:0' holds something that is not a number"),
    ("7:-3:0", "finite and >= 0"), ("1:2:3:4:5", "3 or 4 numbers"), ("embodied", "'embodied' must be 3 or 4"),
    ("1-2=7:3:0,x=1:1:1", "'x' is not an epoch range"), ("1-2", "'1-2' must be 3 or 4"),
    ("1-2=7:3:0,2-=1:7:2", "overlap"), ("3-1=1:1:1", "not a range"), ("1-2=,3-=1:1:1", "must be EPOCHS=F:A:C"),
    ("0-2=1:1:1", "not a range"), ("1-2=7:3:0,3-=1:1:1:1", "same count"),
])
def test_parse_reward_weights_rejects(spec, match):
    with pytest.raises(ValueError, match=match.replace("(", r"\(")):
        er.parse_reward_weights(spec)


# ----------------------------------------------------------------------------- the judges

class FakePromptJudge(judge._PromptJudge):
    """A prompt judge whose model replies from a script keyed by a substring of the prompt."""
    name, model = "fake", "scripted"

    def __init__(self, replies):
        super().__init__()
        self.replies, self.prompts = replies, []

    def _complete_many(self, prompts, max_tokens, images=None):
        self.prompts += prompts
        return [next((r for k, r in self.replies.items() if k in p), None) for p in prompts]


def test_prompt_judge_answer_from_reasoning():
    j = FakePromptJudge({"REASON-1": "<answer>B</answer>", "REASON-2": "<answer>(c)</answer>",
                         "REASON-3": "I cannot tell from this reasoning what the final answer would be",
                         "REASON-4": "3.5", "REASON-5": "The answer is Turn right."})
    items = [(Q, "REASON-1", OPTS), (Q, "REASON-2", OPTS), (Q, "REASON-3", OPTS), ("How far?", "REASON-4"),
             (Q, "REASON-5", OPTS), (Q, "REASON-6", OPTS)]
    assert judging.answer_from_reasoning_batch(j, items) == ["B", "C", None, "3.5", "B", None]
    assert j.stats["missing"] == 2 and j.stats["calls"] == 6
    first = j.prompts[0]
    assert "REASON-1" in first and Q in first and "Options:\nA. Turn left\nB. Turn right\nC. Go straight" in first
    assert "<answer>" in first and "video" in first
    assert "Options" not in j.prompts[3]                          # no options: the question alone
    assert judging.answer_from_reasoning(j, Q, "REASON-1", OPTS) == "B"    # the single form, served by the cache
    assert j.stats["calls"] == 6 and j.stats["cache_hits"] == 1
    with pytest.raises(ValueError, match="question, reasoning"):
        judging.answer_from_reasoning_batch(j, [(Q, "r", OPTS, "extra")])


@pytest.mark.parametrize("reasoning, options, want", [
    ("The floor slides right, so the camera turns left. Wait, let me check: the answer is B.", OPTS, "B"),
    ("Option A looks plausible at first, but the ground moves left, so the agent must turn right.", OPTS, "B"),
    ("It is not turning left; it is turning right, so (B). Hmm, actually the objects grow, it goes straight.",
     OPTS, "C"),
    ("A red cube slides past the camera.", OPTS, None),          # a bare article "A" is not a statement
    ("There are 2 red cubes and one more behind the pillar, so three in total.", None, "3"),
    ("The sofa is 1,000 mm wide, about 2.5 m from the TV.", None, "2.5"),
    ("I cannot see anything in this dark clip.", None, None),
    ("", OPTS, None),
])
def test_local_answer_from_reasoning_heuristic(reasoning, options, want):
    assert judging.last_stated_answer(Q, reasoning, options) == want


def test_local_judge_answer_from_reasoning_counts():
    j = judge.LocalJudge()                                    # the heuristic needs no encoder
    q_inline = "Which way?\nA. Turn left\nB. Turn right"      # options read from the question's lines
    got = judging.answer_from_reasoning_batch(j, [(q_inline, "so it is B."), (Q, "nothing", OPTS),
                                                  ("How many?", "two")])
    assert got == ["B", None, "2"]
    assert j.stats["calls"] == 3 and j.stats["missing"] == 1
    assert judging.answer_from_reasoning(j, Q, "it goes straight", OPTS) == "C"
    rewards, missing = er.consistency_reward([out("the floor slides left, so the agent turns right", "B"),
                                                out("so the answer is C", "B")], Q, "B", "multiple choice", j, OPTS)
    assert rewards == [1.0, 0.0] and missing == 0
