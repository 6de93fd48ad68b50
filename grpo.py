"""Rewards and the GRPO objective of ROVA's dual-branch alignment (Sec. 3.3, Eq. 7-10, Alg. 1).

For one video query, the clean branch gives reference outputs {o_j} (a fixed anchor, no gradient)
and the perturbed branch gives {o~_j}, the outputs being optimised; the j-th clean and the j-th
perturbed rollout form a pair (Alg. 1). Each perturbed rollout gets the reward

    R_j = w_F r^F_j + w_Acc r^Acc_j + r^A_j,    r^A_j = alpha_r Sim^r(o_j, o~_j) + alpha_a Sim^a(o_j, o~_j)

(Alg. 1 l.13; App. D: w_F = w_Acc = 1, alpha_r = 0.3, alpha_a = 0.7), rewards are normalised within
the group of G rollouts into advantages (Eq. 8) and the policy maximises the clipped surrogate with a
KL penalty to the reference model (Eq. 7), written here as a loss to minimise.

Reading (README, "Paper readings"): Alg. 1 writes r^F and r^Acc on o_j; since Sec. 3.3 optimises the
perturbed branch against the clean anchor, the format and accuracy rewards are computed on the
outputs being optimised (the perturbed ones), the alignment reward on the pair. Plain GRPO (the
paper's single-branch baseline) is the same reward without r^A.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import torch

import data

log = logging.getLogger(__name__)

# Alg. 1 l.2 / Eq. 9; Video-R1's format reward: the whole output is <think>...</think> then <answer>...</answer>
FORMAT_PATTERN = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
_THINK = re.compile(r"<think>\s*(.*?)\s*</think>", re.DOTALL)


def format_reward(text: str) -> float:
    """Eq. 9 (Alg. 1 Step 1): 1.0 if the output, stripped of surrounding whitespace, is exactly a
    <think>...</think> block followed by an <answer>...</answer> block, else 0.0."""
    return 1.0 if isinstance(text, str) and FORMAT_PATTERN.fullmatch(text.strip()) else 0.0


def extract_reasoning(text: str) -> str:
    """Alg. 1 Step 2: p_j, the content of the <think> block ("" if there is none)."""
    m = _THINK.search(text) if isinstance(text, str) else None
    return m.group(1).strip() if m else ""


def accuracy_reward(text: str, answer: str, problem_type: str, source: str | None = None) -> float:
    """Eq. 10 (Alg. 1 Step 3): r^Acc = 1[a_j = g], generalised by problem type with Video-R1's
    training rules (data.score with train_reward=True): the answer must sit in <answer> tags."""
    pred = data.extract_answer(text, source, problem_type=problem_type, strict=True)
    return data.score(pred, answer, problem_type, source, train_reward=True)


def temporal_reward(acc_ordered, acc_shuffled, alpha: float = 0.3, mu: float = 0.8, threshold: float = 0.1):
    """Video-R1's T-GRPO bonus (the source of App. D's G = 8, G~ = 4): if the ordered group's mean
    accuracy is at least mu times the shuffled group's, every ordered rollout whose accuracy exceeds
    `threshold` gets +alpha. Returns the bonus per ordered rollout (a list of floats)."""
    acc_ordered, acc_shuffled = [float(a) for a in acc_ordered], [float(a) for a in acc_shuffled]
    if not acc_ordered:
        return []
    mean_o = sum(acc_ordered) / len(acc_ordered)
    mean_s = sum(acc_shuffled) / len(acc_shuffled) if acc_shuffled else 0.0
    if mean_o < mu * mean_s:
        return [0.0] * len(acc_ordered)
    return [alpha if a > threshold else 0.0 for a in acc_ordered]


@dataclass
class Alignment:
    """Alg. 1 Steps 4-5 for one group of pairs: r^A per pair and the judge's verdicts behind it."""
    rewards: list[float]
    sim_r: list[float | None]       # reasoning consistency in {0, 0.5, 1}; None = the judge gave no verdict
    sim_a: list[float | None]       # answer consistency in {0, 1}; None = no verdict
    missing: int = 0                # verdicts the judge could not give (imputed, see alignment_reward)
    skipped: int = 0                # pairs with an empty <think> or <answer> part: scored 0, judge not asked
    notes: list[str] = field(default_factory=list)


