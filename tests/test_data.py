"""Tests for data.py: loaders on fixture files in the exact external formats, prompts, answer
extraction and scoring against hand-worked values of the official formulas."""
import json
import logging
import math
import os

import pytest

from machinery.datasets import answers, data
from machinery.datasets.data import DataError, Sample

# --------------------------------------------------------------------------- fixtures
COT = "<think>Let me think. The sign is on the left, so the answer is B.</think>"

VIDEO_R1_RECORDS = [
    {"problem_id": 2, "problem": "What appears on the screen during the missile's ascent?",
     "data_type": "video", "problem_type": "multiple choice",
     "options": ["A. A subscription notification", "B. A military command", "C. A warning", "D. A weather update"],
     "process": COT, "solution": "<answer>B</answer>",
     "path": "./LLaVA-Video-178K/videos/ytb_a.mp4", "data_source": "LLaVA-Video-178K/30_60_s_youtube_v0_1"},
    {"problem_id": 7, "problem": "How many people enter the room?", "data_type": "video",
     "problem_type": "numerical", "options": [], "solution": "<answer> 3 </answer>",
     "path": "./STAR/b.mp4", "data_source": "STAR"},
    {"problem_id": 8, "problem": "How far is the car from the camera (in meters)?", "data_type": "video",
     "problem_type": "regression", "options": [], "solution": "<answer>4.5</answer>",
     "path": "./Spatial/c.mp4", "data_source": "SR-91k"},
    {"problem_id": 9, "problem": "What does the sign say?", "data_type": "video", "problem_type": "OCR",
     "options": [], "solution": "<answer>KEEP LEFT</answer>", "path": "./OCR/d.mp4", "data_source": "OCR"},
    {"problem_id": 10, "problem": "Describe the weather.", "data_type": "video", "problem_type": "free-form",
     "options": [], "solution": "<answer>It is raining heavily</answer>", "path": "./FF/e.mp4",
     "data_source": "FF"},
    {"problem_id": 1, "problem": "What role does the quartz cylinder play?", "data_type": "image",
     "problem_type": "multiple choice", "options": ["A) It focuses the laser", "B) It is the weight"],
     "solution": "<answer>B</answer>", "path": "./Knowledge/ArxivQA/images/f.jpg", "data_source": ""},
]

VSI_ROWS = [
    {"id": 11, "dataset": "scannet", "scene_name": "scene0001_00", "question_type": "object_rel_distance",
     "question": "Which of these objects (chair, table, sofa) is the closest to the tv?",
     "options": ["A. chair", "B. table", "C. sofa"], "ground_truth": "B"},
    {"id": 12, "dataset": "arkitscenes", "scene_name": "41069025", "question_type": "object_counting",
     "question": "How many chair(s) are in this room?", "options": None, "ground_truth": "4"},
    {"id": 13, "dataset": "scannetpp", "scene_name": "0a5c013435", "question_type": "room_size_estimation",
     "question": "What is the size of this room (in square meters)?", "options": None, "ground_truth": "23.5"},
]

URBAN_ROWS = [
    {"Question_id": 0, "video_id": "AerialVLN_1.mp4", "question_category": "Action Generation",
     "question": "You are a drone. What is your next action? choose: A. Turn left B. Fly up C. Go straight D. Land "
                 "E. Hover",
     "answer": "C"},
    {"Question_id": 1, "video_id": "RealCity_2", "question_category": "Trajectory Captioning",
     "question": "Which choice better summarizes your movement route?\nChoices:\n"
                 "A.  I go from the square to the roof.\nB. I go from the roof to the gate.\n"
                 "C. I go from the gate to the square.\nD. I hover.",
     "answer": "A"},
    {"Question_id": 2, "video_id": "EmbodiedCity_3.mp4", "question_category": "Proximity",
     "question": "How does the distance between you and the building change?\nchoose:\nA. It increases\n"
                 "B. It decreases\nC. It stays the same",
     "answer": "B"},
]


def touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").close()


def write_json(path, obj):
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def write_parquet(path, rows):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.fixture
def video_r1(tmp_path):
    root = tmp_path / "Video-R1-data"
    root.mkdir()
    for r in VIDEO_R1_RECORDS:
        touch(root / r["path"])
    return write_json(root / "Video-R1-260k.json", VIDEO_R1_RECORDS)


@pytest.fixture
def vsi_root(tmp_path):
    root = tmp_path / "vsibench"
    for r in VSI_ROWS:
        touch(root / r["dataset"] / f"{r['scene_name']}.mp4")
    return root


@pytest.fixture
def urban_root(tmp_path):
    root = tmp_path / "videos"
    for name in ("AerialVLN_1.mp4", "RealCity_2.mp4", "EmbodiedCity_3.mp4"):
        touch(root / name)
    return root


# --------------------------------------------------------------------------- Video-R1 loader
def test_video_r1_fields(video_r1):
    samples, missing = data.load_video_r1(video_r1)
    assert missing == []
    assert [s.id for s in samples] == ["2", "7", "8", "9", "10"]          # the image record is skipped
    mc, num, reg, ocr, ff = samples
    root = video_r1.parent
    assert mc.video == os.path.normpath(str(root / "LLaVA-Video-178K/videos/ytb_a.mp4"))
    assert mc.question == VIDEO_R1_RECORDS[0]["problem"]
    assert mc.options == VIDEO_R1_RECORDS[0]["options"]
    assert mc.answer == "B" and mc.problem_type == "multiple choice" and mc.source == "video-r1"
    assert mc.task == "LLaVA-Video-178K/30_60_s_youtube_v0_1" and mc.process == COT
    assert mc.data_type == "video" and mc.meta["row"] == 0
    assert (num.answer, num.problem_type, num.options, num.process) == ("3", "numerical", [], "")
    assert (reg.answer, reg.problem_type) == ("4.5", "regression")
    assert (ocr.answer, ocr.problem_type) == ("KEEP LEFT", "OCR")
    assert (ff.answer, ff.problem_type) == ("It is raining heavily", "free-form")


