"""ROVA's training subset of Video-R1 (Sec. 5.1): which records of a Video-R1 JSON the rule keeps, and the command
that writes them (read back by :func:`data.load_video_r1` and ``train.py --data``)::

    python -m machinery.datasets.subset make-subset --data data/Video-R1-data/Video-R1-COT-165k.json \
        --out data/Video-R1-COT-outdoor.json
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections import Counter
from pathlib import Path

from machinery import cli
from machinery.datasets import data

log = logging.getLogger(__name__)

# The paper trains on "an outdoor-scene-relevant subset of Video-R1-260k (~10% of its video split,
# filtered by scene category labels)". Video-R1 ships no scene labels and the paper defines neither the
# labels nor "outdoor", so the rule below is ours (rule "outdoor", version OUTDOOR_RULE_VERSION):
# explicit lists, nothing learnt, nothing random, decided from the JSON record alone.
OUTDOOR_RULE_VERSION = "outdoor-v1"

# Media folders of Video-R1-data (the first folder of `path`; Video-R1-260k's video rows per folder:
# LLaVA-Video-178K 82,676, STAR 11,455, CLEVRER 8,220, NeXT-QA 7,549, PerceptionTest 6,348 = 116,248)
# and sub-sources inside LLaVA-Video-178K (`path` components, e.g. academic_source/Charades/...) whose
# footage is never outdoor: matched case-insensitively against every component of `path` and of
# `data_source`. What remains (LLaVA-Video-178K's YouTube / ActivityNet / Ego4D / NExT-QA / Kinetics
# clips, NeXT-QA) mixes indoor and outdoor scenes and goes on to the text test.
SUBSET_EXCLUDED_SOURCES = {
    "star": "STAR: Charades home videos (indoor)",
    "perceptiontest": "PerceptionTest: scripted indoor table-top recordings",
    "perception_test": "Perception Test clips of LLaVA-Video-178K (indoor)",
    "clevrer": "CLEVRER: rendered synthetic collisions",
    "charades": "Charades clips of LLaVA-Video-178K (indoor homes)",
    "youcook2": "YouCook2 clips of LLaVA-Video-178K (kitchens)",
    "sthsthv2": "Something-Something v2 clips (close-up hand-object, indoor)",
}

# Outdoor-scene vocabulary: streets and traffic, vehicles, aerial / drone footage, cities, open
# landscapes, sky and weather (PVRBench's perturbations are lighting, weather, occlusion and camera
# motion on outdoor / embodied footage). Whole words or phrases, lower case, plural forms listed.
OUTDOOR_TERMS = (
    "street", "streets", "road", "roads", "roadside", "highway", "highways", "freeway", "motorway",
    "avenue", "boulevard", "alley", "sidewalk", "sidewalks", "crosswalk", "crossroads", "intersection",
    "intersections", "roundabout", "traffic", "traffic light", "traffic lights", "stop sign", "road sign",
    "parking lot", "car", "cars", "truck", "trucks", "bus", "buses", "taxi", "taxis", "vehicle",
    "vehicles", "motorcycle", "motorcycles", "motorbike", "scooter", "bicycle", "bicycles", "bike",
    "bikes", "cyclist", "cyclists", "pedestrian", "pedestrians", "driver", "drivers", "driving",
    "dashcam", "dash cam", "windshield", "drone", "drones", "aerial", "city", "cities", "cityscape",
    "downtown", "urban", "town", "village", "neighborhood", "neighbourhood", "skyline", "skyscraper",
    "skyscrapers", "bridge", "bridges", "tunnel", "railway", "railroad", "airport", "runway", "harbor",
    "harbour", "pier", "outdoor", "outdoors", "outside", "open air", "sky", "skies", "cloud", "clouds",
    "cloudy", "sunny", "sunlight", "sunset", "sunrise", "weather", "rain", "raining", "rainy", "snow",
    "snowing", "snowy", "fog", "foggy", "mist", "misty", "storm", "windy", "park", "parks", "garden",
    "gardens", "backyard", "yard", "lawn", "grass", "forest", "woods", "tree", "trees", "mountain",
    "mountains", "hill", "hills", "river", "lake", "beach", "ocean", "sea", "shore", "coast", "desert",
    "trail", "hiking", "camping", "playground", "plaza",
)
# Indoor vocabulary: a record naming more distinct indoor than outdoor terms is dropped.
INDOOR_TERMS = (
    "indoor", "indoors", "room", "rooms", "living room", "bedroom", "bedrooms", "bathroom", "bathrooms",
    "kitchen", "kitchens", "dining room", "office", "offices", "classroom", "hallway", "corridor",
    "basement", "garage", "studio", "gym", "laboratory", "sofa", "couch", "bed", "beds", "pillow",
    "blanket", "desk", "table", "tabletop", "countertop", "counter", "cabinet", "cupboard", "drawer",
    "shelf", "shelves", "bookshelf", "refrigerator", "fridge", "microwave", "oven", "stove", "sink",
    "toilet", "shower", "bathtub", "ceiling", "carpet", "rug", "curtain", "curtains", "fireplace",
)
SUBSET_RULES = {
    "outdoor": "video records, minus the indoor / synthetic sources, whose question, options and chain of "
               "thought name an outdoor term and more distinct outdoor than indoor terms",
    "video": "every video record (Video-R1's video split, the denominator of the paper's ~10%)",
}


def _term_pattern(terms) -> re.Pattern:
    alternatives = sorted({re.escape(t) for t in terms}, key=len, reverse=True)
    return re.compile(r"\b(?:" + "|".join(alternatives) + r")\b")


_OUTDOOR_RE = _term_pattern(OUTDOOR_TERMS)
_INDOOR_RE = _term_pattern(INDOOR_TERMS)

SUBSET_HELP = f"""rules:
  outdoor  (default, {OUTDOOR_RULE_VERSION}) the paper filters Video-R1-260k's video split "by scene category
           labels" to an outdoor-relevant ~10% but defines neither; Video-R1 has no such labels. Ours,
           decided from each record alone (subset.py: SUBSET_EXCLUDED_SOURCES, OUTDOOR_TERMS, INDOOR_TERMS):
           1. data_type == "video";
           2. not from STAR, PerceptionTest, CLEVRER, nor LLaVA-Video-178K's Charades / YouCook2 /
              Perception Test / Something-Something clips (components of path and data_source);
           3. problem + options + process (the CoT, in Video-R1-COT-165k) name an outdoor term (street,
              road, car, traffic, drone, city, sky, weather, park, ...) and more distinct outdoor than
              indoor terms (kitchen, bedroom, sofa, table, ...).
  video    every video record (the denominator).
