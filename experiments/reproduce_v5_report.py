"""Reproduction v5's claims, decided by the rules committed before its first run (experiments/results/v5-rules.md), and its
section of docs/RESULTS.md. Reads the summary (experiments/results/v5.json) only; runs nothing.

Every claim predicts a positive difference "a - b" over the seeds both rows ran, paired by seed and by clip
(measure_v5's per-clip Table 2 figures), with powered.two_way_se's standard error. The primary claim is tested
alone at 5%; the secondary claims are one Holm family at 5% (powered.holm); powered.verdict names the outcome.
Each claim is decided twice: by the committed rule (p and MDE from the normal distribution: `p`, `p_holm`,
`mde`, `verdict`, unchanged) and, added after the runs, with Student's t at G - 1 degrees of freedom, G the
number of seeds (`df`, `p_t`, `p_holm_t`, `mde_t`, `verdict_t`: powered's module docstring).
"""
from __future__ import annotations

import statistics

import measure_v5 as measure
import powered

BEGIN, END = "<!-- reproduce-v5:begin -->", "<!-- reproduce-v5:end -->"
PRIMARY = ("Table 3: ROVA's perturbed Avg. above naive dual-branch's", "rova", "dual", "avg")
# (claim, a, b, measure): the Holm family. `measure`: avg | orig | drop (per-clip pseudo-values, smaller is
# better, so b - a) | a function of a run (costs, one value per seed).
SECONDARY = (
    ("Table 2: ROVA's drop below standard GRPO's", "grpo", "rova", "drop"),
    ("robust training: ROVA's Avg. above the SFT start's", "rova", "start", "avg"),
    ("ROVA keeps clean accuracy: Orig. above the start's - 0.02", "rova", "start", "orig"),
    ("Fig. 4c: the curriculum above random discarding at the same rho", "rova", "rova-random", "avg"),
    ("Table 13: memory re-evaluation helps (ROVA above w/o re-evaluation)", "rova", "rova-no-reeval", "avg"),
    ("Fig. 5a: the alignment reward helps (ROVA above alpha = 0)", "rova", "rova-no-align", "avg"),
    ("App. H.1: per-component advantages above the summed reward", "rova+h1", "rova", "avg"),
    ("Table 13: a ROVA step cheaper than a naive dual-branch step", "dual", "rova", "sec_step"),
    ("Table 14: self-assessment under 10% of a ROVA step", "rova", None, "assess_share"),
    ("Table 14: memory re-evaluation under 10% of a ROVA step", "rova", None, "reeval_share"),
)
KEEP_MARGIN, SHARE_LIMIT = 0.02, 0.10
FILL_ROUNDS_RUN = 4   # reproduce_v5.RL_PINS: the fill-up v5's ROVA steps ran with
# Table 13 as App. G defines it (fill_rounds 0), on v5's start and toy: writes `cost_app_g` (benchmarks/bench_step.py)
APP_G_COMMAND = "python benchmarks/bench_step.py --v5 --steps 40 --repeats 5 --write experiments/results/v5.json"
# Claims whose measurement cannot decide them, whatever the rule says (the rule's verdicts stay beside the label).
# v5's ROVA step drew from the stream until batch_size samples were selected (fill_rounds 4): it rolled out about
# N / rho samples and trained N, where App. G's step (Eq. 13) rolls out N and trains rho N. Against a dual step,
# which rolls out and trains N, it is dearer by construction, so it cannot test Table 13's claim.
RELABELLED = {"Table 13: a ROVA step cheaper than a naive dual-branch step":
              "uninformative: the fill-up trains a full batch"}
# Table 12: (steps, easy discarded %, difficult deferred %, rho, buffer) over the paper's 300 steps
TABLE12 = (("0-50", 2.1, 11.8, 0.861, 127), ("50-100", 3.8, 9.5, 0.867, 248), ("100-150", 5.4, 7.2, 0.874, 341),
           ("150-200", 7.1, 5.8, 0.871, 389), ("200-250", 8.6, 4.3, 0.871, 352), ("250-300", 9.8, 3.5, 0.867, 298))