def test_video_r1_images_jsonl_and_root(video_r1, tmp_path):
    touch(video_r1.parent / VIDEO_R1_RECORDS[5]["path"])
    samples, _ = data.load_video_r1(video_r1, include_images=True)
    img = samples[-1]
    assert img.data_type == "image" and img.options[1] == "B) It is the weight" and img.answer == "B"
    jl = write_jsonl(tmp_path / "subset.jsonl", VIDEO_R1_RECORDS)   # JSONL, videos under another root
    same, missing = data.load_video_r1(jl, video_root=video_r1.parent)
    assert missing == [] and [s.to_dict() | {"meta": {}} for s in same] == \
        [s.to_dict() | {"meta": {}} for s in data.load_video_r1(video_r1)[0]]
    jl_as_json = write_jsonl(tmp_path / "subset2.json", VIDEO_R1_RECORDS)   # JSONL under a .json name
    assert len(data.load_video_r1(jl_as_json, video_root=video_r1.parent)[0]) == 5


def test_video_r1_missing_video_is_reported(video_r1, caplog):
    os.remove(video_r1.parent / "STAR/b.mp4")
    with caplog.at_level(logging.WARNING, logger="data"):
        samples, missing = data.load_video_r1(video_r1)
    expected = os.path.normpath(str(video_r1.parent / "STAR/b.mp4"))
    assert missing == [(1, expected)]
    assert "7" not in [s.id for s in samples] and len(samples) == 4
    assert "1 of 5 videos missing (1 row)" in caplog.text and expected in caplog.text
    kept, missing2 = data.load_video_r1(video_r1, require_videos=False)
    assert missing2 == missing and [s.id for s in kept] == ["2", "7", "8", "9", "10"]


# --------------------------------------------------------------------------- VSI-Bench loader
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_vsibench_fields(tmp_path, vsi_root, fmt):
    path = (write_parquet(tmp_path / "test-00000-of-00001.parquet", VSI_ROWS) if fmt == "parquet"
            else write_jsonl(tmp_path / "test.jsonl", VSI_ROWS))
    samples, missing = data.load_vsibench(path, vsi_root)
    assert missing == []
    mc, count, room = samples
    assert mc.id == "11" and mc.video == os.path.normpath(str(vsi_root / "scannet/scene0001_00.mp4"))
    assert mc.options == ["A. chair", "B. table", "C. sofa"] and mc.answer == "B"
    assert (mc.problem_type, mc.task, mc.source) == ("multiple choice", "object_rel_distance", "vsibench")
    assert mc.meta["dataset"] == "scannet" and mc.meta["scene_name"] == "scene0001_00"
    assert count.options == [] and count.answer == "4" and count.problem_type == "regression"
    assert room.video.endswith(os.path.join("scannetpp", "0a5c013435.mp4")) and room.answer == "23.5"


def test_vsibench_missing_video(tmp_path, vsi_root):
    os.remove(vsi_root / "arkitscenes/41069025.mp4")
    path = write_jsonl(tmp_path / "test.jsonl", VSI_ROWS)
    samples, missing = data.load_vsibench(path, vsi_root)
    assert [m[0] for m in missing] == [1] and [s.id for s in samples] == ["11", "13"]
    assert len(data.load_vsibench(path, vsi_root, require_videos=False)[0]) == 3


# --------------------------------------------------------------------------- UrbanVideo loader
def test_urbanvideo_fields(tmp_path, urban_root):
    path = write_parquet(tmp_path / "MCQ.parquet", URBAN_ROWS)
    samples, missing = data.load_urbanvideo(path, urban_root)
    assert missing == []
    a, b, c = samples
    assert a.question == "You are a drone. What is your next action?"
    assert a.options == ["A. Turn left", "B. Fly up", "C. Go straight", "D. Land", "E. Hover"]
    assert (a.answer, a.task, a.problem_type, a.source) == ("C", "Action Generation", "multiple choice", "urbanvideo")
    assert a.video == os.path.normpath(str(urban_root / "AerialVLN_1.mp4"))
    assert b.video == os.path.normpath(str(urban_root / "RealCity_2.mp4"))   # id without ".mp4"
    assert b.question == "Which choice better summarizes your movement route?"
    assert b.options[0] == "A. I go from the square to the roof." and len(b.options) == 4
    assert c.options == ["A. It increases", "B. It decreases", "C. It stays the same"] and c.answer == "B"
    assert c.meta["raw_question"] == URBAN_ROWS[2]["question"] and c.id == "2"
    # JSONL / JSON with the same columns
    assert [s.options for s in data.load_urbanvideo(write_jsonl(tmp_path / "mcq.jsonl", URBAN_ROWS), urban_root)[0]] \
        == [s.options for s in samples]


