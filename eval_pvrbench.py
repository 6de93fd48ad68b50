"""PVRBench evaluation: the static protocol of Sec. 4, scored as Table 2 (answer accuracy per perturbation
category and the five reasoning-quality metrics), on the sources of App. B.1 (VSI-Bench, UrbanVideo-Bench).

    python eval_pvrbench.py          # demo: runs/rova/final (else an untrained tiny model) on the synthetic benchmark
    python eval_pvrbench.py --model Qwen/Qwen2.5-VL-7B-Instruct --judge openai:gpt-4o \\
        --benchmark vsibench=data/VSI-Bench/test.jsonl,urbanvideo=data/UrbanVideo-Bench/MCQ.parquet
    python eval_pvrbench.py --model openai:gpt-4o ...       # chat-completions; $OPENAI_API_KEY, --base-url for vLLM
    python eval_pvrbench.py --benchmark ... --export pvrbench/   # the corrupted mp4s + manifest only, no model
    python eval_pvrbench.py --benchmark ... --export-lmms-eval pvrbench/   # ... as an lmms-eval task folder
    python eval_pvrbench.py --compare A_results.json B_results.json
    python eval_pvrbench.py --etas 0.3,0.5,0.7,0.9          # a severity sweep: each intensity, robustness curves
    python eval_pvrbench.py --benchmark ... --export-hf pvrbench_hf/   # as a Hugging Face dataset folder
    python eval_pvrbench.py --regenerate-hf pvrbench_hf/    # its clips rendered again from their specs, checked

Static protocol (Sec. 4). Each (video, subtype) gets one fixed spec, perturb.static_spec(video id, subtype, eta),
seeded by SHA-256 of the video's identity (data.video_identity): every question on that video under that
subtype sees the same corrupted clip, which the manifest (video id, subtype, spec, the engine's RENDER_VERSION,
depth, questions) and the clean frames regenerate: with the depth proxy (the default) from nothing else, with
--depth-model NAME (depth.py: a monocular depth model, its maps cached) with the depth maps --export writes
beside the clips. Conditions:
"clean" and the chosen subtypes (Table 8); `--assign all`: every question under every subtype; `--assign cycle`
(default): every question clean and under ONE subtype, round-robin within each task from an offset hashed from
the task's name, so that every subtype gets an equal share (+-1) of every task and the per-category scores are
not confounded by the task mix; `--assign balanced`: the same round-robin over the task's questions in order of
their answers, so that every subtype also gets an equal share of each answer (a model that falls back on one
answer where it cannot see then scores alike under every subtype).

Scores: each source's official rules (App. B.1, answers.score_sample; answers.condition_score): with --style
official exactly its official code's, with --style reason (the default) with the project's extensions
(answers.EXTENSIONS, written into results.json's `scoring`); Table 2's accuracy per category, Avg. (the mean of
the four category columns, as in every row of Table 2), Orig. (clean) and the drop; its reasoning quality from
--judge (judge.reasoning_quality of each perturbed response against the clean one; an openai: judge also sees
--judge-frames frames), Avg.† without Fra. as its caption says, Orig.† each clean trace against itself. A sample
whose video cannot be read (or whose generation or API call failed for good) is recorded with its reason,
left out of the means, counted in n_errors and tried again by the next run of the same command.

Outputs, under OUT/<model>/ (the model's last path component, "<parent>-final" for train.py's OUT/final, or the
API model's name): run_<hash>/, the working store (the same command run again skips what is done, so a kill
loses at most the batch in flight; the hash covers what changes a generation, not --limit or --judge); then
<timestamp>_results.json, _samples_pvrbench_<source>.jsonl (lmms-eval's layout) and _manifest.jsonl, table.md,
subtypes.png (clean and each subtype) and, with several tasks, per_task.png (Figs. 14-18). With no arguments: the train demo's runs/rova/final, or an untrained tiny model
(OUT/tiny), on the synthetic benchmark (runs/rova/synthetic, as the train demo builds it) at its demo settings.

Severity sweeps (--etas, an extension of the paper's one point at App. D's 0.7): every clip keeps its spec but its
intensity, a condition per (subtype, eta) named "<subtype>@<eta>", clean asked once; each intensity is summarized
as a one-point run (summarize_sweep), and the curves (robustness_curves: accuracy, n, the SE clustered by video,
perturbed / clean per eta; the area under each) and robustness_curves.png added. PVRBench as a dataset:
--export-hf (machinery/eval/hf_dataset.py).

An extension (extensions/) writes its own main from these pieces: parser() with its flags added, resolve_model
with its model schemes, load_benchmark, evaluate with its models, reports, frame sampler and tables.
"""
from __future__ import annotations

from machinery import cli  # noqa: I001 - first: it sets the OpenMP wait policy before torch loads (GOMP_SPINCOUNT)
import argparse
import concurrent.futures
import contextlib
import hashlib
import io
import json
import re
import shutil
import time
from collections import defaultdict
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from machinery import hub, video
from machinery.corruption import depth as depths
from machinery.datasets import answers, data
from machinery.eval import charts, evaluation, hf_dataset, lmms_task, run_files
from machinery.eval import diagnostics
import judge as judges
import perturb
from machinery.datasets import synthetic

SOURCES = ("vsibench", "urbanvideo", "synthetic")
# Each source's scene kind, which decides its occluders (perturb.static_spec(scene=), machinery/corruption/props.py):
# VSI-Bench scans rooms, UrbanVideo-Bench flies drones over cities, the synthetic set is a ground-level agent's street.
SCENES = {"vsibench": "indoor", "urbanvideo": "aerial", "synthetic": "street"}
DEFAULT_SYNTH = "runs/rova/synthetic"   # the train demo's folder
SYNTH_DEFAULTS = dict(frames=synthetic.DEMO_BENCHMARK["num_frames"], max_pixels=synthetic.DEMO_BENCHMARK["size"] ** 2,
                      max_new_tokens=64, fps=2.0, batch_size=32,
                      eta=perturb.eta_arg(synthetic.DEMO_ETA))  # train.py's DEMO
DEMO_CHECKPOINT = "runs/rova/final"
CATEGORY_COLUMNS = (("lighting", "Lig."), ("occlusion", "Occ."), ("camera", "Sha."), ("weather", "Wea."))
QUALITY = judges.QUALITY_KEYS           # fragility, consistency, belief, recovery, attention
DAGGER = QUALITY[1:]                    # Avg.+ / Orig.+ exclude Fra. (Table 2's caption)
INTERRUPTED = ("rerun the same command to continue: the samples generated so far are kept in OUT/<model>/run_<hash>/ "
               "and are not generated again")


mean = answers.mean   # (of the values that are not None)


def drop(orig, avg):
    return (orig - avg) / orig if orig and avg is not None else None


# ----------------------------------------------------------------------------- scoring (App. B.1, Table 2)

def scoring_block(style="reason", scoring=answers.SCORINGS[0]):
    """results.json's `scoring`: which rules scored the run (docs/DESIGN.md, "Readings of the paper"): the style,
    the official code each source follows, and the project's departures from it in this style (answers.EXTENSIONS)."""
    reading = ("exactly as the source's official scorer (the output as its pipeline gives it: stripped for "
               "VSI-Bench, as lmms-eval does; raw for UrbanVideo's eval.py and Video-R1's eval_bench)"
               if style == "official" else "the <answer>...</answer> content when present (every source), else the "
               "whole output, stripped; then the source's official rule")
    return {"style": style, "answer_extraction": reading, "official_code": dict(answers.OFFICIAL_SCORERS),
            "vsibench_numeric": {"lmms-eval-0.7.2": "MRA on the first space-separated token (lmms-eval <= 0.7.2, "
                                 "thinking-in-space)", "lmms-eval-0.7.3": "MRA on lmms-eval 0.7.3's extract_number "
                                 "(the first number or number-word phrase anywhere)"}[scoring],
            "extensions": {k: text for k, (styles, text) in answers.EXTENSIONS.items() if style in styles},
            "avg": "the mean of the four category columns (Table 2)"}