def difference_matrix(a_clips, b_clips, index=1):
    """seeds x clips: run a's minus run b's value per clip (`index` 0: Orig., 1: Avg.) for each seed's pair of
    {clip: [orig, avg]}; the clips both evaluated, in order."""
    common = sorted(set.intersection(*({k for k, v in c.items() if None not in v} for c in [*a_clips, *b_clips])))
    return [[a[c][index] - b[c][index] for c in common] for a, b in zip(a_clips, b_clips)]


def _clips(summary, row, seed):
    if row == "start":
        return summary["start"]["clips"]
    run = summary["runs"].get(f"{row}-s{seed}")
    return run["clips"] if run else None


def _run_value(run, what):
    phases, step = run.get("sec_phases") or {}, run.get("sec_step")
    if what == "sec_step":
        return step
    share = {"assess_share": phases.get("self_assessment"), "reeval_share": phases.get("memory_reevaluation")}
    return share[what] / step if share.get(what) is not None and step else None


COSTS = ("sec_step", "assess_share", "reeval_share")


def _cost_row(summary, a, b, what, seed):
    """[a's cost minus b's] of one seed (b None: SHARE_LIMIT minus a's share), or None if a run is missing."""
    ra, rb = summary["runs"].get(f"{a}-s{seed}"), summary["runs"].get(f"{b}-s{seed}") if b else None
    va = _run_value(ra, what) if ra else None
    vb = (_run_value(rb, what) if rb else None) if b else SHARE_LIMIT
    if va is None or vb is None:
        return None
    return [va - vb] if b else [vb - va]


def _clip_row(summary, a, b, what, seed):
    """a's minus b's figure per clip in one seed (drop: pseudo-values; orig: with the keep margin), or None."""
    ca, cb = _clips(summary, a, seed), _clips(summary, b, seed)
    if ca is None or cb is None:
        return None
    if what == "drop":   # a's drop minus b's (a: the row predicted to drop more)
        pa, pb = measure.drop_pseudo(ca), measure.drop_pseudo(cb)
        return None if pa is None or pb is None else [pa[c] - pb[c] for c in sorted(set(pa) & set(pb))]
    d = difference_matrix([ca], [cb], 0 if what == "orig" else 1)[0]
    return [x + KEEP_MARGIN for x in d] if what == "orig" else d


def matrix(summary, a, b, what, seeds):
    """The seeds x clips (or seeds x 1, for a run's cost) matrix of a claim, over the seeds where both ran."""
    row = _cost_row if what in COSTS else _clip_row
    return [r for r in (row(summary, a, b, what, seed) for seed in seeds) if r is not None]


def _measured(summary, text, a, b, what, seeds):
    """One claim's difference, SE, MDE and p (no verdict yet), or "not measured"."""
    m = matrix(summary, a, b, what, seeds)
    if not m or not m[0]:
        return {"claim": text, "difference": None, "se": None, "mde": None, "p": None, "verdict": "not measured",
                "primary": text == PRIMARY[0], "seeds": 0, "df": None, "mde_t": None, "p_t": None,
                "verdict_t": "not measured"}
    mean, se = powered.two_way_se(m)
    df = powered.degrees_of_freedom(m)
    return {"claim": text, "difference": mean, "se": se, "mde": powered.mde(se), "p": powered.p_value(mean, se),
            "primary": text == PRIMARY[0], "seeds": len(m),
            "informative": not (what == "orig" and summary["start"]["orig"] >= 0.98),
            "df": df, "mde_t": powered.mde_t(se, df), "p_t": powered.p_value_t(mean, se, df)}


