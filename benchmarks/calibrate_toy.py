"""Does the synthetic benchmark degrade like Table 2? Per corruption subtype and intensity eta, on the held-out
clips exactly as PVRBench's static protocol corrupts them (perturb.static_spec, the clip's own depth):

- an oracle: hand-written estimators that read the answer off the pixels (next action: the median horizontal
  optical flow; counting: blobs of the colour's hue after a per-channel contrast stretch), so "does the information
  survive?" has an answer that does not depend on any trained model (target: >= 0.8 under every subtype);
- the model (--model, e.g. the reproduction's SFT start): its format rate (an `<answer>` it can parse; target
  >= 0.9) and its accuracy, whose drop per category relative to the clean clips should fall in Table 2's range
  (15-45% for Qwen2.5-VL-7B).

    python benchmarks/calibrate_toy.py --bench runs/rova/synthetic --etas 0.3,0.5,0.7
    python benchmarks/calibrate_toy.py --bench B --model runs/reproduce/sft/final --etas 0.5,0.7

Prints one row per (subtype, eta) and writes --out (JSON). The model half runs eval_pvrbench.py (one
evaluation per eta, --assign all); the oracle half needs no model.
"""
import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
import data  # noqa: E402
import depth as depths  # noqa: E402
import perturb  # noqa: E402
import synthetic  # noqa: E402
import video  # noqa: E402

FRAMES, PIXELS = 8, 56 * 56   # what the toy model sees (train.DEMO)
TASKS = {"route_planning": "next action", "object_counting": "counting"}   # the tasks with an oracle
FLOW = dict(pyr_scale=0.5, levels=2, winsize=9, iterations=3, poly_n=5, poly_sigma=1.1, flags=0)


def horizontal_motion(frames) -> float:
    """Mean over frame pairs of the median horizontal optical flow (pixels per frame; > 0: the scene slides
    right, i.e. the camera turns left). A median, so an occluder or particles over a minority of the frame
    do not move it."""
    grey = [cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in frames]
    return float(np.mean([np.median(cv2.calcOpticalFlowFarneback(a, b, None, **FLOW)[..., 0])
                          for a, b in zip(grey, grey[1:])]))


def next_action(frames, threshold: float) -> str:
    dx = horizontal_motion(frames)
    return "Go ahead" if abs(dx) < threshold else "Turn left" if dx > 0 else "Turn right"


def _stretch(frame) -> np.ndarray:
    """Per-channel contrast stretch (2nd -> 0, 98th percentile -> 255): removes a uniform veil (fog's airlight,
    overexposure's lift) and a global gain (dusk, night) before colours are compared."""
    f = frame.astype(np.float32)
    lo, hi = np.percentile(f, 2, axis=(0, 1)), np.percentile(f, 98, axis=(0, 1))
    return np.clip((f - lo) / np.maximum(hi - lo, 8.0) * 255, 0, 255).astype(np.uint8)


HUES = {c: float(cv2.cvtColor(np.uint8([[rgb]]), cv2.COLOR_RGB2HSV_FULL)[0, 0, 0]) * 360 / 256
        for c, rgb in synthetic.SYNTH_COLOURS.items()}


def count(frames, colour: str, saturation: float = 0.45, min_px: int = 2) -> int:
    """The objects of one colour: per frame, the connected blobs of saturated pixels whose hue is nearest that
    colour's (after _stretch); the median over frames. (The clean ceiling is ~0.6 MRA: same-coloured objects
    overlap at 56x56, which no frame-level blob count resolves.)"""
    k = list(HUES).index(colour)
    counts = []
    for f in frames:
        hsv = cv2.cvtColor(_stretch(f), cv2.COLOR_RGB2HSV_FULL).astype(np.float32)
        hue = hsv[..., 0] * 360 / 256
        nearest = np.argmin(np.stack([np.abs((hue - h + 180) % 360 - 180) for h in HUES.values()], -1), -1)
        mask = (nearest == k) & (hsv[..., 1] > 255 * saturation) & (hsv[..., 2] > 0.15 * 255)
        _, _, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
        counts.append(int((stats[1:, cv2.CC_STAT_AREA] >= min_px).sum()))
    return int(round(np.median(counts)))


