"""What reproduction v5 reads off a finished run and its evaluation (experiments/reproduce_v5.py writes them into
experiments/results/v5.json): Table 2's columns per clip (for standard errors clustered by clip), the curriculum per
window of steps (Table 12's columns), the buffer's re-evaluation outcomes, optimiser updates, samples seen and
the share of trained groups whose rewards were all equal. Reads files only; runs nothing.
"""
from __future__ import annotations

import glob
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]
import perturb  # noqa: E402  (the subtypes' categories, Table 8)
from reproduce import rl_records  # noqa: E402  (a run's RL step records, as version 4 reads them)

CATEGORY_NAMES = ("lighting", "occlusion", "camera", "weather")   # Table 2's column order


def latest(folder, pattern):
    found = sorted(glob.glob(str(Path(folder) / pattern)))
    return Path(found[-1]) if found else None


def samples(folder):
    """An evaluation's latest sample log (eval_pvrbench.py's `*_samples_*.jsonl`) as a list of dicts."""
    path = latest(folder, "*_samples_*.jsonl")
    if path is None:
        raise FileNotFoundError(f"no sample log in {folder}")
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def table2(scores):
    """Table 2's figures of {condition: [scores]}: Orig. (clean), each category the mean of its subtypes' means,
    Avg. the mean of the categories present, drop 1 - Avg. / Orig."""
    mean = {c: statistics.fmean(v) for c, v in scores.items() if v}
    cats = {}
    for cat in CATEGORY_NAMES:
        subs = [mean[s] for s in perturb.CATEGORIES[cat] if s in mean]
        if subs:
            cats[cat] = statistics.fmean(subs)
    avg = statistics.fmean(cats.values()) if cats else None
    orig = mean.get("clean")
    drop = (1 - avg / orig) if avg is not None and orig else None
    return {"orig": orig, "avg": avg, "drop": drop, "categories": cats}


def per_clip(rows):
    """{clip: Table 2's figures on that clip's questions} from sample-log rows (a row without a score counts 0,
    as the benchmark scores it)."""
    by_clip = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by_clip[r["video_id"]][r["condition"]].append(float(r["score"] or 0.0))
    return {clip: table2(conds) for clip, conds in sorted(by_clip.items())}


def evaluation(folder):
    """Table 2's figures of a whole evaluation and per clip: {"orig", "avg", "drop", "categories", "clips":
    {clip: [orig, avg]}}. The whole is the mean over clips when every clip has the same conditions (--assign all)."""
    rows = samples(folder)
    conds = defaultdict(list)
    for r in rows:
        conds[r["condition"]].append(float(r["score"] or 0.0))
    whole = table2(conds)
    whole["clips"] = {c: [v["orig"], v["avg"]] for c, v in per_clip(rows).items()}
    return whole


def drop_pseudo(clips):
    """Per-clip pseudo-values of the drop 1 - A / O (delta method): with r = A / O over all clips, clip c's value
    is 1 - (r + (A_c - r O_c) / O); their mean is the drop, so the drop's SE clusters by clip like a mean's. None
    when O is 0 (no drop is defined)."""
    clips = {c: v for c, v in clips.items() if None not in v}
    orig = statistics.fmean(o for o, _ in clips.values()) if clips else 0.0
    if not orig:
        return None
    avg = statistics.fmean(a for _, a in clips.values())
    r = avg / orig
    return {c: 1 - (r + (a - r * o) / orig) for c, (o, a) in clips.items()}


def counts(rec):
    """(fresh samples, fresh samples trained, promotions trained) of one RL step record. Table 12's rho_t counts
    fresh samples only (records.decisions); a record written before it did (no `trained` key: v5's runs) counted
    the buffer's promotions, all trained, in `samples` and `selected`, and they are taken out here."""
    promoted = rec.get("promoted_trained", 0) or 0
    if "trained" in rec:
        return rec.get("samples", 0), rec.get("selected", 0), promoted
    return rec.get("samples", 0) - promoted, rec.get("selected", 0) - promoted, promoted


def curriculum(recs, window=20):
    """Table 12's columns per window of `window` steps: easy discarded and hard deferred (shares of the fresh
    samples assessed), rho (the share of them trained: promotions from the buffer count in none of the three), and
    the buffer's mean size over the window's steps (at a re-evaluation step it can be empty, so its size at the
    window's end says little)."""
    out = []
    for start in range(0, len(recs), window):
        part = recs[start:start + window]
        fresh = [counts(r) for r in part]
        n = sum(f for f, _, _ in fresh)

        def share(total):
            return total / n if n else None
        out.append({"steps": [part[0]["step"], part[-1]["step"]],
                    "easy_discarded": share(sum(r.get("discarded", 0) for r in part)),
                    "hard_deferred": share(sum(r.get("deferred", 0) for r in part)),
                    "rho": share(sum(t for _, t, _ in fresh)),
                    "buffer": statistics.fmean(r.get("buffer_size", 0) for r in part)})
    return out


def reevaluation(buffer_stats):
    """The buffer's re-evaluation outcomes over a run (App. G.4: 18% promoted, 12% evicted): promoted, evicted as
    easy, evicted past N_max, kept (re-assessed and left in the buffer)."""
    b = buffer_stats or {}
    done = {"promoted": int(b.get("promoted", 0)), "evicted_easy": int(b.get("evicted_easy", 0)),
            "evicted_nmax": int(b.get("evicted_n_max", 0))}
    return done | {"kept": int(b.get("reevaluations", 0)) - sum(done.values()),
                   "reevaluations": int(b.get("reevaluations", 0))}


def training(run, window=20):
    """What a train.py run's log.jsonl and summary.json say: optimiser updates, steps, samples seen (rolled out:
    fresh samples and the buffer's promotions), the trained groups, rho (trained / seen, as v5 recorded it; its
    rova-random runs discard at that rate), rho_fresh (Table 12's rho_t: the share of the fresh samples trained),
    the curriculum per window, re-evaluation outcomes, the zero-variance share, seconds per step."""
    recs = rl_records(Path(run))
    summary = json.loads((Path(run) / "summary.json").read_text())
    fresh = [counts(r) for r in recs]
    promoted = int(sum(p for _, _, p in fresh))
    n_fresh, n_fresh_trained = int(sum(f for f, _, _ in fresh)), int(sum(t for _, t, _ in fresh))
    groups, seen = n_fresh_trained + promoted, n_fresh + promoted
    return {"updates": int(recs[-1].get("updates", 0)) if recs else 0, "steps": len(recs),
            "samples_seen": seen, "trained_groups": groups, "promoted_trained": promoted,
            "rho": groups / seen if seen else None, "rho_fresh": n_fresh_trained / n_fresh if n_fresh else None,
            "curriculum": curriculum(recs, window), "reeval": reevaluation(summary.get("buffer")),
            "zero_variance_share": (sum(r.get("flat_groups", 0) for r in recs) / groups) if groups else None,
            "sec_step": statistics.fmean(r["sec_step"] for r in recs) if recs else None,
            "sec_phases": {k[4:]: statistics.fmean(r.get(k, 0.0) for r in recs)
                           for k in sorted({k for r in recs for k in r if k.startswith("sec_") and k != "sec_step"})}}