def claims(summary):
    """Every claim with its difference, SE, MDE, p and verdict (module docstring)."""
    if not summary.get("start") or not summary.get("power"):
        return []
    main, ablation = list(range(summary["power"]["seeds"])), summary["settings"]["ablation_seeds"]
    out = [_measured(summary, text, a, b, what,
                     ablation if any(r in summary["settings"]["ablations"] for r in (a, b)) else main)
           for text, a, b, what in (PRIMARY, *SECONDARY)]
    secondary = [c for c in out if not c["primary"] and c["p"] is not None]
    for suffix in ("", "_t"):   # the committed rule (normal), then Student's t at G - 1 df
        rejected, adjusted = powered.holm([c["p" + suffix] for c in secondary])
        for c, rej, adj in zip(secondary, rejected, adjusted):
            c["p_holm" + suffix], c["significant" + suffix] = adj, rej
    for c in out:
        if c["p"] is not None:
            for suffix, df in (("", None), ("_t", c["df"])):
                p = c["p" + suffix]
                c["significant" + suffix] = p < powered.ALPHA if c["primary"] else c["significant" + suffix]
                c["verdict" + suffix] = powered.verdict(c["difference"], c["se"], significant=c["significant" + suffix],
                                                        informative=c["informative"], df=df)
        if c["claim"] in RELABELLED:
            c["relabel"] = RELABELLED[c["claim"]]
    return out


def power(summary):
    """{"seeds", "planned_mde" (the pilot's), "mde" and "mde_t" (the primary claim's, once measured)}."""
    p = dict(summary.get("power") or {})
    primary = next((c for c in summary.get("claims", []) if c.get("primary")), None)
    if p:
        p["mde"] = primary["mde"] if primary else None
        p["mde_t"] = primary.get("mde_t") if primary else None
    return p or None


def _f(x, digits=3, sign=False):
    return "–" if x is None else (f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}")


def render(summary):
    """The marked section of docs/RESULTS.md."""
    s, lines = summary, []
    lines += [f"Measured by `{s['command']}` ({s.get('date', '?')}); rules: experiments/results/v5-rules.md at commit "
              f"{(s.get('rules_commit') or '?')[:12]}; summary: experiments/results/v5.json; stage time so far "
              f"{s.get('wall_s', 0) / 3600:.2f} h.", ""]
    if s.get("start"):
        st = s["start"]
        lines += [f"The start (SFT): Orig. {_f(st['orig'])}, Avg. {_f(st['avg'])}, drop {_f(st['drop'])} on the "
                  f"reported questions; on the validation split Orig. {_f(st['validation']['orig'])}, Avg. "
                  f"{_f(st['validation']['avg'])}.", ""]
    if s.get("budget"):
        b = s["budget"]
        lines += ["Learning rate (dual, seed 0, validation; gain in corrupted Avg. over the start): " +
                  ", ".join(f"{k}: {_f(v, sign=True)}" for k, v in b["grid"].items()) +
                  f"; chosen {b['lr']:g}, {b['steps']} steps (gain target 0.05 "
                  f"{'reached' if b['reached'] else 'not reached'}).", ""]
    if s.get("pilot"):
        p = s["pilot"]
        lines += [f"Pilot (seeds {p['seeds']}, validation): ROVA - dual {_f(p['difference'], sign=True)} ± "
                  f"{_f(p['se'])}; seeds for an MDE <= 0.01: {p['seeds_needed'] or 'none up to the cap'} "
                  f"(planned MDE {_f(p['planned_mde'])}).", ""]
    lines += _runs_table(s) + _costs_table(s) + _curriculum_table(s) + _claims_table(s)
    return "\n".join(lines) + "\n"


def rows_of(s, row):
    return [r for r in s["runs"].values() if r["row"] == row]


def curriculum_windows(s, row="rova"):
    """Table 12's columns per window, averaged over the row's seeds (windows in step order)."""
    runs = [r["curriculum"] for r in rows_of(s, row) if r.get("curriculum")]
    if not runs:
        return []
    out = []
    for k in range(min(len(c) for c in runs)):
        w = [c[k] for c in runs]
        out.append({"steps": w[0]["steps"]} | {key: statistics.fmean(x[key] for x in w if x[key] is not None)
                                               if any(x[key] is not None for x in w) else None
                                               for key in ("easy_discarded", "hard_deferred", "rho", "buffer")})
    return out


