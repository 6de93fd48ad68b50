"""The official scorers' verdicts on adversarial model outputs: expected.json, which tests/test_official_scores.py
checks the project's official style against, output for output. The test suite never runs this script.

    python tests/data/official_scores/generate.py --lmms-eval DIR --thinking-in-space DIR \\
        --urbanvideo DIR --video-r1 DIR [--out tests/data/official_scores/expected.json]

Each DIR is a clone (or a bare mirror) of EvolvingLMMs-Lab/lmms-eval, vision-x-nyu/thinking-in-space,
EmbodiedCity/UrbanVideo-Bench.code and tulerfeng/Video-R1. Their files are read at the commits pinned in OFFICIAL
(`git show`, SHA-256 checked); nothing of them is copied here. Run it in a scratch environment with pandas, numpy,
torch, rouge_score and openpyxl (pandas and openpyxl are no dependencies of the project), e.g.

    python -m venv --system-site-packages /tmp/official
    /tmp/official/bin/pip install pandas==2.2.3 openpyxl
    /tmp/official/bin/python tests/data/official_scores/generate.py ...

How each scorer runs: lmms-eval's and thinking-in-space's vsibench utils.py (given the output stripped, as their
pipeline gives it: ConfigurableTask.process_results strips a generated output first, checked in each pinned
api/task.py), Video-R1's eval_bench.py and grpo.py are parsed, and the functions and constants they need are
taken out by name (their modules import GPU and hub packages at import time) and run as they are:
vsibench_process_results and the aggregators, eval_bench's reward_fn, grpo.py's accuracy_reward and
format_reward. UrbanVideo-Bench's eval.py runs whole, as a script, on a CSV written
as its run.py writes one (the MCQ columns plus Output, DataFrame.to_csv); its per-output letters are its own
extract_option_letter on that CSV read back, as eval.py reads it.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import hashlib
import io
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections import OrderedDict
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent

OFFICIAL = {
    "lmms-eval-0.7.2": dict(
        repo="EvolvingLMMs-Lab/lmms-eval", ref="tag v0.7.2", commit="cb45ac4d4a667ea5ef89c7a148bff69b3489b981",
        path="lmms_eval/tasks/vsibench/utils.py",
        sha256="80ee943d769fbfbe3c4a747cc335af8a6e9074e5c772a454b1426ab514580936"),
    "lmms-eval-0.7.3": dict(
        repo="EvolvingLMMs-Lab/lmms-eval", ref="the PyPI release 0.7.3 (lmms_eval-0.7.3-py3-none-any.whl): its "
        "tasks/vsibench/utils.py is byte for byte this commit's", commit="75571cfe0fa36ca5ec2e6aa2bb268f9d38295af3",
        path="lmms_eval/tasks/vsibench/utils.py",
        sha256="a6b810896a8acb96f4f43dba466e7f5a6ccdcca28934f254550fa1d085106a04"),
    "thinking-in-space": dict(
        repo="vision-x-nyu/thinking-in-space", ref="main", commit="51e089c3ae69b9435e9489058610f5b3964c56a8",
        path="lmms_eval/tasks/vsibench/utils.py",
        sha256="1cdfd6a839120c4e8d4de6640a3b1d9009cf93755a586e1348ddd4687693bc97"),
    "urbanvideo-eval.py": dict(
        repo="EmbodiedCity/UrbanVideo-Bench.code", ref="main", commit="119069d6a2df67822c9cdc8fcc30643b17304a4e",
        path="eval.py", sha256="7b5626d48d1af3cf8513556ac780785b5b0e8add75fc881ba5daaf0bc07b3d07"),
    "video-r1-eval_bench": dict(
        repo="tulerfeng/Video-R1", ref="main", commit="59d65c347e44efa71be27abf9d89b4a2bb7d1c05",
        path="src/eval_bench.py", sha256="a0c0c723522bc4a5a49f1ed824a3a6574e28c7b6a2d777ad2b70675050835a0f"),
    "video-r1-grpo": dict(
        repo="tulerfeng/Video-R1", ref="main", commit="59d65c347e44efa71be27abf9d89b4a2bb7d1c05",
        path="src/r1-v/src/open_r1/grpo.py",
        sha256="f9fc457f2771c570bceae6733ee043f809f5ce323097fc53d2002643b2b216fa"),
}
VSI_PEERS = ("lmms-eval-0.7.2", "thinking-in-space", "lmms-eval-0.7.3")
VSI_MC_TYPES = ("object_rel_direction_easy", "object_rel_direction_medium", "object_rel_direction_hard",
                "object_rel_distance", "route_planning", "obj_appearance_order")
VSI_NA_TYPES = ("object_abs_distance", "object_counting", "object_size_estimation", "room_size_estimation")
URBAN_CATEGORIES = ("Action Generation", "Landmark Position", "Counting", "Object Recall")
NOTES = [
    "An UrbanVideo output holding a carriage return without a line feed ('\\rA', 'A\\r') is not in the suite: "
    "DataFrame.to_csv leaves it unquoted and read_csv ends the row there, so run.py's CSV itself breaks.",
    "An output holding a NUL character is not in the suite: pandas 2.2 reads '\\x00A' back as missing and 'A\\x00' "
    "as 'A', pandas 3 keeps both; eval.py's result depends on the pandas version.",
    "Written under pandas 2.2.3 (contemporary with eval.py); pandas 3.1.1 gives the same file but for this "
    "environment block.",
    "A VSI-Bench numeric ground truth of 0 makes lmms-eval's mean_relative_accuracy raise ZeroDivisionError for any "
    "number read (the evaluation stops); those cases record the exception instead of a score.",
]


# ----------------------------------------------------------------------------- the official code
def official_source(name: str, clones: dict) -> str:
    pin = OFFICIAL[name]
    text = subprocess.run(["git", "-C", str(clones[pin["repo"]]), "show", f"{pin['commit']}:{pin['path']}"],
                          check=True, capture_output=True).stdout
    digest = hashlib.sha256(text).hexdigest()
    if digest != pin["sha256"]:
        raise SystemExit(f"{name}: {pin['path']} at {pin['commit']} has SHA-256 {digest}, expected {pin['sha256']}")
    return text.decode("utf-8")


def take(source: str, names, namespace: dict) -> dict:
    """Execute the named functions and constant assignments of `source` (anywhere in it: eval_bench.py defines its
    functions inside a loop) in `namespace`, unchanged; the rest of the file is not run."""
    wanted, nodes = set(names), []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name in wanted:
            nodes.append(node)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) in wanted for t in node.targets):
            nodes.append(node)
    found = {n.name if isinstance(n, ast.FunctionDef) else n.targets[0].id for n in nodes}
    if found != wanted:
        raise SystemExit(f"not found in the official file: {sorted(wanted - found)}")
    nodes.sort(key=lambda n: n.lineno)
    exec(compile(ast.Module(body=nodes, type_ignores=[]), "<official>", "exec"), namespace)
    return namespace


class _Quiet:
    def info(self, *a, **k):
        pass


def vsibench_scorer(source: str) -> dict:
    import numpy as np
    import pandas as pd
    names = ["MCA_QUESTION_TYPES", "NA_QUESTION_TYPES", "METRICS_FOR_MCA", "METRICS_FOR_NA", "WORST_CASE_FOR_METRICS",
             "fuzzy_matching", "exact_match", "abs_dist_norm", "mean_relative_accuracy", "to_float",
             "vsibench_process_results", "vsibench_aggregate_results"]
    names += [n for n in ("_NUMBER_WORDS", "_NUM_RE", "extract_number", "_compute_all_subscores",
                          "vsibench_aggregate_overall")
              if re.search(rf"^(def )?{n}\b", source, re.MULTILINE)]
    ns = dict(np=np, pd=pd, re=re, os=os, partial=functools.partial, OrderedDict=OrderedDict, eval_logger=_Quiet())
    return take(source, names, ns)


def video_r1_scorers(eval_bench: str, grpo: str) -> tuple[dict, dict]:
    import torch
    from rouge_score import rouge_scorer
    bench = take(eval_bench, ["extract_answer", "normalize_number", "mean_relative_accuracy", "reward_fn"],
                 dict(re=re, torch=torch))
    train = take(grpo, ["accuracy_reward", "format_reward"], dict(re=re, os=os, datetime=datetime,
                                                                    rouge_scorer=rouge_scorer))
    return bench, train


# ----------------------------------------------------------------------------- the adversarial outputs
NUMBER_WORD = re.compile(r"\b(zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|hundred|"
                         r"thousand)\b", re.IGNORECASE)
ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


def non_finite(text: str) -> bool:
    try:
        return not math.isfinite(float(text.replace(",", "")))
    except ValueError:
        return False


def classes(output: str, extra=()) -> list[str]:
    """What an output exercises: the automatic classes (whitespace around it, a complete or unclosed <answer>,
    number words, a non-finite number, a string pandas reads as missing, nothing) and the template's own. The
    names of the project's departures from the official code are answers.EXTENSIONS' keys."""
    from pandas._libs.parsers import STR_NA_VALUES
    found = list(extra)
    if output != output.strip():
        found.append("whitespace")
    tag = ANSWER_TAG.search(output)
    if tag:
        found.append("answer_tag")
    elif "<answer>" in output:
        found.append("unclosed_tag")
    if non_finite(tag.group(1) if tag else output.strip()):
        found.append("non_finite")
    if NUMBER_WORD.search(output):
        found.append("number_words")
    if output in STR_NA_VALUES:
        found.append("missing_value")
    if not output.strip():
        found.append("empty")
    return sorted(set(found))


def mc_outputs(g: str) -> list[tuple[str, str]]:
    """(output, template class) for a multiple-choice ground truth letter `g`."""
    h, lo, wide = "B" if g != "B" else "C", g.lower(), chr(ord(g) + 0xFEE0)
    plain = [g, lo, g + ".", g + ")", f"({g})", f"{g}. sofa", f"{g}: sofa", g + "..", g + ",", f"**{g}**", g + g,
             h, f"{h}. {g}", wide, f"{g}\nBecause it is on the left.", f"{g}.\nBecause", f"{g}. ", f"{g}\t", g + "\n",
             f"<ANSWER>{g}</ANSWER>", f"{g} and {h}", f"{g}/{h}", "E", "Z"]
    text = [f"The answer is {g}", f"Answer: {g}", f"I think {g}", f"Option {g}", f"answer {g}.", f"My answer: {g}",
            f"The answer is {g}.", f"{lo} is correct", "Sorry, I cannot tell."]
    space = [f" {g}", f"  {g}  ", f"\t{g}", f"\n{g}", f"\n\n{g}\n", f"\xa0{g}", f"\u3000{g}", f" \n{g}", f"\r\n{g}",
             f" {g}. sofa", f"\u2003{g}", f" {lo}", f"{g}.\n", f"{g}.\t", f" {g}."]
    tags = [f"<answer>{g}</answer>", f"<answer> {g} </answer>", f"<think>hmm</think><answer>{g}</answer>",
            f"<think>left of the sofa</think>\n<answer>\n{g}\n</answer>", f"<answer>{g}</answer>\n",
            f"<answer>{h}</answer><answer>{g}</answer>", f"<answer>{g}. sofa</answer>",
            f"<answer>Option: [{g}]</answer>", f"<answer>{lo}</answer>", f"<answer></answer>{g}",
            "<answer></answer>", f"{g} <answer>{h}</answer>", f" <answer>{g}</answer>"]
    unclosed = [f"<answer>{g}", f"<answer> {g}", f"<think>so</think><answer>{g}", f"<answer>{g}</answ",
                f"<answer>{g}</", f"<answer>\n{g} because", f"<answer>{g}<answer>", f"<think>{g}"]
    option = [f"Option: [{g}]; Reason: it is nearer", f"Option: {g}", f"Option:{g}", f"Option: [ {g} ]",
              f"option: [{g}]", f"Option: [{lo}]", f"Reason: nearer; Option: [{g}]", f"Option: []; Reason: {g}",
              f"Option: [{wide}]", f"Option: [[{g}]]", f"Option:\n{g}", f"Options: {g}", f"Option: [{h}]",
              f"Option: [{g}];", "Option: [_]", f"Option: [1] {g}"]
    return ([(o, "plain") for o in plain] + [(o, "leading_text") for o in text] + [(o, "") for o in space]
            + [(o, "") for o in tags] + [(o, "") for o in unclosed] + [(o, "option_regex") for o in option])


EMPTY = ["", " ", "  ", "\n", "\t", "\xa0", " \n "]
MISSING_LIKE = ["none", "NONE", " None", "None ", "N/A.", "Nan", "NULL.", "n.a.", "N / A", "nil", "-", "?"]


def missing_outputs() -> list[str]:
    from pandas._libs.parsers import STR_NA_VALUES
    return sorted(STR_NA_VALUES - {""}) + MISSING_LIKE


def number_outputs(n: str) -> list[tuple[str, str]]:
    """(output, template class) for a numeric ground truth `n`."""
    plain = [n, n + ".", n + " meters", n + "m", n + "\n", n + " ", f"{n}\nbecause", f"{n} (approximately)",
             f"{n}-{n}", f"{n} or so", f"[{n}]", f"({n})"]
    text = [f"about {n}", f"The answer is {n}", f"There are {n} chairs.", f"~{n}", f"≈{n}", f"Answer: {n}"]
    space = [f" {n}", f"  {n}  ", f"\n{n}", f"\t{n}", f"\xa0{n}", f"\u3000{n}", f" \n{n}", f"{n}.\n"]
    tags = [f"<answer>{n}</answer>", f"<think>count</think><answer>{n}</answer>", f"<answer> {n} meters </answer>",
            f"<answer>{n}</answer>\n", f"<answer>about {n}</answer>"]
    unclosed = [f"<answer>{n}", f"<think>so</think><answer> {n}", f"<answer>{n}</answ"]
    formats = [f"-{n}", f"+{n}", f"{n}.0", f"{n},", f"{n}e0", f"{n}0", f"0{n}", f"{n},0", f"{n}.00", f"{n}%"]
    return ([(o, "plain") for o in plain] + [(o, "leading_text") for o in text] + [(o, "") for o in space]
            + [(o, "") for o in tags] + [(o, "") for o in unclosed] + [(o, "number_format") for o in formats])


ODD_NUMBERS = ["nan", "inf", "-inf", "NaN", "Infinity", "1e3", "1,000", "1_000", "0x10", "\u0663", "\u00bd", "3/4",
               ".5", "5.", "1e999", "-0", "3.14159", "12,5", "1.000,5", "Option: [A]", "A", "B. sofa"]
NUMBER_WORDS = {  # ground truth -> number-word outputs
    "3": ["three", "Three", "Three.", "three meters", "There are three chairs.", "THREE", "three or four",
          "<answer>three</answer>", "<answer>Three.</answer>", " three"],
    "21": ["twenty one", "twenty-one", "Twenty-one meters", "twenty one meters", "<answer>twenty one</answer>"],
    "105": ["one hundred and five", "one hundred five", "a hundred and five", "One hundred and five.",
            "<answer>one hundred and five</answer>"],
    "7": ["Seven", "seven.", "Seven chairs", "<answer>seven</answer>", "7 (seven)"],
    "2.5": ["two point five", "two and a half", "2 and a half"],
}
ZERO_TRUTH = ["0", "0.0", "1", "", "zero", "<answer>0</answer>", "1e-9", "0.000000001", "-0", "none", "2"]


def vsibench_cases() -> list[dict]:
    cases = []

    def add(output, qtype, gt, template):
        cases.append(dict(output=output, question_type=qtype, ground_truth=gt,
                          classes=classes(output, [template] if template else [])))
    for k, g in enumerate(("A", "B", "D")):
        for j, (o, t) in enumerate(mc_outputs(g) + [(o, "") for o in EMPTY] + [(o, "") for o in missing_outputs()]):
            add(o, VSI_MC_TYPES[(j + k) % len(VSI_MC_TYPES)], g, t)
    for k, n in enumerate(("3", "2.5", "21", "105", "7", "12.8")):
        for j, (o, t) in enumerate(number_outputs(n)):
            add(o, VSI_NA_TYPES[(j + k) % len(VSI_NA_TYPES)], n, t)
        for j, o in enumerate(NUMBER_WORDS.get(n, [])):
            add(o, VSI_NA_TYPES[(j + k) % len(VSI_NA_TYPES)], n, "")
    for j, o in enumerate(ODD_NUMBERS + EMPTY + missing_outputs()):
        add(o, VSI_NA_TYPES[j % len(VSI_NA_TYPES)], "3" if j % 2 else "1000", "odd_number")
    for j, o in enumerate(ZERO_TRUTH):
        add(o, VSI_NA_TYPES[j % len(VSI_NA_TYPES)], "0", "ground_truth_zero")
    return cases


def urbanvideo_cases() -> list[dict]:
    cases = []
    for k, g in enumerate(("A", "C", "E")):
        outs = mc_outputs(g) + [(o, "") for o in EMPTY + missing_outputs()] + [(o, "number_words") for o in
                                                                              ("three", "One", "<answer>two</answer>")]
        for j, (o, t) in enumerate(outs):
            cases.append(dict(output=o, answer=g, question_category=URBAN_CATEGORIES[(j + k) % 4],
                              classes=classes(o, [t] if t else [])))
    return cases


def video_r1_cases() -> list[dict]:
    cases = []

    def add(output, ptype, gt, template=""):
        cases.append(dict(output=output, problem_type=ptype, solution=f"<answer>{gt}</answer>", ground_truth=gt,
                          classes=classes(output, [template] if template else [])))
    for g in ("A", "C"):
        for o, t in mc_outputs(g) + [(o, "") for o in EMPTY]:
            add(o, "multiple choice", g, t)
    for ptype, truths in (("numerical", ("3", "2.5", "1,000", "21")), ("regression", ("4", "2.5", "100", "21"))):
        for n in truths:
            for o, t in number_outputs(n):
                add(o, ptype, n, t)
            for o in NUMBER_WORDS.get(n, []):
                add(o, ptype, n)
        for o in ODD_NUMBERS + EMPTY + ["<answer>nan</answer>", "<answer>inf</answer>"]:
            add(o, ptype, "3", "odd_number")
        for o in ZERO_TRUTH:
            add(o, ptype, "0", "ground_truth_zero")
    texts = {"OCR": ("KEEP LEFT", "STOP 25 km/h"), "free-form": ("It is raining heavily", "a red car turns left")}
    for ptype, truths in texts.items():
        for gt in truths:
            for o in (gt, f"<answer>{gt}</answer>", f"<answer>{gt.lower()}</answer>", f"<answer>{gt}",
                      f" {gt}\n", f"<think>reading</think><answer> {gt} </answer>", gt.split()[0],
                      f"<answer>{gt.split()[0]}</answer>", "", "<answer></answer>", "nothing legible"):
                add(o, ptype, gt, "text_types")
    return cases


FORMAT_OUTPUTS = [
    "<think>a</think><answer>B</answer>", "<think>a</think>\n<answer>B</answer>",
    "<think>a</think> <answer>B</answer>", "<think>a</think><answer>B</answer>\n",
    "\n<think>a</think><answer>B</answer>", " <think>a</think><answer>B</answer>",
    "<think>a</think><answer>B</answer> ", "<think></think><answer></answer>",
    "<think>a\nb</think>\n\n<answer>\nB\n</answer>", "<answer>B</answer>", "<think>a</think>", "<think>a</think>B",
    "B", "", "<think>a</think><answer>B", "<think>a<answer>B</answer>", "<think>a</think><answer>B</answer>tail",
    "head<think>a</think><answer>B</answer>", "<think>a</think><answer>B</answer><answer>C</answer>",
    "<think>a</think>x<answer>B</answer>", "<THINK>a</THINK><ANSWER>B</ANSWER>",
    "<think>a</think><answer>B</answer>\n\n", "\t<think>a</think><answer>B</answer>",
    "<think>a</think>\t<answer>B</answer>", "<think>x</think><think>y</think><answer>B</answer>",
    "<answer>B</answer><think>a</think>", "<think>a</think>\u00a0<answer>B</answer>",
    "<think>a</think><answer>B</answer>\u00a0", "<think>a</think><answer>B</answer>\r\n",
    "<think><answer>B</answer></think><answer>C</answer>",
]


# ----------------------------------------------------------------------------- running the scorers
PIPELINE_STRIP = "results[0] = results[0].strip()", "res.strip() if res is not None else \"\""


def pipeline_strips(peer: str, clones: dict) -> bool:
    """Whether the peer's lmms_eval/api/task.py (at its pinned commit) strips a generated output before the task's
    process_results (ConfigurableTask.process_results, in every lmms-eval since 0.2.0 and in thinking-in-space):
    vsibench_process_results never sees the raw output."""
    pin = OFFICIAL[peer]
    text = subprocess.run(["git", "-C", str(clones[pin["repo"]]), "show", f"{pin['commit']}:lmms_eval/api/task.py"],
                          capture_output=True, text=True, check=True).stdout
    body = text[text.index("    def process_results(self, doc, results, full_docs=None):"):]
    return any(line in body[:800] for line in PIPELINE_STRIP)


def run_vsibench(cases: list[dict], scorers: dict, strips: dict) -> dict:
    aggregates = {}
    for peer, ns in scorers.items():
        docs = []
        for c in cases:
            doc = {"question_type": c["question_type"], "ground_truth": c["ground_truth"]}
            try:   # (what the pipeline gives vsibench_process_results)
                ns["vsibench_process_results"](doc, [c["output"].strip() if strips[peer] else c["output"]])
            except Exception as e:  # noqa: BLE001 - the official code raising is a result
                c.setdefault("raises", {})[peer] = type(e).__name__
                continue
            metric = "accuracy" if c["question_type"] in VSI_MC_TYPES else "MRA:.5:.95:.05"
            c.setdefault("expected", {})[peer] = float(doc[metric])
            docs.append(doc)
        if "_compute_all_subscores" in ns:
            aggregates[peer] = {k: float(v) for k, v in ns["_compute_all_subscores"](docs).items()}
            aggregates[peer]["vsibench_aggregate_results"] = float(ns["vsibench_aggregate_results"](docs))
        else:   # thinking-in-space: percentages, plus two tabulated strings
            out = ns["vsibench_aggregate_results"](docs)
            aggregates[peer] = {k: float(v) for k, v in out.items() if not k.startswith("tabulated")}
    return aggregates


def csv_as_run_py_writes(path: Path, rows: list[dict]) -> None:
    """run.py: the MCQ.parquet frame plus an Output column, DataFrame.to_csv with its index."""
    import pandas as pd
    frame = pd.DataFrame([{"Question_id": k, "video_id": f"v{k % 7}.mp4", "question_category": r["question_category"],
                           "question": "Which way? Choices:\nA. left\nB. right\nC. up\nD. down\nE. stay",
                           "answer": r["answer"], "Output": r["output"]} for k, r in enumerate(rows)])
    frame.to_csv(path)


def run_eval_py(rows: list[dict], eval_py: str, scorer: dict) -> dict:
    """eval.py, unchanged, on the rows (its file and result paths): the per-category and total accuracy of its
    Excel report, and per row the letter its extract_option_letter reads from the CSV (None: dropped)."""
    import pandas as pd
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "result").mkdir()
        csv = Path(tmp) / "result" / "gpt-4o_output.csv"
        csv_as_run_py_writes(csv, rows)
        (Path(tmp) / "eval.py").write_text(eval_py)
        subprocess.run([sys.executable, "eval.py"], cwd=tmp, check=True, capture_output=True)
        report = pd.read_excel(Path(tmp) / "result" / "gpt-4o_acc.xlsx")
        back = pd.read_csv(csv)
    if len(back) != len(rows) or [str(a) for a in back["answer"]] != [r["answer"] for r in rows]:
        raise SystemExit("the CSV did not survive the round trip (an output that breaks rows?)")
    letters = [scorer["extract_option_letter"](t) for t in back["Output"]]
    for r, letter in zip(rows, letters):
        r["expected"] = {"letter": letter, "correct": None if letter is None else int(letter == r["answer"])}
    figures = {row["Category"]: {"accuracy": float(row["Accuracy"]),
                                 **({"num": int(row["Num"])} if row["Category"] != "Total" else {})}
               for _, row in report.iterrows()}
    kept = [r for r in rows if r["expected"]["letter"] is not None]
    if abs(sum(r["expected"]["correct"] for r in kept) / len(kept) - figures["Total"]["accuracy"]) > 1e-12:
        raise SystemExit("eval.py's total differs from its letters")
    return {"total": figures.pop("Total")["accuracy"], "categories": figures, "rows": len(rows), "kept": len(kept)}


def mix_rows() -> list[dict]:
    """200 answers (120 right) with 6 empty outputs, 4 'N/A' and 2 whitespace-only ones, over four categories."""
    rows = []
    for k in range(212):
        cat, gt = URBAN_CATEGORIES[k % 4], "ABCDE"[k % 5]
        out = (f"Option: [{gt}]; Reason: seen" if k < 120 else f"Option: [{'B' if gt != 'B' else 'C'}]" if k < 200
               else "" if k < 206 else "N/A" if k < 210 else "  ")
        rows.append(dict(output=out, answer=gt, question_category=cat))
    return rows


def run_video_r1(cases: list[dict], bench: dict, train: dict) -> None:
    for c in cases:
        sample = {"solution": c["solution"]}
        with contextlib.redirect_stdout(io.StringIO()):
            c["expected"] = {
                "video-r1-eval_bench": float(bench["reward_fn"](sample, c["output"], c["problem_type"])),
                "video-r1-grpo": float(train["accuracy_reward"]([[{"content": c["output"]}]], [c["solution"]],
                                                                problem_type=[c["problem_type"]])[0])}


def versions() -> dict:
    import numpy
    import pandas
    import torch
    out = {"python": platform.python_version(), "pandas": pandas.__version__, "numpy": numpy.__version__,
           "torch": torch.__version__}
    with contextlib.suppress(Exception):
        from importlib.metadata import version
        out["rouge_score"] = version("rouge_score")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    for flag in ("--lmms-eval", "--thinking-in-space", "--urbanvideo", "--video-r1"):
        ap.add_argument(flag, required=True, help="a clone or bare mirror of the repository")
    ap.add_argument("--out", default=str(HERE / "expected.json"))
    args = ap.parse_args(argv)
    clones = {"EvolvingLMMs-Lab/lmms-eval": args.lmms_eval, "vision-x-nyu/thinking-in-space": args.thinking_in_space,
              "EmbodiedCity/UrbanVideo-Bench.code": args.urbanvideo, "tulerfeng/Video-R1": args.video_r1}
    src = {name: official_source(name, clones) for name in OFFICIAL}

    vsi = vsibench_cases()
    strips = {p: pipeline_strips(p, clones) for p in VSI_PEERS}
    vsi_agg = run_vsibench(vsi, {p: vsibench_scorer(src[p]) for p in VSI_PEERS}, strips)
    urban = urbanvideo_cases()
    letter = take(src["urbanvideo-eval.py"], ["extract_option_letter"], dict(re=re))
    urban_agg = run_eval_py(urban, src["urbanvideo-eval.py"], letter)
    mix = mix_rows()
    mix_agg = run_eval_py(mix, src["urbanvideo-eval.py"], letter)
    r1 = video_r1_cases()
    bench, train = video_r1_scorers(src["video-r1-eval_bench"], src["video-r1-grpo"])
    run_video_r1(r1, bench, train)
    fmt = [{"output": o, "classes": ["format_whitespace"] if o != o.strip() else [],
            "expected": {"video-r1-grpo": float(train["format_reward"]([[{"content": o}]])[0])}}
           for o in FORMAT_OUTPUTS]

    out = {"about": "Adversarial model outputs scored by the official code (tests/data/official_scores/generate.py "
                    "wrote this; tests/test_official_scores.py reads it).",
           "official": OFFICIAL, "environment": versions(), "notes": NOTES,
           "vsibench": {"peers": list(VSI_PEERS), "pipeline_strips_the_output": strips, "cases": vsi,
                        "aggregate": vsi_agg},
           "urbanvideo": {"peer": "urbanvideo-eval.py", "cases": urban, "aggregate": urban_agg,
                          "mix": {"rows": [{k: v for k, v in r.items() if k != "expected"} for r in mix],
                                  "aggregate": mix_agg}},
           "video-r1": {"peers": ["video-r1-eval_bench", "video-r1-grpo"], "cases": r1, "format": fmt}}
    Path(args.out).write_text(json.dumps(out, indent=1, ensure_ascii=True) + "\n")
    print(f"{args.out}: {len(vsi)} VSI-Bench, {len(urban)} (+{len(mix)}) UrbanVideo, {len(r1)} Video-R1 outputs, "
          f"{len(fmt)} format-reward outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