def _judge_many(judge, kind: str, pairs: list[tuple[str, str]]) -> list:
    """Ask the judge for `kind` ("answer" or "reasoning") consistency of (reference, candidate) pairs;
    batched when the judge offers it. Any failure becomes None (a missing verdict), never a crash."""
    if not pairs:
        return []
    batch = getattr(judge, f"{kind}_consistency_batch", None)
    try:
        if batch is not None:
            out = list(batch(pairs))
            if len(out) != len(pairs):
                raise ValueError(f"judge returned {len(out)} verdicts for {len(pairs)} pairs")
            return out
    except Exception as e:  # noqa: BLE001 - a judge outage must not stop training
        log.warning("judge %s_consistency_batch failed (%s); asking pair by pair", kind, e)
    single = getattr(judge, f"{kind}_consistency")
    out = []
    for ref, cand in pairs:
        try:
            out.append(single(ref, cand))
        except Exception as e:  # noqa: BLE001
            log.warning("judge %s_consistency failed on one pair (%s)", kind, e)
            out.append(None)
    return out


def _clean_verdicts(values, allowed):
    """Verdicts on the judge's scale as floats; anything else (None, garbage, off-scale) -> None."""
    out = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            f = None
        out.append(f if f in allowed else None)
    return out


def alignment_reward(clean_texts, perturbed_texts, judge, alpha_r: float = 0.3, alpha_a: float = 0.7,
                     missing: str = "mean") -> Alignment:
    """Alg. 1 Steps 2, 4, 5: r^A_j = alpha_r Sim^r(p_j, p~_j) + alpha_a Sim^a(a_j, a~_j) for the
    j-th clean and j-th perturbed rollout (App. D: alpha_r = 0.3, alpha_a = 0.7).

    The judge is any object with `reasoning_consistency(ref, cand) -> 1 | 0.5 | 0 | None` and
    `answer_consistency(ref, cand) -> 1 | 0 | None` (batched `*_batch(pairs)` forms are used when
    present). A pair whose reasoning or answer part is empty on either side scores 0 for that part
    without asking the judge. A verdict the judge cannot give (None, an exception, a value outside
    the scale) is missing: counted in `Alignment.missing`, logged, and imputed with the mean of the
    group's available verdicts of the same kind (`missing="mean"`: neutral for the group-normalised
    advantage of Eq. 8) or with 0 (`missing="zero"`)."""
    if len(clean_texts) != len(perturbed_texts):
        raise ValueError(f"{len(clean_texts)} clean vs {len(perturbed_texts)} perturbed rollouts: pairs must match")
    if missing not in ("mean", "zero"):
        raise ValueError(f"missing must be 'mean' or 'zero', got {missing!r}")
    n = len(clean_texts)
    parts = []
    for o, o_t in zip(clean_texts, perturbed_texts):  # Alg. 1 l.4-5
        parts.append((extract_reasoning(o), extract_reasoning(o_t),
                      data.extract_answer(o, strict=True), data.extract_answer(o_t, strict=True)))
    ask_r = [i for i, p in enumerate(parts) if p[0] and p[1]]
    ask_a = [i for i, p in enumerate(parts) if p[2] and p[3]]
    sim_r: list = [0.0] * n
    sim_a: list = [0.0] * n
    got_r = _clean_verdicts(_judge_many(judge, "reasoning", [(parts[i][0], parts[i][1]) for i in ask_r]),
                            (0.0, 0.5, 1.0))  # Alg. 1 l.9
    got_a = _clean_verdicts(_judge_many(judge, "answer", [(parts[i][2], parts[i][3]) for i in ask_a]),
                            (0.0, 1.0))  # Alg. 1 l.10
    for i, v in zip(ask_r, got_r):
        sim_r[i] = v
    for i, v in zip(ask_a, got_a):
        sim_a[i] = v
    n_missing = sum(v is None for v in sim_r) + sum(v is None for v in sim_a)
    notes = []
    if n_missing:
        notes.append(f"{n_missing} of {len(ask_r) + len(ask_a)} judge verdicts missing ({missing}-imputed)")
        log.warning("alignment_reward: %s", notes[-1])

    def impute(values):
        known = [v for v in values if v is not None]
        fill = sum(known) / len(known) if (known and missing == "mean") else 0.0
        return [fill if v is None else v for v in values]

    r_vals, a_vals = impute(sim_r), impute(sim_a)
    rewards = [alpha_r * r + alpha_a * a for r, a in zip(r_vals, a_vals)]  # Alg. 1 l.12
    return Alignment(rewards, sim_r, sim_a, n_missing, n - len(set(ask_r) & set(ask_a)), notes)


# --------------------------------------------------------------------------- Embodied-R's rewards
# Embodied-R Sec. 2.3: the logical-consistency reward r'''_i = 1 if a_i = a'_i = g else 0, where a'_i
# is the answer a reference model gives from the question q and the rollout's reasoning p_i alone (no
# video). It stops the policy from being rewarded for right answers its reasoning does not support.