def accuracy_block(overall, subtypes):
    """Table 2 left: each category's score (the mean over its chosen subtypes), Avg., Orig. (clean) and the
    relative drop of Avg. from Orig.

    Avg. is the unweighted mean of the table's columns. For Table 2 those are the four category columns: every
    row of the paper's Table 2 is that mean (GPT-4o .54/.47/.50/.52 -> .51; VideoLLaMA2 .28/.25/.27/.29 -> .27,
    where the mean over the 12 subtypes, 4 lighting, 2 occlusion, 3 camera, 3 weather, would give .28). A
    protocol with subtypes outside Table 8 (an extension's) has one column per subtype, and its Avg. is their
    mean. `avg_subtypes`: the mean over the chosen subtypes, whatever the protocol."""
    cats = {c: mean([overall.get(s) for s in perturb.CATEGORIES[c] if s in subtypes]) for c in perturb.CATEGORIES}
    per_subtype = mean([overall.get(s) for s in subtypes])
    avg = mean([mean([overall.get(s) for s in subs]) for subs in avg_groups(subtypes).values()])
    return {"categories": cats, "avg": avg, "avg_subtypes": per_subtype, "orig": overall.get("clean"),
            "drop": drop(overall.get("clean"), avg)}


def avg_groups(subtypes):
    """What Avg. averages (accuracy_block): {category: its chosen subtypes} for Table 8's, {subtype: [subtype]} for
    a protocol with subtypes outside it; the exported lmms-eval task weighs its subtypes by it (lmms_task)."""
    if all(s in perturb.SUBTYPES for s in subtypes):
        return {c: [s for s in subs if s in subtypes] for c, subs in perturb.CATEGORIES.items()
                if any(s in subtypes for s in subs)}
    return {s: [s] for s in subtypes}


def reasoning_block(metrics, avg, orig, **extra):
    """Table 2 right: the per-metric means, Avg.+ / Orig.+ and the drop."""
    return {"metrics": metrics, "avg_dagger": avg, "orig_dagger": orig, "drop_dagger": drop(orig, avg), **extra}


def source_reasoning(recs, subtypes):
    """One source's reasoning quality: per-metric means per condition, then over the perturbed conditions."""
    per_cond = {c: {k: mean([r["judge"].get(k) for r in recs if r["condition"] == c and r.get("judge")])
                    for k in QUALITY} for c in ("clean", *subtypes)}
    metrics = {k: mean([per_cond[s][k] for s in subtypes]) for k in QUALITY}
    return reasoning_block(metrics, mean([metrics[k] for k in DAGGER]), mean([per_cond["clean"][k] for k in DAGGER]),
                           per_condition=per_cond)


def source_block(recs, src, subtypes, style="reason"):
    """One source's aggregates: per condition, Table 2's blocks, per task (clean, perturbed pooled and per
    category: Figs. 14-18)."""
    conds = {c: answers.condition_score([r for r in recs if r["condition"] == c], src, style)
             for c in ("clean", *subtypes) if any(r["condition"] == c for r in recs)}
    pert = [r for r in recs if r["condition"] != "clean"]
    per_task = {"clean": conds.get("clean", {}).get("tasks", {}),
                "perturbed": answers.condition_score(pert, src, style)["tasks"] if pert else {}}
    for cat in perturb.CATEGORIES:
        sub = [r for r in pert if perturb.CATEGORY_OF[r["condition"]] == cat]
        per_task[cat] = answers.condition_score(sub, src, style)["tasks"] if sub else {}
    return {"accuracy": accuracy_block({c: v["overall"] for c, v in conds.items()}, subtypes),
            "reasoning": source_reasoning(recs, subtypes),
            "conditions": conds, "per_task": per_task, "n_samples": len(recs),
            "n_errors": sum(r.get("error") is not None for r in recs)}


def summarize(records_by_source, subtypes, style="reason"):
    """All aggregates. records: {"condition", "task", "score", "error", "response", "judge"} per (question,
    condition); `style` as --style (UrbanVideo's figures, see benchmark_score)."""
    sources = {src: source_block(recs, src, subtypes, style) for src, recs in records_by_source.items()}
    combined = defaultdict(list)
    for block in sources.values():
        for c, v in block["conditions"].items():
            combined[c].append(v["overall"])
    overall = {c: mean(v) for c, v in combined.items()}
    rq = [s["reasoning"] for s in sources.values()]
    reasoning = reasoning_block({k: mean([r["metrics"][k] for r in rq]) for k in QUALITY},
                                mean([r["avg_dagger"] for r in rq]), mean([r["orig_dagger"] for r in rq]))
    return {"pvrbench": {"accuracy": accuracy_block(overall, subtypes), "overall": overall, "reasoning": reasoning},
            "sources": sources, "n_samples": sum(s["n_samples"] for s in sources.values()),
            "n_errors": sum(s["n_errors"] for s in sources.values())}


# ----------------------------------------------------------------------------- severity sweeps (--etas)

def at_eta(records_by_source, eta):
    """A sweep's records at one intensity, as a one-point run's: clean, and each subtype at `eta` named by its
    subtype (so that summarize scores them as Table 2)."""
    def keep(r):
        return r["condition"] == "clean" or split_condition(r["condition"])[1] == eta
    return {src: [dict(r, condition=split_condition(r["condition"])[0]) for r in recs if keep(r)]
            for src, recs in records_by_source.items()}


def clustered_se(scores, clusters):
    """The standard error of the mean of `scores` when the scores of one cluster (one video's questions and
    clips) are correlated: the CLT variance plus each cluster's cross terms (Miller 2024, "Adding Error Bars to
    Evals", Eq. 4, as lmms-eval's clustered_stderr with a task's cluster_key). None below 2 scores."""
    x = np.asarray(scores, dtype=float)
    if len(x) < 2:
        return None
    d, n = x - x.mean(), len(x)
    ids = {c: k for k, c in enumerate(dict.fromkeys(clusters))}
    which = np.fromiter((ids[c] for c in clusters), np.int64, n)
    cross = (np.bincount(which, weights=d) ** 2 - np.bincount(which, weights=d * d)).sum()  # sum_c sum_i!=j d_i d_j
    return float(np.sqrt(max(d.var(ddof=1) / n + cross / n ** 2, 0.0)))


def curve_point(accuracy, records, clean):
    """One point of a robustness curve: the accuracy (as Table 2 scores it), the scored samples behind it, their
    clustered SE by video (clustered_se of the pooled sample scores) and the relative robustness (perturbed / clean)."""
    scored_ = [r for r in records if r.get("error") is None and r.get("score") is not None]
    se = clustered_se([r["score"] for r in scored_], [(r["source"], r["video_id"]) for r in scored_])
    return {"accuracy": accuracy, "n": len(scored_), "se": se,
            "relative": accuracy / clean if accuracy is not None and clean else None}


def area(points, etas):
    """A curve's area: the trapezoid rule over the grid, divided by its width (a mean accuracy over [min, max] of
    the grid); None if a point is missing."""
    ys = [points[f"{e:g}"]["accuracy"] for e in etas]
    if any(y is None for y in ys):
        return None
    return float(np.trapezoid(ys, etas) / (etas[-1] - etas[0]))