def test_urbanvideo_missing_and_unparsable(tmp_path, urban_root, caplog):
    os.remove(urban_root / "RealCity_2.mp4")
    rows = URBAN_ROWS + [{"Question_id": 3, "video_id": "AerialVLN_1.mp4", "question_category": "Causal",
                          "question": "Why do you descend?", "answer": "A"}]
    path = write_json(tmp_path / "mcq.json", rows)
    with pytest.raises(DataError, match=r"row 3 \(id 3\): field 'question'"):
        data.load_urbanvideo(path, urban_root)
    with caplog.at_level(logging.WARNING, logger="data"):
        samples, missing = data.load_urbanvideo(path, urban_root, unparsable="skip")
    assert [s.id for s in samples] == ["0", "2"]
    assert missing == [(1, os.path.normpath(str(urban_root / "RealCity_2.mp4")))]
    assert "skipped 1 row(s)" in caplog.text and "missing" in caplog.text


def test_urbanvideo_evaluation_keeps_rows_whose_options_do_not_parse(tmp_path, urban_root, caplog):
    """unparsable="raw" (eval_pvrbench): as UrbanVideo's eval.py, such a row is asked with its raw question and
    scored by the letter; a row malformed otherwise is skipped and counted; nothing aborts the load."""
    rows = URBAN_ROWS + [
        {"Question_id": 3, "video_id": "AerialVLN_1.mp4", "question_category": "Causal",   # no marker word
         "question": "Why do you descend? A. to land B. to avoid a bird", "answer": "B"},
        {"Question_id": 4, "video_id": "AerialVLN_1.mp4", "question_category": "Causal",   # labels parse in part
         "question": "What next? choose: A. left B. right D. stop", "answer": "D"},
        {"Question_id": 5, "video_id": None, "question_category": "Causal",                  # malformed
         "question": "What next? choose: A. left B. right", "answer": "A"}]
    path = write_json(tmp_path / "mcq.json", rows)
    with pytest.raises(DataError, match=r"row 3 \(id 3\): field 'question'"):
        data.load_urbanvideo(path, urban_root)
    with caplog.at_level(logging.WARNING, logger="data"):
        samples, _ = data.load_urbanvideo(path, urban_root, unparsable="raw")
    assert [s.id for s in samples] == ["0", "1", "2", "3", "4"]
    assert "2 row(s) whose options do not parse are kept" in caplog.text and "skipped 1 row(s)" in caplog.text
    raw = {s.id: s for s in samples if not s.meta["options_parsed"]}
    assert sorted(raw) == ["3", "4"] and raw["3"].options == [] and raw["3"].question == rows[3]["question"]
    prompt = data.build_prompt(raw["3"])
    assert prompt.startswith(rows[3]["question"] + "\nPlease think") and "Options:" not in prompt
    assert data.build_prompt(raw["4"], "official").endswith(rows[4]["question"])
    assert answers.score_sample("<think>it lands</think><answer>D</answer>", raw["4"]) == 1.0
    assert answers.score_sample("<answer>A</answer>", raw["4"]) == 0.0
    assert all(s.meta["options_parsed"] for s in samples if s.id in "012")


# --------------------------------------------------------------------------- malformed rows and files
def _mod(rows, i, **changes):
    rows = json.loads(json.dumps(rows))
    for k, v in changes.items():
        if v is KeyError:
            rows[i].pop(k)
        else:
            rows[i][k] = v
    return rows


@pytest.mark.parametrize("row,changes,field", [
    (1, {"problem": KeyError}, "problem"),
    (1, {"problem": "   "}, "problem"),
    (0, {"options": "A. x"}, "options"),
    (2, {"problem_type": "counting"}, "problem_type"),
    (0, {"solution": "<answer>E</answer>"}, "solution"),
    (0, {"options": ["A. x", "the second"]}, "options"),
    (0, {"options": []}, "options"),
    (3, {"solution": "KEEP LEFT"}, "solution"),
    (4, {"path": 5}, "path"),
    (4, {"problem_id": None}, "problem_id"),
    (2, {"data_type": "audio"}, "data_type"),
])
def test_video_r1_malformed_rows(tmp_path, row, changes, field):
    path = write_json(tmp_path / "bad.json", _mod(VIDEO_R1_RECORDS, row, **changes))
    with pytest.raises(DataError) as e:
        data.load_video_r1(path)
    msg = str(e.value)
    assert "bad.json" in msg and f"row {row}" in msg and f"field '{field}'" in msg
    if changes.get("problem_id", 0) is not None:
        assert f"(id {VIDEO_R1_RECORDS[row]['problem_id']})" in msg


@pytest.mark.parametrize("row,changes,field", [
    (1, {"question_type": "object_volume"}, "question_type"),
    (0, {"ground_truth": "chair"}, "ground_truth"),
    (1, {"ground_truth": "about four"}, "ground_truth"),
    (0, {"options": None}, "options"),
    (2, {"dataset": 3}, "dataset"),
    (2, {"scene_name": ""}, "scene_name"),
])
def test_vsibench_malformed_rows(tmp_path, row, changes, field):
    path = write_jsonl(tmp_path / "vsi.jsonl", _mod(VSI_ROWS, row, **changes))
    with pytest.raises(DataError) as e:
        data.load_vsibench(path, tmp_path)
    msg = str(e.value)
    assert "vsi.jsonl" in msg and f"row {row} (id {VSI_ROWS[row]['id']})" in msg and f"field '{field}'" in msg


