"""eval_pvrbench.py: official aggregation by hand (VSI-Bench, UrbanVideo-Bench, Table 2), end to end on a tiny
model, the manifest regenerating the evaluated clips bit for bit, kill and resume, a corrupt video, an API model.
The extensions' parts: extensions/embodied_r/tests/test_er_eval.py, extensions/robust_to/tests/test_rt_eval.py."""
import base64
import hashlib
import http.server
import io
import json
import shutil
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import eval_pvrbench as ev
import perturb
from machinery import video
from machinery.cli import UserError
from machinery.corruption import depth
from machinery.datasets import answers, data, synthetic
from machinery.eval import evaluation, run_files
from machinery.model import policy


@pytest.fixture(scope="module")
def assets(tmp_path_factory, tiny_path, synthetic_factory):
    syn = synthetic_factory(n=4, seed=0, num_frames=4, size=56, eval_fraction=1.0)  # 9 questions
    return tmp_path_factory.mktemp("evalpvr"), tiny_path, syn


def cli(assets, out, *extra, bench=None):
    root, tiny, syn = assets
    return ["--benchmark", f"synthetic={bench or syn}", "--model", str(tiny), "--frames", "4", "--max-new-tokens", "4",
            "--subtypes", "fog,rain,dusk,static", "--limit", "8", "--out", str(out), "--judge", "none", *extra]


class StubJudge:
    """Stands in for a judge: fixed verdicts, Rec. never given."""
    stats = {}

    def __init__(self):
        self.items = 0

    def reasoning_quality_batch(self, items, images=None):
        self.items += len(items)
        return [{"fragility": 1.0, "consistency": 3.0, "belief": 2.0, "recovery": None, "attention": 4.0}
                for _ in items]


@pytest.fixture
def counted(monkeypatch):
    """Counts samples given to the model and records the clip each (question, condition) was shown."""
    seen, original = {"n": 0, "clips": {}}, evaluation.HFModel.generate

    def generate(self, samples, prompts, clips, fps, style, max_new_tokens):
        seen["n"] += len(samples)
        for s, p, c in zip(samples, prompts, clips):
            seen["clips"].setdefault(s.id, []).append(np.array(c))
        return original(self, samples, prompts, clips, fps, style, max_new_tokens)
    monkeypatch.setattr(evaluation.HFModel, "generate", generate)
    return seen


def stub_judge(monkeypatch):
    stub = StubJudge()
    monkeypatch.setattr(ev.judges, "make_judge", lambda spec, **kw: stub)
    return stub


def lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def outputs(out):
    (model_dir,) = [p for p in Path(out).iterdir() if p.is_dir()]
    res = json.loads(sorted(model_dir.glob("*_results.json"))[-1].read_text())
    return model_dir, res


# ----------------------------------------------------------------------------- aggregation by hand

def fake(source, i, task, answer, options=("A. a", "B. b", "C. c", "D. d")):
    mc = answer.isalpha()
    return data.Sample(id=f"q{i}", video="v.mp4", question="Q?", options=list(options) if mc else [], answer=answer,
                       problem_type="multiple choice" if mc else "regression", task=task, source=source)


def scored(source, rows):
    """rows: (i, task, answer, condition, response or None for an unreadable video, judge)."""
    g = ev.Group(source, "vid", "v.mp4", [])
    out = []
    for i, task, answer, cond, text, verdict in rows:
        error = None if text is not None else "VideoError"
        out.append(dict(evaluation.record(g, fake(source, i, task, answer), cond, "prompt", text, error),
                        judge=verdict))
    return out


VSI = [  # clean: counting MRA (1 + 0.6) / 2; rel_direction levels easy 1, medium 2/3, hard 0; route 1
    (1, "object_counting", "4", "clean", "<answer>4</answer>", {"fragility": 0, "consistency": 4, "belief": 2,
                                                                 "recovery": None, "attention": 4}),
    (2, "object_counting", "4", "clean", "<think>hmm</think><answer>5</answer>", None),
    (3, "object_rel_direction_easy", "A", "clean", "<answer>A</answer>", None),
    (4, "object_rel_direction_medium", "B", "clean", "<answer>C</answer>", None),
    (5, "object_rel_direction_medium", "B", "clean", "<answer>b.</answer>", None),
    (8, "object_rel_direction_medium", "B", "clean", "<answer>B</answer>", None),
    (6, "object_rel_direction_hard", "C", "clean", "<answer>D</answer>", None),
    (7, "route_planning", "A", "clean", "A. Turn left", {"fragility": 0, "consistency": 2, "belief": 4,
                                                         "recovery": None, "attention": None}),
    (1, "object_counting", "4", "dusk", "<answer>2</answer>", {"fragility": 2, "consistency": 3, "belief": 1,
                                                                "recovery": 2, "attention": 3}),
    (7, "route_planning", "A", "dusk", "<answer>B</answer>", {"fragility": 4, "consistency": 1, "belief": 1,
                                                               "recovery": None, "attention": 1}),
    (3, "object_rel_direction_easy", "A", "fog", "<answer>A</answer>", {"fragility": 1, "consistency": 4,
                                                                         "belief": 3, "recovery": 4, "attention": 4}),
    (2, "object_counting", "4", "rain", "<answer>4</answer>", None),
    (4, "object_rel_direction_medium", "B", "rain", None, None),   # unreadable: an error, not a zero
]
URBAN = [  # official style: "Option: [X]; Reason: ..." (eval.py's regex); clean AG 2/3, LP 1/1, micro 3/4
    (1, "Action Generation", "A", "clean", "Option: [A]; Reason: it turns", None),
    (2, "Action Generation", "B", "clean", "Option: B; Reason: -", None),
    (3, "Action Generation", "C", "clean", "Option: [D]; Reason: -", None),
    (4, "Landmark Position", "E", "clean", "E", None),
    (1, "Action Generation", "A", "snow", "Option: [C]", None),
    (4, "Landmark Position", "E", "snow", "Option: [E]", None),
]


