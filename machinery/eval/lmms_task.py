"""PVRBench as an lmms-eval task folder: ``eval_pvrbench.py --export-lmms-eval DIR`` (with the usual --benchmark,
--eta, --subtypes, --limit, --style).

    lmms-eval --include_path DIR --tasks pvrbench --model ... --log_samples --output_path OUT

What DIR holds, in lmms-eval's conventions (its built-in vsibench task is laid out the same way):
  <video id>/<condition>.mp4    the clips exactly as eval_pvrbench.py shows them to a model: its frames (--frames,
                                --max-pixels) under the static protocol's corruption (Sec. 4), lossless (H.264 RGB
                                at qp 0: read back bit for bit), at the frame rate the model is told (--fps)
  docs/<condition>.jsonl        one doc per (question, condition): prompt, video, ground truth, source, task
  _default_template_yaml        what every task shares: the local JSON dataset, doc_to_messages / doc_to_visual /
                                doc_to_text, process_results, generation (greedy, --max-new-tokens)
  pvrbench_<condition>.yaml     one task per subtype, and pvrbench_clean
  pvrbench_<category>.yaml      a group per category of Table 8 (its accuracy: the mean of its subtypes')
  pvrbench.yaml                 the group: clean and the categories; its pvr_avg is the paper's Avg.
A sweep (--etas) has a task per (subtype, eta), pvrbench_<subtype>_eta<eta> ("." as "p": fog_eta0p3), grouped per
intensity as above (pvrbench_eta0p3_<category>, pvrbench_eta0p3 with its pvr_avg), and pvrbench groups clean and
the intensities' groups. Every task names its clip as lmms-eval's cluster_key (`video`: source/video id), so that
lmms-eval's clustered standard errors cluster by video, as eval_pvrbench.py's curves do.
  utils.py, pvrbench_scoring/   machinery/eval/lmms_utils.py, and the scoring code it runs (answers.py and the modules
                                it imports), copied: the folder needs nothing from this project at run time
  export.json                   the export's settings (style, scoring, Avg.'s weights, eta, frames, fps, versions)
The data files are named relative to the YAMLs, which lmms-eval resolves from 0.7.3 on (the version checked by
checks/lmms_eval_check.py). Clips that could not be read are left out and counted in export.json.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from machinery import hub
from machinery.datasets import data

HERE = Path(__file__).resolve().parent
MACHINERY = HERE.parent
SCORING_MODULES = ("datasets/answers.py", "datasets/data.py", "cli.py")   # answers.py and what it imports
METADATA = "metadata:\n  version: 1.0\n"


def tag(cond):
    """A condition in file and task names: fog, or a sweep's fog_eta0p3 (fog@0.3)."""
    return cond.replace("@", "_eta").replace(".", "p")


def task_name(cond):
    return "pvrbench_" + tag(cond)


def docs_of(groups, written, style):
    """{condition: [doc]} for every (question, condition) whose clip was written; `written`: {(video id,
    condition): file relative to DIR}."""
    docs = {}
    for g in groups:
        for s, conds in g.items:
            for cond in conds:
                if (g.video_id, cond) in written:
                    docs.setdefault(cond, []).append({
                        "id": f"{s.id}|{cond}", "question_id": s.id, "condition": cond, "video_id": g.video_id,
                        "video": written[(g.video_id, cond)], "prompt": data.build_prompt(s, style),
                        "answer": s.answer, "problem_type": s.problem_type, "source": s.source, "task": s.task,
                        "question": s.question, "options": s.options})
    return docs


def avg_weights(groups_of_avg):
    """Each condition's weight in its Avg. = the mean over `groups_of_avg` ({category: [conditions]}) of their
    means."""
    return {s: 1.0 / (len(groups_of_avg) * len(subs)) for subs in groups_of_avg.values() for s in subs}


def template(max_new_tokens):
    return ("dataset_path: json\ntest_split: test\noutput_type: generate_until\n"
            "doc_to_visual: !function utils.doc_to_visual\ndoc_to_text: !function utils.doc_to_text\n"
            "doc_to_messages: !function utils.doc_to_messages\ndoc_to_target: answer\n"
            "process_results: !function utils.process_results\n"   # (metric_list: each task's own, task_yaml)
            "cluster_key: video\n"   # (lmms-eval's clustered SE: the questions of one clip are correlated)
            f"generation_kwargs:\n  max_new_tokens: {int(max_new_tokens)}\n  temperature: 0\n  do_sample: false\n"
            "  until: []\n" + METADATA)


def task_yaml(cond):
    share = ("" if cond == "clean" else "  - metric: pvr_avg\n    aggregation: !function utils.pvr_avg\n"
             "    higher_is_better: true\n")
    return (f"task: {task_name(cond)}\ninclude: _default_template_yaml\n"
            f"dataset_kwargs:\n  data_files:\n    test: docs/{tag(cond)}.jsonl\n"
            "metric_list:\n  - metric: accuracy\n    aggregation: !function utils.accuracy\n"
            "    higher_is_better: true\n" + share)