@pytest.mark.parametrize("row,changes,field", [
    (2, {"answer": "D"}, "answer"),                  # an A-C question answered D
    (0, {"video_id": None}, "video_id"),
    (1, {"question": "Which route? Choices: the left one or the right one"}, "question"),
])
def test_urbanvideo_malformed_rows(tmp_path, row, changes, field):
    path = write_jsonl(tmp_path / "MCQ.jsonl", _mod(URBAN_ROWS, row, **changes))
    with pytest.raises(DataError) as e:
        data.load_urbanvideo(path, tmp_path)
    msg = str(e.value)
    assert "MCQ.jsonl" in msg and f"row {row} (id {row})" in msg and f"field '{field}'" in msg


def test_bad_files(tmp_path):
    with pytest.raises(DataError, match="nope.json: file not found"):
        data.load_video_r1(tmp_path / "nope.json")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("this is not json\n")
    with pytest.raises(DataError, match="garbage.json: not JSON/JSONL/parquet"):
        data.load_video_r1(garbage)
    broken = tmp_path / "broken.json"
    broken.write_text('[{"problem_id": 1,')
    with pytest.raises(DataError, match="broken.json: invalid JSON"):
        data.load_video_r1(broken)
    obj = write_json(tmp_path / "obj.json", {"results": []})
    with pytest.raises(DataError, match="obj.json: expected a list of records"):
        data.load_video_r1(obj)
    fake = tmp_path / "fake.parquet"
    fake.write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="fake.parquet: not a readable parquet"):
        data.load_vsibench(fake, tmp_path)
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe\x00\x81")
    with pytest.raises(DataError, match="bin.jsonl: not JSON/JSONL/parquet"):
        data.load_urbanvideo(binary, tmp_path)


# --------------------------------------------------------------------------- Sample
def test_sample_round_trip():
    s = Sample(id="1", video="v.mp4", question="q?", options=["A. x", "B. y"], answer="A",
               problem_type="multiple choice", task="t", source="synthetic", meta={"row": 3})
    d = s.to_dict()
    assert json.loads(json.dumps(d)) == d and Sample.from_dict(d) == s
    with pytest.raises(ValueError, match="unknown keys"):
        Sample.from_dict(d | {"extra": 1})


# --------------------------------------------------------------------------- prompts
def _mc(source="video-r1", **kw):
    base = {"id": "1", "video": "v.mp4", "question": "Which object is closest to the tv?",
            "options": ["A. chair", "B. table"], "answer": "B", "problem_type": "multiple choice",
            "task": "object_rel_distance", "source": source}
    return Sample(**(base | kw))


def test_reason_prompt_is_video_r1_template():
    assert data.QUESTION_TEMPLATE.startswith("{Question}\nPlease think about this question as if you were a human "
                                             "pondering deeply. ")
    assert data.QUESTION_TEMPLATE.endswith("Provide your detailed reasoning between the <think> </think> tags, "
                                           "and then give your final answer between the <answer> </answer> tags.")
    p = data.build_prompt(_mc())
    assert p == ("Which object is closest to the tv?Options:\nA. chair\nB. table\n\n"
                 + data.QUESTION_TEMPLATE[len("{Question}\n"):]
                 + " Please provide only the single option letter (e.g., A, B, C, D, etc.) within the "
                   "<answer> </answer> tags.")
    num = data.build_prompt(_mc(options=[], answer="4", problem_type="regression"))
    assert num.startswith("Which object is closest to the tv?\nPlease think") and "Options:" not in num
    assert num.endswith(" Please provide the numerical value (e.g., 42 or 3.14) within the <answer> </answer> tags.")
    assert data.TYPE_TEMPLATE["numerical"] == data.TYPE_TEMPLATE["regression"]
    assert set(data.TYPE_TEMPLATE) == set(data.PROBLEM_TYPES)
    with pytest.raises(ValueError, match="style"):
        data.build_prompt(_mc(), style="chatty")


def test_official_prompts():
    assert data.build_prompt(_mc("vsibench"), "official") == (
        "These are frames of a video.\nWhich object is closest to the tv?\nOptions:\nA. chair\nB. table\n"
        "Answer with the option's letter from the given choices directly.")
    na = _mc("vsibench", options=[], answer="4", problem_type="regression", question="How many chairs?")
    assert data.build_prompt(na, "official") == (
        "These are frames of a video.\nHow many chairs?\nPlease answer the question using a single word or phrase.")
    raw = "What next? choose: A. Turn left B. Fly up"
    urban = _mc("urbanvideo", question="What next?", options=["A. Turn left", "B. Fly up"],
                meta={"raw_question": raw})
    p = data.build_prompt(urban, "official")
    assert p.startswith("This video (captured into multiple frames of images as follows) presents the perception data")
    assert "The template for the answer is: \n" + " " * 24 + "Option: []; Reason: []\n" in p
    assert p.endswith("Reason explains why you choose this option.\n" + raw)


def test_build_messages_and_sft_target():
    s = _mc(process=COT)
    msgs = data.build_messages(s)
    assert msgs == [{"role": "user", "content": [{"type": "video"},
                                                {"type": "text", "text": data.build_prompt(s)}]}]
    assert data.build_messages(s, "official")[0]["content"][1]["text"] == data.build_prompt(s, "official")
    assert data.sft_target(s) == COT + "\n<answer>B</answer>"             # Video-R1: process + "\n" + solution
    assert data.sft_target(_mc(process="bare thought")) == "<think>bare thought</think>\n<answer>B</answer>"