def robustness_curves(records_by_source, per_eta, subtypes, etas):
    """results.json's `curves` ({"clean": point, and per Table 2 column, per category and per subtype: {eta:
    point}}: curve_point), `auc` (area, per curve) and `relative_robustness` (Avg. / Orig. per eta)."""
    by_condition = defaultdict(list)
    for src, rs in records_by_source.items():
        for r in rs:
            by_condition[r["condition"]].append(dict(r, source=src))
    clean = next(iter(per_eta.values()))["pvrbench"]["accuracy"]["orig"]
    curves = {"clean": curve_point(clean, by_condition["clean"], clean)}
    for name, subs in curve_members(subtypes).items():
        curves[name] = {}
        for e in etas:
            cell = [r for s in subs for r in by_condition[condition(s, e)]]
            curves[name][f"{e:g}"] = curve_point(column(per_eta[f"{e:g}"]["pvrbench"], name), cell, clean)
    return {"curves": curves, "auc": {k: area(v, etas) for k, v in curves.items() if k != "clean"},
            "relative_robustness": {k: v["relative"] for k, v in curves["avg"].items()}}


def curve_members(subtypes):
    """{curve: the subtypes whose samples it pools}: Avg., each category in Table 2's order, each subtype."""
    cats = {c: [s for s in perturb.CATEGORIES[c] if s in subtypes] for c, _ in CATEGORY_COLUMNS}
    return {"avg": list(subtypes), **{c: subs for c, subs in cats.items() if subs}, **{s: [s] for s in subtypes}}


def column(pvr, name):
    """A curve's accuracy in one intensity's Table 2 blocks: Avg., a category's column or a subtype's score."""
    if name == "avg":
        return pvr["accuracy"]["avg"]
    return pvr["accuracy"]["categories"][name] if name in perturb.CATEGORIES else pvr["overall"].get(name)


def summarize_sweep(records_by_source, subtypes, etas, style="reason"):
    """A sweep's aggregates: each intensity's as a one-point run's (summarize of at_eta), and the curves."""
    per_eta = {f"{e:g}": summarize(at_eta(records_by_source, e), subtypes, style) for e in etas}
    return {"sweep": {"etas": list(etas), "per_eta": per_eta},
            **robustness_curves(records_by_source, per_eta, subtypes, etas),
            "n_samples": sum(len(rs) for rs in records_by_source.values()),
            "n_errors": sum(r.get("error") is not None for rs in records_by_source.values() for r in rs)}


# ----------------------------------------------------------------------------- Table 2, charts, --compare

def _f(x, lead=False):
    """Table 2's style: accuracy as .51, reasoning (0-5) as 2.65; "–" when absent."""
    if x is None:
        return "–"
    s = f"{x:.2f}"
    return s[1:] if not lead and s.startswith("0.") else s


def _d(x):
    return "" if x is None else f" {'↓' if x >= 0 else '↑'}{abs(x) * 100:.0f}%"


TABLE_HEADER = ("| Model | #Fr | Lig. | Occ. | Sha. | Wea. | Avg. | Orig. | Fra.↓ | Con. | Bel. | Rec. | Att. "
                "| Avg.† | Orig.† |\n" + "|---" * 15 + "|\n")
TABLE_LEGEND = ("#Fr frames per video. Accuracy (0-1): Lig. lighting (dusk, night, overexposure, shadow), Occ. "
                "occlusion (static, dynamic), Sha. camera shake (translation, zoom, rotation), Wea. weather (fog, "
                "rain, snow); Avg. mean of the four (drop vs Orig.), Orig. clean videos.\n"
                "Reasoning quality (0-5, the judge): Fra. fragility (lower is better), Con. consistency, Bel. "
                "belief, Rec. recovery, Att. attention; Avg.† mean without Fra., Orig.† on clean videos; – not "
                "rated (the local judge rates Fra. and Con. only).\n")


def table_row(name, frames, pvr):
    a, r = pvr["accuracy"], pvr["reasoning"]
    cells = [name, str(frames)] + [_f(a["categories"][c]) for c, _ in CATEGORY_COLUMNS]
    cells += [_f(a["avg"]) + _d(a["drop"]), _f(a["orig"])] + [_f(r["metrics"][k], True) for k in QUALITY]
    cells += [_f(r["avg_dagger"], True) + _d(r["drop_dagger"]), _f(r["orig_dagger"], True)]
    return "| " + " | ".join(cells) + " |\n"


# table.md per --protocol: (table(name, frames, pvr), legend); an extension adds its protocol's
TABLES = {"pvrbench": (lambda name, frames, pvr: TABLE_HEADER + table_row(name, frames, pvr), TABLE_LEGEND)}


def run_table(tables, protocol, name, frames, results):
    """table.md's (table, legend) for `protocol` (TABLES): Table 2's row, or a sweep's row per intensity (one
    header) followed by its curves (curves_table)."""
    table, legend = tables.get(protocol, TABLES["pvrbench"])
    if "sweep" not in results:
        return table(name, frames, results["pvrbench"]), legend
    parts = [table(f"{name} η={e}", frames, b["pvrbench"]).splitlines(keepends=True)
             for e, b in results["sweep"]["per_eta"].items()]
    rows = parts[0] + [line for part in parts[1:] for line in part if line not in parts[0]]
    curves, curves_legend = curves_table(results)
    return "".join(rows) + "\n" + curves, legend + curves_legend


def curves_table(results):
    """A sweep's curves as a table: Avg., each category and each subtype at each intensity (± clustered SE), their
    AUC, and Avg./Orig. (relative robustness) per intensity; with its legend."""
    etas = list(results["sweep"]["per_eta"])
    head = "| Curve | " + " | ".join(f"η={e}" for e in etas) + " | AUC |\n" + "|---" * (len(etas) + 2) + "|\n"
    rows = []
    for name, points in results["curves"].items():
        if name != "clean":
            cells = [_f(points[e]["accuracy"]) + (f" ±{points[e]['se']:.2f}" if points[e]["se"] is not None else "")
                     for e in etas]
            rows.append(f"| {'Avg.' if name == 'avg' else name} | " + " | ".join(cells)
                        + f" | {_f(results['auc'][name])} |\n")
    rel = "| Avg./Orig. | " + " | ".join(_f(results["relative_robustness"][e], True) for e in etas) + " | |\n"
    clean = results["curves"]["clean"]
    se = "" if clean["se"] is None else f" ±{clean['se']:.2f}"
    legend = (f"Curves: accuracy at each intensity η (± its clustered SE by video); AUC: the area under the curve "
              f"over the grid divided by its width; Avg./Orig.: relative robustness. Orig. (clean, answered once): "
              f"{_f(clean['accuracy'])}{se}.\n")
    return head + "".join(rows) + rel, legend


def subtype_series(results):
    """A results' bars for charts.subtype_bars: {"clean", each subtype, "avg": accuracy}, or for a sweep one
    (label, values) per intensity."""
    def values(pvr):
        return {**pvr["overall"], "avg": pvr["accuracy"]["avg"]}
    if "sweep" in results:
        return [(f"η={e}", values(b["pvrbench"])) for e, b in results["sweep"]["per_eta"].items()]
    return [("", values(results["pvrbench"]))]


def chart_categories(subtypes):
    """{category: its chosen subtypes} in Table 2's column order, an extension's subtypes each a column of its own."""
    groups, order = avg_groups(subtypes), [c for c, _ in CATEGORY_COLUMNS]
    return {c: groups[c] for c in sorted(groups, key=lambda c: order.index(c) if c in order else len(order))}