def group_yaml(name, tasks, metric=None, aggregation=None):
    """A group of `tasks`, aggregating `metric` (None: the group lists its members' figures only)."""
    listed = "".join(f"  - {t}\n" for t in tasks)
    aggregate = (f"aggregate_metric_list:\n  - metric: {metric}\n    aggregation: {aggregation}\n"
                 "    weight_by_size: false\n") if metric else ""
    return f"group: {name}\ntask:\n{listed}" + aggregate + METADATA


def write_groups(root, prefix, groups_of_avg):
    """A group per category of several conditions (its accuracy: their mean) and `prefix`'s group of the categories,
    whose pvr_avg is Avg.; returns the category members."""
    members = []
    for cat, conds in groups_of_avg.items():
        if len(conds) == 1 and conds[0].split("@")[0] == cat:   # an extension's subtype: a column of its own
            members.append(task_name(conds[0]))
            continue
        members.append(f"{prefix}_{cat}")
        (root / f"{prefix}_{cat}.yaml").write_text(group_yaml(f"{prefix}_{cat}", map(task_name, conds), "accuracy",
                                                              "mean"))
    return members


def write_yamls(root, docs, points, max_new_tokens):
    """The template, one task per condition, the groups (write_groups) and `pvrbench`; `points`: {eta label:
    {category: [conditions]}}, with the one label "" unless a sweep."""
    for cond in docs:
        (root / f"{task_name(cond)}.yaml").write_text(task_yaml(cond))
    clean = ["pvrbench_clean"] if "clean" in docs else []
    if list(points) == [""]:
        members = write_groups(root, "pvrbench", points[""])
        (root / "pvrbench.yaml").write_text(group_yaml("pvrbench", clean + members, "pvr_avg", "!function utils.total"))
    else:
        for label, groups_of_avg in points.items():
            name = "pvrbench_eta" + label.replace(".", "p")
            (root / f"{name}.yaml").write_text(group_yaml(name, write_groups(root, name, groups_of_avg), "pvr_avg",
                                                          "!function utils.total"))
        (root / "pvrbench.yaml").write_text(group_yaml("pvrbench", clean + ["pvrbench_eta" + label.replace(".", "p")
                                                                            for label in points]))
    (root / "_default_template_yaml").write_text(template(max_new_tokens))


def copy_scoring(root):
    """utils.py (lmms_utils.py) and the scoring modules it imports, under DIR/pvrbench_scoring/machinery/ in the
    project's layout (machinery/cli.py, machinery/datasets/answers.py and data.py)."""
    shutil.copyfile(HERE / "lmms_utils.py", root / "utils.py")
    package = root / "pvrbench_scoring" / "machinery"
    for name in SCORING_MODULES:
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(MACHINERY / name, package / name)
    for folder in {(package / name).parent for name in SCORING_MODULES}:   # machinery/ and machinery/datasets/
        (folder / "__init__.py").write_text("")


def write(root, groups, written, settings, points, errors=0):
    """The task folder in `root` (where evaluation.Exporter wrote the clips); `settings`: the run's
    evaluation.EvalSettings; `points`: what each Avg. averages, {eta label ("" unless a sweep): {category:
    [conditions]}} (eval_pvrbench.avg_groups, per intensity). Returns the number of docs per condition."""
    root = Path(root)
    docs = docs_of(groups, written, settings.style)
    (root / "docs").mkdir(parents=True, exist_ok=True)
    for cond, rows in docs.items():
        (root / "docs" / f"{tag(cond)}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    present = {label: {c: [s for s in conds if s in docs] for c, conds in groups_of_avg.items()}
               for label, groups_of_avg in points.items()}
    present = {label: {c: conds for c, conds in g.items() if conds} for label, g in present.items()}
    write_yamls(root, docs, present, settings.max_new_tokens)
    copy_scoring(root)
    config = {"style": settings.style, "scoring": settings.scoring,
              "avg_weights": {s: w for g in present.values() for s, w in avg_weights(g).items()},
              "groups_of_avg": present[""] if list(present) == [""] else present,
              "etas": list(settings.etas), "docs": {c: len(r) for c, r in docs.items()},
              "corrupted_clips_not_exported": errors, "eta": settings.eta, "frames": settings.frames,
              "max_pixels": settings.max_pixels, "fps": settings.fps, "max_new_tokens": settings.max_new_tokens,
              "benchmark": settings.benchmark, "versions": hub.versions()}
    (root / "export.json").write_text(json.dumps(config, indent=1, default=str))
    print(f"lmms-eval task: {sum(map(len, docs.values()))} docs in {len(docs)} tasks; run it with\n  lmms-eval "
          f"--include_path {root} --tasks pvrbench --model ... (docs/USAGE.md: a served model)")
    return {c: len(r) for c, r in docs.items()}
