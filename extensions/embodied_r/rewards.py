"""Embodied-R's rewards (its Sec. 2.3) on ROVA's harness: the logical-consistency reward and the staged
reward weights format : accuracy : consistency, added to the core's rewards by the Embodied-R training
step (extensions/embodied_r/train.py)."""
from __future__ import annotations

import functools
import logging
import re

from machinery.datasets import answers, data
from extensions.embodied_r import judging
from grpo import accuracy_reward

log = logging.getLogger(__name__)

# Embodied-R Sec. 2.3: the logical-consistency reward r'''_i = 1 if a_i = a'_i = g else 0, where a'_i
# is the answer a reference model gives from the question q and the rollout's reasoning p_i alone (no
# video). It stops the policy from being rewarded for right answers its reasoning does not support.

def _correct(acc: float, problem_type: str) -> bool:
    """a_i = g: an exact hit (1.0) for multiple choice; above 0.5 for the graded types (numerical
    is 0/1 anyway; regression's training reward is 1 - clipped relative error, so > 0.5 means
    within 50% of g; OCR/free-form have no exact notion)."""
    return acc == 1.0 if problem_type == "multiple choice" else acc > 0.5


def _same_answer(judge_answer, answer, problem_type: str, source=None) -> bool:
    """a'_i = a_i: answers.score(a'_i, a_i) >= 0.5 (exact for MC/numerical, MRA >= 0.5 for regression),
    or the same option letter up to case and decoration ("b", "(B)", "B." and "B. sofa" = "B"), or
    the same number ("3.0" = "3": answers.score's numerical rule rejects that, a judge's formatting is
    not the policy's fault)."""
    a, b = str(judge_answer or "").strip(), str(answer or "").strip()
    if not a or not b:
        return False
    if answers.score(a, b, problem_type, source) >= 0.5:
        return True
    if problem_type == "multiple choice":
        la, lb = data.split_option(a)[0], data.split_option(b)[0]
        return bool(la) and la == lb
    try:
        x, y = float(a.replace(",", "")), float(b.replace(",", ""))
    except ValueError:
        return False
    return problem_type in ("numerical", "regression") and round(x, 2) == round(y, 2)


def _answers_from_reasoning(judge, items) -> list:
    """a'_i for (question, reasoning, options) items: from a core judge through `judging`, or from a
    judge of your own that answers them itself (``answer_from_reasoning(question, reasoning, options)``,
    optionally ``answer_from_reasoning_batch(items)``). Batched when possible; a failure becomes None
    (a missing verdict), never a crash (as judge.ask_pairs)."""
    if not items:
        return []
    if hasattr(judge, "answer_from_reasoning"):
        batch, one = getattr(judge, "answer_from_reasoning_batch", None), judge.answer_from_reasoning
    else:
        batch = functools.partial(judging.answer_from_reasoning_batch, judge)
        one = functools.partial(judging.answer_from_reasoning, judge)
    if batch is not None:
        try:
            out = list(batch(items))
            if len(out) != len(items):
                raise ValueError(f"judge returned {len(out)} answers for {len(items)} items")
            return out
        except Exception as e:  # noqa: BLE001 - a judge outage must not stop training
            log.warning("judge answer_from_reasoning_batch failed (%s); asking item by item", e)
    out = []
    for q, r, o in items:
        try:
            out.append(one(q, r, o))
        except Exception as e:  # noqa: BLE001
            log.warning("judge answer_from_reasoning failed on one item (%s)", e)
            out.append(None)
    return out


def consistency_reward(texts, question: str, answer: str, problem_type: str, judge, options=None,
                       source: str | None = None) -> tuple[list[float], int]:
    """Embodied-R Sec. 2.3, r'''_i for the G rollouts `texts` of one query: 1.0 iff the rollout's
    own answer is correct (a_i = g, see _correct), its <think> block is non-empty, and the judge's
    answer from the question (+ options) and that reasoning alone (`judging.answer_from_reasoning`,
    or the judge's own `answer_from_reasoning`, see _answers_from_reasoning) is the same answer
    (a'_i = a_i, see _same_answer); else 0.0.
    The judge is asked only about rollouts that are correct and have reasoning (the paper: "when
    a_i = g"). Returns (rewards, missing): a None answer or a judge failure scores 0 and counts as
    missing (no imputation: r''' is a strict 0/1 gate)."""
    n = len(texts)
    rewards, ask = [0.0] * n, []
    for i, t in enumerate(texts):
        reasoning = answers.extract_reasoning(t)
        if reasoning and _correct(accuracy_reward(t, answer, problem_type, source), problem_type):
            ask.append((i, reasoning, answers.extract_answer(t, source, problem_type=problem_type, strict=True)))
    got = _answers_from_reasoning(judge, [(question, r, options) for _, r, _ in ask])
    missing = 0
    for (i, _, own), a in zip(ask, got):
        if a is None:
            missing += 1
        elif _same_answer(a, own, problem_type, source):
            rewards[i] = 1.0
    if missing:
        log.warning("consistency_reward: %d of %d judge answers missing (scored 0)", missing, len(ask))
    return rewards, missing


# Embodied-R Sec. 2.3: the reward weights format : accuracy : consistency change in three stages,
# epochs 1-2 at 7:3:0 (learn the format), 3-4 at 3:7:0 (accuracy), 5-12 at 1:7:2 (consistency joins).
# (first epoch, last epoch or None = open end, weights); epochs count from 1. A weights tuple may
# carry a 4th number, the weight of ROVA's alignment reward r^A.
EMBODIED_R_SCHEDULE = ((1, 2, (7, 3, 0)), (3, 4, (3, 7, 0)), (5, None, (1, 7, 2)))