def draw_charts(folder, results, name, subtypes):
    """A run's pictures: subtypes.png (charts.subtype_bars), per_task.png where the run has several tasks
    (Figs. 14-18), robustness_curves.png for a sweep."""
    cats = chart_categories(subtypes)
    charts.subtype_bars(folder / "subtypes.png", cats, subtype_series(results), f"PVRBench: {name}, clean and per subtype")
    blocks = results["sweep"]["per_eta"].values() if "sweep" in results else [results]
    if len({task for b in blocks for task in tasks_of(b)}) > 1:
        run_files.chart(folder / "per_task.png", [{"results": b} for b in blocks],
                        [f"η={e}" for e in results["sweep"]["per_eta"]] if "sweep" in results else [name])
    if "sweep" in results:
        charts.robustness_curves(folder / "robustness_curves.png", cats, results["curves"], results["sweep"]["etas"],
                                 f"PVRBench robustness curves: {name}")


def compare(paths, out):
    """Several results side by side: one Table 2 (printed, OUT/compare.md; a sweep: a row per intensity, and its
    curves), OUT/compare.png (per subtype, one bar per one-point result), OUT/compare_per_task.png where they have
    several tasks, OUT/compare_curves.png (the sweeps' curves overlaid). Of several results of one model and
    configuration (reruns of one command), the latest is shown."""
    paths, results = zip(*run_files.latest_per_config(paths).values())
    labels = [r["config"]["model_name"] for r in results]
    labels = [f"{lb} ({Path(p).name[:15]})" if labels.count(lb) > 1 else lb for lb, p in zip(labels, paths)]
    rows, curves = [], []
    for lb, r in zip(labels, results):
        frames, res = r["config"]["frames"], r["results"]
        if "sweep" not in res:
            rows.append(table_row(lb, frames, res["pvrbench"]))
            continue
        rows += [table_row(f"{lb} η={e}", frames, b["pvrbench"]) for e, b in res["sweep"]["per_eta"].items()]
        curves.append(f"\n{lb}:\n" + curves_table(res)[0])
    table = TABLE_HEADER + "".join(rows) + "".join(curves)
    out.mkdir(parents=True, exist_ok=True)
    written = compare_charts(out, results, labels)
    (out / "compare.md").write_text(table + "\n" + TABLE_LEGEND)
    print(table + TABLE_LEGEND + "written: " + ", ".join(map(str, [out / "compare.md", *written])))
    return table


def compare_charts(out, results, labels):
    """compare.png (per subtype) and compare_per_task.png (several tasks) of the one-point results, and
    compare_curves.png of the sweeps (compare), as the results allow."""
    points = [(lb, r) for lb, r in zip(labels, results) if "sweep" not in r["results"]]
    sweeps = [(lb, r) for lb, r in zip(labels, results) if "sweep" in r["results"]]
    cats = chart_categories(list(dict.fromkeys(s for _, r in points + sweeps for s in r["config"]["subtypes"])))
    written = [compare_points(out, cats, points) if points else None, compare_tasks(out, points),
               compare_sweeps(out, cats, sweeps) if sweeps else None]
    return [w for w in written if w is not None]


def compare_points(out, cats, points):
    """compare.png: a bar series per one-point run [(label, its results file)], per subtype."""
    series = [(lb, subtype_series(r["results"])[0][1]) for lb, r in points]
    return charts.subtype_bars(out / "compare.png", cats, series, "PVRBench: clean and per subtype")


def compare_tasks(out, points):
    """compare_per_task.png, where the one-point runs' questions span several tasks (else None)."""
    if len({task for _, r in points for task in tasks_of(r["results"])}) <= 1:
        return None
    return run_files.chart(out / "compare_per_task.png", [r for _, r in points], [lb for lb, _ in points])


def compare_sweeps(out, cats, sweeps):
    """compare_curves.png: the sweeps' robustness curves overlaid."""
    etas = sorted({e for _, r in sweeps for e in r["results"]["sweep"]["etas"]})
    return charts.compare_curves(out / "compare_curves.png", cats, [(lb, r["results"]["curves"]) for lb, r in sweeps],
                                 etas, "PVRBench robustness curves")


def tasks_of(results):
    """The (source, task) pairs a one-point results' blocks score."""
    return {(src, t) for src, block in results["sources"].items() for t in block["per_task"]["clean"]}


# ----------------------------------------------------------------------------- benchmarks and the plan

def parse_sources(spec, what="--benchmark"):
    """"vsibench=X,urbanvideo=Y" -> {source: value}. --benchmark: synthetic's DIR is optional, the others need a
    file; --video-root: a bare "DIR" -> {None: DIR}, for every source."""
    if what != "--benchmark" and spec and "=" not in spec:
        return {None: spec}
    out = {}
    for part in filter(None, spec.split(",")):
        name, _, value = part.strip().partition("=")
        if name not in SOURCES:
            raise cli.UserError(f"{what}: unknown source {name!r} (valid: {', '.join(SOURCES)})")
        if what == "--benchmark" and not value and name != "synthetic":
            raise cli.UserError(f"--benchmark: {name} needs a file: {name}=PATH")
        out[name] = value or (DEFAULT_SYNTH if what == "--benchmark" else None)
    return out


def parse_subtypes(spec, protocol="pvrbench"):
    """"all" (the protocol's subtypes, perturb.PROTOCOLS), "none" (clean only), or a comma list of subtypes
    (Table 8's and the registered ones, perturb.CATEGORY_OF) and categories; in canonical order."""
    known = list(perturb.CATEGORY_OF)
    order = list(perturb.PROTOCOLS[protocol]) + [s for s in known if s not in perturb.PROTOCOLS[protocol]]
    if spec.strip() == "all":
        return list(perturb.PROTOCOLS[protocol])
    chosen = set()
    for name in filter(None, (p.strip() for p in spec.split(","))):
        if name in perturb.CATEGORIES:
            chosen.update(perturb.CATEGORIES[name])
        elif name in order:
            chosen.add(name)
        elif name != "none":
            raise cli.UserError(f"--subtypes: unknown {name!r} (subtypes: {', '.join(known)}; categories: "
                                f"{', '.join(perturb.CATEGORIES)}; or all / none)")
    return [s for s in order if s in chosen]


def etas_arg(text) -> tuple:
    """--etas as argparse's type=: a comma list of at least two distinct intensities in [0, 1] -> sorted; a mistake
    is argparse's one line, naming the flag."""
    values = set()
    for part in text.split(","):
        try:
            eta = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} is not a number (a comma list of intensities in "
                                             "[0, 1], e.g. 0.3,0.5,0.7,0.9)") from None
        if not 0.0 <= eta <= 1.0:   # (also NaN)
            raise argparse.ArgumentTypeError(f"{part.strip()} is outside [0, 1]")
        values.add(eta)
    if len(values) < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: a sweep needs at least two distinct intensities (one: --eta)")
    return tuple(sorted(values))


def condition(subtype, eta=None) -> str:
    """A perturbed condition's name: the subtype, or in a sweep "<subtype>@<eta>" (e.g. fog@0.3)."""
    return subtype if eta is None else f"{subtype}@{eta:g}"


def split_condition(cond):
    """condition()'s inverse: (subtype, eta or None); "clean" -> ("clean", None)."""
    subtype, _, eta = cond.partition("@")
    return subtype, float(eta) if eta else None


def load_source(name, path, root, limit):
    if name == "synthetic":
        folder = Path(path)
        if not (folder / "eval.jsonl").is_file():
            print(f"building the synthetic benchmark ({synthetic.DEMO_BENCHMARK['n']} clips) in {folder}", flush=True)
            synthetic.make_synthetic(folder, **synthetic.DEMO_BENCHMARK)   # the train demo's
        samples, _ = data.load_vsibench(folder / "eval.jsonl", root or folder / "videos", require_videos=False)
    elif name == "vsibench":  # (the loaders' default video roots: next to the annotation file)
        samples, _ = data.load_vsibench(path, root or None, require_videos=False)
    else:
        samples, _ = data.load_urbanvideo(path, root or None, require_videos=False, unparsable="raw")
    return samples[:limit] if limit else samples