def test_vsibench_aggregation_by_hand():
    recs = scored("vsibench", VSI)
    assert [r["score"] for r in recs[:2]] == [1.0, pytest.approx(0.6)]   # |5-4|/4 = .25 <= 1 - theta, 6 of 10
    assert recs[4]["score"] == 1.0 and recs[8]["score"] == pytest.approx(0.1)  # "b." -> "b" ~ "B"; |2-4|/4: 1 of 10
    res = ev.summarize({"vsibench": recs}, ["dusk", "fog", "rain"])
    clean = res["sources"]["vsibench"]["conditions"]["clean"]
    rel = (1 + 2 / 3 + 0) / 3   # the mean of the three levels, not the pooled 3/5
    assert clean["tasks"] == pytest.approx({"object_counting": 0.8, "object_rel_direction": rel, "route_planning": 1.0})
    assert clean["question_types"]["object_rel_direction_medium"] == pytest.approx(2 / 3)
    orig = (0.8 + rel + 1.0) / 3
    assert clean["overall"] == pytest.approx(orig)
    conds = res["sources"]["vsibench"]["conditions"]
    assert conds["dusk"]["overall"] == pytest.approx(0.05) and conds["fog"]["overall"] == 1.0
    assert conds["rain"]["overall"] == 1.0 and conds["rain"]["n_errors"] == 1 and conds["rain"]["n"] == 2
    acc = res["pvrbench"]["accuracy"]
    assert acc["categories"] == {"lighting": pytest.approx(0.05), "camera": None, "occlusion": None, "weather": 1.0}
    avg = (0.05 + 1.0) / 2  # the mean of the category columns (lighting: dusk; weather: fog, rain), not of 3 subtypes
    assert acc["avg"] == pytest.approx(avg) and acc["orig"] == pytest.approx(orig)
    assert acc["avg_subtypes"] == pytest.approx((0.05 + 1.0 + 1.0) / 3)
    assert acc["drop"] == pytest.approx((orig - avg) / orig)
    assert res["n_samples"] == len(VSI) and res["n_errors"] == 1
    # reasoning: per-condition means, then over conditions (rain has no verdicts); Avg.+ and Orig.+ without Fra.
    rq = res["pvrbench"]["reasoning"]
    assert rq["metrics"] == pytest.approx({"fragility": 2.0, "consistency": 3.0, "belief": 2.0, "recovery": 3.0,
                                           "attention": 3.0})
    assert rq["avg_dagger"] == pytest.approx(2.75) and rq["orig_dagger"] == pytest.approx(10 / 3)
    assert rq["drop_dagger"] == pytest.approx((10 / 3 - 2.75) / (10 / 3))
    row = ev.table_row("m", 32, res["pvrbench"])
    assert row == ("| m | 32 | .05 | – | – | 1.00 | .53 ↓33% | .79 | "
                   "2.00 | 3.00 | 2.00 | 3.00 | 3.00 | 2.75 ↓18% | 3.33 |\n")
    # per-task breakdown (Figs. 14-18): clean vs all perturbed pooled, and per category
    pt = res["sources"]["vsibench"]["per_task"]
    assert pt["perturbed"] == pytest.approx({"object_counting": 0.55, "object_rel_direction": 1.0,
                                             "route_planning": 0.0})
    assert pt["weather"] == pytest.approx({"object_counting": 1.0, "object_rel_direction": 1.0})


# Table 2 of the paper (Lig., Occ., Sha., Wea., Avg., Orig. | Con., Bel., Rec., Att., Avg.†), a few rows
PAPER_TABLE2 = {
    "GPT-4o": ((.54, .47, .50, .52), .51, .59, (3.42, 3.55, 3.38, 3.21), 3.39),
    "Embodied-R 7B": ((.45, .38, .42, .43), .42, .54, (2.82, 2.91, 2.72, 2.68), 2.78),
    "VideoLLaMA2 7B": ((.28, .25, .27, .29), .27, .36, (2.18, 2.25, 2.12, 2.15), 2.18),
    "MiniCPM-V 2.6": ((.34, .28, .31, .32), .31, .43, (2.48, 2.42, 2.55, 2.21), 2.42),
    "Qwen2.5-VL 72B": ((.48, .41, .44, .47), .45, .57, (3.15, 3.08, 2.92, 3.12), 3.07),
    "Qwen2.5-VL 7B + ROVA": ((.48, .43, .47, .49), .47, .53, (3.05, 3.08, 2.98, 2.85), 2.99),
}