def fresh_rho(run):
    """Table 12's rho_t over a whole run: the share of its fresh samples trained. A run measured since records count
    fresh samples records it (measure_v5.training's rho_fresh); v5's recorded runs counted the buffer's promotions
    among the samples seen and the trained groups, and every promotion is trained (Alg. 2 l.17; a run's last step
    re-evaluates nothing), so it is (trained - promoted) / (seen - promoted)."""
    if run.get("rho_fresh") is not None:
        return run["rho_fresh"]
    promoted = (run.get("reeval") or {}).get("promoted", 0)
    seen = run.get("samples_seen", 0) - promoted
    return (run.get("trained_groups", 0) - promoted) / seen if seen > 0 else None


def _fresh_rho_lines(s):
    rova = rows_of(s, "rova")
    if not rova or all(r.get("rho_fresh") is not None for r in rova):
        return []
    fresh, recorded = [fresh_rho(r) for r in rova], [r["rho"] for r in rova]
    out = [f"These windows count the buffer's promotions among the samples and the trained, as v5's logs did; Table "
           f"12's rho_t counts fresh samples only. Over whole runs, fresh samples only: ROVA's rho "
           f"{statistics.fmean(fresh):.3f} ({min(fresh):.3f}-{max(fresh):.3f} over {len(fresh)} seeds) against the "
           f"{statistics.fmean(recorded):.3f} recorded (seed 0: {fresh_rho(rova[0]):.3f} against {rova[0]['rho']:.3f}; "
           "(trained - promoted) / (seen - promoted), every promotion trained). The windows cannot be recomputed: "
           "experiments/results/v5.json holds each window's shares, not its promotions, and the runs' logs were not kept."]
    random = {r["seed"]: r for r in rows_of(s, "rova-random")}
    pairs = [(fresh_rho(r), r["rho"], fresh_rho(random[r["seed"]])) for r in rova if r["seed"] in random]
    if pairs:
        out[0] += (" Fig. 4c's control discarded at random at its seed's recorded rho, so it trained "
                   f"{statistics.fmean(x for _, _, x in pairs):.3f} of its fresh samples where ROVA trained "
                   f"{statistics.fmean(f for f, _, _ in pairs):.3f} (seeds {', '.join(map(str, sorted(random)))}).")
    return out + [""]


def _curriculum_table(s):
    windows = curriculum_windows(s)
    if not windows:
        return []
    rows = ["ROVA's curriculum per window of steps (mean over seeds), then the paper's Table 12 (300 steps, windows of "
            "50): the trends are what compare.", "", "| steps | easy discarded | hard deferred | rho | buffer |",
            "|---|---|---|---|---|"]
    rows += [f"| {w['steps'][0]}-{w['steps'][1]} | {_pct(w['easy_discarded'])} | {_pct(w['hard_deferred'])} | "
             f"{_f(w['rho'])} | {_f(w['buffer'], 1)} |" for w in windows]
    rows += [""] + _fresh_rho_lines(s)
    rows += ["| Table 12 steps | easy discarded | hard deferred | rho | buffer |", "|---|---|---|---|---|"]
    rows += [f"| {a} | {b}% | {c}% | {d} | {e} |" for a, b, c, d, e in TABLE12]
    re = [r["reeval"] for r in rows_of(s, "rova") if r.get("reeval")]
    total = sum(x["reevaluations"] for x in re)
    if total:
        rows += ["", "Re-evaluation outcomes over ROVA's runs (App. G.4: 18% promoted, 12% evicted): " + ", ".join(
            f"{k.replace('_', ' ')} {sum(x[k] for x in re)} ({sum(x[k] for x in re) / total:.0%})"
            for k in ("promoted", "evicted_easy", "evicted_nmax", "kept")) + f" of {total}."]
    return rows + [""]