@dataclass
class Group:
    """The questions of one video, with their conditions."""
    source: str
    video_id: str
    path: str
    items: list   # [(sample, [conditions])]


def round_robin(samples, subtypes, by_answer=False) -> list:
    """One subtype per question (eval_pvrbench's --assign cycle, or balanced with `by_answer`): round-robin within
    each task from an offset hashed from the task's name, over the task's questions in their order, or in order of
    their answers (stable), so that every subtype also gets an equal share (+-1) of each answer."""
    by_task, out = defaultdict(list), [None] * len(samples)
    for k, s in enumerate(samples):
        by_task[s.task].append(k)
    for task, ks in by_task.items():
        off = int(hashlib.sha256(task.encode()).hexdigest(), 16)
        for rank, k in enumerate(sorted(ks, key=lambda k: str(samples[k].answer)) if by_answer else ks):
            out[k] = subtypes[(rank + off) % len(subtypes)]
    return out


def make_plan(sources, subtypes, assign, eta, depth=None, etas=()):
    """Groups (one per video, in order of first appearance) and the manifest rows (Sec. 4 static specs, each with its
    source's scene kind, SCENES, in an occlusion spec's params; `depth`:
    the depth.Depth of --depth-model, each row recording where its clip's depth comes from; None: the proxy).
    `etas` (--etas, a sweep): each chosen subtype at each intensity, a condition per (subtype, eta) whose spec is
    the one-point spec with that eta (the same seed, regions and trajectory) and whose row names its `condition`."""
    groups, manifest = {}, {}
    for src, samples in sources.items():
        one = round_robin(samples, subtypes, assign == "balanced") if assign != "all" and subtypes else None
        for k, s in enumerate(samples):
            chosen = subtypes if one is None else [one[k]]
            points = [(sub, e, condition(sub, e)) for sub in chosen for e in etas] or [(sub, eta, sub) for sub in chosen]
            vid = data.video_identity(s)
            groups.setdefault((src, vid), Group(src, vid, s.video, [])).items.append(
                (s, ["clean"] + [cond for _, _, cond in points]))
            for sub, e, cond in points:
                row = manifest.setdefault((src, vid, cond), {
                    "source": src, "video_id": vid, "subtype": sub,   # no local path: the same file everywhere
                    **({"condition": cond} if etas else {}),
                    "spec": perturb.static_spec(vid, sub, e, scene=SCENES.get(src, "auto")).to_dict(),
                    "render": perturb.RENDER_VERSION,
                    "depth": depth.describe(s.video) if depth is not None else "proxy", "questions": []})
                row["questions"].append(s.id)
    return list(groups.values()), list(manifest.values())


# ----------------------------------------------------------------------------- models


MODELS = {  # --model SCHEME:PATH -> factory(args, path); "" = a checkpoint folder or hub id
    "": lambda args, path: evaluation.HFModel(path, args.adapter or None, args.batch_size),
    "openai": lambda args, name: evaluation.APIModel(name, args.base_url, args.api_retries, args.api_timeout,
                                                     args.api_concurrency,
                                                     evaluation.video_format(args.video_format, args.base_url)),
}


def split_model(spec, models):
    """--model -> (scheme, path): "openai:gpt-4o" -> ("openai", "gpt-4o"); a folder or hub id -> ("", spec)."""
    scheme, sep, path = spec.partition(":")
    return (scheme, path) if sep and scheme and scheme in models else ("", spec)


@dataclass
class Target:
    """The model evaluated: --model as resolved, the results folder's name, its scheme ("": a checkpoint folder or
    hub id) and path."""
    spec: str
    name: str
    scheme: str
    path: str


def resolve_model(args, models=None, rename=lambda args, scheme, base: f"{scheme}-{base}") -> Target:
    """--model (default: the train demo's checkpoint, else an untrained tiny model) -> a Target, checked
    (check_sources). `models`: the schemes known (MODELS); `rename`: the name of a SCHEME:PATH model."""
    models = MODELS if models is None else models
    spec, name = _model_and_name(args, models, rename)
    scheme, path = split_model(spec, models)
    check_sources(args, scheme, path)
    return Target(spec, re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("_") or "model", scheme, path)


def _model_and_name(args, models, rename):
    if args.model:
        scheme, path = split_model(args.model, models)
        if scheme == "openai":
            return args.model, args.model_name or path
        parts = Path(path.rstrip("/")).parts
        name = "-".join(parts[-2:]) if parts[-1] == "final" and len(parts) > 1 else parts[-1]  # train.py's OUT/final
        name = rename(args, scheme, name) if scheme else name
        if args.adapter:
            name += "+" + Path(args.adapter.rstrip("/")).name
        return args.model, args.model_name or name
    if (Path(DEMO_CHECKPOINT) / "config.json").is_file():
        return DEMO_CHECKPOINT, args.model_name or "rova-final"
    tiny = Path(args.out) / "tiny"
    print(f"no --model and no {DEMO_CHECKPOINT} (`python train.py` trains it): evaluating an UNTRAINED tiny model "
          f"({tiny})", flush=True)
    if not (tiny / "config.json").is_file():
        from machinery.model import tiny as tiny_model
        with hub.no_hf_progress_bars():
            tiny_model.build_tiny(tiny)
    return str(tiny), args.model_name or "tiny-untrained"


def check_sources(args, scheme, path):
    """Every local model, adapter and judge the run will load exists: one line now, before any folder is
    made or any video is read (an API model is checked by its first request)."""
    unknown = re.fullmatch(r"([a-z][a-z0-9_-]*):.+", path)
    if not scheme and unknown and not Path(path).exists():
        raise cli.UserError(f"--model {path}: no model scheme {unknown[1]}: here (a folder, a hub id or "
                            "openai:NAME; an extension's entry point adds its own: python -m "
                            "extensions.<name>.eval --model SCHEME:PATH)")
    if scheme != "openai":
        hub.model_source(path)
    if args.adapter and not (Path(args.adapter) / "adapter_config.json").is_file():
        raise cli.UserError(f"--adapter {args.adapter}: no adapter_config.json there (a peft LoRA adapter "
                            "folder, e.g. train.py --lora-r's OUT/final)")
    hub.check_hf_flags({"--judge": args.judge})


# ----------------------------------------------------------------------------- the resumable store and the run


# ----------------------------------------------------------------------------- the command line and main