def test_tokenizer_corpus():
    corpus = data.tokenizer_corpus()
    assert all(isinstance(t, str) and t for t in corpus) and len(corpus) == len(set(corpus))
    text = "\n".join(corpus)
    for piece in [*data.TYPE_TEMPLATE.values(), data.VSI_PRE_PROMPT, data.VSI_MC_POST_PROMPT,
                  data.VSI_NA_POST_PROMPT, data.URBAN_PRE_PROMPT, "<think>", "</answer>", "twenty", "7", "E"]:
        assert piece in corpus
    assert "Please think about this question" in text
    more = data.tokenizer_corpus(["Which way?", "<think>", "Which way?"])   # appended, each once
    assert more == corpus + ["Which way?"]


# --------------------------------------------------------------------------- extraction
@pytest.mark.parametrize("text,source,expected", [
    ("<think>hmm</think>\n<answer>\n  B \n</answer>", None, "B"),
    ("<answer>A</answer> then <answer>C</answer>", None, "A"),             # first pair, as Video-R1
    ("<think>so</think><answer> B", None, "B"),                            # no closing tag
    ("<answer>B</answ", "video-r1", "B"),
    ("Option: [B]; Reason: the gate is on the left", None, "B"),
    ("Option: [B]; Reason: the gate is on the left", "urbanvideo", "B"),
    ("Option:C", "urbanvideo", "C"),
    ("b. the chair", "urbanvideo", "B"),                                   # first character, upper-cased
    ("B. The chair", None, "B"),
    ("B. The chair", "vsibench", "B"),
    ("B. The chair", "video-r1", "B. The chair"),                          # Video-R1: the whole output
    ("The answer is B", None, "The"),                                      # lmms-eval's first token, as is
    ("3.5 meters", "vsibench", "3.5"),
    ("<answer>3 meters</answer>", "vsibench", "3"),
    ("", None, ""), (None, "urbanvideo", ""), ("   ", "vsibench", ""), (42, None, "42"),
])
def test_extract_answer(text, source, expected):
    assert answers.extract_answer(text, source) == expected


def test_extract_answer_strict_and_text_types():
    assert answers.extract_answer("B", strict=True) == ""                     # Video-R1 training reward
    assert answers.extract_answer("<answer> B </answer>", strict=True) == "B"
    assert answers.extract_answer("<answer>B", strict=True) == ""
    assert answers.extract_answer("it is raining", None, problem_type="free-form") == "it is raining"
    assert answers.extract_answer("<answer>KEEP LEFT</answer>", "vsibench", problem_type="OCR") == "KEEP LEFT"


# --------------------------------------------------------------------------- scoring
def test_mra_hand_worked():
    # lmms-eval: thresholds 1 - linspace(.5, .95, 10) = .5, .45, .4, .35, .3, .25, .2-eps, ... (non-strict <=)
    # Video-R1:  float32 thresholds, strict <
    assert answers.mean_relative_accuracy(2, 4, strict=False) == pytest.approx(0.1)   # rel .5 <= .5 only
    assert answers.mean_relative_accuracy(2, 4, strict=True) == 0.0                   # .5 < .5 is false
    assert answers.mean_relative_accuracy(3, 4, strict=False) == pytest.approx(0.6)   # rel .25: 6 of 10
    assert answers.mean_relative_accuracy(3, 4, strict=True) == pytest.approx(0.5)    # .25 < .25 false: 5
    # rel .2 vs 1 - 0.8 = 0.19999999999999996 in float64: not <=, so 6 of 10, not 7
    assert answers.mean_relative_accuracy(12, 10, strict=False) == pytest.approx(0.6)
    # rel 0.10000000000000009 in float64 equals 1 - 0.8999999999999999: 9 of 10; float32 rel is
    # 0.100000024 > 0.1: 8 of 10
    assert answers.mean_relative_accuracy(1.1, 1, strict=False) == pytest.approx(0.9)
    assert answers.mean_relative_accuracy(1.1, 1, strict=True) == pytest.approx(0.8)
    for strict in (False, True):
        assert answers.mean_relative_accuracy(7.25, 7.25, strict=strict) == 1.0
        assert answers.mean_relative_accuracy(100, 4, strict=strict) == 0.0
        assert answers.mean_relative_accuracy(0, 0, strict=strict) == 1.0            # our limit for gt == 0
        assert answers.mean_relative_accuracy(0.5, 0, strict=strict) == 0.0
        assert answers.mean_relative_accuracy(float("nan"), 3, strict=strict) == 0.0


def test_mra_float32_emulation_matches_torch():
    torch = pytest.importorskip("torch")

    def video_r1(pred, target):   # Video-R1 eval_bench.py mean_relative_accuracy
        pred, target = torch.tensor(pred, dtype=torch.float32), torch.tensor(target, dtype=torch.float32)
        rel = torch.abs(pred - target) / (torch.abs(target) + 1e-8)
        th = torch.arange(0.5, 0.95 + 0.05 / 2, 0.05, dtype=torch.float32)
        return (rel < (1 - th)).float().mean().item()

    gts = [0.3, 1, 1.7, 2.5, 4, 10, 23.5, 100, 333.3]
    for g in gts:
        for k in range(-60, 61):
            p = g * (1 + k / 100)
            assert answers.mean_relative_accuracy(p, g, strict=True) == video_r1(p, g), (p, g)