def load(bench, tasks=tuple(TASKS)):
    samples, _ = data.load_vsibench(Path(bench) / "eval.jsonl", Path(bench) / "videos")
    samples = [s for s in samples if s.task in tasks and s.task in TASKS]
    train = json.loads((Path(bench) / "train.json").read_text())
    return samples, train


def read(path):
    return video.read_frames(path, num_frames=FRAMES, max_pixels=PIXELS)[:2]


def fit_threshold(bench, train, limit=150):
    """The next-action oracle's |flow| threshold, fitted on clean training clips (best accuracy; ties: the
    middle of the best range)."""
    rows = [r for r in train if r["data_source"] == "synthetic/next_action"][:limit]
    dx = np.array([horizontal_motion(read(Path(bench) / r["path"])[0]) for r in rows])
    gt = [data.extract_answer(r["solution"], problem_type="multiple choice") for r in rows]
    truth = [dict(o.split(". ", 1) for o in r["options"])[g] for r, g in zip(rows, gt)]
    grid = np.linspace(0.05, 4.0, 80)
    acc = np.array([np.mean([("Go ahead" if abs(d) < t else "Turn left" if d > 0 else "Turn right") == a
                             for d, a in zip(dx, truth)]) for t in grid])
    best = np.median(grid[acc == acc.max()])   # the middle of the best thresholds: the widest margin
    return float(best)


def oracle_score(sample, frames, threshold):
    if sample.task == "route_planning":
        name = next_action(frames, threshold)
        letter = next(o.split(".")[0] for o in sample.options if o.split(". ", 1)[1] == name)
        return data.score(letter, sample.answer, sample.problem_type, sample.source)
    colour = sample.question.split("How many ")[1].split()[0]
    return data.score(str(count(frames, colour)), sample.answer, sample.problem_type, sample.source)


def oracles(bench, etas, subtypes, tasks, limit=0):
    """{condition: {task: mean oracle score}} for "clean" and every "subtype@eta", on `tasks`' questions."""
    samples, train = load(bench, tasks)
    samples = samples[:limit] if limit else samples
    threshold = fit_threshold(bench, train)
    clips = {s.video: read(s.video) for s in samples}
    depth = depths.Depth(depths.AUTO)
    out = defaultdict(lambda: defaultdict(list))
    for s in samples:
        frames, idx = clips[s.video]
        out["clean"][s.task].append(oracle_score(s, frames, threshold))
        d = depth(frames, data.video_identity(s), idx, video_path=s.video)
        for sub in subtypes:
            for eta in etas:
                spec = perturb.static_spec(data.video_identity(s), sub, eta)
                out[f"{sub}@{eta:g}"][s.task].append(oracle_score(s, perturb.apply(frames, spec, d), threshold))
    return {c: {t: float(np.mean(v)) for t, v in tasks.items()} for c, tasks in out.items()}, threshold


def task_bench(bench, work, tasks):
    """A copy of the benchmark holding only `tasks`' questions (the videos and depth linked, not copied)."""
    out = Path(work) / "bench"
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in (Path(bench) / "eval.jsonl").read_text().splitlines() if json.loads(r)["question_type"] in tasks]
    (out / "eval.jsonl").write_text("".join(r + "\n" for r in rows))
    for name in ("videos", "depth"):
        if not (out / name).exists():
            (out / name).symlink_to(Path(bench, name).resolve())
    return out


def model_scores(model, bench, etas, work, subtypes, tasks):
    """eval_pvrbench.py (--assign all) at each eta, on `tasks`' questions: {"clean"|"subtype@eta": {"format":
    rate, task: accuracy}} from results.json (conditions, diagnostics' format rate)."""
    folder = task_bench(bench, work, tasks)
    table = {}
    for eta in etas:
        out = Path(work) / f"eta{eta:g}"
        cmd = [sys.executable, str(ROOT / "eval_pvrbench.py"), "--model", model, "--benchmark", f"synthetic={folder}",
               "--assign", "all", "--judge", "none", "--eta", f"{eta:g}", "--out", str(out),
               "--subtypes", ",".join(subtypes)]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        res = json.loads(sorted(out.glob("*/*_results.json"))[-1].read_text())["results"]
        conditions = res["sources"]["synthetic"]["conditions"]
        fmt = res["diagnostics"]["sources"]["synthetic"]["format_rate"]
        for cond, v in conditions.items():
            table["clean" if cond == "clean" else f"{cond}@{eta:g}"] = {"format": fmt[cond], **v["tasks"]}
    return table


