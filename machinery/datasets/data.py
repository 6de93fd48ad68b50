"""Samples, loaders and prompts for ROVA and PVRBench: the datasets in their native formats. Reading and scoring a
model's answer is answers.py's.

One record type, :class:`Sample`, for every source: the Video-R1 training JSON (ROVA trains on an outdoor
subset of Video-R1-260k, Sec. 5.1; our rule for that subset, which the paper leaves undefined, is subset.py's
:func:`machinery.datasets.subset.make_subset`, CLI ``python -m machinery.datasets.subset make-subset``),
VSI-Bench and UrbanVideo-Bench (PVRBench's sources, App. B.1) and the synthetic benchmark (synthetic.py, written
in the Video-R1 / VSI-Bench formats). Loaders return ``(samples, missing)``: rows whose video file is absent are
reported (and logged), never dropped silently; a malformed row raises :class:`DataError` naming the file, the
row and the field.

Prompts follow the official code of each source (verified against Video-R1's ``src/r1-v/src/open_r1/grpo.py`` /
``sft_video.py`` / ``eval_bench.py``, lmms-eval's ``tasks/vsibench/utils.py`` and UrbanVideo-Bench's ``run.py``):
style ``"reason"`` is Video-R1's think/answer template (the one ROVA trains and evaluates with), ``"official"``
the benchmark's own direct-answer prompt. Also here: the one option-label parser (:func:`split_option`), the SFT
target, the number words and lmms-eval's ``to_float`` that answers.py reads answers with. Every place where we
depart from, or fill a gap in, the official code is marked "our addition" / "our reading".
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import unicodedata
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from machinery import cli

log = logging.getLogger(__name__)

PROBLEM_TYPES = ("multiple choice", "numerical", "regression", "OCR", "free-form")
SOURCES = ("video-r1", "vsibench", "urbanvideo", "synthetic")
TEXT_TYPES = ("OCR", "free-form")
VIDEO_EXTS = (".mp4", ".avi", ".mov", ".mkv", ".webm")


class DataError(cli.UserError, ValueError):
    """A data file or one of its rows is malformed (message names file, row, id and field)."""


# --------------------------------------------------------------------------- the sample
@dataclass
class Sample:
    """One video question with its ground truth, in Video-R1's vocabulary."""

    id: str                 # problem_id / VSI id / UrbanVideo Question_id, as a string
    video: str              # path to the video (or image) file
    question: str           # the question text without the options
    options: list[str]      # ["A. ...", "B. ..."]; [] when there are none
    answer: str             # option letter (MC), a number as a string, or text
    problem_type: str       # "multiple choice" | "numerical" | "regression" | "OCR" | "free-form"
    task: str               # VSI question_type / UrbanVideo question_category / Video-R1 data_source
    source: str             # "video-r1" | "vsibench" | "urbanvideo" | "synthetic"
    process: str = ""       # chain of thought for SFT (Video-R1-COT: "<think>...</think>")
    data_type: str = "video"
    meta: dict = field(default_factory=dict)  # file, row, dataset, scene_name, raw_question, ...

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Sample:
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"Sample.from_dict: unknown keys {unknown}")
        return cls(**{**d, "options": list(d.get("options") or []), "meta": dict(d.get("meta") or {})})


# --------------------------------------------------------------------------- option labels
# The project's one option-label grammar: a letter, optionally in parentheses, then a separator:
# "A." "A)" "(A)" "A:" or the full-width "Ａ．" "Ａ：". A labelled option needs an upper-case letter (a
# lower-case one would read "e.g. the car" as option E); a bare letter ("B", "(b)", "b.") may be either.
OPTION_SEPARATORS = "[.):\uff0e\uff1a]"
_LABELLED = re.compile(rf"\s*\(?([A-Z\uff21-\uff3a]){OPTION_SEPARATORS}\s*(.*)", re.DOTALL)
_BARE = re.compile(rf"\s*\(?([A-Za-z\uff21-\uff3a\uff41-\uff5a])\)?{OPTION_SEPARATORS}?\s*")