def test_score_regression_sources():
    assert answers.score("2", "4", "regression", "vsibench") == pytest.approx(0.1)
    assert answers.score("2", "4", "regression") == 0.0
    assert answers.score("3", "4", "regression", "video-r1") == pytest.approx(0.5)
    assert answers.score("3", "4", "regression", train_reward=True) == pytest.approx(0.75)   # grpo.py: 1 - .25
    assert answers.score("100", "4", "regression", train_reward=True) == 0.0
    assert answers.score("three", "4", "regression", "vsibench") == pytest.approx(0.6)       # number word
    assert answers.score("3.5m", "3.5", "regression", "vsibench") == 0.0                      # to_float fails
    assert answers.score("1,000", "1000", "regression", "vsibench") == 0.0                    # float("1,000") fails
    assert answers.score("1,000", "1000", "regression") == 1.0                                # Video-R1 drops commas
    assert answers.score("0", "0", "regression", "vsibench") == 1.0


def test_score_numerical_video_r1_rule():
    assert answers.score("3", "3", "numerical") == 1.0
    assert answers.score("3.0", "3", "numerical") == 0.0        # decimal point in one only
    assert answers.score("3.141", "3.14", "numerical") == 1.0   # round(3.141, 2) == 3.14
    assert answers.score("3.146", "3.14", "numerical") == 0.0   # round -> 3.15
    assert answers.score("1000", "1,000", "numerical") == 0.0   # ',' counts as a decimal mark
    assert answers.score("1,000", "1,000", "numerical") == 1.0
    assert answers.score("three", "3", "numerical") == 1.0      # number words: our addition
    assert answers.score("twenty-one", "21", "numerical") == 1.0
    assert answers.score("Zero", "0", "numerical") == 1.0
    assert answers.score("three apples", "3", "numerical") == 0.0


def test_score_multiple_choice():
    assert answers.score(" B ", "B", "multiple choice") == 1.0
    assert answers.score("b", "B", "multiple choice") == 0.0               # Video-R1: exact
    assert answers.score("b", "B", "multiple choice", "vsibench") == 1.0   # lmms-eval: lower()
    assert answers.score("b", "B", "multiple choice", "urbanvideo") == 0.0  # eval.py: ==
    assert answers.score("B. sofa", "B", "multiple choice", "vsibench") == 0.0  # no letter parsing in score
    assert answers.score("A", "B", "multiple choice") == 0.0


def test_score_ocr_and_free_form():
    assert answers.score("KEEP LEFT", "KEEP LEFT", "OCR") == 1.0
    assert answers.score("KEEP RIGHT NOW OK", "KEEP LEFT NOW OK", "OCR") == pytest.approx(0.75)  # 1 sub / 4
    assert answers.score("KEEP", "KEEP LEFT", "OCR") == pytest.approx(0.5)                        # 1 deletion / 2
    assert answers.score("a b c d e", "KEEP LEFT", "OCR") == 0.0                                  # WER 2.5, clipped
    assert answers.score("", "KEEP LEFT", "OCR") == 0.0
    assert answers.score("It is raining heavily", "It is raining heavily", "free-form") == pytest.approx(1.0)
    assert answers.score("sunny skies tomorrow", "It is raining heavily", "free-form") == 0.0
    partial = answers.score("it is raining", "It is raining heavily", "free-form")
    # ROUGE-1 F = 2*(3/3)(3/4)/(7/4) = 6/7, ROUGE-2: 2 of 2 / 2 of 3 -> F = 0.8, ROUGE-L = ROUGE-1
    assert partial == pytest.approx((6 / 7 + 0.8 + 6 / 7) / 3)


def test_score_never_raises_on_garbage():
    for ptype in data.PROBLEM_TYPES:
        for source in (None, *data.SOURCES):
            for pred in (None, "", "\x00<<>>", "nan", "inf", "-", "1e999", "三", 12, "   "):
                v = answers.score(pred, "4" if ptype in ("numerical", "regression") else "A", ptype, source)
                assert 0.0 <= v <= 1.0 and not math.isnan(v)
    with pytest.raises(ValueError, match="problem_type"):
        answers.score("A", "A", "yes/no")


def test_score_sample():
    s = _mc("vsibench")
    assert answers.score_sample("B. table", s) == 1.0
    assert answers.score_sample("<think>near</think><answer>b</answer>", s) == 1.0
    assert answers.score_sample("B", _mc("video-r1"), strict=True) == 0.0
    assert answers.score_sample("<answer>B</answer>", _mc("video-r1"), strict=True) == 1.0
    u = _mc("urbanvideo")
    assert answers.score_sample("Option: [B]; Reason: it is nearer", u) == 1.0