@pytest.mark.parametrize("name", list(PAPER_TABLE2))
def test_the_papers_table2_rows_follow_from_their_category_columns(name):
    """Every subtype of a category at the paper's category value: summarize's Avg. rounds to the paper's Avg.,
    its drop to the paper's percentage, and Avg.+ is the mean of Con., Bel., Rec., Att."""
    cols, avg, orig, quality, avg_dagger = PAPER_TABLE2[name]
    value = dict(zip(("lighting", "occlusion", "camera", "weather"), cols))
    overall = {s: value[perturb.CATEGORY_OF[s]] for s in perturb.SUBTYPES} | {"clean": orig}
    acc = ev.accuracy_block(overall, list(perturb.SUBTYPES))
    assert round(acc["avg"] + 1e-9, 2) == avg
    assert acc["categories"] == pytest.approx(value)
    rq = ev.reasoning_block(dict(zip(("consistency", "belief", "recovery", "attention"), quality)),
                            ev.mean(quality), 4.0)
    assert round(rq["avg_dagger"] + 1e-9, 2) == avg_dagger


def test_the_12_subtype_mean_misses_rows_of_table2():
    """Why Avg. is the category mean: with 4 lighting, 2 occlusion, 3 camera and 3 weather subtypes, the mean over
    subtypes rounds to .28 for VideoLLaMA2 (the paper prints .27), while the mean of the four columns gives .27."""
    cols = dict(zip(("lighting", "occlusion", "camera", "weather"), PAPER_TABLE2["VideoLLaMA2 7B"][0]))
    overall = {s: cols[perturb.CATEGORY_OF[s]] for s in perturb.SUBTYPES}
    acc = ev.accuracy_block(overall, list(perturb.SUBTYPES))
    assert round(acc["avg_subtypes"] + 1e-9, 2) == .28 and round(acc["avg"] + 1e-9, 2) == .27


def test_urbanvideo_outputs_eval_py_drops_score_0_with_its_figures_beside():
    recs = [{"task": "t", "score": 1.0, "response": "Option: [A]"}, {"task": "t", "score": 0.0, "response": ""},
            {"task": "t", "score": 0.0, "response": "Option: [B]"}, {"task": "t", "score": None, "error": "x"},
            {"task": "u", "score": 0.0, "response": "N/A"}, {"task": "u", "score": 0.0, "response": "  "},
            {"task": "u", "score": 1.0, "response": "Option: [C]"}]
    got = answers.condition_score(recs, "urbanvideo")
    assert got["overall"] == pytest.approx(2 / 6) and got["n_dropped"] == 2   # ours: "" and "N/A" score 0
    assert got["tasks"] == pytest.approx({"t": 1 / 3, "u": 1 / 3})
    assert got["overall_official_rule"] == pytest.approx(2 / 4)              # eval.py: both dropped, "  " kept
    assert got["tasks_official_rule"] == pytest.approx({"t": 1 / 2, "u": 1 / 2})
    official = answers.condition_score(recs, "urbanvideo", style="official")   # the official style: eval.py's figures
    assert official["overall"] == pytest.approx(2 / 4) and official["tasks"] == got["tasks_official_rule"]
    assert "n_dropped" not in answers.condition_score(recs, "vsibench")


def test_scoring_block_lists_the_styles_departures():
    reason, official = ev.scoring_block("reason"), ev.scoring_block("official", "lmms-eval-0.7.3")
    assert {"answer_tag", "unclosed_tag", "whitespace", "number_words",
            "urbanvideo_dropped"} <= set(reason["extensions"])
    assert set(official["extensions"]) == {"ground_truth_zero"}   # lmms-eval's MRA raises on it: no official score
    assert "extract_number" in official["vsibench_numeric"] and official["style"] == "official"
    assert "format_whitespace" not in reason["extensions"]        # a training reward's, not an evaluation's


def test_stored_records_are_scored_again_under_the_runs_style(tmp_path):
    """A store written under older scoring code gets today's scores; --style picks the rules (here an answer tag:
    the reasoning style reads inside it, lmms-eval's first-token rule reads the tag whole)."""
    s = fake("vsibench", 1, "route_planning", "A")
    store = evaluation.Store(tmp_path, "none")
    row = evaluation.record(ev.Group("vsibench", "vid", "v.mp4", []), s, "clean", "p", " <answer>A</answer>", None)
    store.append("samples", "vsibench", [dict(row, score=0.5, filtered_resps="stale")])
    groups = [ev.Group("vsibench", "vid", "v.mp4", [(s, ["clean"])])]
    (reason,) = store.records(groups)["vsibench"]
    (official,) = store.records(groups, "official")["vsibench"]
    assert (reason["filtered_resps"], reason["score"]) == ("A", 1.0)
    assert (official["filtered_resps"], official["score"]) == ("<answer>A</answer>", 0.0)   # (stripped, as lmms-eval)


def test_the_scoring_rule_is_part_of_the_run_hash_when_not_the_default(tmp_path):
    def key(*flags):
        args = ev.parse_args(["--benchmark", f"synthetic={tmp_path}", "--depth-model", "proxy", *flags])
        return run_files.run_config(ev.eval_settings(args), ev.Target("m", "m", "", str(tmp_path)),
                                     {"synthetic": tmp_path}, {}, ["fog"], ev.perturb.RENDER_VERSION)
    assert "scoring" not in key()   # the default: the hashes of earlier runs stay as they were
    assert key("--scoring", "lmms-eval-0.7.3")["scoring"] == "lmms-eval-0.7.3"


