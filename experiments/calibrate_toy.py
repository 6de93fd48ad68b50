"""Does the synthetic benchmark degrade like Table 2? Per corruption subtype and intensity eta, on the held-out
clips exactly as PVRBench's static protocol corrupts them (perturb.static_spec, the clip's own depth):

- an oracle: hand-written estimators that read the answer off the pixels (next action: the median horizontal
  optical flow of the textured pixels; counting: blobs of the colour's hue after a per-channel contrast
  stretch), so "does the information survive?" has an answer that does not depend on any trained model
  (target: >= 0.8 under every subtype);
- the model (--model, e.g. the reproduction's SFT start): its format rate (an `<answer>` it can parse; target
  >= 0.9) and its accuracy, whose drop per category relative to the clean clips should fall in Table 2's range
  (15-45% for Qwen2.5-VL-7B).

    python experiments/calibrate_toy.py --bench runs/rova/synthetic --etas 0.3,0.5,0.7
    python experiments/calibrate_toy.py --bench B --model runs/reproduce/sft/final --etas 0.5,0.7

Prints one row per (subtype, eta) and writes --out (JSON; a rerun on the same benchmark reuses its oracle
scores). The model half runs eval_pvrbench.py (one evaluation per eta, --assign all; a rerun reuses the
evaluations' sample stores); the oracle half needs no model.
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
from machinery.corruption import depth as depths  # noqa: E402
from machinery.datasets import answers, data  # noqa: E402
import perturb  # noqa: E402
from machinery import video  # noqa: E402
from machinery.datasets import synthetic  # noqa: E402

FRAMES, PIXELS = 8, 56 * 56   # what the toy model sees (train.DEMO)
TASKS = {"route_planning": "next action", "object_counting": "counting"}   # the tasks with an oracle
FLOW = dict(pyr_scale=0.5, levels=2, winsize=9, iterations=3, poly_n=5, poly_sigma=1.1, flags=0)
TEXTURE = 20.0   # Sobel magnitude (grey levels) above which a pixel's flow counts
ORACLE_VERSION = 2   # (a rerun reuses a previous run's oracle scores only from the same version)


def horizontal_motion(frames) -> float:
    """Mean over frame pairs of the median horizontal optical flow over the textured pixels (pixels per frame;
    > 0: the scene slides right, i.e. the camera turns left). Textured: a Sobel gradient above TEXTURE, so the
    flat sky, whose flow is 0 whatever the camera does, does not vote; a median, so an occluder or particles
    over a minority of them do not move it."""
    grey = [cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in frames]
    moves = []
    for a, b in zip(grey, grey[1:]):
        flow = cv2.calcOpticalFlowFarneback(a, b, None, **FLOW)[..., 0]
        textured = np.hypot(cv2.Sobel(a, cv2.CV_32F, 1, 0), cv2.Sobel(a, cv2.CV_32F, 0, 1)) > TEXTURE
        moves.append(np.median(flow[textured] if textured.sum() >= 20 else flow))
    return float(np.mean(moves))


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
    if not rows:
        return None
    dx = np.array([horizontal_motion(read(Path(bench) / r["path"])[0]) for r in rows])
    gt = [answers.extract_answer(r["solution"], problem_type="multiple choice") for r in rows]
    truth = [dict(o.split(". ", 1) for o in r["options"])[g] for r, g in zip(rows, gt)]
    grid = np.linspace(0.05, 4.0, 80)
    acc = np.array([np.mean([("Go ahead" if abs(d) < t else "Turn left" if d > 0 else "Turn right") == a
                             for d, a in zip(dx, truth)]) for t in grid])
    best = np.median(grid[acc == acc.max()])   # the middle of the best thresholds: the widest margin
    return float(best)


def threshold_from(bench):
    """fit_threshold on `bench`'s training clips; a rendering without any (a validation split) is refused."""
    threshold = fit_threshold(bench, json.loads((Path(bench) / "train.json").read_text()))
    if threshold is None:
        raise SystemExit(f"calibrate_toy: {bench}/train.json has no next-action clip to fit the oracle's "
                         "threshold on; pass --fit-on with a rendering that has training clips")
    return threshold


