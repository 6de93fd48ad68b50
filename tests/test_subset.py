"""Tests for subset.py: the outdoor rule on Video-R1 records, make_subset's output (read back by
data.load_video_r1), its refusals, and the make-subset command line."""
import json
import os
from pathlib import Path

import pytest

from machinery.datasets import data
from machinery.datasets import subset
from machinery.datasets.data import DataError
from machinery.cli import UserError
from test_data import touch, write_json

# --------------------------------------------------------------------------- records
YT = "./LLaVA-Video-178K/liwei_youtube_videos/videos/youtube_video_2024/"


def _r1(pid, problem, path, data_source, data_type="video", process=None, **kw):
    row = {"problem_id": pid, "problem": problem, "data_type": data_type, "problem_type": "multiple choice",
           "options": ["A. yes", "B. no"], "solution": "<answer>A</answer>", "path": path,
           "data_source": data_source}
    if process is not None:
        row["process"] = process
    return row | kw


# Video-R1-COT-165k-style records: (record, kept by the outdoor rule?, reason)
SUBSET_RECORDS = [
    (_r1(1, "Do the cars stop at the traffic light?", YT + "ytb_1.mp4", "LLaVA-Video-178K/0_30_s_youtube_v0_1",
         process="<think>The street is busy.</think>"), True, "kept"),
    (_r1(2, "Does the woman put the tray in the oven?", YT + "ytb_2.mp4", "LLaVA-Video-178K/0_30_s_youtube_v0_1",
         process="<think>She is in her kitchen.</think>"), False, "no outdoor term"),
    (_r1(3, "Is the person outside?", "./LLaVA-Video-178K/academic_source/Charades/RW587.mp4",
         "LLaVA-Video-178K/0_30_s_academic_v0_1"), False, "source"),
    (_r1(4, "How many moving rubber objects are there when the video ends?",
         "./CLEVRER/video_validation/video_10000.mp4", "", problem_type="numerical", options=[],
         solution="<answer>1</answer>"), False, "source"),
    (_r1(5, "What do the children do?", "./NeXT-QA/NExTVideo/1012/2384280571.mp4", "NeXT-QA",
         process="<think>The children run across the grass in a park under a cloudy sky.</think>"), True, "kept"),
    (_r1(6, "Does the man walk from the street into the kitchen and sit at the table?", YT + "ytb_6.mp4",
         "LLaVA-Video-178K/30_60_s_youtube_v0_1"), False, "indoor terms"),
    (_r1(7, "How tall is the building across the road?", "./Spatial/SR_91k/img_7.jpg", "SR-91k", data_type="image",
         problem_type="regression", options=[], solution="<answer>12.5</answer>"), False, "image"),
    (_r1(8, "What does the person pick up from the road?", "./STAR/Charades_v1_480/6H78U.mp4", "STAR"),
     False, "source"),
    (_r1(9, "What is the cartoon character holding?", YT + "ytb_9.mp4", "LLaVA-Video-178K/0_30_s_youtube_v0_1"),
     False, "no outdoor term"),
    (_r1(10, "Is it snowing on the mountain road?", "./PerceptionTest/video_1007.mp4", ""), False, "source"),
    (_r1(11, "In which direction does the drone fly over the city?", YT + "ytb_11.mp4",
         "LLaVA-Video-178K/1_2_m_youtube_v0_1"), True, "kept"),
]


@pytest.fixture
def video_r1_data(tmp_path):
    """The Video-R1-data layout after `hf download Video-R1/Video-R1-data` and unpacking every
    <source>/*.zip in place: the JSON at the top, `path` relative to it."""
    root = tmp_path / "Video-R1-data"
    for row, _, _ in SUBSET_RECORDS:
        touch(root / row["path"])
    return write_json(root / "Video-R1-COT-165k.json", [row for row, _, _ in SUBSET_RECORDS])


def test_subset_decision_rule():
    for row, keep, reason in SUBSET_RECORDS:
        got = subset.subset_decision(row)
        assert got[:2] == (keep, reason), (row["problem_id"], got)
    assert subset.subset_decision(SUBSET_RECORDS[0][0])[2] == ["cars", "street", "traffic light"]
    assert [subset.subset_decision(r, "video")[0] for r, _, _ in SUBSET_RECORDS] == \
        [r["data_type"] == "video" for r, _, _ in SUBSET_RECORDS]
    assert subset.video_r1_source(SUBSET_RECORDS[3][0]) == "CLEVRER"          # empty data_source: the folder
    assert subset.video_r1_source(SUBSET_RECORDS[0][0]) == "LLaVA-Video-178K/0_30_s_youtube_v0_1"