def _costs_table(s):
    rows = ["| row | seeds | Avg. | Orig. | updates | samples seen | s/step | CPU s per run |",
            "|---|---|---|---|---|---|---|---|"]
    for row in dict.fromkeys(r["row"] for r in s["runs"].values()):
        rs = rows_of(s, row)

        def mean(key):
            vals = [r.get(key) for r in rs if r.get(key) is not None]
            return statistics.fmean(vals) if vals else None
        rows.append(f"| {row} | {len(rs)} | {_f(mean('avg'))} | {_f(mean('orig'))} | {_f(mean('updates'), 0)} | "
                    f"{_f(mean('samples_seen'), 0)} | {_f(mean('sec_step'), 2)} | {_f(mean('cpu_s'), 0)} |")
    return (["Per row at the fixed number of steps (Table 3's cost, Table 13's s/step; means over seeds):", ""]
            + rows + [""] + _unequal_work(s) + _table13(s)) if s["runs"] else []


def _mean(runs, key):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.fmean(vals) if vals else None


def _unequal_work(s):
    rova, dual = rows_of(s, "rova"), rows_of(s, "dual")
    seen, other = _mean(rova, "samples_seen"), _mean(dual, "samples_seen")
    if not seen or not other:
        return []
    return [f"At the same number of steps the rows did unequal work: ROVA rolled out {seen:,.0f} samples per run on "
            f"average (its steps drew from the stream until their batch was selected: fill_rounds "
            f"{FILL_ROUNDS_RUN}) against dual's {other:,.0f} ({seen / other:.2f}x), and trained "
            f"{_mean(rova, 'trained_groups'):,.0f} against {_mean(dual, 'trained_groups'):,.0f}. The primary "
            "comparison (Table 3) is at equal steps and nearly equal trained samples, not at equal rollouts.", ""]


def app_g_verdict(cost):
    """Table 13 from App. G's measurement: holds if ROVA's step is below dual's in every repeat, does not hold if
    above in every repeat, else mixed (experiments/results/v5-rules.md, "Added after the runs")."""
    ratios = [r["rova_over_dual"] for r in cost["per_repeat"]]
    return "holds" if all(x < 1 for x in ratios) else "does not hold" if all(x > 1 for x in ratios) else "mixed"