def test_urbanvideo_and_pvrbench_combination_by_hand():
    urban = scored("urbanvideo", URBAN)
    assert [r["filtered_resps"] for r in urban] == ["A", "B", "D", "E", "C", "E"]
    res = ev.summarize({"urbanvideo": urban}, ["snow"])
    clean = res["sources"]["urbanvideo"]["conditions"]["clean"]
    assert clean["tasks"] == pytest.approx({"Action Generation": 2 / 3, "Landmark Position": 1.0})
    assert clean["overall"] == 0.75   # micro-averaged, not the 5/6 macro mean
    acc = res["pvrbench"]["accuracy"]
    assert acc["categories"]["weather"] == 0.5 and acc["avg"] == 0.5 and acc["drop"] == pytest.approx(1 / 3)
    assert res["pvrbench"]["reasoning"]["avg_dagger"] is None
    both = ev.summarize({"vsibench": scored("vsibench", VSI), "urbanvideo": urban}, ["dusk", "fog", "rain", "snow"])
    vsi_clean = (0.8 + (1 + 2 / 3) / 3 + 1.0) / 3
    assert both["pvrbench"]["overall"]["clean"] == pytest.approx((vsi_clean + 0.75) / 2)  # unweighted over sources
    assert both["pvrbench"]["overall"]["snow"] == 0.5 and both["pvrbench"]["overall"]["dusk"] == pytest.approx(0.05)


# ----------------------------------------------------------------------------- end to end

def test_end_to_end_tiny_model(assets, tmp_path, monkeypatch, counted):
    stub = stub_judge(monkeypatch)
    ev.main(cli(assets, tmp_path / "out", "--judge", "stub"))
    model_dir, res = outputs(tmp_path / "out")
    assert model_dir.name == "tiny"
    for key in ("results", "table_row", "config", "manifest", "versions", "n_samples", "n_errors", "timing"):
        assert key in res
    assert res["n_samples"] == 16 and res["n_errors"] == 0 and counted["n"] == 16   # 8 questions x (clean + 1)
    assert res["raw_question_rows"] == {"synthetic": 0}  # (UrbanVideo rows asked with their raw question)
    assert ("lmms-eval <= 0.7.2" in res["scoring"]["vsibench_numeric"]
            and "<answer>" in res["scoring"]["answer_extraction"])
    assert res["config"]["max_pixels"] == 56 * 56 and res["config"]["fps"] == 2.0   # the synthetic defaults
    pvr = res["results"]["pvrbench"]
    for key in ("categories", "avg", "orig", "drop"):
        assert key in pvr["accuracy"]
    assert pvr["accuracy"]["categories"]["camera"] is None   # no camera subtype chosen
    diag = res["results"]["diagnostics"]["sources"]["synthetic"]   # collapse diagnostics (diagnostics.py)
    assert (set(diag["format_rate"]) == {"clean", "dusk", "fog", "rain", "static"}
            and diag["one_answer_share"] is not None)
    assert all(b["clean"]["n"] + b["perturbed"]["n"] > 0 for b in diag["tasks"].values())
    assert pvr["reasoning"]["avg_dagger"] == 3.0 and pvr["reasoning"]["orig_dagger"] == 3.0
    assert pvr["reasoning"]["metrics"]["fragility"] == 1.0 and stub.items == 16
    table = (model_dir / "table.md").read_text().strip().splitlines()
    assert len(table) == 7 and table[2].startswith("| tiny | 4 |")  # header, rule, row, blank, the legend, and
    assert table[6].startswith("Collapse warning:")   # a random-weight model is no better than a constant answer
    assert res["results"]["diagnostics"]["warnings"]
    assert table[4].startswith("#Fr frames per video") and "Sha. camera shake" in table[4]
    samples = lines(next(model_dir.glob("*_samples_pvrbench_synthetic.jsonl")))
    assert len(samples) == 16 and len({(s["doc_id"], s["condition"]) for s in samples}) == 16
    assert sorted({s["condition"] for s in samples}) == ["clean", "dusk", "fog", "rain", "static"]
    for s in samples:
        assert s["resps"] == [[s["response"]]] and s["judge"]["consistency"] == 3.0 and s["error"] is None
    manifest_file = next(model_dir.glob("*_manifest.jsonl"))
    manifest = lines(manifest_file)
    assert hashlib.sha256(manifest_file.read_bytes()).hexdigest() == res["manifest"]["sha256"]
    assert sum(len(r["questions"]) for r in manifest) == 8
    png = Image.open(model_dir / "per_task.png")
    assert png.size[0] >= 400
    # the manifest regenerates bit for bit what the model was shown, and a second run writes the same manifest
    for row in manifest:
        path = assets[2] / "videos" / f"{row['video_id']}.mp4"   # synthetic/<scene> -> videos/synthetic/<scene>.mp4
        frames, idx, _ = video.read_frames(path, num_frames=4, max_pixels=56 * 56)
        assert row["depth"] == {"own": f"depth/{path.stem}.npy"}   # auto: the synthetic clips' true depth
        d = depth.own_depth(assets[2] / row["depth"]["own"], frames, idx)
        clip = perturb.apply(frames, perturb.PerturbSpec.from_dict(row["spec"]), d)
        again = perturb.apply(frames, perturb.static_spec(row["video_id"], row["subtype"], synthetic.DEMO_ETA), d)
        if row["subtype"] == "fog":   # graded by depth: the proxy's would differ
            assert not np.array_equal(clip, perturb.apply(frames, perturb.PerturbSpec.from_dict(row["spec"])))
        assert np.array_equal(clip, again)
        for qid in row["questions"]:
            assert any(np.array_equal(clip, c) for c in counted["clips"][qid])
            assert any(np.array_equal(frames, c) for c in counted["clips"][qid])   # and the clean clip
    ev.main(cli(assets, tmp_path / "out2"))
    second = next((tmp_path / "out2" / "tiny").glob("*_manifest.jsonl")).read_bytes()
    assert hashlib.sha256(second).hexdigest() == res["manifest"]["sha256"]
    # --compare: one table, one chart
    table = ev.main(["--compare", str(next(model_dir.glob("*_results.json"))),
                     str(next((tmp_path / "out2" / "tiny").glob("*_results.json"))), "--out", str(tmp_path / "cmp")])
    assert len(table.strip().splitlines()) == 4 and (tmp_path / "cmp" / "compare.png").is_file()