def oracle_score(sample, frames, threshold):
    if sample.task == "route_planning":
        name = next_action(frames, threshold)
        letter = next(o.split(".")[0] for o in sample.options if o.split(". ", 1)[1] == name)
        return answers.score(letter, sample.answer, sample.problem_type, sample.source)
    colour = sample.question.split("How many ")[1].split()[0]
    return answers.score(str(count(frames, colour)), sample.answer, sample.problem_type, sample.source)


def oracles(bench, etas, subtypes, tasks, limit=0, known=None, fit_on=None):
    """({condition: {task: mean oracle score}} for "clean" and every "subtype@eta", on `tasks`' questions; the
    threshold, fitted on the training clips of `fit_on` (default: `bench`; a validation rendering has none).
    `known`: a previous run's result for this benchmark (its conditions are not measured again)."""
    samples, _ = load(bench, tasks)
    samples = samples[:limit] if limit else samples
    known = known or {}
    table = dict(known.get("oracle", {}))
    threshold = known.get("threshold") or threshold_from(fit_on or bench)
    todo = [(sub, eta) for sub in subtypes for eta in etas if f"{sub}@{eta:g}" not in table]
    depth = depths.Depth(depths.AUTO)
    out = defaultdict(lambda: defaultdict(list))
    for s in samples:
        frames, idx = read(s.video)
        if "clean" not in table:
            out["clean"][s.task].append(oracle_score(s, frames, threshold))
        d = depth(frames, data.video_identity(s), idx, video_path=s.video) if todo else None
        for sub, eta in todo:
            spec = perturb.static_spec(data.video_identity(s), sub, eta)
            out[f"{sub}@{eta:g}"][s.task].append(oracle_score(s, perturb.apply(frames, spec, d), threshold))
    table.update({c: {t: float(np.mean(v)) for t, v in scores.items()} for c, scores in out.items()})
    return table, threshold


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


def resolved(chosen, smallest):
    """Each subtype's eta to use: the chosen one, or the grid's smallest where none passes (it misses the targets,
    and the table says so)."""
    return {s: (e if e is not None else smallest) for s, e in chosen.items()}


def eta_flag(use):
    """--eta's value: App. D's 0.7 for the others, then each subtype's eta (`resolved`)."""
    return ",".join([f"{perturb.DEFAULT_ETA:g}"] + [f"{s}={e:g}" for s, e in use.items() if e != perturb.DEFAULT_ETA])