def choose(oracle, model, etas, subtypes, tasks, clean_oracle):
    """The rule, fixed before measuring: per subtype the largest eta of the grid at which the oracle keeps
    >= 0.8 of its clean score on every task, the model keeps its format (>= 0.9), and the model's accuracy
    drop (mean over `tasks`, relative to clean) stays <= 45% (Table 2's worst category). None: no eta passes."""
    clean = np.mean([model["clean"][t] for t in tasks])
    chosen = {}
    for sub in subtypes:
        ok = [eta for eta in etas if all(oracle[f"{sub}@{eta:g}"].get(t, 1.0) >= 0.8 * clean_oracle.get(t, 1.0)
                                         for t in tasks)
              and model[f"{sub}@{eta:g}"]["format"] >= 0.9
              and 1 - np.mean([model[f"{sub}@{eta:g}"][t] for t in tasks]) / clean <= 0.45]
        chosen[sub] = max(ok) if ok else None
    return chosen


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", default="runs/rova/synthetic", help="the synthetic benchmark's folder")
    ap.add_argument("--model", default="", help="also evaluate this checkpoint (format rate, drop per category)")
    ap.add_argument("--etas", default="0.3,0.5,0.7")
    ap.add_argument("--subtypes", default="all")
    ap.add_argument("--limit", type=int, default=0, help="held-out questions per task for the oracles (0: all)")
    ap.add_argument("--tasks", default="route_planning", help="the question types the model is calibrated on "
                    "(those its start answers above the best constant)")
    ap.add_argument("--work", default="runs/calibrate_toy", help="the model evaluations' folder")
    ap.add_argument("--out", default="runs/calibrate_toy/calibration.json")
    args = ap.parse_args(argv)
    etas = [float(e) for e in args.etas.split(",")]
    subtypes = list(perturb.SUBTYPES) if args.subtypes == "all" else args.subtypes.split(",")
    tasks = args.tasks.split(",")
    table, threshold = oracles(args.bench, etas, subtypes, tasks, args.limit)
    print(f"next-action oracle threshold {threshold:.3f} px/frame")
    print(f"{'oracle':<22}" + "".join(f"{TASKS[t]:>13}" for t in tasks))
    for cond, scores in table.items():
        print(f"{cond:<22}" + "".join(f"{scores.get(t, float('nan')):>13.3f}" for t in tasks))
    result = {"oracle": table, "threshold": threshold}
    if args.model:
        model = result["model"] = model_scores(args.model, args.bench, etas, args.work, subtypes, tasks)
        result["chosen"] = chosen = choose(table, model, etas, subtypes, tasks, table["clean"])
        clean = np.mean([model["clean"][t] for t in tasks])
        print(f"\nmodel on {', '.join(tasks)}: clean {clean:.3f}")
        print(f"{'subtype':<14}" + "".join(f"{'eta ' + format(e, 'g'):>18}" for e in etas) + "   chosen")
        for sub in subtypes:
            cells = []
            for e in etas:
                m, o = model[f"{sub}@{e:g}"], table[f"{sub}@{e:g}"]
                acc = np.mean([m[t] for t in tasks])
                cells.append(f"{acc:.2f}/f{m['format']:.2f}/o{np.mean([o[t] for t in tasks if t in o]):.2f}")
            print(f"{sub:<14}" + "".join(f"{c:>18}" for c in cells) + f"   {chosen[sub]}")
        print("cells: model accuracy / format rate / oracle score")
        for cat, subs in perturb.CATEGORIES.items():
            accs = [np.mean([model[f"{s}@{chosen[s]:g}"][t] for t in tasks]) for s in subs if chosen.get(s)]
            if len(accs) == len(subs):
                print(f"{cat:<10} drop at the chosen etas: {1 - np.mean(accs) / clean:.1%}")
        print("--eta " + ",".join([f"{perturb.DEFAULT_ETA:g}"] + [f"{s}={e:g}" for s, e in chosen.items() if e]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