def test_official_style_reads_the_output_as_the_official_pipelines_give_it():
    vsi, urban, r1 = _mc("vsibench"), _mc("urbanvideo"), _mc("video-r1")
    num = _mc("vsibench", options=[], answer="7", problem_type="regression", task="object_counting")
    for text, reason, official in ((" B", 1.0, 1.0), ("  B  ", 1.0, 1.0), ("\nB", 1.0, 1.0), ("B.\n", 1.0, 1.0),
                                   ("B .", 1.0, 1.0), ("<answer>B</answer>", 1.0, 0.0), ("<answer>B", 1.0, 0.0),
                                   ("B. table", 1.0, 1.0), ("B,C", 0.0, 0.0)):
        assert answers.score_sample(text, vsi) == reason, text   # lmms-eval strips, then split(" ")[0] and strip()
        assert answers.score_sample(text, vsi, style="official") == official, text
    assert answers.score_sample(" 7", num, style="official") == 1.0 and answers.score_sample(" 7", num) == 1.0
    assert answers.score_sample("Seven", num, style="official") == 0.0 and answers.score_sample("Seven", num) == 1.0
    for text in ("\nB", "\xa0B", " B", "<answer>B</answer>", "<answer>B"):   # eval.py: the first character
        assert answers.score_sample(text, urban, style="official") == 0.0 and answers.score_sample(text, urban) == 1.0
    assert answers.extract_answer("\nB", "urbanvideo", style="official") == "\n"
    assert answers.score_sample("Option: [B]; Reason: near", urban, style="official") == 1.0
    assert (answers.score_sample("<answer>B", r1, style="official") == 0.0
            and answers.score_sample("<answer>B", r1) == 1.0)
    assert answers.score_sample(" B \n", r1, style="official") == 1.0        # eval_bench strips before comparing
    assert answers.extract_answer("<answer></answer> x", "video-r1", style="official") == "<answer></answer> x"
    numerical = _mc(options=[], answer="7", problem_type="numerical")
    assert answers.score_sample("<answer>Seven</answer>", numerical, style="official") == 0.0
    ocr = _mc(options=[], answer="KEEP LEFT", problem_type="OCR")
    assert (answers.score_sample("KEEP LEFT", ocr) == 1.0
            and answers.score_sample("KEEP LEFT", ocr, style="official") == 0.0)
    with pytest.raises(ValueError, match="style"):
        answers.score_sample("B", vsi, style="lmms")
    with pytest.raises(ValueError, match="strict"):
        answers.extract_answer("B", strict=True, style="official")


def test_urbanvideo_drops_what_pandas_reads_back_as_missing():
    for text in (None, "", "None", "N/A", "nan", "NaN", "null", "NULL", "NA", "#N/A", "<NA>", "n/a", "-nan"):
        assert answers.urban_dropped(text), text
    for text in (" ", "  ", "\n", "none", " None", "None ", "N/A.", "Nan", "nil", "A"):
        assert not answers.urban_dropped(text), text   # whitespace-only: eval.py keeps it, wrong
    assert answers.extract_answer("  ", "urbanvideo", style="official") == " "


def test_lmms_eval_073_first_number():
    cases = {"3": "3.0", "There are 3 chairs.": "3.0", "about 2.5 m": "2.5", "-4": "-4.0", "three": "3.0",
             "Three boxes.": "3.0", "twenty-one": "21.0", "three hundred and twenty-one": "321.0",
             "one apple, room 2": "1.0", "room 2, one apple": "2.0", "a hundred": "100.0", "two thousand and five":
             "2005.0", "1,000": "1.0", "none": "", "": "", "3e5": "3.0", "zero": "0.0", "1.5.2": "1.5"}
    for text, n in cases.items():
        assert answers._first_number(text) == n, text
    num = _mc("vsibench", options=[], answer="21", problem_type="regression", task="object_counting")
    assert answers.score_sample("There are twenty one chairs", num, scoring="lmms-eval-0.7.3", style="official") == 1.0
    assert answers.score_sample("There are twenty one chairs", num, style="official") == 0.0
    with pytest.raises(ValueError, match="scoring"):
        answers.extract_answer("3", "vsibench", scoring="lmms-eval-0.8")


def test_reasoning_style_reads_a_leading_number_phrase_whole():
    """VSI-Bench's first-token rule would read "twenty one" as 20 and "one hundred and five" as 1."""
    for text, n in (("twenty one", "21"), ("twenty one meters", "21"), ("one hundred and five", "105"),
                    ("<answer>one hundred and five.</answer>", "105"), ("Seven", "7"), ("3 meters", "3")):
        s = _mc("vsibench", options=[], answer=n, problem_type="regression", task="object_counting")
        assert answers.score_sample(text, s) == 1.0, text
    assert answers.extract_answer("twenty one, I think", "vsibench", problem_type="regression") == "twenty one"
    assert answers.extract_answer("one of them", "vsibench", problem_type="regression") == "one"


def test_words_to_number():
    cases = {"zero": 0, "three": 3, "twelve": 12, "twenty": 20, "twenty-one": 21, "Ninety Nine": 99,
             "one hundred": 100, "one hundred and five": 105, "nine hundred ninety-nine": 999, "Seven.": 7}
    for text, n in cases.items():
        assert answers.words_to_number(text) == n
    for text in ("hundred", "and", "", "one two", "twenty zero", "a dozen", "3", "one hundred and", None):
        assert answers.words_to_number(text) is None


def test_parse_inline_options_edge_cases():
    assert data.parse_inline_options("Pick one.\nOptions:\n(A) up\n(B) down") == ("Pick one.", ["A. up", "B. down"])
    # a marker word inside the stem that is not followed by options is skipped
    stem, opts = data.parse_inline_options("Which option: is best? Choices: A. x B. y")
    assert stem == "Which option: is best?" and opts == ["A. x", "B. y"]
    assert data.parse_inline_options("choose: A. only one") == ("choose: A. only one", [])
    assert data.split_option("C) sofa")[0] == "C" and data.split_option("(D) bed")[0] == "D"
    assert data.split_option("sofa")[0] is None and data.split_option("I go left")[0] is None


