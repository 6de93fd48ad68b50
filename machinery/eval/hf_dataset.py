"""PVRBench as a Hugging Face dataset folder: ``eval_pvrbench.py --export-hf DIR`` (with the usual --benchmark,
--subtypes, --eta or --etas, --limit, --assign, --frames, --max-pixels, --style).

    from datasets import load_dataset
    ds = load_dataset("DIR", split="test")      # or, once pushed, load_dataset("ORG/NAME", split="test")

What DIR holds (the layout of datasets' "parquet + files" folders, e.g. VSI-Bench's on the Hub):
  README.md                         the dataset card: YAML `configs` (data/test-*.parquet), how it was made, the
                                    sources' licences and citations, how to regenerate it and how to push it
  data/test-0000K-of-0000N.parquet  one row per (question, condition): COLUMNS
  videos/<video id>/<condition>.mp4 the clips as eval_pvrbench.py shows them (lossless H.264 RGB, qp 0: decoded
                                    back bit for bit), clean.mp4 once per video; depth.npy where the clip's depth
                                    was not the proxy (what regenerates a depth-graded clip)
  videos/manifest.jsonl             each corrupted clip's spec (Eq. 4's V~), render version and source video
  pvrbench_export.json              the export's settings (`flags`), what regeneration runs again

``eval_pvrbench.py --regenerate-hf DIR`` renders every clip again from its spec and its source video (the recorded
--benchmark / --video-root, or those given) into a scratch folder beside DIR, then compares: the rows must be the
same, each clip the same bytes (or, from another ffmpeg build, the same decoded frames: `frames_sha256`); a clip
missing from DIR (a copy shipped without the videos, for licence reasons) is written in. A clip that differs is
refused in one line naming it, and DIR is left as it was.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

SETTINGS = "pvrbench_export.json"
ROWS_PER_SHARD = 10_000
COLUMNS = {   # name: (arrow type, what it holds): the card's table, and the parquet schema
    "id": ("string", "the question id and the condition, joined by a vertical bar"),
    "question_id": ("string", "the source's question id"),
    "question": ("string", "the question as the source gives it"),
    "options": ("list<string>", "the choices of a multiple-choice question ([] otherwise)"),
    "answer": ("string", "the ground truth (a letter, or a number as text)"),
    "problem_type": ("string", "multiple choice / numerical / regression ..."),
    "task": ("string", "the source's task (question type)"),
    "source": ("string", "vsibench / urbanvideo / synthetic"),
    "prompt": ("string", "the prompt eval_pvrbench.py asks with (the export's --style)"),
    "clip_id": ("string", "the video's identity (the static spec's seed is drawn from it)"),
    "condition": ("string", "clean, a subtype, or in a sweep `subtype@eta` (e.g. `fog@0.3`)"),
    "subtype": ("string", "clean or one of the 12 subtypes (Table 8)"),
    "category": ("string", "clean, lighting, occlusion, camera or weather"),
    "eta": ("float64", "the corruption's intensity (null for clean)"),
    "spec": ("string", "the corruption's spec as JSON (perturb.PerturbSpec.to_dict; null for clean)"),
    "video": ("string", "the clip, relative to the dataset folder"),
    "fps": ("float64", "the frame rate the model is told"),
    "video_sha256": ("string", "sha256 of the mp4 file"),
    "frames_sha256": ("string", "sha256 of the decoded uint8 frames [T, H, W, 3]"),
}


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def frames_sha256(frames) -> str:
    import numpy as np
    return hashlib.sha256(np.ascontiguousarray(frames, dtype=np.uint8).tobytes()).hexdigest()


def check_target(root, flags):
    """Before any work: DIR must be empty, absent, or a previous export of the same `flags` (then it is written again
    in place). Returns the reason it is refused, or None."""
    root = Path(root)
    if root.exists() and not root.is_dir():
        return f"--export-hf {root}: is a file"
    if not root.exists() or not any(root.iterdir()):
        return None
    settings = root / SETTINGS
    if not settings.is_file():
        return f"--export-hf {root}: the folder is not empty and holds no PVRBench export ({SETTINGS}); give an empty folder"
    try:
        before = json.loads(settings.read_text())["flags"]
    except (ValueError, KeyError):
        return f"--export-hf {root}: {SETTINGS} is not readable; give an empty folder"
    differ = sorted(k for k in before.keys() | flags.keys() if before.get(k) != flags.get(k))
    return (f"--export-hf {root}: a previous export of other settings (differs in {', '.join(differ)}); give an empty "
            "folder, or the same settings to write it again") if differ else None


def write_parquet(root, rows):
    """data/test-0000K-of-0000N.parquet, ROWS_PER_SHARD rows each, with COLUMNS' schema."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"string": pa.string(), "float64": pa.float64(), "list<string>": pa.list_(pa.string())}
    schema = pa.schema([(name, types[t]) for name, (t, _) in COLUMNS.items()])
    shards = [rows[k:k + ROWS_PER_SHARD] for k in range(0, len(rows), ROWS_PER_SHARD)] or [[]]
    (root / "data").mkdir(parents=True, exist_ok=True)
    for old in (root / "data").glob("test-*.parquet"):
        old.unlink()
    for k, shard in enumerate(shards):
        table = pa.Table.from_pylist([{c: r.get(c) for c in COLUMNS} for r in shard], schema=schema)
        pq.write_table(table, root / "data" / f"test-{k:05d}-of-{len(shards):05d}.parquet")
    return len(shards)