def _correct(acc: float, problem_type: str) -> bool:
    """a_i = g: an exact hit (1.0) for multiple choice; above 0.5 for the graded types (numerical
    is 0/1 anyway; regression's training reward is 1 - clipped relative error, so > 0.5 means
    within 50% of g; OCR/free-form have no exact notion)."""
    return acc == 1.0 if problem_type == "multiple choice" else acc > 0.5


def _same_answer(judge_answer, answer, problem_type: str, source=None) -> bool:
    """a'_i = a_i: data.score(a'_i, a_i) >= 0.5 (exact for MC/numerical, MRA >= 0.5 for regression),
    or the same option letter up to case and decoration ("b", "(B)", "B." and "B. sofa" = "B"), or
    the same number ("3.0" = "3": data.score's numerical rule rejects that, a judge's formatting is
    not the policy's fault)."""
    a, b = str(judge_answer or "").strip(), str(answer or "").strip()
    if not a or not b:
        return False
    if data.score(a, b, problem_type, source) >= 0.5:
        return True
    if problem_type == "multiple choice":
        def letter(s):
            m = re.fullmatch(r"\(?([A-Za-z])\)?\.?", s)
            return (m.group(1) if m else data.option_letter(s) or "").upper()
        return bool(letter(a)) and letter(a) == letter(b)
    try:
        x, y = float(a.replace(",", "")), float(b.replace(",", ""))
    except ValueError:
        return False
    return problem_type in ("numerical", "regression") and round(x, 2) == round(y, 2)


def _answers_from_reasoning(judge, items) -> list:
    """a'_i for (question, reasoning, options) items, batched when the judge offers it; a failure
    becomes None (a missing verdict), never a crash (as _judge_many)."""
    if not items:
        return []
    batch = getattr(judge, "answer_from_reasoning_batch", None)
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
            out.append(judge.answer_from_reasoning(q, r, o))
        except Exception as e:  # noqa: BLE001
            log.warning("judge answer_from_reasoning failed on one item (%s)", e)
            out.append(None)
    return out


def consistency_reward(texts, question: str, answer: str, problem_type: str, judge, options=None,
                       source: str | None = None) -> tuple[list[float], int]:
    """Embodied-R Sec. 2.3, r'''_i for the G rollouts `texts` of one query: 1.0 iff the rollout's
    own answer is correct (a_i = g, see _correct), its <think> block is non-empty, and the judge's
    answer from the question (+ options) and that reasoning alone, `judge.answer_from_reasoning(
    question, reasoning, options)`, is the same answer (a'_i = a_i, see _same_answer); else 0.0.
    The judge is asked only about rollouts that are correct and have reasoning (the paper: "when
    a_i = g"). Returns (rewards, missing): a None answer or a judge failure scores 0 and counts as
    missing (no imputation: r''' is a strict 0/1 gate)."""
    n = len(texts)
    rewards, ask = [0.0] * n, []
    for i, t in enumerate(texts):
        reasoning = extract_reasoning(t)
        if reasoning and _correct(accuracy_reward(t, answer, problem_type, source), problem_type):
            ask.append((i, reasoning, data.extract_answer(t, source, problem_type=problem_type, strict=True)))
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


# --------------------------------------------------------------------------- Robust-TO's reward
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
    own = data.extract_answer(answer_text, source, problem_type=problem_type, strict=True)
    rel = 0.0
    for e in evidence or []:
        get = e.get if isinstance(e, dict) else (lambda k, e=e: getattr(e, k))
        if own is not None and supports(get("prediction"), own, problem_type, options):
            rel = max(rel, float(get("confidence")) * (1.0 - float(get("disturbance"))))
    extra = max(0, int(n_subqueries) - int(n_expected)) if n_expected is not None else 0
    total = w_acc * acc + w_rel * rel - w_cost * extra
    return {"total": total, "accuracy": acc, "reliability": rel, "extra_subqueries": extra}