def _table13(s):
    rova, dual = rows_of(s, "rova"), rows_of(s, "dual")
    step, other = _mean(rova, "sec_step"), _mean(dual, "sec_step")
    if not step or not other:
        return []
    steps = _mean(rova, "steps")
    out = [f"**Table 13, a ROVA step against a naive dual-branch step.** As v5's runs measured it: ROVA {step:.2f} "
           f"s/step against dual's {other:.2f} ({step / other:.2f}x), **uninformative: the fill-up trains a full "
           f"batch**. A ROVA step rolled out {_mean(rova, 'samples_seen') / steps:.2f} samples on average and trained "
           f"{_mean(rova, 'trained_groups') / steps:.2f} (N = {s['settings']['rl']['batch_size']}): about N / rho "
           "rolled out to train N, where App. G's step (Eq. 13) rolls out N and trains rho N. Against a dual step, "
           "which rolls out and trains N, the fill-up's step is dearer by construction. Self-assessment itself is one "
           "answerability forward pass per fresh sample (no rollouts): the fill-up's extra cost is its extra draws' "
           "rollouts.", ""]
    cost = s.get("cost_app_g")
    if not cost:
        return out + [f"As App. G defines it (fill_rounds 0): not measured yet. `{APP_G_COMMAND}`, then `python "
                      "experiments/reproduce_v5.py --render`, measures it on v5's start and toy and writes `cost_app_g` "
                      "into experiments/results/v5.json; this row is then decided from it (holds if ROVA's step is below "
                      "dual's in every repeat, does not hold if above in every repeat, else mixed) and Eq. 15's "
                      "predicted ratio from its measured rho and components stands beside it.", ""]
    sp = cost["spread"]

    def rng(key, digits=3):
        return f"{sp[key]['min']:.{digits}f}-{sp[key]['max']:.{digits}f}" if key in sp else "–"
    out += [f"As App. G defines it (fill_rounds {cost['fill_rounds']}): `{cost['command']}` ({cost['date']}, commit "
            f"{(cost.get('commit') or '?')[:12]}, {cost['repeats']} repeats of {cost['steps']} timed steps, "
            f"{cost.get('cpus', '?')} CPUs): ROVA / dual {cost['rova_over_dual']:.3f} (repeats "
            f"{rng('rova_over_dual')}), ROVA / GRPO {cost['rova_over_grpo']:.3f} (repeats {rng('rova_over_grpo')}); "
            f"ROVA's rho {_f(cost['rho'])} (repeats {rng('rho')}), trained share {_f(cost.get('trained_share'))}; "
            f"Eq. 15's predicted ROVA / dual from these rho and components {_f(cost['predicted_ratio'])} (repeats "
            f"{rng('predicted_ratio')}). Table 13 (a ROVA step cheaper than a dual step): "
            f"**{app_g_verdict(cost)}**.", "",
            "| seconds per step (means over repeats) | grpo | dual | rova |", "|---|---|---|---|"]
    modes = ("grpo", "dual", "rova")
    out += [f"| {c.replace('_', ' ')} | " + " | ".join(f"{cost['components'][m][c]:.3f}" for m in modes) + " |"
            for c in cost["components"]["rova"]]
    out += ["| step | " + " | ".join(f"{cost['sec_per_step'][m]:.3f}" for m in modes) + " |",
            "| samples rolled out per step | " + " | ".join(f"{cost['samples_per_step'][m]:.2f}" for m in modes) + " |",
            "| samples trained per step | " + " | ".join(f"{cost['trained_per_step'][m]:.2f}" for m in modes) + " |"]
    rova_step, comp = cost["sec_per_step"]["rova"], cost["components"]["rova"]
    saved = (comp["alignment_reward"] + comp["backward"]) / rova_step
    out += ["", f"The paper's ratio is 403 / 428 = 0.94 (Table 13). The saving is on the alignment reward and the "
                f"backward of the (1 - rho) samples not selected; the rollouts of all N are paid either way. Here "
                f"the rollouts are {100 * comp['rollout'] / rova_step:.0f}% of ROVA's step and the alignment reward "
                f"and backward {100 * saved:.0f}% (Table 14: 70.8% and 21.1%), so the same rho saves more on this "
                f"CPU toy than on the paper's GPUs."]
    return out + [""]


def _pct(x):
    return "–" if x is None else f"{100 * x:.1f}%"


def chart(s, path):
    """Fig. 4a's kind of plot: ROVA's easy-discard and hard-defer rates per window (mean over seeds)."""
    windows = curriculum_windows(s)
    if not windows:
        return None
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from machinery.eval import run_files
    return run_files.bar_chart(path, [f"{w['steps'][0]}-{w['steps'][1]}" for w in windows],
                                [("easy discarded", (214, 96, 77), [w["easy_discarded"] for w in windows]),
                                 ("hard deferred", (67, 147, 195), [w["hard_deferred"] for w in windows])],
                                "ROVA's curriculum per window of steps (share of the samples assessed)")