def read_rows(root):
    """Every row of DIR's parquet shards, in order."""
    import pyarrow.parquet as pq
    return [r for f in sorted((Path(root) / "data").glob("test-*.parquet")) for r in pq.read_table(f).to_pylist()]


def write(root, rows, flags, card):
    """The parquet shards, the settings and the card (the clips are already under DIR/videos)."""
    root = Path(root)
    shards = write_parquet(root, rows)
    (root / SETTINGS).write_text(json.dumps({"flags": flags}, indent=1, sort_keys=True))
    (root / "README.md").write_text(card)
    print(f"Hugging Face dataset: {len(rows)} rows in {shards} parquet shard(s), the card and the clips in {root}; "
          f"load it with datasets.load_dataset({str(root)!r}, split='test')")


def compare(fresh, root):
    """Regeneration's verdict: (None, clips written into DIR) or (the one-line reason DIR does not match, 0). `fresh`:
    the scratch export of the same settings. Rows must match; each clip the same bytes, or the same decoded frames."""
    from machinery import video

    mine, theirs = read_rows(fresh), read_rows(root)
    if [_row_key(r) for r in mine] != [_row_key(r) for r in theirs]:
        return f"{root}: its rows differ from the export of its settings (another benchmark file, subtypes or engine)", 0
    missing = []
    for r in mine:
        clip, new = Path(root) / r["video"], Path(fresh) / r["video"]
        if not clip.is_file():
            missing.append((new, clip))
        elif sha256(clip) != r["video_sha256"] and frames_sha256(video.read_clip(clip)[0]) != r["frames_sha256"]:
            return (f"{clip}: its frames are not those rendered again from its row's spec and source video "
                    "(--regenerate-hf)"), 0
    for extra in sorted(Path(fresh, "videos").rglob("depth.npy")):
        if not (Path(root) / extra.relative_to(fresh)).is_file():
            missing.append((extra, Path(root) / extra.relative_to(fresh)))
    for new, clip in dict(missing).items():
        clip.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(new, clip)
    return None, len(dict(missing))


def _row_key(r):
    """What a row says, without the mp4's bytes (another ffmpeg build writes other bytes for the same frames)."""
    return {k: v for k, v in r.items() if k != "video_sha256"}


