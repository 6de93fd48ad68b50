"""Rewards and the GRPO objective of ROVA's dual-branch alignment (Sec. 3.3, Eq. 7-10, Alg. 1).

For one video query, the clean branch gives reference outputs {o_j} (a fixed anchor, no gradient)
and the perturbed branch gives {o~_j}, the outputs being optimised; the j-th clean and the j-th
perturbed rollout form a pair (Alg. 1). Each perturbed rollout gets the reward

    R_j = w_F r^F_j + w_Acc r^Acc_j + r^A_j,    r^A_j = alpha_r Sim^r(o_j, o~_j) + alpha_a Sim^a(o_j, o~_j)

(Alg. 1 l.13; App. D: w_F = w_Acc = 1, alpha_r = 0.3, alpha_a = 0.7), rewards are normalised within
the group of G rollouts into advantages (Eq. 8) and the policy maximises the clipped surrogate with a
KL penalty to the reference model (Eq. 7), written here as a loss to minimise.

Reading (docs/DESIGN.md, "Readings of the paper"): Alg. 1 writes r^F and r^Acc on o_j; since Sec. 3.3 optimises the
perturbed branch against the clean anchor, the format and accuracy rewards are computed on the
outputs being optimised (the perturbed ones), the alignment reward on the pair. Plain GRPO (the
paper's single-branch baseline) is the same reward without r^A.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import torch

import judge as judges
from machinery.datasets import answers

log = logging.getLogger(__name__)

# Alg. 1 l.2 / Eq. 9; Video-R1's format reward: the whole output is <think>...</think> then <answer>...</answer>
FORMAT_PATTERN = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)


def format_reward(text: str) -> float:
    """Eq. 9 (Alg. 1 Step 1): 1.0 if the output, stripped of surrounding whitespace, is exactly a
    <think>...</think> block followed by an <answer>...</answer> block, else 0.0. The stripping is our addition
    (answers.EXTENSIONS["format_whitespace"]): Video-R1's fullmatch gives "...</answer>\n" 0."""
    return 1.0 if isinstance(text, str) and FORMAT_PATTERN.fullmatch(text.strip()) else 0.0


def accuracy_reward(text: str, answer: str, problem_type: str, source: str | None = None) -> float:
    """Eq. 10 (Alg. 1 Step 3): r^Acc = 1[a_j = g], generalised by problem type with Video-R1's
    training rules (answers.score with train_reward=True): the answer must sit in <answer> tags."""
    pred = answers.extract_answer(text, source, problem_type=problem_type, strict=True)
    return answers.score(pred, answer, problem_type, source, train_reward=True)


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


def _verdicts(judge, kind, pairs, allowed) -> tuple[list, list]:
    """(verdicts, the indices asked) of the judge on the (reference, candidate) `pairs`: a pair empty on either
    side is not asked and scores 0.0; a verdict outside `allowed` is missing (None)."""
    asked = [i for i, (ref, cand) in enumerate(pairs) if ref and cand]
    out: list = [0.0] * len(pairs)
    for i, v in zip(asked, judges.on_scale(judges.ask_pairs(judge, kind, [pairs[i] for i in asked]), allowed)):
        out[i] = v
    return out, asked


