"""eval_pvrbench.py --export-hf: PVRBench as a Hugging Face dataset folder that datasets.load_dataset reads (a row per
(question, condition) with its subtype, category, intensity and spec; a card with YAML configs), whose clips are
the frames the spec renders from the source video, and which --regenerate-hf rebuilds bit for bit; a folder that
is not an export of the same settings, or whose clips do not match their specs, is refused in one line."""
import json
import shutil

import numpy as np
import pytest
import yaml

import eval_pvrbench as ev
import perturb
from machinery import video
from machinery.corruption import depth
from machinery.eval import hf_dataset
from test_eval_pvrbench import assets, run_cli  # noqa: F401 - assets: a fixture

datasets = pytest.importorskip("datasets")   # (requirements-test.txt)


def argv(assets, folder, *extra):
    return ["--benchmark", f"synthetic={assets[2]}", "--frames", "4", "--limit", "8", "--subtypes",
            "fog,rain,dusk,static", "--etas", "0.3,0.9", "--export-hf", str(folder), *extra]


@pytest.fixture(scope="module")
def exported(assets, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf") / "pvrbench"
    ev.main(argv(assets, folder))
    return folder


def test_load_dataset_reads_the_folder_with_its_subtypes_and_card(exported):
    ds = datasets.load_dataset(str(exported), split="test")
    assert len(ds) == 8 * 3 and list(ds.features) == list(hf_dataset.COLUMNS)   # clean + 2 intensities
    assert set(ds["subtype"]) == {"clean", "fog", "rain", "dusk", "static"}
    assert ds.filter(lambda r: r["subtype"] == "clean")["eta"] == [None] * 8
    assert sorted(set(ds["eta"]) - {None}) == [0.3, 0.9]
    for r in ds:
        assert r["category"] == perturb.CATEGORY_OF.get(r["subtype"], "clean")
        assert r["condition"] == ("clean" if r["subtype"] == "clean" else f"{r['subtype']}@{r['eta']:g}")
        assert (exported / r["video"]).is_file() and r["id"] == f"{r['question_id']}|{r['condition']}"
    card = (exported / "README.md").read_text()
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["configs"] == [{"config_name": "default", "data_files": [{"split": "test",
                                                                            "path": "data/test-*.parquet"}]}]
    for needed in ("--regenerate-hf", "hf upload", "## Licences and citations", "--etas 0.3,0.9"):
        assert needed in card


def test_each_clip_is_its_spec_rendered_on_the_source_video(exported, assets):
    ds = datasets.load_dataset(str(exported), split="test")
    for r in ds.filter(lambda r: r["subtype"] != "clean"):
        spec = perturb.PerturbSpec.from_dict(json.loads(r["spec"]))
        assert spec.to_dict() == perturb.static_spec(r["clip_id"], r["subtype"], r["eta"], scene="street").to_dict()
        source = assets[2] / "videos" / f"{r['clip_id']}.mp4"
        frames, idx, _ = video.read_frames(source, num_frames=4, max_pixels=56 * 56)
        d = depth.own_depth(assets[2] / "depth" / f"{source.stem}.npy", frames, idx)
        shown = video.read_clip(exported / r["video"])[0]
        assert np.array_equal(shown, perturb.apply(frames, spec, d))
        assert hf_dataset.frames_sha256(shown) == r["frames_sha256"]
        assert hf_dataset.sha256(exported / r["video"]) == r["video_sha256"]


def test_regenerate_rebuilds_every_clip_bit_for_bit(exported, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    for clip in (copy / "videos").rglob("*.mp4"):   # a copy shipped without its videos
        clip.unlink()
    assert ev.main(["--regenerate-hf", str(copy)]) == len(list(exported.rglob("*.mp4")))   # every clip written
    for r in hf_dataset.read_rows(copy):
        assert hf_dataset.sha256(copy / r["video"]) == r["video_sha256"]
    assert sorted(p.relative_to(copy) for p in copy.rglob("*.mp4")) == sorted(
        p.relative_to(exported) for p in exported.rglob("*.mp4"))
    assert not (tmp_path / ".copy.regenerate").exists()


def test_a_clip_that_does_not_match_its_spec_is_one_line_and_left_as_it_is(exported, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(exported, copy)
    row = next(r for r in hf_dataset.read_rows(copy) if r["subtype"] == "fog")
    frames = video.read_clip(copy / row["video"])[0]
    frames[0, 0, 0, 0] ^= 1   # one bit of one pixel
    video.write_video(copy / row["video"], frames, fps=row["fps"], lossless=True)
    tampered = (copy / row["video"]).read_bytes()
    run = run_cli("--regenerate-hf", copy)
    lines = [ln for ln in run.stderr.splitlines() if ln.strip() and "it/s]" not in ln]
    assert run.returncode == 2 and len(lines) == 1 and row["video"] in lines[0], run.stderr[-2000:]
    assert (copy / row["video"]).read_bytes() == tampered and not (tmp_path / ".copy.regenerate").exists()


def test_an_export_into_a_folder_of_other_things_is_refused_before_any_work(assets, exported, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    run = run_cli(*argv(assets, other))
    assert run.returncode == 2 and "not empty" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert [p.name for p in other.iterdir()] == ["notes.txt"]
    copy = tmp_path / "copy"   # a previous export of other settings: refused, naming what differs
    shutil.copytree(exported, copy)
    before = {p: p.stat().st_mtime_ns for p in copy.rglob("*")}
    run = run_cli(*argv(assets, copy)[:-2], "--limit", "4", "--export-hf", copy)
    assert run.returncode == 2 and "differs in limit" in run.stderr, run.stderr
    assert {p: p.stat().st_mtime_ns for p in copy.rglob("*")} == before
    assert ev.main(argv(assets, copy)) is None   # the same settings: written again in place
    assert hf_dataset.read_rows(copy) == hf_dataset.read_rows(exported)


def test_regenerate_needs_an_export(tmp_path):
    run = run_cli("--regenerate-hf", tmp_path)
    assert run.returncode == 2 and hf_dataset.SETTINGS in run.stderr and len(run.stderr.strip().splitlines()) == 1