def parser():
    """The command line's parser (an extension adds its own argument group to it, then calls parse_args)."""
    ap = cli.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=cli.HelpFormatter,
                                 usage="%(prog)s [--model M] [--benchmark SRC=PATH,...] [--video-root ...] [options]")
    g = ap.add_argument_group("benchmark",
                              "what is evaluated: the sources, the perturbations (Sec. 4, Table 8)").add_argument
    g("--benchmark", default="synthetic", help="vsibench=PATH,urbanvideo=PATH (native files) or synthetic[=DIR] "
      f"(default {DEFAULT_SYNTH}; built with synthetic.make_synthetic when it has no eval.jsonl)")
    g("--video-root", default="", help="DIR for all, or vsibench=DIR,urbanvideo=DIR (default: next to the file)")
    g("--subtypes", default="all", help="all (the protocol's), none, or a comma list of subtypes / categories "
      "(lighting, occlusion, camera, weather)")
    g("--protocol", default="pvrbench", choices=sorted(perturb.PROTOCOLS), help="what --subtypes all means: "
      "pvrbench (Table 8's 12) or an extension's (perturb.register_protocol)")
    g("--assign", default="cycle", choices=["cycle", "balanced", "all"], help="cycle: clean + one subtype per "
      "question (round-robin within each task); balanced: the same in order of the answers (each subtype also an "
      "equal share of each answer); all: clean + every subtype")
    g("--limit", type=int, default=0, help="questions per source (the first N; 0 = all)")
    g("--eta", type=perturb.eta_arg, default=None, help="perturbation intensity: a number (App. D: 0.7, the "
      "default), or per subtype, e.g. '0.7,fog=0.4' (the first number is the other subtypes'); the synthetic "
      "benchmark's default: its own per subtype (synthetic.DEMO_ETA, the demo's)")
    g("--etas", type=etas_arg, default=(), metavar="ETA,ETA,...", help="a severity sweep: the static protocol at "
      "each of these intensities (at least two in [0, 1], e.g. 0.3,0.5,0.7,0.9), each clip's spec the same but its "
      "intensity, clean answered once; adds robustness curves (results.json `curves`, `auc`; robustness_curves.png)")
    g("--export", default="", help="write the clean and corrupted videos (lossless mp4) and the manifest to DIR, then "
      "exit (with --depth-model also each clip's depth, <video id>/depth.npy)")
    g("--export-lmms-eval", default="", metavar="DIR", help="--export DIR, and DIR made an lmms-eval task folder: "
      "lmms-eval --include_path DIR --tasks pvrbench (machinery/eval/lmms_task.py; docs/USAGE.md)")
    g("--export-hf", default="", metavar="DIR", help="PVRBench as a Hugging Face dataset folder: parquet rows (one per "
      "question and condition, with subtype, category, eta and spec), the clips (lossless) and a dataset card; "
      "datasets.load_dataset(DIR) loads it (machinery/eval/hf_dataset.py)")
    g("--regenerate-hf", default="", metavar="DIR", help="render every clip of an --export-hf folder again from its spec "
      "and source video (the recorded --benchmark / --video-root, or those given): checks each bit for bit, writes "
      "the missing ones, refuses in one line a folder whose clips do not match")
    g("--depth-model", default=depths.AUTO, metavar="NAME", help="depth of the depth-graded corruptions: auto (a "
      f"clip's own depth, the synthetic set's; else {depths.RECOMMENDED}, cached: depth.py), proxy (perturb's "
      "depth proxy, no model), or a transformers depth-estimation model's hub id or folder")
    g("--depth-cache", default="", metavar="DIR", help="folder of --depth-model's cached maps (default "
      "~/.cache/rova/depth, or $XDG_CACHE_HOME/rova/depth)")
    v = ap.add_argument_group("video", "how the frames are read").add_argument
    v("--frames", type=int, default=None, help="frames per video (App. D: 32; synthetic: 8)")
    v("--max-pixels", type=int, default=None, help="pixels per frame (App. D: 256x28x28; synthetic: 56x56)")
    v("--fps", default=None, help="fps given to the model for M-RoPE: 'video' (qwen-vl-utils' sample fps) or a number "
      "(synthetic: 2.0, as train.py)")
    m = ap.add_argument_group("model", "the model evaluated and how it is asked").add_argument
    m("--model", default="", help=f"checkpoint folder or hub id, or openai:NAME (default: {DEMO_CHECKPOINT}, else an "
      "untrained tiny model, said so)")
    m("--adapter", default="", help="a peft LoRA adapter folder for --model")
    m("--model-name", default="", help="name of the results folder (default: from --model)")
    m("--style", default="reason", choices=data.STYLES, help="prompt and scoring: reason (think/answer; the answer "
      "read with the project's extensions, answers.EXTENSIONS) or official (each benchmark's direct prompt; every "
      "output scored exactly as its official code)")
    m("--scoring", default=answers.SCORINGS[0], choices=answers.SCORINGS, help="VSI-Bench's numeric answers: "
      "lmms-eval-0.7.2 (the first token, as thinking-in-space) or lmms-eval-0.7.3 (its extract_number: the first "
      "number or number-word phrase anywhere)")
    m("--max-new-tokens", type=int, default=None, help="default 256 (reason), 16 (official, lmms-eval); synthetic 64")
    m("--batch-size", type=int, default=None, help="questions a local model decodes at once (default 8; synthetic "
      "32; a clip's questions share one prefill); an openai: model keeps --api-concurrency requests in flight")
    m("--base-url", default="", help="chat-completions server of an openai: model (default $OPENAI_BASE_URL or OpenAI)")
    m("--api-retries", type=int, default=5, help="retries of a failed API request (with backoff)")
    m("--api-timeout", type=float, default=120.0, help="seconds per API request")
    m("--api-concurrency", type=int, default=64, help="requests of an openai: model kept in flight (a finished one is "
      "replaced at once)")
    m("--video-format", default="auto", choices=evaluation.VIDEO_FORMATS, help="how an openai: model gets the "
      "frames: video (one video_url part, data:video/jpeg, as vLLM reads it, with the fps), images (one image part "
      "per frame), or mp4 (one lossless mp4: the frames exactly; what lmms-eval's pass_video_url sends); auto: video "
      "for --base-url / $OPENAI_BASE_URL servers, images for OpenAI's API")
    j = ap.add_argument_group("judge", "Table 2's reasoning-quality metrics").add_argument
    j("--judge", default="local", help="local | openai:MODEL | hf:PATH | none")
    j("--judge-base-url", default="", help="server of an openai: judge (default $OPENAI_BASE_URL or OpenAI)")
    j("--judge-frames", type=int, default=4, help="frames shown to an openai: judge (0: text only)")
    j("--judge-concurrency", type=int, default=32, help="requests of an openai: judge kept in flight (each window is "
      "judged while the next one generates)")
    out_group = ap.add_argument_group("output", "results, resuming, comparing")
    o = out_group.add_argument
    o("--out", default="runs/eval", help="results go to OUT/<model>/; the same command run again continues an "
      "unfinished evaluation and writes no new results when nothing changed")
    o("--compare", nargs="+", default=None, metavar="RESULTS", help="lay several results.json side by side (the "
      "latest of each model and configuration)")
    o("--stop-after", type=int, default=0, help="testing: stop (as if killed) after this many generated samples")
    cli.add_debug_flag(out_group)
    return ap


def parse_args(argv=None, ap=None):
    """The command line (`ap`: parser(), or an extension's parser built on it) with its defaults resolved."""
    ap = ap or parser()
    args = ap.parse_args(argv)
    cli.out_dir(args.out, create=False)  # (made when there are results to write)
    check_exclusive(ap, args)
    args.export = args.export_lmms_eval or args.export or (str(Path(args.export_hf) / "videos") if args.export_hf else "")
    resolve_defaults(args)
    if args.etas:
        args.eta = None   # (each condition's intensity is its point of the sweep)
    if args.fps != "video":
        try:
            args.fps = float(args.fps)
        except ValueError:
            ap.error(f"--fps must be 'video' or a number, got {args.fps!r}")
    return args


def resolve_defaults(args):
    """Flags left unset: the synthetic benchmark's demo settings (alone, not in --compare), then App. D's."""
    synth = not args.compare and set(parse_sources(args.benchmark)) == {"synthetic"}
    for key, value in SYNTH_DEFAULTS.items():
        if getattr(args, key) is None and synth and not (key == "max_new_tokens" and args.style == "official"):
            setattr(args, key, value)
    for key, value in dict(frames=32, max_pixels=256 * 28 * 28, fps="video", batch_size=8, eta=perturb.DEFAULT_ETA,
                           max_new_tokens=256 if args.style == "reason" else 16).items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def check_exclusive(ap, args):
    """Flags that exclude each other: one line (argparse's) before any work."""
    if args.etas and args.eta is not None:
        ap.error("--eta and --etas: give one (--eta: one intensity; --etas: a sweep over several)")
    if sum(map(bool, (args.export, args.export_lmms_eval, args.export_hf, args.regenerate_hf))) > 1:
        ap.error("--export, --export-lmms-eval, --export-hf and --regenerate-hf: give one")