def _impute(values, missing):
    """Missing verdicts (None) filled with the mean of the group's others (missing="mean") or 0 ("zero")."""
    known = [v for v in values if v is not None]
    fill = sum(known) / len(known) if (known and missing == "mean") else 0.0
    return [fill if v is None else v for v in values]


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
    parts = [(answers.extract_reasoning(o), answers.extract_reasoning(o_t),   # Alg. 1 l.4-5
              answers.extract_answer(o, strict=True), answers.extract_answer(o_t, strict=True))
             for o, o_t in zip(clean_texts, perturbed_texts)]
    sim_r, ask_r = _verdicts(judge, "reasoning", [(p[0], p[1]) for p in parts], (0.0, 0.5, 1.0))  # Alg. 1 l.9
    sim_a, ask_a = _verdicts(judge, "answer", [(p[2], p[3]) for p in parts], (0.0, 1.0))  # Alg. 1 l.10
    n_missing = sum(v is None for v in sim_r) + sum(v is None for v in sim_a)
    notes = []
    if n_missing:
        notes.append(f"{n_missing} of {len(ask_r) + len(ask_a)} judge verdicts missing ({missing}-imputed)")
        log.warning("alignment_reward: %s", notes[-1])
    r_vals, a_vals = _impute(sim_r, missing), _impute(sim_a, missing)
    rewards = [alpha_r * r + alpha_a * a for r, a in zip(r_vals, a_vals)]  # Alg. 1 l.12
    return Alignment(rewards, sim_r, sim_a, n_missing, n - len(set(ask_r) & set(ask_a)), notes)


