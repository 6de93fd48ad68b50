"""The RL step's log record: this rank's sums and counts (`key_sum`, `key_n`), reduced over ranks by
distributed.reduce_record into the means log.jsonl shows. Every key is in every record, on every rank (None where
there is no data), so that the reduction sums them in the same order."""
from __future__ import annotations

from collections import defaultdict


def flat(lists):
    return [v for vals in lists for v in vals or []]


def decisions(items, selected, categories, category_of):
    """The curriculum's counts of a step, overall and per corruption category (Table 12's rates by category:
    `cat_<category>_<samples | trained | deferred | discarded>`), and the trained groups whose rewards are all
    equal (`flat_groups`: zero advantage, no gradient but the KL's).

    Table 12's rho_t is the share of a step's fresh samples that survive filtering (App. G, Eq. 13), so `samples`,
    `selected`, `discarded`, `deferred` and the per-category counts count fresh samples only (those drawn from the
    stream and self-assessed); the buffer's promotions (Alg. 2 l.17: trained without a new assessment) are counted
    apart, as `promoted_trained`. `trained` is every group the step trained: selected + promoted_trained."""
    fresh = [it for it in items if not it.promoted]
    trained = {id(it) for it in selected}
    out = {"samples": len(fresh), "discarded": sum(it.decision == "discard" for it in fresh),
           "deferred": sum(it.decision == "defer" for it in fresh),
           "selected": sum(id(it) in trained for it in fresh), "trained": len(selected),
           "promoted_trained": sum(it.promoted for it in selected),
           "flat_groups": sum(bool(it.rewards) and max(it.rewards) - min(it.rewards) < 1e-9 for it in selected)}
    for cat in categories:  # every key on every rank (distributed.reduce_record sums them in order)
        mine = [it for it in fresh if category_of.get(it.spec.subtype) == cat]
        out |= {f"cat_{cat}_samples": len(mine), f"cat_{cat}_trained": sum(id(it) in trained for it in mine),
                f"cat_{cat}_deferred": sum(it.decision == "defer" for it in mine),
                f"cat_{cat}_discarded": sum(it.decision == "discard" for it in mine)}
    return out


def values(items, selected, on_corrupted):
    """Per-rollout values of the step: each branch's accuracy (`on_corrupted` False, --mode grpo: the clean one only),
    the selected samples' reward components and the judge's verdicts."""
    trained, other = ("acc_perturbed", "acc_clean") if on_corrupted else ("acc_clean", "acc_perturbed")
    out = {trained: flat(it.acc for it in items), other: flat(it.clean_acc for it in items),
           "r_total": flat(it.rewards for it in selected)}
    for key in ("format", "accuracy", "alignment", "temporal"):
        out[f"r_{key}"] = flat(it.comp.get(key) for it in selected)
    for key in ("sim_r", "sim_a"):
        out[key] = [v for v in flat(it.comp.get(key) for it in selected) if v is not None]
    return out


def step_record(items, selected, loss_stats, n_rows, per_rollout, *, buffer_size, seconds, weights, categories,
                category_of, missing=0, promoted=0, evicted=0):
    """This rank's record of one step: counts (`samples`: the fresh ones; `promoted`, `evicted`: the buffer's
    re-evaluation at this step), the curriculum's decisions (`decisions`), the sums of `per_rollout` values ({key:
    list}), the loss statistics' means over the `n_rows` trained completions, each phase's `seconds`, and the reward
    `weights` (w_format, w_acc, w_alignment); the rollout engine's sync check from the loss statistics (the mean
    |engine - policy| log-prob per trained token over every rank's completions, the same on each rank, logged as
    engine_logprob_gap; -1: none). distributed.reduce_record's rho = selected / samples is
    Table 12's rho_t: fresh samples only."""
    s = defaultdict(float, judge_missing=missing, promoted=promoted,
                    evicted=evicted, buffer_size=buffer_size,
                    engine_logprob_gap_max=loss_stats.get("engine_logprob_gap", -1.0),
                    **decisions(items, selected, categories, category_of))
    for key, vals in per_rollout.items():
        s[f"{key}_sum"], s[f"{key}_n"] = sum(vals), len(vals)
    for key in ("kl", "clip_fraction", "ratio", "loss"):  # means over the trained completions
        s[f"{key}_sum"], s[f"{key}_n"] = (loss_stats[key] * n_rows, n_rows) if key in loss_stats else (0.0, 0)
    s.update({f"sec_{k}": v for k, v in seconds.items()})
    s.update(w_format=weights[0], w_acc=weights[1], w_alignment=weights[2])
    return s