def test_export_writes_the_corrupted_videos(assets, tmp_path):
    ev.main(cli(assets, tmp_path / "out", "--export", str(tmp_path / "pvr")))
    rows = lines(tmp_path / "pvr" / "manifest.jsonl")
    assert sum(len(r["questions"]) for r in rows) == 8 and not (tmp_path / "out").exists()   # no model, no eval
    for row in rows:
        got = video.read_frames(tmp_path / "pvr" / row["file"], num_frames=4, max_pixels=56 * 56)[0]
        frames = video.read_frames(row["source_video"], num_frames=4, max_pixels=56 * 56)[0]
        assert row["depth"]["own"].startswith("depth/")   # the synthetic clips' true depth, exported beside them
        d = depth.read(tmp_path / "pvr" / row["depth"]["file"])
        want = perturb.apply(frames, perturb.PerturbSpec.from_dict(row["spec"]), d)
        assert np.array_equal(got, want)   # lossless: the frames a model is shown, bit for bit
        assert (tmp_path / "pvr" / row["clean_file"]).is_file()


def test_kill_and_resume_gives_the_same_results(assets, tmp_path, monkeypatch, counted):
    stub = stub_judge(monkeypatch)
    ev.main(cli(assets, tmp_path / "full", "--judge", "stub", "--batch-size", "4"))
    full = outputs(tmp_path / "full")[1]
    assert counted["n"] == 16 and stub.items == 16
    counted["n"] = stub.items = 0
    assert ev.main(cli(assets, tmp_path / "cut", "--judge", "stub", "--batch-size", "4", "--stop-after", "5")) is None
    done = counted["n"]   # stops after the batch that reaches 5
    assert 5 <= done < 16 and not list((tmp_path / "cut" / "tiny").glob("*_results.json"))
    (store,) = (tmp_path / "cut" / "tiny").glob("run_*/samples_synthetic.jsonl")
    assert len(store.read_text().splitlines()) == done
    store.write_bytes(store.read_bytes()[:-20])   # a kill while writing: the last line is torn
    ev.main(cli(assets, tmp_path / "cut", "--judge", "stub", "--batch-size", "4"))
    assert counted["n"] == 16 + 1 and stub.items == 16   # only the torn sample twice; every verdict once
    cut = outputs(tmp_path / "cut")[1]
    assert cut["results"] == full["results"]
    counted["n"] = 0   # the same command once more: nothing left to do
    ev.main(cli(assets, tmp_path / "cut", "--judge", "stub", "--batch-size", "4"))
    assert counted["n"] == 0