def _check_schedule(schedule):
    """A schedule as a tuple of (start, end, weights) with ints and floats, or ValueError."""
    out, prev_end, length = [], 0, None
    for k, entry in enumerate(schedule):
        try:
            start, end, weights = entry
            start, end = int(start), (None if end is None else int(end))
            weights = tuple(float(w) for w in weights)
        except (TypeError, ValueError) as e:
            raise ValueError(f"schedule entry {k} {entry!r} is not (start, end, weights)") from e
        if start < 1 or (end is not None and end < start):
            raise ValueError(f"schedule entry {k}: epochs {start}-{end or ''} are not a range of epochs counted from 1")
        if prev_end is None or start <= prev_end:
            raise ValueError(f"schedule entry {k}: epochs {start}-{end or ''} must start after the previous entry ends "
                             "(entries in order, no overlap)")
        if len(weights) not in (3, 4) or (length is not None and len(weights) != length):
            raise ValueError(f"schedule entry {k}: weights {weights} must be 3 numbers (format, accuracy, "
                             "consistency) or 4 (+ alignment), the same count in every entry")
        if not all(w >= 0 and w != float("inf") for w in weights):
            raise ValueError(f"schedule entry {k}: weights {weights} must be finite and >= 0")
        out.append((start, end, weights))
        prev_end, length = end, len(weights)
    if not out:
        raise ValueError("the reward-weight schedule is empty")
    return tuple(out)


def reward_weights(epoch: int, schedule=EMBODIED_R_SCHEDULE, normalize: bool = True) -> tuple[float, ...]:
    """(w_format, w_acc, w_consistency) for `epoch` (counted from 1) from a staged schedule
    (Embodied-R Sec. 2.3; a 4th weight, w_align, when the schedule has one).

    normalize=True divides by their sum, so the weights add to 1 (7:3:0 -> 0.7, 0.3, 0.0): the paper
    gives ratios, and the weighted sum then stays in [0, 1] for 0/1 rewards. Eq. 8's group
    normalisation makes the advantages the same either way; the scale only shows in logged rewards.
    normalize=False returns the numbers as given. An epoch no entry covers raises ValueError."""
    epoch = int(epoch)
    for start, end, weights in _check_schedule(schedule):
        if start <= epoch and (end is None or epoch <= end):
            if not normalize:
                return weights
            total = sum(weights)
            if total <= 0:
                raise ValueError(f"weights {weights} for epoch {epoch} sum to 0: cannot normalise")
            return tuple(w / total for w in weights)
    raise ValueError(f"epoch {epoch} is not covered by the reward-weight schedule {schedule}")


def _parse_weights(part: str, where: str) -> tuple[float, ...]:
    nums = part.split(":")
    if len(nums) not in (3, 4):
        raise ValueError(f"{where}: {part!r} must be 3 or 4 numbers joined by ':' "
                         "(format:accuracy:consistency[:alignment])")
    try:
        weights = tuple(float(x) for x in nums)
    except ValueError:
        raise ValueError(f"{where}: {part!r} holds something that is not a number") from None
    if not all(0 <= w < float("inf") for w in weights):
        raise ValueError(f"{where}: {part!r}: weights must be finite and >= 0")
    return weights


def parse_reward_weights(spec: str):
    """A reward-weight schedule (for reward_weights) from a command-line string:
    "7:3:0" (format:accuracy:consistency for every epoch; a 4th number is the alignment weight),
    "embodied-r" (EMBODIED_R_SCHEDULE, Embodied-R Sec. 2.3), or ranges of epochs
    "1-2=7:3:0,3-4=3:7:0,5-=1:7:2" ("5-" = from epoch 5 on, "6" = epoch 6 only)."""
    s = str(spec or "").strip()
    if not s:
        raise ValueError("empty reward-weight spec; expected e.g. '7:3:0', 'embodied-r' or '1-2=7:3:0,3-=1:7:2'")
    if s.lower().replace("_", "-") in ("embodied-r", "embodiedr"):
        return EMBODIED_R_SCHEDULE
    if "=" not in s:
        return _check_schedule(((1, None, _parse_weights(s, "reward weights")),))
    entries = []
    for part in s.split(","):
        rng, eq, w = (x.strip() for x in part.partition("="))
        if not eq or not rng or not w:
            raise ValueError(f"reward-weight stage {part.strip()!r} must be EPOCHS=F:A:C (e.g. '3-4=3:7:0')")
        m = re.fullmatch(r"(\d+)(?:\s*(-)\s*(\d*))?", rng)
        if not m:
            raise ValueError(f"reward-weight stage {part.strip()!r}: {rng!r} is not an epoch range "
                             "('3', '3-4' or '5-')")
        start = int(m.group(1))
        end = start if not m.group(2) else (int(m.group(3)) if m.group(3) else None)
        entries.append((start, end, _parse_weights(w, f"reward-weight stage {part.strip()!r}")))
    try:
        return _check_schedule(entries)
    except ValueError as e:
        raise ValueError(f"reward weights {s!r}: {e}") from None


def with_consistency(rewards, texts, question, answer, problem_type, judge, w_consistency, options=None,
                     source=None):
    """R_j + w_C r'''_j (Embodied-R Sec. 2.3) for the G rollouts `texts` of one query, given the core's R_j
    (grpo.total_reward). Returns (rewards, r''' or None when w_C = 0, missing judge answers); w_C = 0
    leaves the rewards exactly as they are and asks nothing."""
    if not w_consistency:
        return list(rewards), None, 0
    if judge is None or question is None:
        raise ValueError("w_consistency > 0 needs a judge and the question (Embodied-R's consistency reward)")
    r_c, missing = consistency_reward(texts, question, answer, problem_type, judge, options, source)
    return [r + w_consistency * c for r, c in zip(rewards, r_c)], r_c, missing