def split_option(text) -> tuple[str | None, str]:
    """``(letter, text)`` of an option: "A. red" / "(A) red" / "A) red" / "A: red" / "Ａ．red" -> ("A", "red");
    a bare "B" / "(b)" / "b." -> ("B", ""); no label ("A red car") -> (None, the text). The letter is
    upper-case ASCII, the text stripped."""
    text = "" if text is None else str(text)
    bare = _BARE.fullmatch(text)
    m = bare or _LABELLED.match(text)
    if m is None:
        return None, text.strip()
    return unicodedata.normalize("NFKC", m.group(1)).upper(), "" if bare else m.group(2).strip()


# --------------------------------------------------------------------------- reading files
def _read_records(path) -> list[dict]:
    """Rows of a JSON list, JSONL or parquet file as plain Python dicts."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    with open(path, "rb") as f:
        head = f.read(4)
    if path.suffix.lower() == ".parquet" or head == b"PAR1":
        import pyarrow.parquet as pq
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:
            raise DataError(f"{path}: not a readable parquet file ({e})") from e
    else:
        try:
            rows = _parse_json_text(path, path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not JSON/JSONL/parquet (not UTF-8 text)") from e
    if not isinstance(rows, list):
        raise DataError(f"{path}: expected a list of records, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{path}: row {i}: expected a JSON object, got {type(row).__name__}")
    return rows


def _parse_json_text(path: Path, text: str):
    """A JSON document, else JSONL (one record a line; a .jsonl file is always read so)."""
    if path.suffix.lower() != ".jsonl":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            if text.lstrip().startswith("["):   # a broken JSON list, not JSONL
                raise DataError(f"{path}: invalid JSON ({e})") from e
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: not JSON/JSONL/parquet (line {n}: {e})") from e
    if not rows:
        raise DataError(f"{path}: empty file, no records")
    return rows


class _Row:
    """Typed field access for one record; every error names file, row, id and field."""

    def __init__(self, path, index: int, row: dict, id_key: str):
        self.path, self.index, self.row = path, index, row
        rid = row.get(id_key)
        self.where = f"{path}: row {index}" + (f" (id {rid!r})" if rid is not None else "")

    def error(self, name: str, msg: str) -> DataError:
        return DataError(f"{self.where}: field {name!r}: {msg}")

    def text(self, name: str, required: bool = True) -> str:
        """A string: required and non-empty, or optional ("" when absent or null)."""
        v = self.row.get(name)
        if v is None and not required:
            return ""
        if v is None:
            raise self.error(name, "missing")
        if not isinstance(v, str):
            raise self.error(name, f"expected a string, got {type(v).__name__}")
        if required and not v.strip():
            raise self.error(name, "empty")
        return v

    def ident(self, name: str) -> str:
        """A required id: an int or a non-empty string, returned as a string."""
        v = self.row.get(name)
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
        if v is not None and not isinstance(v, str):
            raise self.error(name, f"expected an int or string, got {type(v).__name__}")
        return self.text(name)

    def choice(self, name: str, allowed) -> str:
        v = self.text(name)
        if v not in allowed:
            raise self.error(name, f"unknown value {v!r} (expected one of {list(allowed)})")
        return v

    def options(self, name: str, mc: bool) -> list[str]:
        """A list of option strings; for MC required, each with a distinct letter label."""
        v = self.row.get(name)
        if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
            if mc:
                raise self.error(name, "missing or empty, but the question is multiple choice")
            return []
        if not isinstance(v, (list, tuple)) or not all(isinstance(o, str) for o in v):
            raise self.error(name, f"expected a list of strings, got {v!r}")
        letters = [split_option(o)[0] for o in v]
        if mc and None in letters:
            raise self.error(name, f"cannot parse option {v[letters.index(None)]!r} (expected 'A. ...')")
        if mc and len(set(letters)) != len(letters):
            raise self.error(name, f"repeated option letters {letters}")
        return list(v)

    def mc_answer(self, name: str, answer: str, options: list[str]) -> str:
        letters = [split_option(o)[0] for o in options]
        if answer not in letters:
            raise self.error(name, f"answer {answer!r} is not one of the option letters {letters}")
        return answer


def _zip_hint(paths, limit: int = 20) -> str:
    """A note for the missing-video warning when the nearest existing folder above a missing video holds
    .zip archives (VSI-Bench's arkitscenes.zip, Video-R1-data/<source>/*.zip): the usual reason for
    missing videos right after a download. An empty string otherwise."""
    found = {}
    for p in list(paths)[:limit]:
        folder = Path(p).parent
        while not folder.is_dir() and folder != folder.parent:
            folder = folder.parent
        if folder not in found:
            found[folder] = sorted(z.name for z in folder.glob("*.zip"))
    found = {d: z for d, z in found.items() if z}
    if not found:
        return ""
    d, zips = next(iter(found.items()))
    more = f" and {len(found) - 1} other folder(s)" if len(found) > 1 else ""
    return (f" ({d}{more} holds {len(zips)} .zip archive(s), e.g. {', '.join(zips[:2])}: not unpacked yet? "
            f"unpack them in place)")


def _report_missing(what: str, missing: list, total: int | None = None) -> None:
    """Log the missing videos once: the number of distinct files (of `total` distinct videos referenced),
    the number of rows that use them and up to three of them. `missing`: [(row, path)]."""
    if not missing:
        return
    distinct = list(dict.fromkeys(p for _, p in missing))   # first-seen order
    count = f"{len(distinct)} of {total} videos" if total is not None else f"{len(distinct)} video(s)"
    rows = len(missing)
    log.warning("%s: %s missing (%d row%s), e.g. %s%s", what, count, rows, "" if rows == 1 else "s",
                ", ".join(distinct[:3]), _zip_hint(distinct))


def _finish(path, samples_all: list, require_videos: bool):
    """Split rows into present and missing videos, log the missing ones."""
    exists = {v: os.path.exists(v) for v in dict.fromkeys(s.video for s in samples_all)}
    missing = [(s.meta["row"], s.video) for s in samples_all if not exists[s.video]]
    _report_missing(str(path), missing, total=len(exists))
    if require_videos:
        gone = {row for row, _ in missing}
        samples_all = [s for s in samples_all if s.meta["row"] not in gone]
    return samples_all, missing


# --------------------------------------------------------------------------- Video-R1 (Sec. 5.1)
ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)   # Video-R1's pattern


def _video_r1_sample(r: _Row, root: Path) -> Sample:
    """One Video-R1 record as a Sample; every field checked (errors name file, row, id and field)."""
    data_type = r.choice("data_type", ("video", "image"))
    pid = r.ident("problem_id")
    problem = r.text("problem")
    ptype = r.choice("problem_type", PROBLEM_TYPES)
    options = r.options("options", mc=ptype == "multiple choice")
    solution = r.text("solution")
    m = ANSWER_TAG.search(solution)
    if not m:
        raise r.error("solution", f"no <answer>...</answer> tag in {solution!r}")
    answer = m.group(1).strip()
    if not answer:
        raise r.error("solution", "empty answer")
    if ptype == "multiple choice":
        r.mc_answer("solution", answer, options)
    rel = r.text("path")
    video = os.path.normpath(rel if os.path.isabs(rel) else str(root / rel))
    return Sample(
        id=pid, video=video, question=problem, options=options, answer=answer, problem_type=ptype,
        task=r.text("data_source", required=False), source="video-r1", process=r.text("process", required=False),
        data_type=data_type, meta={"file": str(r.path), "row": r.index, "path": rel})


def load_video_r1(json_path, video_root=None, require_videos: bool = True, include_images: bool = False):
    """Load a Video-R1 JSON/JSONL (Video-R1-260k, Video-R1-COT-165k or a subset of them).

    ROVA trains on the *video* split (Sec. 5.1), so image records are skipped (counted in the log; only
    their ``data_type`` is checked) unless ``include_images=True`` keeps them with ``data_type="image"``.
    ``path`` ("./LLaVA-Video-178K/x.mp4") is resolved against ``video_root``, by default the JSON's
    folder (Video-R1 keeps its JSON in ``Video-R1-data/`` next to the media folders). ``answer`` is
    the content of ``solution``'s ``<answer>`` tag; ``process`` is kept verbatim.
    Returns ``(samples, missing)``, ``missing`` = [(row index, video path)].
    """
    json_path = Path(json_path)
    root = Path(video_root) if video_root is not None else json_path.parent
    samples, images = [], 0
    for i, row in enumerate(_read_records(json_path)):
        r = _Row(json_path, i, row, "problem_id")
        if r.choice("data_type", ("video", "image")) == "image" and not include_images:
            images += 1
            continue
        samples.append(_video_r1_sample(r, root))
    samples, missing = _finish(json_path, samples, require_videos)
    log.info("%s: %d samples, %d image records skipped, %d missing videos",
             json_path, len(samples), images, len(missing))
    return samples, missing


# --------------------------------------------------------------------------- VSI-Bench (App. B.1.2)
# lmms-eval tasks/vsibench/utils.py: MCA_QUESTION_TYPES / NA_QUESTION_TYPES
VSI_MC_TYPES = ("object_rel_direction_easy", "object_rel_direction_medium", "object_rel_direction_hard",
                "object_rel_distance", "route_planning", "obj_appearance_order")
VSI_NUMERIC_TYPES = ("object_abs_distance", "object_counting", "object_size_estimation",
                     "room_size_estimation")
# What `hf download nyu-visionx/VSI-Bench` gives, in the order a folder is searched: the full set as JSONL
# (the hub's current main), the full set as parquet (the first release). The debiased / pruned subsets
# (test_debiased.parquet, test_pruned.parquet) are loaded by passing their file.
VSI_ANNOTATION_FILES = ("test.jsonl", "test-00000-of-00001.parquet", "test.parquet")


def _vsi_annotation(path: Path) -> Path:
    """The annotation file of a VSI-Bench download folder (or `path` itself when it is a file)."""
    if not path.is_dir():
        return path
    for name in VSI_ANNOTATION_FILES:
        if (path / name).is_file():
            return path / name
    shards = sorted(p for p in path.glob("test-*.parquet"))
    if shards:
        return shards[0]
    raise DataError(f"{path}: a folder without a VSI-Bench annotation file (looked for "
                    f"{', '.join(VSI_ANNOTATION_FILES)}); pass the file itself")


def load_vsibench(path, video_root=None, require_videos: bool = True):
    """Load VSI-Bench (``nyu-visionx/VSI-Bench``): its parquet or JSONL file, or the download folder.

    Columns: id, dataset, scene_name, question_type, question, options (["A. sofa", ...], null for
    numeric), ground_truth (the letter, or a number as a string), and in the hub's current files
    ``pruned`` (True for the rows VSI-Bench-Debiased removes; kept in ``meta["pruned"]``). The video is
    ``<video_root>/<dataset>/<scene_name>.mp4`` (lmms-eval's doc_to_visual): arkitscenes.zip,
    scannet.zip and scannetpp.zip each unpack to a folder of that name. ``video_root`` defaults to
    the annotation file's folder (the download folder). A folder as ``path`` means its
    ``test.jsonl``, else ``test-00000-of-00001.parquet`` (the first release), else ``test.parquet``.
    MC question types get problem_type "multiple choice", numeric ones "regression" (scored by MRA).
    """
    path = _vsi_annotation(Path(path))
    video_root = Path(video_root) if video_root is not None else path.parent
    samples = []
    for i, row in enumerate(_read_records(path)):
        r = _Row(path, i, row, "id")
        rid, dataset, scene = r.ident("id"), r.text("dataset"), r.text("scene_name")
        qtype = r.choice("question_type", VSI_MC_TYPES + VSI_NUMERIC_TYPES)
        question = r.text("question")
        mc = qtype in VSI_MC_TYPES
        options = r.options("options", mc=mc)
        gt = row.get("ground_truth")
        numeric = isinstance(gt, (int, float)) and not isinstance(gt, bool)   # JSONL may hold numbers
        gt = (str(gt) if numeric else r.text("ground_truth")).strip()
        if mc:
            r.mc_answer("ground_truth", gt, options)
        elif to_float(gt) is None or not math.isfinite(to_float(gt)):
            raise r.error("ground_truth", f"numeric question type {qtype!r} needs a number, got {gt!r}")
        samples.append(Sample(
            id=rid, video=os.path.normpath(str(video_root / dataset / f"{scene}.mp4")), question=question,
            options=options, answer=gt, problem_type="multiple choice" if mc else "regression", task=qtype,
            source="vsibench", meta={"file": str(path), "row": i, "dataset": dataset, "scene_name": scene}))
        if isinstance(row.get("pruned"), bool):
            samples[-1].meta["pruned"] = row["pruned"]
    return _finish(path, samples, require_videos)


# --------------------------------------------------------------------------- UrbanVideo-Bench (App. B.1.1)
# Option-list markers seen in MCQ.parquet's `question` (the split words of the UrbanVideo-to-tsv
# converter): "... choose: A. x B. y", "...?\nChoices:\nA. x\nB. y", also Choice:/Options:/Option:.
_URBAN_MARKER = re.compile(r"(?:choices?|choose|options?)\s*:", re.IGNORECASE)


def _label_at(text: str, letter: str, start: int):
    """Span of the option label `letter` ("B." / "B)" / "(B)", the grammar of :func:`split_option`) at or
    after `start`, at the start of the text or after whitespace."""
    m = re.compile(r"(?:(?<=\s)|^)\(?" + letter + OPTION_SEPARATORS).search(text, start)
    return (m.start(), m.end()) if m else None


def parse_inline_options(question: str):
    """Split an UrbanVideo question into (stem, ["A. x", "B. y", ...]); options=[] if none parse.

    Our reading of the format: the options follow a marker ("choose:", "Choices:", ...) as
    sequential labels A., B., C., ... separated by newlines or spaces. Labels are searched in
    order (B only after A, ...), so a stray "B." inside an option text rarely splits it.
    """
    for marker in _URBAN_MARKER.finditer(question):
        tail = question[marker.end():]
        first = _label_at(tail, "A", 0)
        if first is None or tail[:first[0]].strip():
            continue
        spans, letter = [first], "B"
        while (hit := _label_at(tail, letter, spans[-1][1])) is not None:
            spans.append(hit)
            letter = chr(ord(letter) + 1)
        if len(spans) < 2:
            continue
        ends = [s for s, _ in spans[1:]] + [len(tail)]
        bodies = [" ".join(tail[e:end].split()) for (_, e), end in zip(spans, ends)]
        if not all(bodies):
            return question.strip(), []
        return question[:marker.start()].strip(), [f"{chr(ord('A') + k)}. {b}" for k, b in enumerate(bodies)]
    return question.strip(), []


def _urban_video(root: Path, video_id: str) -> str:
    """Videos lie flat in <root>; video_id usually carries ".mp4" already (run.py joins them)."""
    p = root / video_id
    if p.suffix.lower() in VIDEO_EXTS or p.exists():
        return os.path.normpath(str(p))
    return os.path.normpath(str(root / (video_id + ".mp4")))


def _urban_root(root: Path, video_id: str) -> Path:
    """`root`, or `root`/videos when the videos are there and not in `root` (the download folder given
    instead of its videos folder: EmbodiedCity/UrbanVideo-Bench ships MCQ.parquet next to videos/)."""
    nested = root / "videos"
    if (not os.path.exists(_urban_video(root, video_id)) and nested.is_dir()
            and os.path.exists(_urban_video(nested, video_id))):
        log.info("%s: the videos are in %s; using it as the video root", root, nested)
        return nested
    return root


def load_urbanvideo(path, video_root=None, require_videos: bool = True, unparsable: str = "raise"):
    """Load UrbanVideo-Bench ``MCQ.parquet`` (or JSON/JSONL with the same columns), or its download folder.

    Columns: Question_id, video_id, question_category, question (options inline), answer (a
    letter). The options are parsed out of ``question`` (:func:`parse_inline_options`);
    the verbatim question is kept in ``meta["raw_question"]`` for the official prompt.
    A row whose options do not parse, or parse without the answer's letter, raises :class:`DataError` by
    default (training data must be exact). ``unparsable="raw"`` (evaluation: UrbanVideo's own eval code never
    parses options, it sends the raw question and scores the letter) keeps such a row with its raw question as
    the question and no options (``meta["options_parsed"] = False``), and skips (logs and counts) a row that
    is malformed otherwise (no video id, an answer that is not a letter); ``"skip"`` skips both kinds (the
    public UrbanVideo-to-tsv converter skips 19 such rows).
    ``EmbodiedCity/UrbanVideo-Bench`` ships ``MCQ.parquet`` and a flat ``videos/`` folder of mp4s;
    a folder as ``path`` means its MCQ.parquet; ``video_root`` defaults to ``videos/`` next to the
    file, and a ``video_root`` that holds ``videos/`` rather than the videos is followed into it.
    """
    path = Path(path)
    if path.is_dir():
        if not (path / "MCQ.parquet").is_file():
            raise DataError(f"{path}: a folder without MCQ.parquet; pass the annotation file itself")
        path = path / "MCQ.parquet"
    if video_root is None:
        root = path.parent / "videos" if (path.parent / "videos").is_dir() else path.parent
    else:
        root = Path(video_root)
    if unparsable not in ("raise", "raw", "skip"):
        raise ValueError(f"unparsable must be 'raise', 'raw' or 'skip', got {unparsable!r}")
    samples, skipped, raw_rows = [], [], []
    for i, row in enumerate(_read_records(path)):
        try:
            sample = _urban_sample(_Row(path, i, row, "Question_id"), path, i, unparsable == "raw")
        except DataError as e:
            if unparsable == "raise":
                raise
            skipped.append(str(e))
            continue
        if not samples:
            root = _urban_root(root, sample.meta["video_id"])
        sample.video = _urban_video(root, sample.meta["video_id"])
        samples.append(sample)
        if not sample.meta["options_parsed"]:
            raw_rows.append(i)
    if raw_rows:
        log.warning("%s: %d row(s) whose options do not parse are kept with their raw question (scored by the "
                    "letter, as UrbanVideo's eval.py): rows %s", path, len(raw_rows), raw_rows[:10])
    if skipped:
        log.warning("%s: skipped %d row(s): %s", path, len(skipped), "; ".join(skipped[:3]))
    return _finish(path, samples, require_videos)


def _urban_sample(r, path, i, keep_raw):
    """One UrbanVideo row as a Sample (the caller sets its video path). ``keep_raw``: a row whose options do
    not parse, or parse without the answer's letter, keeps its raw question and no options."""
    qid, video_id = r.ident("Question_id"), r.text("video_id").strip()
    category, raw, answer = r.text("question_category"), r.text("question"), r.text("answer").strip()
    stem, options = parse_inline_options(raw)
    parsed = answer in [split_option(o)[0] for o in options]
    if not parsed and not keep_raw:
        if not options:
            raise r.error("question", "cannot parse inline options (expected '... choose: A. x B. y' or "
                                      "'Choices:\\nA. x\\nB. y'; evaluation keeps such rows: unparsable='raw')")
        r.mc_answer("answer", answer, options)
    if not parsed and not re.fullmatch(r"[A-Z]", answer):
        raise r.error("answer", f"answer {answer!r} is not an option letter")
    return Sample(id=qid, video="", question=stem if parsed else raw.strip(), options=options if parsed else [],
                  answer=answer, problem_type="multiple choice", task=category, source="urbanvideo",
                  meta={"file": str(path), "row": i, "video_id": video_id, "raw_question": raw,
                        "options_parsed": parsed})


# --------------------------------------------------------------------------- prompts
# Video-R1 src/r1-v/src/open_r1/grpo.py (and sft_video.py), verbatim. Note the missing period after
# "thought expressions": it is in the original.
QUESTION_TEMPLATE = (
    "{Question}\n"
    "Please think about this question as if you were a human pondering deeply. "
    "Engage in an internal dialogue using expressions such as 'let me think', 'wait', 'Hmm', "
    "'oh, I see', 'let's break it down', etc, or other natural language thought expressions "
    "It's encouraged to include self-reflection or verification in the reasoning process. "
    "Provide your detailed reasoning between the <think> </think> tags, and then give your final "
    "answer between the <answer> </answer> tags."
)
TYPE_TEMPLATE = {
    "multiple choice": " Please provide only the single option letter (e.g., A, B, C, D, etc.) within the "
                       "<answer> </answer> tags.",
    "numerical": " Please provide the numerical value (e.g., 42 or 3.14) within the <answer> </answer> tags.",
    "OCR": " Please transcribe text from the image/video clearly and provide your text answer within the "
           "<answer> </answer> tags.",
    "free-form": " Please provide your text answer within the <answer> </answer> tags.",
    "regression": " Please provide the numerical value (e.g., 42 or 3.14) within the <answer> </answer> tags.",
}

# lmms-eval tasks/vsibench (utils.py + vsibench.yaml, default kwargs; greedy, 16 new tokens)
VSI_PRE_PROMPT = "These are frames of a video."
VSI_MC_POST_PROMPT = "Answer with the option's letter from the given choices directly."
VSI_NA_POST_PROMPT = "Please answer the question using a single word or phrase."

# UrbanVideo-Bench.code run.py. The backslash-continued literal keeps the 24 spaces of
# indentation of its continuation lines; they are part of the official prompt.
URBAN_PRE_PROMPT = (
    "This video (captured into multiple frames of images as follows) presents the perception data "
    "of an agent moving in the environment from a first person perspective. Please answer the "
    "following questions: \n"
    "The template for the answer is: \n"
    + " " * 24 + "Option: []; Reason: []\n"
    + " " * 24 + "where the Option only outputs one option from 'A' to 'E' here, do not output "
    "redundant content. Reason explains why you choose this option."
)

STYLES = ("reason", "official")


def build_prompt(sample: Sample, style: str = "reason") -> str:
    """The user text of the prompt.

    ``"reason"``: Video-R1's template (grpo.py ``make_conversation_image_and_video``): for MC the
    question becomes ``problem + "Options:\\n" + "".join(op + "\\n")`` (no separator before
    "Options:", a newline after every option, as in the original), then QUESTION_TEMPLATE and the
    type suffix. ``"official"``: VSI-Bench -> lmms-eval's doc_to_text; UrbanVideo -> run.py's prompt
    + "\\n" + the verbatim question; Video-R1 and synthetic samples have no official direct prompt,
    so they get the lmms-eval VSI-Bench wording (our choice).
    """
    if sample.problem_type not in PROBLEM_TYPES:
        raise ValueError(f"sample {sample.id!r}: unknown problem_type {sample.problem_type!r}")
    if style == "reason":
        question = sample.question
        if sample.problem_type == "multiple choice" and sample.options:  # else: the options are in the question
            question = question + "Options:\n" + "".join(op + "\n" for op in sample.options)
        return QUESTION_TEMPLATE.format(Question=question) + TYPE_TEMPLATE[sample.problem_type]
    if style != "official":
        raise ValueError(f"unknown prompt style {style!r} (expected one of {STYLES})")
    if sample.source == "urbanvideo":
        raw = sample.meta.get("raw_question") or (sample.question + "\n" + "\n".join(sample.options))
        return URBAN_PRE_PROMPT + "\n" + raw
    if sample.problem_type == "multiple choice":
        options = "Options:\n" + "\n".join(sample.options)
        return f"{VSI_PRE_PROMPT}\n{sample.question}\n{options}\n{VSI_MC_POST_PROMPT}"
    return VSI_PRE_PROMPT + "\n" + sample.question + "\n" + VSI_NA_POST_PROMPT


def build_messages(sample: Sample, style: str = "reason") -> list[dict]:
    """Chat messages for ``processor.apply_chat_template``: the video, then the prompt.

    (UrbanVideo's run.py puts the text before the frames; we keep one layout for all sources.)
    """
    return [{"role": "user", "content": [{"type": sample.data_type},
                                         {"type": "text", "text": build_prompt(sample, style)}]}]


def sft_target(sample: Sample) -> str:
    """Assistant text for SFT, Video-R1's format: ``"<think>...</think>\\n<answer>X</answer>"``.

    Video-R1 (sft_video.py) writes ``process + "\\n" + solution`` with process already in
    ``<think>`` tags (Video-R1-COT-165k); a bare chain of thought is wrapped in them here.
    """
    process = sample.process
    if not process.lstrip().startswith("<think>"):
        process = f"<think>{process}</think>"
    return f"{process}\n<answer>{sample.answer}</answer>"


def question_text(sample: Sample) -> str:
    """The question with its options, one per line after "Options:" (what the answerability prompt, the
    extensions' perception and agents are given)."""
    return sample.question + ("\nOptions:\n" + "\n".join(sample.options) if sample.options else "")


NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                 "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
                 "eighteen", "nineteen"]
TENS_WORDS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def tokenizer_corpus(extra=()) -> list[str]:
    """Every fixed string data.py prompts with, then the strings of ``extra`` (tiny.build_tiny adds
    synthetic.tokenizer_corpus()), each once: what policy.py's tiny offline tokenizer is trained on."""
    letters = [chr(c) for c in range(ord("A"), ord("I"))]
    texts = [
        QUESTION_TEMPLATE.replace("{Question}\n", ""), "Options:\n", *TYPE_TEMPLATE.values(),
        VSI_PRE_PROMPT, VSI_MC_POST_PROMPT, VSI_NA_POST_PROMPT, URBAN_PRE_PROMPT,
        "<think>", "</think>", "<answer>", "</answer>", "<think> </think>", "<answer> </answer>",
        "Option: []; Reason: []", "Option: ", "Reason: ", "choose:", "Choices:",
        *letters, *(f"{c}. " for c in letters), *(f"<answer>{c}</answer>" for c in letters),
        *(str(d) for d in range(10)), "0.5", "3.14", "42", "100", ".", ",", "-",
        *NUMBER_WORDS, *TENS_WORDS, "hundred", "and",
        "yes", "no", "Yes", "No", "YES", "NO", "left", "right", "straight", "forward", "backward",
        "up", "down", "turn left", "turn right", "go straight", "meters", "centimeters",
        "square meters", "let me think", "wait", "Hmm", "oh, I see", "let's break it down",
    ]
    return list(dict.fromkeys([*texts, *extra]))


def to_float(s) -> float | None:
    """lmms-eval to_float: float(s), None on failure."""
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


# --------------------------------------------------------------------------- identities
def video_identity(sample: Sample) -> str:
    """A video's identity in PVRBench: what the static protocol seeds a video's corruption with
    (Sec. 4, `perturb.static_spec`), so every question on a video sees the same corrupted video, on
    every machine (ids, never local paths)."""
    m = sample.meta
    if sample.source == "urbanvideo":
        return f"urbanvideo/{m['video_id']}"
    if sample.source == "synthetic" or m.get("dataset") == "synthetic":
        return f"synthetic/{m.get('scene_name') or Path(sample.video).stem}"
    if sample.source == "vsibench":
        return f"vsibench/{m['dataset']}/{m['scene_name']}"
    return f"{sample.source}/{Path(sample.video).name}"