def test_questions_on_one_clip_share_its_prefill(assets, tmp_path, monkeypatch):
    """HFModel gets the questions of a (video, condition) with at least SHARE_MIN of them in one call and
    encodes and prefills the clip once for them (policy.answer_same_video); the other clips' questions go
    in batches of --batch-size across clips; the results are those of batches of --batch-size prompts."""
    calls, real, sizes, generate = [], policy.answer_same_video, [], evaluation.HFModel.generate

    def counted_answer(model, processor, prompts, video, *a, **kw):
        calls.append(len(prompts))
        return real(model, processor, prompts, video, *a, **kw)
    monkeypatch.setattr(policy, "answer_same_video", counted_answer)
    monkeypatch.setattr(evaluation, "SHARE_MIN", 3)
    monkeypatch.setattr(evaluation.HFModel, "generate", lambda self, samples, *a: sizes.append(len(samples))
                        or generate(self, samples, *a))
    args = cli(assets, tmp_path / "shared", "--assign", "all", "--subtypes", "fog,dusk", "--batch-size", "2")
    ev.main(args)
    model_dir, shared = outputs(tmp_path / "shared")
    store = lines(next(model_dir.glob("run_*/samples_synthetic.jsonl")))
    per_clip = Counter((r["video_id"], r["condition"]) for r in store)
    big, few = [n for n in per_clip.values() if n >= 3], sum(n for n in per_clip.values() if n < 3)
    assert max(big) > 2 and few and sorted(sizes) == sorted(big + [2] * (few // 2) + [1] * (few % 2))  # rest: by 2
    assert all(calls.count(n) >= big.count(n) for n in big)   # (a batch that is one clip's shares it too)
    monkeypatch.setattr(evaluation.HFModel, "share_clips", False)
    calls.clear()
    ev.main(cli(assets, tmp_path / "plain", "--assign", "all", "--subtypes", "fog,dusk", "--batch-size", "2"))
    plain_dir, plain = outputs(tmp_path / "plain")
    assert calls == [] and plain["results"] == shared["results"]
    again = lines(next(plain_dir.glob("run_*/samples_synthetic.jsonl")))
    assert {(r["doc_id"], r["condition"]): r["response"] for r in again} == \
        {(r["doc_id"], r["condition"]): r["response"] for r in store}


def test_the_judge_runs_while_the_next_window_generates(assets, tmp_path, monkeypatch):
    """A window is judged in a background thread while the next one generates; a judge that fails stops the
    run with its error, the samples generated so far kept."""
    generating, seen = threading.Event(), {}
    real = evaluation.HFModel.generate

    def generate(self, *a, **kw):
        generating.set()
        return real(self, *a, **kw)
    monkeypatch.setattr(evaluation.HFModel, "generate", generate)

    class SlowJudge(StubJudge):
        def reasoning_quality_batch(self, items, images=None):
            if not seen:   # the first window's verdicts wait until the next window generates
                generating.clear()
                seen["overlap"] = generating.wait(timeout=20)
                seen["thread"] = threading.current_thread().name
            return super().reasoning_quality_batch(items, images)
    stub = SlowJudge()
    monkeypatch.setattr(ev.judges, "make_judge", lambda spec, **kw: stub)
    ev.main(cli(assets, tmp_path / "out", "--judge", "stub", "--batch-size", "2"))
    assert seen == {"overlap": True, "thread": "judge"} and stub.items == 16
    assert outputs(tmp_path / "out")[1]["results"]["pvrbench"]["reasoning"]["avg_dagger"] == 3.0

    class BrokenJudge(StubJudge):
        def reasoning_quality_batch(self, items, images=None):
            raise RuntimeError("the judge is down")
    monkeypatch.setattr(ev.judges, "make_judge", lambda spec, **kw: BrokenJudge())
    with pytest.raises(RuntimeError, match="the judge is down"):
        ev.main(cli(assets, tmp_path / "broken", "--judge", "stub", "--batch-size", "2"))
    assert lines(next((tmp_path / "broken" / "tiny").glob("run_*/samples_synthetic.jsonl")))


def test_corrupt_video_is_an_error_not_a_crash(assets, tmp_path, counted):
    bench = tmp_path / "syn"
    shutil.copytree(assets[2], bench)
    bad = sorted((bench / "videos" / "synthetic").glob("*.mp4"))[0]
    good = bad.read_bytes()
    bad.write_bytes(b"\x00garbage" * 100)
    ev.main(cli(assets, tmp_path / "out", "--judge", "local", bench=bench))   # and the real offline judge
    model_dir, res = outputs(tmp_path / "out")
    samples = lines(next(model_dir.glob("*_samples_pvrbench_synthetic.jsonl")))
    errs = [s for s in samples if s["error"]]
    assert len(samples) == 16 and errs and res["n_errors"] == len(errs)
    assert all(bad.stem in s["doc_id"] and "cannot be decoded" in s["error"] and s["score"] is None for s in errs)
    assert res["results"]["sources"]["synthetic"]["conditions"]["clean"]["n_errors"] > 0
    ok = [s for s in samples if not s["error"]]
    assert all(s["judge"]["consistency"] is not None and s["judge"]["belief"] is None for s in ok)  # LocalJudge
    assert res["results"]["pvrbench"]["reasoning"]["orig_dagger"] is not None
    bad.write_bytes(good)   # the video repaired: the next run tries the failed samples again, and only those
    counted["n"] = 0
    ev.main(cli(assets, tmp_path / "out", "--judge", "local", bench=bench))
    assert counted["n"] == len(errs) and outputs(tmp_path / "out")[1]["n_errors"] == 0


# ----------------------------------------------------------------------------- the API backend

class FakeAPI(http.server.BaseHTTPRequestHandler):
    """A chat-completions server: the model "fake-vlm" answers A (its first request gets a 500); the judge
    "fake-judge" returns the five metrics."""
    requests, judged, fail_first, always_fail = [], [], 1, False

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["model"] == "fake-judge":
            FakeAPI.judged.append(body)
            return self.reply('{"fragility": 1, "consistency": 4, "belief": 3, "recovery": 2, "attention": 5}')
        FakeAPI.requests.append((dict(self.headers), body))
        if FakeAPI.always_fail or len(FakeAPI.requests) <= FakeAPI.fail_first:
            self.send_response(500)
            self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(b"overloaded")
            return
        self.reply("<think>I look.</think><answer>A</answer>")

    def reply(self, content):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"choices": [{"message": {"content": content}}]}).encode())

    def log_message(self, *a):
        pass


