"""utils.py of the lmms-eval task that ``eval_pvrbench.py --export-lmms-eval DIR`` writes (copied there as is).

lmms-eval calls these functions by name from the task YAMLs (machinery/eval/lmms_task.py writes them). Scoring and
aggregation are eval_pvrbench.py's own code: the export copies answers.py and the two modules it imports into
DIR/pvrbench_scoring/machinery/, so a model scored here gets eval_pvrbench.py's figures under the export's
--style / --scoring (DIR/export.json), and the folder needs nothing from the project at run time.

* A doc is one (question, condition): its prompt (data.build_prompt in the export's style), its video (the
  clip as eval_pvrbench.py corrupts it, lossless, at the frame rate the model is told), its ground truth.
* process_results: the answer read and scored as eval_pvrbench.py does (answers.read_and_score); an output
  lmms-eval marks as a failed request is an error, left out of every figure, as eval_pvrbench.py leaves out
  a request that failed. lmms-eval strips every output before a task sees it: VSI-Bench's official reading
  strips too (answers.OFFICIAL_SCORERS), but UrbanVideo's eval.py reads the raw output, so an UrbanVideo output
  with leading whitespace (' A') scores here as eval.py would score 'A' (eval_pvrbench.py: as ' A').
* accuracy (each task): the condition's official aggregate (answers.condition_score per source, then the mean
  over the sources, as eval_pvrbench.summarize). The category groups average their subtypes' accuracy.
* pvr_avg: a subtype's share of the paper's Avg. (Table 2: the mean of the category means), that is its
  accuracy x export.json's weight for it; the `pvrbench` group sums the shares (total), which is Avg.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
if (HERE / "pvrbench_scoring").is_dir():   # in an export; in the project, its own machinery
    sys.path.insert(0, str(HERE / "pvrbench_scoring"))
from machinery.datasets import answers  # noqa: E402

CONFIG = json.loads((HERE / "export.json").read_text()) if (HERE / "export.json").is_file() else {}
FAILED = "[LMMS_EVAL_REQUEST_FAILED"   # how lmms-eval's API models return a request that failed for good


def doc_to_visual(doc):
    return [str(HERE / doc["video"])]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    return doc["prompt"]


def doc_to_messages(doc, lmms_eval_specific_kwargs=None):
    """One user turn: the video, then the prompt (eval_pvrbench.py's order)."""
    return [{"role": "user", "content": [{"type": "video", "url": doc_to_visual(doc)[0]},
                                         {"type": "text", "text": doc["prompt"]}]}]


def process_results(doc, results):
    text = results[0] if results else ""
    record = {"id": doc["id"], "question_id": doc["question_id"], "condition": doc["condition"],
              "source": doc["source"], "task": doc["task"], "video": f"{doc['source']}/{doc['video_id']}",
              "response": text, "error": None}
    if isinstance(text, str) and text.startswith(FAILED):
        record.update(error=text, filtered_resps=None, score=None)
    else:
        pred, score = answers.read_and_score(text, doc["source"], doc["problem_type"], doc["answer"],
                                             CONFIG.get("style", "reason"), CONFIG.get("scoring", answers.SCORINGS[0]))
        record.update(filtered_resps=pred, score=score)
    return {"accuracy": record} if doc["condition"] == "clean" else {"accuracy": record, "pvr_avg": record}


def accuracy(items):
    """A condition's score: each source's official aggregate, then their mean (None: nothing scored)."""
    by_source = defaultdict(list)
    for r in items:
        by_source[r["source"]].append(r)
    style = CONFIG.get("style", "reason")
    return answers.mean([answers.condition_score(recs, src, style)["overall"] for src, recs in by_source.items()])


def pvr_avg(items):
    """A subtype's share of Avg.: its accuracy x its weight (export.json `avg_weights`)."""
    score = accuracy(items)
    return None if score is None else score * CONFIG["avg_weights"][items[0]["condition"]]


def total(metrics, sizes=None, weight_by_size=False):
    """The `pvrbench` group's Avg.: the sum of its subtypes' shares (lmms-eval's group aggregation signature)."""
    return sum(m for m in metrics if isinstance(m, int | float))