def test_make_subset_writes_loadable_video_r1_json(video_r1_data, tmp_path):
    out = tmp_path / "subsets" / "Video-R1-COT-outdoor.json"
    summary = subset.make_subset(video_r1_data, out)
    rows = json.loads(out.read_text(encoding="utf-8"))
    expected = [row for row, keep, _ in SUBSET_RECORDS if keep]
    assert rows == expected                                   # unchanged records, input order
    assert summary["read"] == 11 and summary["video"] == 10 and summary["image"] == 1 and summary["kept"] == 3
    assert summary["dropped"] == {"indoor terms": 1, "no outdoor term": 2, "source": 4}
    assert summary["per_source"]["CLEVRER"] == {"read": 1, "kept": 0}
    assert summary["per_source"]["NeXT-QA"] == {"read": 1, "kept": 1}
    assert summary["kept_share_of_video"] == 0.3
    samples, missing = data.load_video_r1(out, video_root=video_r1_data.parent, require_videos=False)
    assert missing == [] and [s.id for s in samples] == ["1", "5", "11"]
    assert samples[1].process.startswith("<think>The children") and samples[1].task == "NeXT-QA"
    again = subset.make_subset(video_r1_data, tmp_path / "again.json")  # deterministic, byte for byte
    assert (tmp_path / "again.json").read_bytes() == out.read_bytes() and again["kept"] == 3
    jl = subset.make_subset(video_r1_data, tmp_path / "subset.jsonl", rule="video")
    assert (jl["kept"] == 10
            and len(data.load_video_r1(tmp_path / "subset.jsonl", video_root=video_r1_data.parent)[0]) == 10)


def test_make_subset_video_root_and_refusals(video_r1_data, tmp_path):
    os.remove(video_r1_data.parent / SUBSET_RECORDS[4][0]["path"])        # one NeXT-QA zip not unpacked
    out = tmp_path / "s.json"
    summary = subset.make_subset(video_r1_data, out, video_root=video_r1_data.parent)
    assert summary["kept"] == 2 and summary["dropped"]["missing video"] == 1
    with pytest.raises(UserError, match="exists; pass --force"):
        subset.make_subset(video_r1_data, out)
    assert subset.make_subset(video_r1_data, out, force=True)["kept"] == 3
    with pytest.raises(UserError, match="is the input file"):
        subset.make_subset(video_r1_data, video_r1_data, force=True)
    with pytest.raises(UserError, match="unsupported extension"):
        subset.make_subset(video_r1_data, tmp_path / "s.csv")


def test_make_subset_malformed_rows(tmp_path):
    rows = [r for r, _, _ in SUBSET_RECORDS]
    rows[5] = dict(rows[5], solution="<answer>E</answer>")
    path = write_json(tmp_path / "bad.json", rows)
    with pytest.raises(DataError, match=r"bad.json: row 5 \(id 6\): field 'solution'"):
        subset.make_subset(path, tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()
    summary = subset.make_subset(path, tmp_path / "out.json", skip_invalid=True)
    assert summary["invalid"] == 1 and "row 5" in summary["invalid_examples"][0] and summary["kept"] == 3


# --------------------------------------------------------------------------- the command line
def _cli(*args):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "machinery.datasets.subset", *map(str, args)],
                          cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=120)


def test_cli_make_subset(video_r1_data, tmp_path):
    out = tmp_path / "Video-R1-COT-outdoor.json"
    p = _cli("make-subset", "--data", video_r1_data, "--out", out)
    assert p.returncode == 0, p.stderr
    assert "read 11 records (10 video, 1 image)" in p.stdout and "kept 3 of 10 video records (30.0%)" in p.stdout
    assert "NeXT-QA" in p.stdout and "CLEVRER" in p.stdout
    first = out.read_bytes()
    p = _cli("make-subset", "--data", video_r1_data, "--out", out)        # refuses to overwrite
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0
    assert p.stderr.startswith("error: --out") and "--force" in p.stderr and out.read_bytes() == first
    p = _cli("make-subset", "--data", video_r1_data, "--out", out, "--force", "--rule", "video")
    assert p.returncode == 0 and len(json.loads(out.read_text())) == 10


def test_cli_bad_row_is_one_line(tmp_path):
    rows = [r for r, _, _ in SUBSET_RECORDS]
    rows[2] = {k: v for k, v in rows[2].items() if k != "problem"}
    path = write_json(tmp_path / "bad.json", rows)
    p = _cli("make-subset", "--data", path, "--out", tmp_path / "out.json")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "Traceback" not in p.stderr
    assert "bad.json: row 2 (id 3): field 'problem': missing" in p.stderr
    p = _cli("--debug", "make-subset", "--data", path, "--out", tmp_path / "out.json")
    assert p.returncode != 0 and "Traceback" in p.stderr