def total_reward(texts, answer: str, problem_type: str, reference_texts=None, judge=None, *,
                 w_format: float = 1.0, w_acc: float = 1.0, alpha_r: float = 0.3, alpha_a: float = 0.7,
                 source: str | None = None, missing: str = "mean"):
    """Alg. 1 l.13: R_j = w_F r^F_j + w_Acc r^Acc_j + r^A_j for the G rollouts `texts` of one query
    (App. D: w_F = w_Acc = 1.0). With `reference_texts` (the clean branch's G rollouts) and a judge,
    r^A is the alignment reward of each pair; without them (plain GRPO) r^A = 0.
    Returns (rewards, components) where components holds the per-rollout lists "format",
    "accuracy", "alignment", "sim_r", "sim_a" and the counts "judge_missing", "judge_skipped"
    (an RL subclass adds its own terms: train.RL.reward)."""
    r_f = [format_reward(t) for t in texts]
    r_acc = [accuracy_reward(t, answer, problem_type, source) for t in texts]
    if reference_texts is not None and judge is not None:
        al = alignment_reward(reference_texts, texts, judge, alpha_r, alpha_a, missing)
    else:
        al = Alignment([0.0] * len(texts), [None] * len(texts), [None] * len(texts))
    rewards = [w_format * f + w_acc * a + r for f, a, r in zip(r_f, r_acc, al.rewards)]
    return rewards, {"format": r_f, "accuracy": r_acc, "alignment": al.rewards, "sim_r": al.sim_r,
                     "sim_a": al.sim_a, "judge_missing": al.missing,
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


ADVANTAGES = ("summed", "per_component")   # train.py's `advantage`: group_advantages of R_j, or component_advantages


def component_advantages(components, weights, eps: float = 1e-4) -> torch.Tensor:
    """App. H.1's multi-component reading of Eq. 8: each reward component normalised within its group, then added
    with its weight, A_j = sum_k w_k (r^k_j - mean(r^k)) / (std(r^k) + eps). `components`: {name: [B, G]}
    (unweighted), `weights`: {name: w_k}. H.1 compares it with "a single combined reward that merges all components
    into one scalar via weighted summation before advantage estimation": group_advantages(sum_k w_k r^k)."""
    return sum(w * group_advantages(components[k], eps) for k, w in weights.items())


LOSS_NORMS = ("sequence", "fixed", "token")   # train.py's `loss_norm`: what `aggregate` divides Eq. 7's sum by


def token_losses(logp, old_logp, ref_logp, advantages, mask, clip_eps: float = 0.2, beta: float = 0.01):
    """Eq. 7's summand as a loss to minimise, per token of N completions of T tokens (logp, old_logp, ref_logp, mask:
    [N, T]; advantages: [N]): -min(r A, clip(r, 1 - eps, 1 + eps) A) + beta KL(F_theta || F_ref), r = exp(logp -
    old_logp) being the ratio F_theta / F_theta_old and the KL the k3 estimator exp(ref - logp) - (ref - logp) - 1
    (App. D: eps = 0.2, beta = 0.01). Returns ([N, T] losses, stats: the means of "kl", "clip_fraction" (the clip
    active) and "ratio" over the unmasked tokens)."""
    mask = mask.to(logp.dtype)
    adv = advantages.to(logp.dtype).unsqueeze(1)
    ratio = torch.exp(logp - old_logp)
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    delta = ref_logp - logp
    kl = torch.exp(delta) - delta - 1  # k3: unbiased, always >= 0
    with torch.no_grad():
        n_tok = mask.sum().clamp(min=1)
        clipped = ((ratio < 1 - clip_eps) & (adv < 0)) | ((ratio > 1 + clip_eps) & (adv > 0))
        stats = {"kl": float((kl * mask).sum() / n_tok), "clip_fraction": float((clipped * mask).sum() / n_tok),
                 "ratio": float((ratio * mask).sum() / n_tok)}
    return -surrogate + beta * kl, stats


# ----------------------------------------------------------------------------- Eq. 7's normalisation (loss_norm)
# The paper writes Eq. 7 for one group (1/G sum_j 1/|o_j| sum_t) and is silent on how a step's groups combine when
# the curriculum keeps only some (docs/DESIGN.md, "What Eq. 7 is averaged over"). Over the completions i a step
# trains (T_i tokens each, counted as at least 1; losses l_it: token_losses), its loss L is
#   sequence  L = sum_i (1/T_i sum_t l_it) / N         N = the completions trained (DeepSeekMath; TRL "grpo")
#   fixed     L = sum_i (1/T_i sum_t l_it) / (W B G)   B x G per process (App. D's batch) however few were kept: the
#                                                      update shrinks with them (Dr. GRPO's constant)
#   token     L = sum_i sum_t l_it / sum_i T_i         every trained token alike (DAPO)
# `count` gives one process's part of the denominator; train.py sums them over the processes once per step and
# `agg_loss` divides each micro-batch's part of the sum by it, so the micro-batches' terms add up to L.

def count(loss_norm: str, tokens, fixed: int) -> float:
    """One process's part of its step's denominator: its completions (sequence), `fixed` = B x G (fixed) or their
    tokens (token). `tokens`: each completion's token count [N], or the masks [N, T]; None: it trains none."""
    if loss_norm == "fixed":
        return float(fixed)
    return 0.0 if tokens is None else float(tokens.sum() if loss_norm == "token" else len(tokens))


def agg_loss(per_token, mask, loss_norm: str, denominator: float | None = None):
    """Eq. 7 normalised by `loss_norm` (above) on N completions (`per_token` [N, T] from token_losses, `mask` [N, T]):
    their part of the sum divided by `denominator` (count's, summed over the step), or, with None, the batch's own
    normalised mean (the batch is a whole step on one process; fixed: a full one, N = B x G)."""
    mask = mask.to(per_token.dtype)
    if loss_norm == "token":   # the mean of its tokens' losses; their number
        mean, size = (per_token * mask).sum() / mask.sum().clamp(min=1), mask.sum()
    elif loss_norm in ("sequence", "fixed"):   # the mean of its completions' token means; their number
        mean, size = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).mean(), len(per_token)
    else:
        raise ValueError(f"loss_norm must be one of {', '.join(LOSS_NORMS)}, got {loss_norm!r}")
    return mean if denominator is None else mean * size * (1.0 / denominator)   # (the sum as mean x size)


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_eps: float = 0.2, beta: float = 0.01,
              loss_norm: str = "sequence"):
    """Eq. 7 as a loss to minimise on a whole step (the defaults: DeepSeekMath's GRPO, TRL's loss_type="grpo"):
    agg_loss of token_losses. Returns (the loss, token_losses' stats)."""
    per_token, stats = token_losses(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta)
    return agg_loss(per_token, mask, loss_norm), stats