The share of video records kept is printed; the paper reports ~10% (not measured here)."""


def _record_text(row: dict) -> str:
    """The text the rule reads: problem, options and process (the CoT of Video-R1-COT-165k; absent in
    Video-R1-260k), lower case, whitespace collapsed."""
    options = row.get("options") or []
    parts = [row.get("problem") or "", *(o for o in options if isinstance(o, str)), row.get("process") or ""]
    return " ".join(" ".join(p for p in parts if isinstance(p, str)).lower().replace("\u2019", "'").split())


def _path_parts(row: dict) -> list[str]:
    path = row.get("path") if isinstance(row.get("path"), str) else ""
    return [p for p in path.replace("\\", "/").split("/") if p not in ("", ".", "..")]


def video_r1_source(row: dict) -> str:
    """A record's source for the counts: ``data_source`` ("LLaVA-Video-178K/0_30_s_academic_v0_1"), or
    when that is empty (CLEVRER's rows, for one) the media folder, the first folder of ``path``."""
    ds = row.get("data_source")
    if isinstance(ds, str) and ds.strip():
        return ds.strip()
    parts = _path_parts(row)
    return parts[0] if len(parts) > 1 else "(none)"


def subset_decision(row: dict, rule: str = "outdoor") -> tuple[bool, str, list[str], list[str]]:
    """Whether `rule` keeps a Video-R1 record: ``(keep, reason, outdoor terms, indoor terms)``.

    reason: "kept", "image" (not a video record), "source" (an excluded source, see
    SUBSET_EXCLUDED_SOURCES), "no outdoor term", "indoor terms" (as many distinct indoor as outdoor
    terms, or more). Pure and deterministic: the record alone decides.
    """
    if rule not in SUBSET_RULES:
        raise ValueError(f"unknown rule {rule!r} (expected one of {list(SUBSET_RULES)})")
    if row.get("data_type") != "video":
        return False, "image", [], []
    if rule == "video":
        return True, "kept", [], []
    ds = row.get("data_source") if isinstance(row.get("data_source"), str) else ""
    components = {p.lower() for p in _path_parts(row)} | {p.strip().lower() for p in ds.split("/")}
    if components & set(SUBSET_EXCLUDED_SOURCES):
        return False, "source", [], []
    text = _record_text(row)
    outdoor = sorted(set(_OUTDOOR_RE.findall(text)))
    indoor = sorted(set(_INDOOR_RE.findall(text)))
    if not outdoor:
        return False, "no outdoor term", outdoor, indoor
    if len(indoor) >= len(outdoor):
        return False, "indoor terms", outdoor, indoor
    return True, "kept", outdoor, indoor


def make_subset(data_path, out_path, rule: str = "outdoor", video_root=None, force: bool = False,
                skip_invalid: bool = False) -> dict:
    """Write the training subset of a Video-R1 JSON (Sec. 5.1): the records `rule` keeps (see SUBSET_HELP,
    the command's --help, and :func:`subset_decision`), unchanged and in their order, as a JSON list
    (``.json``) or JSONL (``.jsonl``) that :func:`data.load_video_r1` and ``train.py --data`` read.

    Share kept: Video-R1-260k's video split is 116,248 records; the excluded sources leave at most 90,225
    (77.6%: LLaVA-Video-178K and NeXT-QA) before LLaVA-Video-178K's sub-sources; what the text test keeps
    has not been measured here (no copy of the JSON offline). The paper reports ~10% (~11.6k records);
    the command prints the share it kept, to compare.

    ``video_root``: also drop the records whose video is missing under it (resolved as
    :func:`data.load_video_r1` does), e.g. while only some zips are unpacked. Every video record is checked as
    :func:`data.load_video_r1` checks it: a malformed row raises :class:`data.DataError`, or with ``skip_invalid``
    is skipped and counted. ``out_path`` is never replaced unless ``force``. Returns the printed summary.
    """
    data_path = Path(data_path)
    out = cli.out_file(out_path, (".json", ".jsonl"), what="--out")
    if rule not in SUBSET_RULES:
        raise cli.UserError(f"--rule {rule!r}: unknown (expected one of {', '.join(SUBSET_RULES)})")
    if data_path.exists() and out.exists() and out.resolve() == data_path.resolve():
        raise cli.UserError(f"--out {out} is the input file; give another name")
    if out.exists() and not force:
        raise cli.UserError(f"--out {out} exists; pass --force to replace it")
    root = Path(video_root) if video_root else None
    if root is not None and not root.is_dir():
        raise cli.UserError(f"--video-root {root}: not a folder")
    rows = data._read_records(data_path)
    scan = _subset_scan(data_path, rows, rule, root, skip_invalid)
    if not scan["kept"]:
        log.warning("%s: rule %s kept no record", data_path, rule)
    _write_records(out, scan["kept"])
    reasons, n_video, kept = scan["reasons"], scan["n_video"], scan["kept"]
    with open(data_path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {"input": str(data_path), "input_sha256": digest, "rule": rule,
            "rule_version": OUTDOOR_RULE_VERSION if rule == "outdoor" else rule, "out": str(out),
            "read": len(rows), "video": n_video, "image": reasons.get("image", 0), "invalid": len(scan["invalid"]),
            "invalid_examples": scan["invalid"][:3], "kept": len(kept),
            "kept_share_of_video": round(len(kept) / n_video, 4) if n_video else 0.0,
            "dropped": {k: v for k, v in sorted(reasons.items()) if k not in ("kept", "image")},
            "per_source": {src: {"read": n, "kept": scan["kept_by"].get(src, 0)}
                           for src, n in sorted(scan["read_by"].items())}}


def _subset_scan(data_path, rows, rule, root, skip_invalid) -> dict:
    """make_subset's pass over the records: every video record checked as load_video_r1 checks it, the
    rule's decision, and the counts (per reason, per source)."""
    kept, invalid, n_video = [], [], 0
    reasons, read_by, kept_by = Counter(), Counter(), Counter()
    for i, row in enumerate(rows):
        r = data._Row(data_path, i, row, "problem_id")
        try:
            is_video = r.choice("data_type", ("video", "image")) == "video"
            sample = data._video_r1_sample(r, root or data_path.parent) if is_video else None
        except data.DataError as e:
            if not skip_invalid:
                raise
            invalid.append(str(e))
            continue
        keep, reason, _, _ = subset_decision(row, rule)
        if sample is not None:
            n_video += 1
            source = video_r1_source(row)
            read_by[source] += 1
            if keep and root is not None and not os.path.exists(sample.video):
                keep, reason = False, "missing video"
            kept_by[source] += keep
        reasons[reason] += 1
        if keep:
            kept.append(row)
    return {"kept": kept, "invalid": invalid, "n_video": n_video, "reasons": reasons, "read_by": read_by,
            "kept_by": kept_by}


def _write_records(out: Path, rows: list) -> None:
    """Records as a JSON list (.json) or JSONL (.jsonl), written to a temporary name and renamed."""
    if out.suffix.lower() == ".jsonl":
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    else:
        text = json.dumps(rows, ensure_ascii=False, indent=2) + "\n"
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _print_subset_summary(s: dict) -> None:
    print(f"{s['input']}: read {s['read']} records ({s['video']} video, {s['image']} image"
          + (f", {s['invalid']} invalid, skipped" if s['invalid'] else "") + ")")
    for msg in s["invalid_examples"]:
        print(f"  invalid: {msg}")
    print(f"rule {s['rule_version']}: kept {s['kept']} of {s['video']} video records "
          f"({100 * s['kept_share_of_video']:.1f}%)")
    if s["dropped"]:
        print("dropped: " + ", ".join(f"{v} {k}" for k, v in s["dropped"].items()))
    width = max((len(k) for k in s["per_source"]), default=6)
    print(f"{'data_source':<{width}}  {'kept':>7}  {'read':>7}")
    for src, c in s["per_source"].items():
        print(f"{src:<{width}}  {c['kept']:>7}  {c['read']:>7}")
    print(f"wrote {s['out']} (input sha256 {s['input_sha256'][:16]})")


# --------------------------------------------------------------------------- command line
def main(argv=None):
    import argparse

    ap = cli.ArgumentParser(description="Data tools of the ROVA reference implementation (the synthetic "
                                             "benchmark: synthetic.py).")
    cli.add_debug_flag(ap)
    sub = ap.add_subparsers(dest="command", required=True)
    ms = sub.add_parser(
        "make-subset", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=SUBSET_HELP,
        help="write ROVA's training subset of a Video-R1 JSON (Sec. 5.1: outdoor scenes, video records)",
        description="Write the records of a Video-R1 JSON (Video-R1-COT-165k.json or Video-R1-260k.json) that "
                    "a rule keeps, unchanged and in order, in the same format (train.py --data reads it).")
    ms.add_argument("--data", required=True, help="the Video-R1 JSON / JSONL to filter")
    ms.add_argument("--out", required=True, help="the subset to write (.json: a JSON list; .jsonl: one record a "
                    "line); never replaced without --force")
    ms.add_argument("--rule", default="outdoor", choices=sorted(SUBSET_RULES), help="which records to keep "
                    "(see below; default outdoor)")
    ms.add_argument("--video-root", default="", help="also drop the records whose video is missing under this "
                    "folder (the paths are relative to it, as in train.py --video-root)")
    ms.add_argument("--force", action="store_true", help="replace --out if it exists")
    ms.add_argument("--skip-invalid", action="store_true", help="skip malformed rows (counted, the first three "
                    "shown) instead of stopping at the first")
    cli.add_debug_flag(ms)
    args = ap.parse_args(argv)
    summary = make_subset(args.data, args.out, rule=args.rule, video_root=args.video_root or None,
                          force=args.force, skip_invalid=args.skip_invalid)
    _print_subset_summary(summary)
    return 0


if __name__ == "__main__":
    cli.run(main)