def test_api_model_against_a_fake_server(assets, tmp_path, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-test-key")
    FakeAPI.requests, FakeAPI.judged, FakeAPI.fail_first, FakeAPI.always_fail = [], [], 1, False
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    args = cli(assets, tmp_path / "out", "--subtypes", "fog", "--limit", "3", "--batch-size", "1")
    args[args.index("--model") + 1] = "openai:fake-vlm"
    args += ["--base-url", url, "--video-format", "images"]   # (a --base-url server gets one video by default)
    try:
        ev.main(args + ["--judge", "openai:fake-judge", "--judge-base-url", url])
        assert len(FakeAPI.requests) == 7   # 6 samples + the one retried after the 500
        assert len(FakeAPI.judged) == 6     # 3 clean traces with themselves (Orig.+), 3 perturbed with clean
        for body in FakeAPI.judged:         # the judge sees 4 frames of the video it rates
            assert sum(p["type"] == "image_url" for p in body["messages"][0]["content"]) == 4
        for headers, body in FakeAPI.requests:
            assert headers["Authorization"] == "Bearer sk-secret-test-key" and body["model"] == "fake-vlm"
            parts = body["messages"][0]["content"]
            images = [p for p in parts if p["type"] == "image_url"]
            assert len(images) == 4 and parts[-1]["type"] == "text" and "<answer>" in parts[-1]["text"]
            url = images[0]["image_url"]["url"]
            assert url.startswith("data:image/jpeg;base64,")
            assert Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).size == (56, 56)
        model_dir, res = outputs(tmp_path / "out")
        assert model_dir.name == "fake-vlm" and res["n_errors"] == 0
        rq = res["results"]["pvrbench"]["reasoning"]
        assert rq["avg_dagger"] == 3.5 and rq["orig_dagger"] == 3.5 and rq["metrics"]["fragility"] == 1.0
        samples = lines(next(model_dir.glob("*_samples_pvrbench_synthetic.jsonl")))
        assert all(s["filtered_resps"] == ["A"] and s["score"] == float(s["target"] == "A") for s in samples)
        for f in model_dir.rglob("*"):   # the key is never written
            assert not f.is_file() or b"sk-secret-test-key" not in f.read_bytes()
        # a server that keeps failing: recorded errors, retried by the next run
        FakeAPI.requests, FakeAPI.always_fail = [], True
        ev.main(args + ["--out", str(tmp_path / "down"), "--api-retries", "0"])
        assert outputs(tmp_path / "down")[1]["n_errors"] == 6
        FakeAPI.requests, FakeAPI.always_fail, FakeAPI.fail_first = [], False, 0
        ev.main(args + ["--out", str(tmp_path / "down")])
        assert len(FakeAPI.requests) == 6 and outputs(tmp_path / "down")[1]["n_errors"] == 0
    finally:
        server.shutdown()


class FakeVideoServer(http.server.BaseHTTPRequestHandler):
    """A vLLM-like server: answers A to a request whose frames come as one video part (refuses it with a 400
    when `refuse` is set: `refuse` is the error body, e.g. a server without video support's)."""
    requests, refuse = [], None

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeVideoServer.requests.append(body)
        if FakeVideoServer.refuse:
            self.send_response(400)
            self.end_headers()
            self.wfile.write(json.dumps(FakeVideoServer.refuse).encode())
            return
        FakeAPI.reply(self, "<answer>A</answer>")

    def log_message(self, *a):
        pass