def card(info):
    """The dataset card (README.md): YAML front matter with `configs`, then what the dataset is, its columns, how it
    was made, regenerated and pushed, and its sources' licences and citations. `info`: name, sources, subtypes,
    etas, eta, rows, clips, command, render, versions."""
    yaml = ("---\npretty_name: " + info["name"] + "\nlicense: other\nlanguage:\n- en\ntask_categories:\n"
            "- video-text-to-text\ntags:\n- video\n- robustness\n- corruption\n- spatial-reasoning\nconfigs:\n"
            "- config_name: default\n  data_files:\n  - split: test\n    path: data/test-*.parquet\n---\n\n")
    columns = "| column | type | what it holds |\n|---|---|---|\n" + "".join(
        f"| `{name}` | {t} | {what} |\n" for name, (t, what) in COLUMNS.items())
    return yaml + "\n".join([
        f"# {info['name']}",
        "",
        "PVRBench's static protocol (Sec. 4 of \"Are Video Reasoning Models Ready to Go Outside?\"): each (video, "
        "subtype) has one fixed corruption spec, seeded from the video's identity, so that every question on a video "
        f"sees the same corrupted clip. Sources: {', '.join(info['sources'])}. Subtypes: {', '.join(info['subtypes'])}. "
        + (f"Intensities (a sweep): {', '.join(f'{e:g}' for e in info['etas'])}." if info["etas"]
           else f"Intensity: {info['eta']}."),
        f"{info['rows']} rows (question, condition) over {info['clips']} clips, clean ones included.",
        "",
        ("```python\nfrom datasets import load_dataset\nds = load_dataset(\"PATH_OR_ORG/NAME\", split=\"test\")\n"
         "fog = ds.filter(lambda r: r[\"subtype\"] == \"fog\")\n```"),
        "",
        "## Columns",
        "",
        columns,
        "## How it was made",
        "",
        f"    {info['command']}",
        "",
        (f"Corruption engine: perturb.py, render version {info['render']} (a spec renders the same pixels under the "
         f"same version). Versions: {json.dumps(info['versions'], sort_keys=True)}."),
        "The clips are lossless (H.264 RGB at qp 0): decoded, they are the frames a model was shown, bit for bit.",
        "",
        "## Regenerating the clips",
        "",
        ("Every clip follows from its row's `spec` and its source video. With the sources in place (the recorded "
         "paths, or `--benchmark` / `--video-root`):"),
        "",
        "    python eval_pvrbench.py --regenerate-hf DIR [--benchmark ... --video-root ...]",
        "",
        ("renders every clip again, checks each against `video_sha256` (or `frames_sha256` under another ffmpeg "
         "build), writes the missing ones, and refuses in one line a folder whose clips do not match their specs."),
        "",
        "## Publishing",
        "",
        ("Not done by the export. Check the sources' terms first: a benchmark whose videos may not be redistributed "
         "can be shared without `videos/` and regenerated by its users from their own copies. With a token (`hf auth "
         "login`), the whole folder, rows and clips:"),
        "",
        "    hf upload ORG/NAME DIR --repo-type dataset",
        "",
        ("or from Python, `huggingface_hub.HfApi().upload_folder(folder_path=\"DIR\", repo_id=\"ORG/NAME\", "
         "repo_type=\"dataset\")`. `datasets`' `load_dataset(\"DIR\").push_to_hub(\"ORG/NAME\")` uploads the rows "
         "only: the `video` column holds paths, not the mp4 files."),
        "",
        "## Licences and citations",
        "",
        *[SOURCE_NOTES[s] for s in info["sources"] if s in SOURCE_NOTES],
        "",
        ("The corruptions: the ROVA / PVRBench paper, \"Are Video Reasoning Models Ready to Go Outside?\", and this "
         "implementation."),
        ""])


SOURCE_NOTES = {
    "vsibench": "- **VSI-Bench** (Yang et al., \"Thinking in Space: How Multimodal Large Language Models See, Remember, "
                "and Recall Spaces\", arXiv:2412.14171; nyu-visionx/VSI-Bench, Apache-2.0). Its videos come from "
                "ScanNet, ScanNet++ and ARKitScenes, each under its own terms of use, which apply to these clips.",
    "urbanvideo": "- **UrbanVideo-Bench** (Zhao et al., \"UrbanVideo-Bench: Benchmarking Vision-Language Models on "
                  "Embodied Intelligence with Video Data in Urban Spaces\", arXiv:2503.06157). Its terms, as stated "
                  "on its dataset page, apply to these clips.",
    "synthetic": "- **synthetic**: rendered by this project (machinery/datasets/synthetic.py); no third-party content.",
}