def make_judge(args, run_dir):
    """--judge (None: none), its verdicts cached in the run's store; a served judge keeps --judge-concurrency
    requests in flight."""
    served = {"concurrency": max(1, args.judge_concurrency)} if args.judge.startswith("openai:") else {}
    return None if args.judge == "none" else judges.make_judge(
        args.judge, base_url=args.judge_base_url or None, cache=str(run_dir / "judge_cache.sqlite"), **served)


def eval_settings(args) -> evaluation.EvalSettings:
    """What the machinery reads of the command line (evaluation.EvalSettings: its fields are flags' names), taken
    from the parsed flags here, once: the machinery never sees the namespace."""
    names = [f.name for f in fields(evaluation.EvalSettings)]
    return evaluation.EvalSettings(**{name: getattr(args, name) for name in names})


def corrupt(frames, spec, depth):
    """Sec. 4's static protocol: a clip under the manifest's spec (Eq. 4's V~, regenerated exactly: Eq. 2)."""
    return perturb.apply(frames, perturb.PerturbSpec.from_dict(spec), depth)


def corrupted(window, pool):
    """A window's corrupted clips (corrupt), started in `pool` in the order they are asked for: a served model's
    first requests go out while the rest are rendered. {(video id, condition): Future of the frames}."""
    return {(g.video_id, c): pool.submit(lambda g=g, f=frames, s=spec: corrupt(f, s, window.depth(g)))
            for g, c, frames, spec in window.conditions()}


def check_depth(args, paths):
    """--depth-model's check (depth.check_source), before any work: `auto` needs the recommended model for every
    source but the synthetic set, which has its own depth."""
    depths.check_source(args.depth_model, args.depth_cache, needs_model=any(n != "synthetic" for n in paths))


@dataclass
class Benchmark:
    """The questions evaluated: --benchmark's files, --video-root's folders, the subtypes, each source's samples."""
    paths: dict
    roots: dict
    subtypes: list
    sources: dict


def load_benchmark(args) -> Benchmark:
    """The questions, read first (a data mistake is the error reported), then --depth-model's check."""
    paths, roots = parse_sources(args.benchmark), parse_sources(args.video_root, "--video-root")
    subtypes = parse_subtypes(args.subtypes, args.protocol)
    sources = {n: load_source(n, p, roots.get(n, roots.get(None)), args.limit) for n, p in paths.items()}
    check_depth(args, paths)   # (also for --export)
    return Benchmark(paths, roots, subtypes, sources)


def main(argv=None):
    args = parse_args(argv)
    if args.compare:
        return compare(args.compare, Path(args.out))
    if args.regenerate_hf:
        return regenerate_hf(args)
    if args.export_hf and (reason := hf_dataset.check_target(args.export_hf, dataset_flags(args))):
        raise cli.UserError(reason)
    bench = load_benchmark(args)   # the data's mistakes before the model's
    return evaluate(args, None if args.export else resolve_model(args), bench)


def evaluate(args, target, bench, models=MODELS, reports=None, read_kwargs=None, run_key=None, tables=TABLES):
    """Sec. 4's static protocol on `bench` with `target` (None: --export, the videos only); results.json,
    the samples, the table. An extension passes its own `models` (MODELS and its schemes), `reports`
    ({results.json key: report}), `read_kwargs` (video.read_frames arguments: a frame sampler), `run_key`
    (its settings that change a generation) and `tables` ({protocol: (table, legend)}, TABLES and its own)."""
    t_start, read_kwargs = time.perf_counter(), read_kwargs or {}
    settings = eval_settings(args)   # what the machinery reads (the namespace stays here)
    groups, manifest = make_plan(bench.sources, bench.subtypes, args.assign, args.eta, depths.Depth(args.depth_model),
                                 args.etas)
    if args.export:
        return export(args, settings, bench, groups, manifest, read_kwargs)
    keyed = run_files.run_config(settings, target, bench.paths, bench.roots, bench.subtypes, perturb.RENDER_VERSION,
                                  run_key)
    run_hash = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:12]
    model_dir = Path(args.out) / target.name
    run_dir = model_dir / f"run_{run_hash}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(keyed, indent=1))
    evaluation.write_jsonl(run_dir / "manifest.jsonl", manifest)
    store = evaluation.Store(run_dir, re.sub(r"[^A-Za-z0-9.-]+", "-", args.judge))
    pending = sum(len(store.pending(g)) for g in groups)
    print(f"PVRBench: {len(groups)} videos, {sum(len(c) for g in groups for _, c in g.items)} (question, condition) "
          f"samples, {pending} to generate; model {target.spec}; store {run_dir}", flush=True)
    model = models[target.scheme](args, target.path) if pending else None
    judge = make_judge(args, run_dir)
    if model is not None and (note := judges.stand_in_note(args.judge, evaluation.parameters(model))):
        print(note, flush=True)   # (the default offline judge on a real model)
    runner = evaluation.Runner(settings, store, model, judge, manifest, read_kwargs, pending)
    with runner, concurrent.futures.ThreadPoolExecutor(4) as pool:
        for window in runner.windows(groups):   # each video read once, each (video, condition) corrupted once
            if not runner.generate(window, corrupted(window, pool)):
                print(f"--stop-after {args.stop_after}: stopped after {runner.generated} samples (as if killed)")
                return None
    getattr(judge, "close", lambda: None)()
    flat = store.records(groups, args.style, args.scoring)
    results = (summarize_sweep(flat, bench.subtypes, args.etas, args.style) if args.etas
               else summarize(flat, bench.subtypes, args.style))
    results["diagnostics"] = diagnostics.collapse(flat, bench.sources)   # did the model stop looking at the video?
    table, legend = run_table(tables, args.protocol, target.name, args.frames, results)
    legend += diagnostics.warning_line(results["diagnostics"])
    previous = run_files.latest_results(model_dir, run_hash, args.judge)
    if previous and previous[1]["results"] == json.loads(json.dumps(results)):  # (as it would be written)
        print(f"nothing new since {previous[0]}: no new results file\n" + table + legend, flush=True)
        return previous[1]
    ts = time.strftime("%Y%m%d_%H%M%S")
    out = results_file(args, results, target, bench, run_dir, run_hash, judge, manifest, reports or {}, ts)
    out["timing"] = {"total_s": time.perf_counter() - t_start, "generate_s": runner.sec_generate,
                     "judge_s": runner.sec_judge, "generated": runner.generated}
    run_files.write_results(out, flat, model_dir, run_dir, ts, table + "\n" + legend)
    draw_charts(model_dir, results, target.name, bench.subtypes)
    print_results(out, model_dir / (ts + "_results.json"), table + legend)
    return out


def export(args, settings, bench, groups, manifest, read_kwargs):
    """--export DIR (evaluation.Exporter: the clips, their depth and the manifest), made an lmms-eval task folder
    with --export-lmms-eval (lmms_task.write) or a Hugging Face dataset with --export-hf (export_hf). Returns None:
    no model is evaluated."""
    out, shown = evaluation.Exporter(manifest, settings, read_kwargs), {}   # shown: --export-hf's frame hashes
    for row, frames, depth in out.clips(groups):
        clip = corrupt(frames, row["spec"], depth)
        out.write(row, clip)
        if args.export_hf:
            if (row["video_id"], "clean") not in shown:
                shown[(row["video_id"], "clean")] = hf_dataset.frames_sha256(frames)
            shown[(row["video_id"], evaluation.row_condition(row))] = hf_dataset.frames_sha256(clip)
    written, errors = out.close()
    if args.export_hf:
        export_hf(args, bench, groups, manifest, out, shown)
    if args.export_lmms_eval:
        per_eta = {f"{e:g}": {c: [condition(s, e) for s in subs] for c, subs in avg_groups(bench.subtypes).items()}
                   for e in args.etas}
        lmms_task.write(args.export, groups, written, settings, per_eta or {"": avg_groups(bench.subtypes)}, errors)
    return None