def _runs_table(s):
    if not s["runs"]:
        return []
    rows = ["| run | Orig. | Avg. | drop | updates | steps | samples seen | rho (first window) | rho (run, fresh) | "
            "zero-variance | s/step | CPU s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in s["runs"].items():
        first = r["curriculum"][0]["rho"] if r.get("curriculum") else None
        rows.append(f"| {name} | {_f(r['orig'])} | {_f(r['avg'])} | {_f(r['drop'])} | {r['updates']} | "
                    f"{r['steps']} | {r['samples_seen']} | {_f(first, 2)} | {_f(fresh_rho(r), 3)} | "
                    f"{_f(r.get('zero_variance_share'), 2)} | {_f(r.get('sec_step'), 2)} | {_f(r.get('cpu_s'), 0)} |")
    return rows + [""]


def _p(x):
    return "–" if x is None else (f"{x:.1e}" if 0 < x < 0.001 else f"{x:.3f}")


def _verdict(c, suffix):
    v = c.get("verdict" + suffix)
    return f"{c['relabel']} (rule: {v})" if c.get("relabel") and v not in (None, "not measured") else v or "–"


def _claims_table(s):
    if not s.get("claims"):
        return []
    rows = ["Each claim decided by the committed rule (p and MDE from the normal distribution, as pre-registered in "
            "experiments/results/v5-rules.md) and by Student's t with G - 1 degrees of freedom, G the number of seeds "
            "(Cameron and Miller 2015; added after the runs, the same data and the same decision rule):", "",
            "| claim | difference ± SE | seeds (df) | MDE: normal / t | p (Holm): normal, pre-registered | "
            "p (Holm): t, G - 1 df | verdict: normal, pre-registered | verdict: t, G - 1 df |",
            "|---|---|---|---|---|---|---|---|"]
    for c in s["claims"]:
        p = _p(c.get("p")) + (f" ({_p(c.get('p_holm'))})" if c.get("p_holm") is not None else "")
        pt = _p(c.get("p_t")) + (f" ({_p(c.get('p_holm_t'))})" if c.get("p_holm_t") is not None else "")
        rows.append(f"| {'**primary** ' if c['primary'] else ''}{c['claim']} | {_f(c['difference'], sign=True)} ± "
                    f"{_f(c['se'])} | {c['seeds']} ({c['df'] if c.get('df') is not None else '–'}) | "
                    f"{_f(c['mde'])} / {_f(c.get('mde_t'))} | {p} | {pt} | {_verdict(c, '')} | {_verdict(c, '_t')} |")
    if cost := s.get("cost_app_g"):   # the decided Table 13 row: App. G's step, timed apart (no seeds, no p)
        ratios = [r["rova_over_dual"] for r in cost["per_repeat"]]
        rows.append(f"| Table 13 at App. G's step (fill_rounds {cost['fill_rounds']}; bench_step, rova / dual per "
                    f"repeat) | {cost['rova_over_dual']:.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | "
                    f"{cost['repeats']} repeats | – | – | – | {app_g_verdict(cost)} | {app_g_verdict(cost)} |")
    return rows + [""] + _changed(s) + [""]


def _changed(s):
    """Which verdicts Student's t changes, in words."""
    claims = [c for c in s["claims"] if c.get("verdict_t") not in (None, "not measured")]
    if not claims:
        return []
    changed = [c for c in claims if c["verdict"] != c["verdict_t"]]
    primary = next((c for c in claims if c["primary"]), None)

    def p_of(c, suffix):
        return c.get("p_holm" + suffix) if c.get("p_holm" + suffix) is not None else c.get("p" + suffix)
    dfs = sorted({c["df"] for c in claims})
    text = (f"With Student's t at G - 1 degrees of freedom ({' or '.join(map(str, dfs))} here), "
            + (f"{len(changed)} verdict{'s' if len(changed) > 1 else ''} change: " + "; ".join(
                f"{c['claim']}: {c['verdict']} -> {c['verdict_t']} (p {'Holm ' if c.get('p_holm') is not None else ''}"
                f"{_p(p_of(c, ''))} -> {_p(p_of(c, '_t'))})" for c in changed) if changed else "no verdict changes")
            + ".")
    if primary and primary.get("mde_t") is not None:
        text += (f" The primary claim's MDE is {100 * primary['mde_t']:.1f} points with t, not "
                 f"{100 * primary['mde']:.1f}.")
    seeds = " or ".join(str(n) for n in sorted({c["seeds"] for c in claims}))
    text += (" The committed rule (experiments/results/v5-rules.md) took p and the MDE from the normal distribution, which is "
             f"anti-conservative with this few clusters ({seeds} seeds): its p-values are too small and its MDEs too "
             "short. The pre-registered verdicts are kept as they came; the t column is the sound reading.")
    return [text]