@pytest.mark.parametrize("text,expected", [
    ("A. red", ("A", "red")), ("(A) red", ("A", "red")), ("A) red", ("A", "red")), ("A: red", ("A", "red")),
    ("Ａ．red", ("A", "red")), ("A：red", ("A", "red")), ("  C)  two words ", ("C", "two words")),
    ("B", ("B", "")), ("(b)", ("B", "")), ("b.", ("B", "")), ("(B)", ("B", "")), ("Ｂ", ("B", "")),
    ("A red car", (None, "A red car")), ("e.g. the car", (None, "e.g. the car")), ("sofa", (None, "sofa")),
    ("AB. x", (None, "AB. x")), ("1. one", (None, "1. one")), ("", (None, "")), (None, (None, "")),
])
def test_split_option_is_the_one_label_grammar(text, expected):
    assert data.split_option(text) == expected


# --------------------------------------------------------------------------- missing-video report
def test_report_missing_counts_distinct_videos(caplog):
    missing = [(0, "a.mp4"), (1, "a.mp4"), (2, "b.mp4"), (3, "c.mp4"), (4, "a.mp4"), (5, "d.mp4")]
    with caplog.at_level(logging.WARNING, logger="data"):
        data._report_missing("f.json", missing, total=10)
    assert "f.json: 4 of 10 videos missing (6 rows), e.g. a.mp4, b.mp4, c.mp4" in caplog.text
    assert caplog.text.count("a.mp4") == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="data"):
        data._report_missing("f.json", [], total=3)
    assert caplog.text == ""


def test_vsibench_missing_shared_video_and_zip_hint(tmp_path, caplog):
    """Several questions on one scene count once; a download whose zips are not unpacked says so."""
    root = tmp_path / "VSI-Bench"
    root.mkdir()
    rows = VSI_ROWS + [dict(VSI_ROWS[1], id=14, question="How many table(s) are in this room?", ground_truth="2")]
    path = write_jsonl(root / "test.jsonl", rows)
    (root / "arkitscenes.zip").write_bytes(b"PK")
    touch(root / "scannet/scene0001_00.mp4")
    touch(root / "scannetpp/0a5c013435.mp4")
    with caplog.at_level(logging.WARNING, logger="data"):
        samples, missing = data.load_vsibench(path)          # video root: the file's folder
    assert [r for r, _ in missing] == [1, 3] and [s.id for s in samples] == ["11", "13"]
    assert "1 of 3 videos missing (2 rows)" in caplog.text
    assert "arkitscenes.zip" in caplog.text and "unpack" in caplog.text


# --------------------------------------------------------------------------- the real download layouts
def test_vsibench_download_folder(tmp_path):
    """`hf download nyu-visionx/VSI-Bench --local-dir VSI-Bench` + unzip: test.jsonl (current hub; with
    the `pruned` column of VSI-Bench-Debiased), test_debiased.parquet, and <dataset>/<scene>.mp4 from the
    three zips; the first release had test-00000-of-00001.parquet instead of test.jsonl."""
    root = tmp_path / "VSI-Bench"
    for r in VSI_ROWS:
        touch(root / r["dataset"] / f"{r['scene_name']}.mp4")
    rows = [dict(r, pruned=(i == 1)) for i, r in enumerate(VSI_ROWS)]
    write_jsonl(root / "test.jsonl", rows)
    write_parquet(root / "test_debiased.parquet", [r for r in rows if not r["pruned"]])
    samples, missing = data.load_vsibench(root)               # the folder: its test.jsonl, videos next to it
    assert missing == [] and [s.id for s in samples] == ["11", "12", "13"]
    assert [s.meta["pruned"] for s in samples] == [False, True, False]
    assert samples[0].video == os.path.normpath(str(root / "scannet/scene0001_00.mp4"))
    assert samples[0].meta["file"] == str(root / "test.jsonl")
    deb, _ = data.load_vsibench(root / "test_debiased.parquet")
    assert [s.id for s in deb] == ["11", "13"] and deb[1].video == samples[2].video
    old = tmp_path / "old" / "VSI-Bench"                        # the first release's file name
    old.mkdir(parents=True)
    write_parquet(old / "test-00000-of-00001.parquet", VSI_ROWS)
    same, missing = data.load_vsibench(old, root)             # backward compatible: file, video root
    assert [s.video for s in same] == [s.video for s in samples] and missing == []
    with pytest.raises(DataError, match="without a VSI-Bench annotation file"):
        data.load_vsibench(tmp_path / "old")


def test_urbanvideo_download_folder(tmp_path):
    """EmbodiedCity/UrbanVideo-Bench: MCQ.parquet next to a flat videos/ folder of mp4s (run.py joins
    dataset/videos and video_id)."""
    root = tmp_path / "UrbanVideo-Bench"
    for name in ("AerialVLN_1.mp4", "RealCity_2.mp4", "EmbodiedCity_3.mp4"):
        touch(root / "videos" / name)
    write_parquet(root / "MCQ.parquet", URBAN_ROWS)
    expected = [os.path.normpath(str(root / "videos" / n)) for n in ("AerialVLN_1.mp4", "RealCity_2.mp4",
                                                                     "EmbodiedCity_3.mp4")]
    mcq = root / "MCQ.parquet"
    for args in ((root,), (mcq,), (mcq, root), (mcq, root / "videos")):   # folder, file, nested root
        samples, missing = data.load_urbanvideo(*args)
        assert missing == [] and [s.video for s in samples] == expected, args
    with pytest.raises(DataError, match="without MCQ.parquet"):
        data.load_urbanvideo(tmp_path)