def report(oracle, model, chosen, etas, subtypes, tasks, args):
    """The calibration table (markdown): per subtype, App. D's 0.7 -> the chosen eta."""
    clean = np.mean([model["clean"][t] for t in tasks])
    use = resolved(chosen, min(etas))

    def cell(table, sub, eta, key=None):
        row = table[f"{sub}@{eta:g}"]
        return row[key] if key else np.mean([row[t] for t in tasks if t in row])

    L = [f"Measured by `python experiments/calibrate_toy.py --bench {args.bench} --model {args.model} --etas "
         f"{args.etas} --tasks {args.tasks}` on the {', '.join(tasks)} questions ({len(subtypes)} subtypes, each "
         f"held-out question under each; the start's clean accuracy {clean:.3f}, the oracle's "
         f"{np.mean([oracle['clean'][t] for t in tasks]):.3f}). The rule, fixed before measuring: per subtype the "
         "largest eta of the grid at which the oracle keeps >= 0.8 of its clean score, the start's format rate is "
         ">= 0.9 and its drop <= 45%; where none passes, the grid's smallest (marked: it misses the targets).", "",
         "| subtype | eta | oracle (0.7 → eta) | format rate (0.7 → eta) | accuracy (0.7 → eta) | drop at eta |",
         "|---|---|---|---|---|---|"]
    for sub in subtypes:
        e = use[sub]
        acc7, acc = cell(model, sub, 0.7), cell(model, sub, e)
        L.append(f"| {sub} | {e:g}{'' if chosen[sub] is not None else ' (none passes)'} | "
                 f"{cell(oracle, sub, 0.7):.2f} → {cell(oracle, sub, e):.2f} | "
                 f"{cell(model, sub, 0.7, 'format'):.2f} → {cell(model, sub, e, 'format'):.2f} | "
                 f"{acc7:.2f} → {acc:.2f} | {1 - acc / clean:.0%} |")
    L += ["", "| category | drop at 0.7 | drop at the chosen etas | Table 2 (Qwen2.5-VL-7B) |", "|---|---|---|---|"]
    for cat, subs in perturb.CATEGORIES.items():
        d7 = 1 - np.mean([cell(model, s, 0.7) for s in subs]) / clean
        d = 1 - np.mean([cell(model, s, use[s]) for s in subs]) / clean
        L.append(f"| {cat} | {d7:.0%} | {d:.0%} | 31-45% |")
    return "\n".join(L + ["", f"The toy's intensities: `--eta {eta_flag(use)}`"]) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", default="runs/rova/synthetic", help="the synthetic benchmark's folder")
    ap.add_argument("--fit-on", default="", help="fit the next-action oracle's threshold on this rendering's "
                    "training clips (default: --bench's; a validation rendering, all held out, has none)")
    ap.add_argument("--model", default="", help="also evaluate this checkpoint (format rate, drop per category)")
    ap.add_argument("--etas", default="0.3,0.5,0.7")
    ap.add_argument("--subtypes", default="all")
    ap.add_argument("--limit", type=int, default=0, help="held-out questions per task for the oracles (0: all)")
    ap.add_argument("--tasks", default="route_planning", help="the question types the model is calibrated on "
                    "(those its start answers above the best constant)")
    ap.add_argument("--work", default="runs/calibrate_toy", help="the model evaluations' folder")
    ap.add_argument("--out", default="runs/calibrate_toy/calibration.json")
    ap.add_argument("--results", default="", help="also write the table between the calibration markers of this "
                    "markdown file (docs/RESULTS.md)")
    args = ap.parse_args(argv)
    etas = [float(e) for e in args.etas.split(",")]
    subtypes = list(perturb.SUBTYPES) if args.subtypes == "all" else args.subtypes.split(",")
    tasks = args.tasks.split(",")
    previous = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    fit_on = args.fit_on or args.bench
    if (previous.get("bench"), previous.get("fit_on", str(args.bench)), previous.get("tasks"),
            previous.get("oracle_version")) != (str(args.bench), str(fit_on), tasks, ORACLE_VERSION) or args.limit:
        previous = {}
    table, threshold = oracles(args.bench, etas, subtypes, tasks, args.limit, previous, fit_on)
    print(f"next-action oracle threshold {threshold:.3f} px/frame")
    print(f"{'oracle':<22}" + "".join(f"{TASKS[t]:>13}" for t in tasks))
    for cond, scores in table.items():
        print(f"{cond:<22}" + "".join(f"{scores.get(t, float('nan')):>13.3f}" for t in tasks))
    result = {"bench": str(args.bench), "fit_on": str(fit_on), "tasks": tasks, "oracle_version": ORACLE_VERSION,
              "oracle": table, "threshold": threshold}
    if args.model:
        model = result["model"] = model_scores(args.model, args.bench, etas, args.work, subtypes, tasks)
        result["chosen"] = chosen = choose(table, model, etas, subtypes, tasks, table["clean"])
        result["eta"] = eta_flag(resolved(chosen, min(etas)))
        text = report(table, model, chosen, etas, subtypes, tasks, args)
        print(text)
        if args.results:
            sys.path.insert(0, str(ROOT / "experiments"))
            from reproduce import write_marked
            write_marked(Path(args.results), text, "<!-- calibration:begin -->", "<!-- calibration:end -->")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