# ----------------------------------------------------------------------------- PVRBench as a dataset (--export-hf)

DATASET_FLAGS = ("benchmark", "video_root", "subtypes", "protocol", "assign", "limit", "eta", "etas", "frames",
                 "max_pixels", "fps", "style", "depth_model")   # what an --export-hf folder is made of


def dataset_flags(args):
    """The settings an --export-hf folder is made from (pvrbench_export.json's `flags`: what --regenerate-hf runs
    again, and what a second export into the same folder must repeat)."""
    return json.loads(json.dumps({k: getattr(args, k) for k in DATASET_FLAGS}))


def command_line(flags):
    """The export's command, for the card."""
    def value(v):
        if isinstance(v, list):
            return ",".join(f"{x:g}" for x in v)
        if isinstance(v, dict):   # --eta's per-subtype table
            return ",".join([f"{v['*']:g}"] + [f"{k}={x:g}" for k, x in v.items() if k != "*"])
        return str(v)
    parts = [f"--{k.replace('_', '-')} {value(v)}" for k, v in flags.items() if v not in ("", None, [], 0)]
    return "python eval_pvrbench.py --export-hf DIR " + " ".join(parts)


def hf_rows(args, groups, manifest, out, shown):
    """One row per (question, condition) whose clip was written (hf_dataset.COLUMNS)."""
    specs = evaluation.manifest_specs(manifest)
    root, rows = Path(args.export_hf), []
    for g in groups:
        for s, conds in g.items:
            for cond in conds:
                if (g.video_id, cond) not in out.written:
                    continue
                sub, _ = split_condition(cond)
                spec, file = specs.get((g.source, g.video_id, cond)), Path("videos") / out.written[(g.video_id, cond)]
                rows.append({"id": f"{s.id}|{cond}", "question_id": s.id, "question": s.question,
                             "options": [str(o) for o in s.options], "answer": str(s.answer),
                             "problem_type": s.problem_type, "task": s.task, "source": g.source,
                             "prompt": data.build_prompt(s, args.style), "clip_id": g.video_id, "condition": cond,
                             "subtype": sub, "category": perturb.CATEGORY_OF.get(sub, "clean"),
                             "eta": spec["eta"] if spec else None,
                             "spec": json.dumps(spec, sort_keys=True) if spec else None, "video": file.as_posix(),
                             "fps": out.shown[g.video_id]["fps"], "video_sha256": hf_dataset.sha256(root / file),
                             "frames_sha256": shown.get((g.video_id, cond)) or hf_dataset.frames_sha256(
                                 video.read_clip(root / file)[0])})
    return rows


def export_hf(args, bench, groups, manifest, out, shown):
    """--export-hf DIR: the clips are under DIR/videos (the Exporter's); the rows, the settings and the card."""
    rows, flags = hf_rows(args, groups, manifest, out, shown), dataset_flags(args)
    info = {"name": "PVRBench" + (" severity sweep" if args.etas else ""), "sources": list(bench.sources),
            "subtypes": bench.subtypes, "etas": list(args.etas), "eta": json.dumps(flags["eta"]), "rows": len(rows),
            "clips": len({r["video"] for r in rows}), "command": command_line(flags), "render": perturb.RENDER_VERSION,
            "versions": {k: v for k, v in hub.versions().items() if k not in ("git_commit", "platform")}}
    hf_dataset.write(args.export_hf, rows, flags, hf_dataset.card(info))


def regenerate_hf(args):
    """--regenerate-hf DIR: the export of DIR's recorded settings (the sources: --benchmark / --video-root when given)
    into a scratch folder beside DIR, compared with DIR (hf_dataset.compare); DIR is left as it was if it differs."""
    root = Path(args.regenerate_hf)
    if not (root / hf_dataset.SETTINGS).is_file():
        raise cli.UserError(f"--regenerate-hf {root}: no {hf_dataset.SETTINGS} there (a folder --export-hf wrote)")
    flags = json.loads((root / hf_dataset.SETTINGS).read_text())["flags"]
    defaults = parser()
    flags.update({k: getattr(args, k) for k in ("benchmark", "video_root") if getattr(args, k) != defaults.get_default(k)})
    scratch = root.parent / f".{root.name}.regenerate"
    shutil.rmtree(scratch, ignore_errors=True)
    run = parse_args(["--export-hf", str(scratch), "--out", args.out])
    for key, value in flags.items():
        setattr(run, key, tuple(value) if key == "etas" else value)
    try:
        print(f"rendering every clip of {root} again in {scratch}", flush=True)
        with contextlib.redirect_stdout(io.StringIO()):   # (the scratch export's own report)
            evaluate(run, None, load_benchmark(run))
        reason, added = hf_dataset.compare(scratch, root)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if reason:
        raise cli.UserError(reason)
    print(f"{root}: every clip regenerated from its spec and source video matches ({added} missing clip(s) written)")
    return added


def print_results(out, path, text):
    """Each source's clean and perturbed scores (a sweep's: at each intensity), the table (`text`) and where the
    results went."""
    res = out["results"]
    blocks = res["sweep"]["per_eta"].items() if "sweep" in res else [("", res)]
    for eta, result in blocks:
        for src, block in result["sources"].items():
            acc = block["accuracy"]
            print(f"{src}{f' η={eta}' if eta else ''}: clean {_f(acc['orig'])}, perturbed {_f(acc['avg'])}"
                  f"{_d(acc['drop'])}; {block['n_samples']} samples, {block['n_errors']} errors")
    print(text + f"results: {path} ({out['timing']['total_s']:.0f} s)", flush=True)


def results_file(args, results, target, bench, run_dir, run_hash, judge, manifest, reports, ts):
    """<ts>_results.json's content (its "timing" added by evaluate)."""
    model_dir = run_dir.parent
    rows = ({e: table_row(f"{target.name} η={e}", args.frames, b["pvrbench"]).strip()
             for e, b in results["sweep"]["per_eta"].items()} if "sweep" in results
            else table_row(target.name, args.frames, results["pvrbench"]).strip())
    return {"results": results, "table_row": rows,
            "config": {**{k: v for k, v in vars(args).items() if k != "compare"}, "model": target.spec,
                       "model_name": target.name, "subtypes": bench.subtypes, "run_dir": str(run_dir),
                       "run_hash": run_hash, "judge_stats": getattr(judge, "stats", None)},
            "manifest": {"path": str(model_dir / f"{ts}_manifest.jsonl"), "sha256": hashlib.sha256(
                (run_dir / "manifest.jsonl").read_bytes()).hexdigest(), "rows": len(manifest)},
            "raw_question_rows": raw_question_rows(bench.sources),
            "scoring": scoring_block(args.style, args.scoring),
            **reports, "versions": hub.versions(), "date": ts, "n_samples": results["n_samples"],
            "n_errors": results["n_errors"]}


def raw_question_rows(sources):
    """Per source, the questions asked with their raw text because their options did not parse (UrbanVideo:
    data.load_urbanvideo(unparsable="raw"), scored by the letter as its eval.py does)."""
    return {src: sum(not s.meta.get("options_parsed", True) for s in samples) for src, samples in sources.items()}


if __name__ == "__main__":
    cli.run(main, interrupted=INTERRUPTED)
