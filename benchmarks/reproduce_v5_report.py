"""Reproduction v5's claims, decided by the rules committed before its first run (docs/results/v5-rules.md), and its
section of docs/RESULTS.md. Reads the summary (docs/results/v5.json) only; runs nothing.

Every claim predicts a positive difference "a - b" over the seeds both rows ran, paired by seed and by clip
(measure_v5's per-clip Table 2 figures), with powered.two_way_se's standard error. The primary claim is tested
alone at 5%; the secondary claims are one Holm family at 5% (powered.holm); powered.verdict names the outcome.
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
                "primary": text == PRIMARY[0], "seeds": 0}
    mean, se = powered.two_way_se(m)
    return {"claim": text, "difference": mean, "se": se, "mde": powered.mde(se), "p": powered.p_value(mean, se),
            "primary": text == PRIMARY[0], "seeds": len(m),
            "informative": not (what == "orig" and summary["start"]["orig"] >= 0.98)}


def claims(summary):
    """Every claim with its difference, SE, MDE, p and verdict (module docstring)."""
    if not summary.get("start") or not summary.get("power"):
        return []
    main, ablation = list(range(summary["power"]["seeds"])), summary["settings"]["ablation_seeds"]
    out = [_measured(summary, text, a, b, what,
                     ablation if any(r in summary["settings"]["ablations"] for r in (a, b)) else main)
           for text, a, b, what in (PRIMARY, *SECONDARY)]
    secondary = [c for c in out if not c["primary"] and c["p"] is not None]
    rejected, adjusted = powered.holm([c["p"] for c in secondary])
    for c, rej, adj in zip(secondary, rejected, adjusted):
        c["p_holm"], c["significant"] = adj, rej
    for c in out:
        if c["p"] is not None:
            c["significant"] = c["p"] < powered.ALPHA if c["primary"] else c["significant"]
            c["verdict"] = powered.verdict(c["difference"], c["se"], significant=c["significant"],
                                           informative=c["informative"])
    return out


def power(summary):
    """{"seeds", "planned_mde" (the pilot's), "mde" (the primary claim's, once measured)}."""
    p = dict(summary.get("power") or {})
    primary = next((c for c in summary.get("claims", []) if c.get("primary")), None)
    if p:
        p["mde"] = primary["mde"] if primary else None
    return p or None


def _f(x, digits=3, sign=False):
    return "–" if x is None else (f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}")


def render(summary):
    """The marked section of docs/RESULTS.md."""
    s, lines = summary, []
    lines += [f"Measured by `{s['command']}` ({s.get('date', '?')}); rules: docs/results/v5-rules.md at commit "
              f"{(s.get('rules_commit') or '?')[:12]}; summary: docs/results/v5.json; stage time so far "
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


def _curriculum_table(s):
    windows = curriculum_windows(s)
    if not windows:
        return []
    rows = ["ROVA's curriculum per window of steps (mean over seeds), then the paper's Table 12 (300 steps, windows of "
            "50): the trends are what compare.", "", "| steps | easy discarded | hard deferred | rho | buffer |",
            "|---|---|---|---|---|"]
    rows += [f"| {w['steps'][0]}-{w['steps'][1]} | {_pct(w['easy_discarded'])} | {_pct(w['hard_deferred'])} | "
             f"{_f(w['rho'])} | {_f(w['buffer'], 1)} |" for w in windows]
    rows += ["", "| Table 12 steps | easy discarded | hard deferred | rho | buffer |", "|---|---|---|---|---|"]
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
            + rows + [""]) if s["runs"] else []


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
    rows = ["| run | Orig. | Avg. | drop | updates | steps | samples seen | rho (first window) | zero-variance | "
            "s/step | CPU s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in s["runs"].items():
        first = r["curriculum"][0]["rho"] if r.get("curriculum") else None
        rows.append(f"| {name} | {_f(r['orig'])} | {_f(r['avg'])} | {_f(r['drop'])} | {r['updates']} | "
                    f"{r['steps']} | {r['samples_seen']} | {_f(first, 2)} | {_f(r.get('zero_variance_share'), 2)} | "
                    f"{_f(r.get('sec_step'), 2)} | {_f(r.get('cpu_s'), 0)} |")
    return rows + [""]


def _claims_table(s):
    if not s.get("claims"):
        return []
    rows = ["| claim | difference ± SE | MDE | p (Holm) | verdict |", "|---|---|---|---|---|"]
    for c in s["claims"]:
        p = _f(c.get("p"), 3) + (f" ({_f(c.get('p_holm'), 3)})" if c.get("p_holm") is not None else "")
        rows.append(f"| {'**primary** ' if c['primary'] else ''}{c['claim']} | {_f(c['difference'], sign=True)} ± "
                    f"{_f(c['se'])} | {_f(c['mde'])} | {p} | {c['verdict']} |")
    return rows + [""]