def test_a_served_model_gets_the_frames_as_one_video(assets, tmp_path, monkeypatch):
    """--base-url (vLLM, SGLang): one video_url part, data:video/jpeg with the JPEG frames comma-separated (what
    vLLM's VideoMediaIO decodes), and the clip's fps for Qwen-VL's temporal positions; a server that refuses
    it stops the run with one line that says how to switch."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeVideoServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FakeVideoServer.requests, FakeVideoServer.refuse = [], None
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    args = cli(assets, tmp_path / "out", "--subtypes", "fog", "--limit", "2", "--judge", "none")
    args[args.index("--model") + 1] = "openai:fake-vlm"
    encoded = []
    real_jpegs = evaluation.chat.jpegs
    monkeypatch.setattr(evaluation.chat, "jpegs", lambda frames: (encoded.append(1) if frames is not None and not
                        isinstance(frames[0], bytes) else None) or real_jpegs(frames))  # (bytes, None pass through)
    try:
        ev.main(args + ["--base-url", url])
        assert len(FakeVideoServer.requests) == 4
        clips = {body["messages"][0]["content"][0]["video_url"]["url"] for body in FakeVideoServer.requests}
        assert len(encoded) == len(clips)  # each (video, condition) encoded once, whatever its questions
        for body in FakeVideoServer.requests:
            parts = body["messages"][0]["content"]
            assert [p["type"] for p in parts] == ["video_url", "text"]
            head, frames = parts[0]["video_url"]["url"].split(",", 1)
            assert head == "data:video/jpeg;base64"
            decoded = [Image.open(io.BytesIO(base64.b64decode(f))) for f in frames.split(",")]
            assert len(decoded) == 4 and all(im.size == (56, 56) for im in decoded)
            assert body["media_io_kwargs"] == {"video": {"fps": 2.0, "num_frames": -1}}
        assert outputs(tmp_path / "out")[1]["n_errors"] == 0
        FakeVideoServer.refuse = {"error": "video_url is not supported by this model"}
        refused = (r"refused a request with the clip as one video part \(HTTP 400: "
                   r"video_url is not supported by this model\): .*--video-format images")
        with pytest.raises(UserError, match=refused):
            ev.main(args + ["--base-url", url, "--out", str(tmp_path / "refused"), "--api-retries", "0"])
        words = ("Per-request media_io_kwargs are disabled by default because they can change multimodal media "
                 "loading resource usage. Start the server with --trust-request-mm-kwargs only when clients are "
                 "trusted. (parameter=media_io_kwargs)")   # vLLM 0.32.0's own, quoted whole
        FakeVideoServer.refuse = {"error": {"message": words, "type": "BadRequestError", "code": 400}}
        with pytest.raises(UserError) as refused:
            ev.main(args + ["--base-url", url, "--out", str(tmp_path / "untrusted"), "--api-retries", "0"])
        assert words in str(refused.value) and str(refused.value).endswith(
            "start the server with --trust-request-mm-kwargs: the clip's frame rate goes with each request as "
            "media_io_kwargs, which Qwen-VL's temporal positions are computed from")
        assert "--video-format images" not in str(refused.value)
    finally:
        server.shutdown()


def test_a_served_run_stopped_with_requests_in_flight_repeats_nothing_it_stored(assets, tmp_path):
    """--api-concurrency requests in flight, each finished one stored at once: stopped after 3 (as if killed
    with 4 in flight), the rerun asks only for what was not stored, and every sample ends up stored once."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeVideoServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    FakeVideoServer.requests, FakeVideoServer.refuse = [], None
    args = cli(assets, tmp_path / "out", "--limit", "6", "--subtypes", "fog", "--judge", "none")
    args[args.index("--model") + 1] = "openai:fake-vlm"
    args += ["--base-url", f"http://127.0.0.1:{server.server_address[1]}/v1", "--api-concurrency", "4"]
    try:
        assert ev.main(args + ["--stop-after", "3"]) is None
        (store,) = (tmp_path / "out" / "fake-vlm").glob("run_*/samples_synthetic.jsonl")
        stored, asked = len(store.read_text().splitlines()), len(FakeVideoServer.requests)
        assert stored == 3 and asked >= stored  # (those in flight when it stopped finish unstored)
        ev.main(args)
        rows = lines(store)
        assert len(rows) == 12 and len({(r["doc_id"], r["condition"]) for r in rows}) == 12
        assert len(FakeVideoServer.requests) - asked == 12 - stored  # nothing stored was asked again
    finally:
        server.shutdown()


# ----------------------------------------------------------------------------- a user's first hour, through the CLI

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*argv):
    import os
    import subprocess
    import sys
    return subprocess.run([sys.executable, "eval_pvrbench.py", *map(str, argv)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_a_rerun_that_changes_nothing_writes_no_new_results_and_compare_keeps_the_latest(assets, tmp_path):
    out = tmp_path / "out"
    first = run_cli(*cli(assets, out))
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_cli(*cli(assets, out))
    assert again.returncode == 0 and "nothing new since" in again.stdout
    model_dir = out / "tiny"
    assert len(list(model_dir.glob("*_results.json"))) == 1
    # a second configuration of the same model, then --compare over every results file of the folder
    other = run_cli(*cli(assets, out, "--subtypes", "fog"))
    assert other.returncode == 0, other.stderr[-2000:]
    results = sorted(model_dir.glob("*_results.json"))
    assert len(results) == 2
    stale = json.loads(results[0].read_text())
    stale["date"] = "19990101_000000"  # an older result of the first configuration, e.g. from an earlier rerun
    (model_dir / "19990101_000000_results.json").write_text(json.dumps(stale))
    table = ev.main(["--compare", *map(str, model_dir.glob("*_results.json")), "--out", str(tmp_path / "cmp")])
    rows = [ln for ln in table.strip().splitlines() if ln.startswith("| tiny")]
    assert len(rows) == 2  # one row per configuration, not one per results file


def test_mistakes_are_one_line_and_leave_no_folder(assets, tmp_path):
    out = tmp_path / "ev"
    for model, expect in ((tmp_path / "runs" / "nope" / "final", "no such folder"),
                          ("someorg/not-in-the-cache", "HF_HUB_OFFLINE")):
        run = run_cli(*cli(assets, out), "--model", model)
        lines_ = [ln for ln in run.stderr.splitlines() if ln.strip()]
        assert run.returncode == 2 and len(lines_) == 1 and expect in lines_[0], run.stderr
    assert not out.exists()  # no empty runs/eval/nope-final/
    (tmp_path / "afile").write_text("x")
    run = run_cli(*cli(assets, tmp_path / "afile"))
    assert run.returncode == 2 and "is a file" in run.stderr and "Traceback" not in run.stderr


def test_the_core_knows_no_extension(assets, tmp_path):
    """--help lists the core's flags only; an extension's model scheme is one line that says where schemes come from."""
    text = run_cli("--help").stdout
    assert "--model" in text and "--protocol" in text
    for flag in ("--perceiver", "--debias", "--frame-sampler", "--agent-k", "--agent-synthesis", "robust-to:"):
        assert flag not in text
    run = run_cli(*cli(assets, tmp_path / "ev"), "--model", f"robust-to:{assets[1]}")
    assert run.returncode == 2 and "no model scheme robust-to" in run.stderr, run.stderr
    assert "python -m extensions.<name>.eval" in run.stderr, run.stderr
    assert len([ln for ln in run.stderr.splitlines() if ln.strip()]) == 1 and not (tmp_path / "ev").exists()