def total_reward(texts, answer: str, problem_type: str, reference_texts=None, judge=None, *,
                 w_format: float = 1.0, w_acc: float = 1.0, alpha_r: float = 0.3, alpha_a: float = 0.7,
                 source: str | None = None, missing: str = "mean", w_consistency: float = 0.0,
                 question: str | None = None, options=None):
    """Alg. 1 l.13: R_j = w_F r^F_j + w_Acc r^Acc_j + r^A_j for the G rollouts `texts` of one query
    (App. D: w_F = w_Acc = 1.0). With `reference_texts` (the clean branch's G rollouts) and a judge,
    r^A is the alignment reward of each pair; without them (plain GRPO) r^A = 0.
    With w_consistency > 0 (Embodied-R Sec. 2.3; see reward_weights for its staged weights) each
    rollout also gets w_consistency * r^C_j, the logical-consistency reward of consistency_reward,
    which needs the judge and the `question` (with its `options`); its missing answers are added to
    "judge_missing". w_consistency = 0 (the default) leaves the rewards exactly as without it.
    Returns (rewards, components) where components holds the per-rollout lists "format",
    "accuracy", "alignment", "sim_r", "sim_a", "consistency" (None when w_consistency = 0) and the
    counts "judge_missing", "judge_skipped"."""
    r_f = [format_reward(t) for t in texts]
    r_acc = [accuracy_reward(t, answer, problem_type, source) for t in texts]
    if reference_texts is not None and judge is not None:
        al = alignment_reward(reference_texts, texts, judge, alpha_r, alpha_a, missing)
    else:
        al = Alignment([0.0] * len(texts), [None] * len(texts), [None] * len(texts))
    rewards = [w_format * f + w_acc * a + r for f, a, r in zip(r_f, r_acc, al.rewards)]
    r_c, c_missing = None, 0
    if w_consistency:
        if judge is None or question is None:
            raise ValueError("w_consistency > 0 needs a judge and the question (Embodied-R's consistency reward)")
        r_c, c_missing = consistency_reward(texts, question, answer, problem_type, judge, options, source)
        rewards = [r + w_consistency * c for r, c in zip(rewards, r_c)]
    return rewards, {"format": r_f, "accuracy": r_acc, "alignment": al.rewards, "sim_r": al.sim_r,
                     "sim_a": al.sim_a, "consistency": r_c, "judge_missing": al.missing + c_missing,
                     "judge_skipped": al.skipped}


def group_advantages(rewards, eps: float = 1e-4) -> torch.Tensor:
    """Eq. 8: A_j = (r_j - mean(r)) / (std(r) + eps) within each group (row), rewards [B, G] -> [B, G].
    std is the unbiased one (as DeepSeekMath/TRL); a group of equal rewards (or of one) gives zeros."""
    r = torch.as_tensor(rewards, dtype=torch.float32)
    if r.dim() != 2:
        raise ValueError(f"rewards must be [B, G], got shape {tuple(r.shape)}")
    if r.shape[1] < 2:
        return torch.zeros_like(r)
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, keepdim=True, unbiased=True)
    return (r - mean) / (std + eps)


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_eps: float = 0.2, beta: float = 0.01,
              normalize: str = "sequence"):
    """Eq. 7 as a loss to minimise, for N completions of T tokens (logp, old_logp, ref_logp, mask:
    [N, T]; advantages: [N], one per completion).

    Per token: r = exp(logp - old_logp) (the ratio F_theta / F_theta_old), surrogate
    -min(r A, clip(r, 1 - eps, 1 + eps) A), plus beta * KL(F_theta || F_ref) by the k3 estimator
    exp(ref - logp) - (ref - logp) - 1 (App. D: eps = 0.2, beta = 0.01). `normalize="sequence"` (the
    default; DeepSeekMath's GRPO and TRL's loss_type="grpo"): masked mean over each completion's
    tokens, then the mean over completions. Options: "token" (sum over all tokens / number of
    tokens, DAPO) and "constant" (sum / (N * T), Dr. GRPO).
    Returns (loss, stats) with stats: "kl" (mean per-token KL), "clip_fraction" (tokens where the
    clip is active), "ratio" (mean ratio), all over unmasked tokens."""
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(1)
    ratio = torch.exp(logp - old_logp)
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    delta = ref_logp - logp
    kl = torch.exp(delta) - delta - 1  # k3: unbiased, always >= 0
    per_token = -surrogate + beta * kl
    if normalize == "sequence":
        loss = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
    elif normalize == "token":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
    elif normalize == "constant":
        loss = (per_token * mask).sum() / (mask.shape[0] * mask.shape[1])
    else:
        raise ValueError(f"normalize must be 'sequence', 'token' or 'constant', got {normalize!r}")
    with torch.no_grad():
        n_tok = mask.sum().clamp(min=1)
        clipped = ((ratio < 1 - clip_eps) & (adv < 0)) | ((ratio > 1 + clip_eps) & (adv > 0))
        stats = {"kl": float((kl * mask).sum() / n_tok), "clip_fraction": float((clipped * mask).sum() / n_tok),
                 "ratio": float((ratio * mask).sum() / n_tok)}
    return loss, stats
