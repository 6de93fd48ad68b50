"""The synthetic embodied benchmark, and a procedural street clip for demos and tests.

:func:`make_synthetic` writes a small, real task on which the whole pipeline runs and learns on a
CPU: egocentric clips of a camera moving over a textured ground among coloured boxes, with their
true depth, and questions of PVRBench's task families (App. B.1): the next action of Fig. 1 (turn
left / turn right / go ahead), first-appearance order, object counting (numeric, MRA) and relative
distance. It is written as a Video-R1 training file (with a ``process`` chain of thought for SFT)
and a VSI-Bench evaluation file, so that data.py's real loaders read it; same seed, same bytes.
:func:`text_only_baseline` checks that the questions cannot be answered without the video.

:func:`sample_clip` ray-casts a street scene (RGB plus metric depth): the built-in footage when no
video is given (perturb.py's demo, the tests). :func:`photo_clip` pans and zooms over a real photograph
(scikit-image's bundled outdoor ones, no download): real content for the corruption engine's tests and
contact sheets (experiments/contact_sheet.py).

CLI: ``python -m machinery.datasets.synthetic --out DIR [--n 200 --seed 0 --frames 16 --size 112
--eval-fraction 0.25]``.
"""
from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import cv2
import numpy as np

from machinery import cli
from machinery import video
from machinery.datasets import answers, data

# --------------------------------------------------------------------------- the benchmark
SYNTH_COLOURS = {"red": (200, 40, 40), "green": (40, 160, 60), "blue": (40, 70, 200),
                 "yellow": (220, 200, 40), "purple": (140, 60, 170), "orange": (235, 130, 30)}
SYNTH_SHAPES = {"cube": (0.8, 0.8, 0.8), "pillar": (0.5, 1.8, 0.5), "block": (1.4, 0.6, 0.9),
                "slab": (1.2, 0.3, 1.2)}  # width, height, depth in metres
SYNTH_ACTIONS = ("Turn left", "Turn right", "Go ahead")
SYNTH_FAMILIES = {  # family -> VSI-Bench question_type it is filed under
    "next_action": "route_planning", "appearance_order": "obj_appearance_order",
    "counting": "object_counting", "relative_distance": "object_rel_distance"}
_CAM_HEIGHT, _FOV = 1.5, 70.0
_Q_ACTION = ("The video is what an agent sees while it moves through a scene. "
             "Which action is the agent taking?")
_Q_ORDER = "What is the first-time appearance order of the following objects in the video: {}?"
_Q_COUNT = "How many {} objects appear in the video?"
_Q_DIST = "Which of these objects is the closest to the {}?"
_SYNTH_PROCESS_WORDS = [
    "Let me look at how the view changes from frame to frame.",
    "The ground pattern and the objects slide to the right, so the camera is rotating to the left.",
    "The ground pattern and the objects slide to the left, so the camera is rotating to the right.",
    "The objects grow and move outward from the centre without sliding sideways, so the camera moves straight ahead.",
    "I note the frame in which each object first becomes visible.",
    "I count the objects of that colour across all frames, each one once.",
    "I compare the distances between the objects on the ground.",
]
_SEEN_PX = 12  # an object "appears" once it covers a dozen pixels of a frame


def tokenizer_corpus() -> list[str]:
    """Every fixed string of the benchmark's questions and chains of thought: tiny.build_tiny trains
    its tokenizer on them after data.tokenizer_corpus()'s (``data.tokenizer_corpus(tokenizer_corpus())``)."""
    names = [f"{c} {s}" for c in SYNTH_COLOURS for s in SYNTH_SHAPES]
    return ([_Q_ACTION, _Q_ORDER.format(", ".join(names[:3])), _Q_DIST.format(names[0])] + list(SYNTH_ACTIONS)
            + [_Q_COUNT.format(c) for c in SYNTH_COLOURS] + names + _SYNTH_PROCESS_WORDS)


def _camera_matrix(yaw, pitch=np.radians(12)):
    """Camera -> world rotation: looking down by `pitch`, turned by `yaw` (positive = to the left,
    toward -x; x is right, y up, z forward)."""
    c, s = np.cos(yaw), np.sin(yaw)
    cp, sp = np.cos(pitch), np.sin(pitch)
    return np.array([[c, 0, -s], [0, 1, 0], [s, 0, c]]) @ np.array([[1, 0, 0], [0, cp, -sp], [0, sp, cp]])


def render_synthetic(objects, yaw_rate, speed, num_frames=16, size=112, supersample=2):
    """Render one egocentric clip: a pinhole camera 1.5 m above a checkered ground plane, moving
    forward `speed` m/frame and turning `yaw_rate` rad/frame (positive = left), among box objects
    drawn in painter's order (far to near). Returns (frames uint8 [T,S,S,3], depth float32 [T,S,S]
    in metres, visible_px int [T, n_objects] at output resolution)."""
    S = size * supersample
    f = (S / 2) / np.tan(np.radians(_FOV) / 2)
    px = (np.arange(S) + 0.5 - S / 2) / f
    rx, ry = np.meshgrid(px, -px)  # camera rays (x right, y up, z forward)
    rays = np.stack([rx, ry, np.ones_like(rx)], -1)
    sky = np.array((150, 190, 235), np.float32) * (0.8 + 0.2 * np.clip(ry, 0, 1))[..., None] ** 0.5
    frames = np.zeros((num_frames, size, size, 3), np.uint8)
    depth = np.zeros((num_frames, size, size), np.float32)
    visible = np.zeros((num_frames, len(objects)), np.int64)
    for t in range(num_frames):
        yaw = yaw_rate * t
        R = _camera_matrix(yaw)
        heading = np.array([-np.sin(yaw), 0.0, np.cos(yaw)])
        cam = np.array([0.0, _CAM_HEIGHT, 0.0]) + speed * t * heading  # moves along its heading
        d = rays @ R.T
        down = d[..., 1] < -1e-6
        tt = np.where(down, _CAM_HEIGHT / np.maximum(-d[..., 1], 1e-6), 1e3)
        hx, hz = cam[0] + tt * d[..., 0], cam[2] + tt * d[..., 2]
        checker = (np.floor(hx) + np.floor(hz)) % 2
        fade = np.exp(-tt / 25.0)[..., None]  # far texture fades into haze (no moire at the horizon)
        ground = np.where(checker[..., None] > 0, (120, 128, 96), (84, 92, 70)).astype(np.float32)
        haze = np.array((170, 180, 185), np.float32)
        img = np.where(down[..., None], ground * fade + haze * (1 - fade), sky)
        zbuf = np.where(down, tt, 1e3).astype(np.float32)  # z-depth: rays have unit forward component
        ids = np.full((S, S), -1, np.int32)
        order = sorted(range(len(objects)), key=lambda i: -np.linalg.norm(np.array(objects[i]["pos"]) - cam[[0, 2]]))
        for i in order:  # painter's order: far to near
            _draw_box(img, zbuf, ids, i, objects[i], cam, R, f, S)
        frames[t] = cv2.resize(np.clip(img, 0, 255).astype(np.uint8), (size, size), interpolation=cv2.INTER_AREA)
        depth[t] = cv2.resize(zbuf, (size, size), interpolation=cv2.INTER_AREA)
        counts = np.bincount(ids[ids >= 0].ravel(), minlength=len(objects))
        visible[t] = counts // (supersample * supersample)
    return frames, depth, visible


def _draw_box(img, zbuf, ids, index, obj, cam, R, f, S):
    """Draw one box's visible faces (shaded by a fixed light) into the image, the depth and the id buffers."""
    w, h, dd = SYNTH_SHAPES[obj["shape"]]
    x, z = obj["pos"]
    xs, ys, zs = np.array([-w, w]) / 2 + x, np.array([0.0, h]), np.array([-dd, dd]) / 2 + z
    corners = np.array([[a, b, c] for a in xs for b in ys for c in zs])  # index = 4i + 2j + k
    faces = [((0, 1, 3, 2), (-1, 0, 0)), ((4, 5, 7, 6), (1, 0, 0)), ((2, 3, 7, 6), (0, 1, 0)),
             ((0, 2, 6, 4), (0, 0, -1)), ((1, 3, 7, 5), (0, 0, 1))]  # sides, top, front, back
    local = (corners - cam) @ R  # world -> camera
    if (local[:, 2] < 0.2).any():  # partly behind the camera: not drawn (it is leaving the view)
        return
    uv = np.stack([S / 2 + f * local[:, 0] / local[:, 2], S / 2 - f * local[:, 1] / local[:, 2]], 1)
    base = np.array(SYNTH_COLOURS[obj["colour"]], np.float32)
    light = np.array([0.4, 0.8, -0.45]) / np.linalg.norm([0.4, 0.8, -0.45])
    for idx, normal in faces:
        fc = corners[list(idx)].mean(0)
        if np.dot(np.array(normal), cam - fc) <= 0:  # back face
            continue
        shade = 0.55 + 0.45 * max(0.0, float(np.dot(normal, light)))
        poly = np.round(uv[list(idx)] * 16).astype(np.int32)
        cv2.fillConvexPoly(img, poly, tuple(float(v) for v in base * shade), cv2.LINE_AA, shift=4)
        cv2.fillConvexPoly(zbuf, poly, float(local[list(idx)].mean(0)[2]), shift=4)
        cv2.fillConvexPoly(ids, poly, int(index), shift=4)


def _synthetic_scene(rng, action, count_colour, count):
    """Objects for one clip: `count` objects of `count_colour` in the forward view, 3-5 distractors of
    other colours; unique (colour, shape) names. Positions (x, z) in metres, camera at the origin."""
    names, objects = set(), []

    def add(colour, x, z):
        for shape in rng.permutation(list(SYNTH_SHAPES)):
            if (colour, shape) not in names:
                names.add((colour, shape))
                objects.append({"colour": colour, "shape": str(shape), "pos": (float(x), float(z))})
                return True
        return False

    lanes = rng.permutation(np.linspace(-2.4, 2.4, 5))[:count]
    for lane in lanes:  # the counted objects: spread across the forward view, never hidden
        add(count_colour, lane + rng.uniform(-0.25, 0.25), rng.uniform(5.0, 8.0))
    others = [c for c in SYNTH_COLOURS if c != count_colour]
    turn = {"Turn left": -1, "Turn right": 1, "Go ahead": 0}[action]  # the side the turn reveals
    for _ in range(int(rng.integers(3, 6))):  # distractors; while turning, most enter from that side
        if turn and rng.random() < 0.8:
            angle = np.radians(rng.uniform(38, 75))  # outside the first frame's view, inside the last's
            r = rng.uniform(4.0, 10.0)
            x, z = turn * r * np.sin(angle), r * np.cos(angle) + 1.0
        else:
            x, z = rng.uniform(-4.0, 4.0), rng.uniform(9.0, 14.0)
        add(str(rng.choice(others)), x, z)
    return objects


def _obj_name(o):
    return f"{o['colour']} {o['shape']}"


def _centre_distance(a, b):
    """Ground distance between object centres (VSI-Bench measures from the closest points; centres
    keep the object's size from giving the answer away)."""
    return float(np.hypot(a["pos"][0] - b["pos"][0], a["pos"][1] - b["pos"][1]))


def _place(rng, correct, distractors, slot):
    """MC options with the correct one at letter `slot` (answers balanced by construction)."""
    rest = [distractors[i] for i in rng.permutation(len(distractors))]
    opts = rest[:slot] + [correct] + rest[slot:]
    return [f"{'ABCD'[i]}. {o}" for i, o in enumerate(opts)], "ABCD"[slot]


def _seen(visible):
    """Which objects appear in the clip: those covering a dozen pixels in some frame."""
    return visible.max(0) >= _SEEN_PX


def _count_seen(objects, visible, colour) -> int:
    seen = _seen(visible)
    return int(sum(seen[i] for i, o in enumerate(objects) if o["colour"] == colour))


def _q_next_action(action):
    k = SYNTH_ACTIONS.index(action)
    return {"family": "next_action", "question": _Q_ACTION,
            "options": [f"{'ABC'[i]}. {a}" for i, a in enumerate(SYNTH_ACTIONS)], "answer": "ABC"[k],
            "process": f"{_SYNTH_PROCESS_WORDS[0]} {_SYNTH_PROCESS_WORDS[1 + k]} The agent's action is: {action}."}


def _q_appearance_order(rng, objects, visible, slot):
    """Three objects that first appear in three different frames (else None), in a random option's order."""
    seen = _seen(visible)
    first = {i: int(np.argmax(visible[:, i] >= _SEEN_PX)) for i in range(len(objects)) if seen[i]}
    by_frame = {}
    for i, t in first.items():
        by_frame.setdefault(t, []).append(i)
    singles = [v[0] for t, v in sorted(by_frame.items()) if len(v) == 1]  # unambiguous first frames
    if len(singles) < 3:
        return None
    pick = sorted(rng.choice(singles, 3, replace=False).tolist(), key=lambda i: first[i])
    names = [_obj_name(objects[i]) for i in pick]
    wrong = [", ".join(names[j] for j in perm) for perm in ([0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0])]
    wrong = [wrong[j] for j in rng.permutation(5)[:3]]
    options, answer = _place(rng, ", ".join(names), wrong, slot)
    shown = data.split_option(options[int(rng.integers(4))])[1]  # listed in the order of a random option
    return {"family": "appearance_order", "question": _Q_ORDER.format(shown), "options": options,
            "answer": answer, "process": f"{_SYNTH_PROCESS_WORDS[4]} The order is {', '.join(names)}."}


def _q_relative_distance(rng, objects, visible, slot):
    """The object closest to a random reference object, among four or more of other colours (colour
    tells nothing); None unless the closest is clearly the closest."""
    seen = _seen(visible)
    vis = [i for i in range(len(objects)) if seen[i]]
    ref = int(rng.choice(vis)) if vis else -1
    cands = [i for i in vis if objects[i]["colour"] != objects[ref]["colour"]]
    if len(cands) < 4:
        return None
    gaps = sorted((_centre_distance(objects[ref], objects[i]), i) for i in cands)
    if not gaps[1][0] > 1.2 * gaps[0][0] + 0.2:
        return None
    closest = _obj_name(objects[gaps[0][1]])
    distract = [_obj_name(objects[i]) for i in rng.permutation([i for _, i in gaps[1:]])[:3]]
    options, answer = _place(rng, closest, distract, slot)
    return {"family": "relative_distance", "question": _Q_DIST.format(_obj_name(objects[ref])),
            "options": options, "answer": answer, "process": f"{_SYNTH_PROCESS_WORDS[6]} The closest is the {closest}."}


def synthetic_questions(rng, objects, visible, action, count_colour, slots):
    """The questions one clip supports, as dicts (family, question, options, answer, process); `slots`:
    the letter index of the correct option per MC family (balanced by make_synthetic)."""
    n = _count_seen(objects, visible, count_colour)
    counting = {"family": "counting", "question": _Q_COUNT.format(count_colour), "options": [], "answer": str(n),
                "process": f"{_SYNTH_PROCESS_WORDS[5]} There are {n} {count_colour} objects."}
    order = _q_appearance_order(rng, objects, visible, slots["appearance_order"])
    distance = _q_relative_distance(rng, objects, visible, slots["relative_distance"])
    return [q for q in (_q_next_action(action), counting, order, distance) if q is not None]


TURN = (0.035, 0.05)   # a turning clip's yaw rate, rad/frame, drawn uniformly in this range
# The CPU demo's benchmark (train.DEMO renders it, eval_pvrbench.py's default builds it): make_synthetic's arguments.
# The next action only (appearance order yields a question on about 1% of 8-frame clips; docs/RESULTS.md, "The
# demo"), with turns down to slight ones (0.005 rad/frame), which corruptions make hard to tell from going ahead.
DEMO_BENCHMARK = dict(n=480, seed=0, num_frames=8, size=56, families=("next_action",), turn=(0.005, 0.05))
# Its corruption intensities, per subtype (perturb.parse_eta's form): App. D's 0.7 where 8 frames of 56x56 keep the
# answer, lower where 0.7 leaves nothing to read (night, overexposure, fog) or nothing moving to tell (dynamic
# occlusion), higher where 0.7 costs nothing; calibrated on a validation render (another seed's clips) by
# experiments/calibrate_toy.py's rule (experiments/results/v5-rules.md, "The toy"). eval_pvrbench.py scores the synthetic
# benchmark at these by default, and App. D's 0.7 everywhere with --eta 0.7.
DEMO_ETA = ("0.7,dusk=1,night=0.35,overexposure=0.35,shadow=0.85,translation=0.85,zoom=1,rotation=1,static=1,"
            "dynamic=0.1,fog=0.35,rain=1,snow=1")


def parse_turn(text):
    """'LOW,HIGH' -> (low, high) yaw rates, 0 <= low <= high."""
    try:
        low, high = (float(x) for x in str(text).split(","))
    except ValueError:
        raise cli.UserError(f"a turn range is LOW,HIGH in rad/frame, e.g. 0.035,0.05; got {text!r}") from None
    if not 0 <= low <= high:
        raise cli.UserError(f"a turn range wants 0 <= LOW <= HIGH, got {text!r}")
    return low, high


def make_synthetic(out_dir, n=200, seed=0, num_frames=16, size=112, eval_fraction=0.25, families=None, turn=TURN):
    """Render `n` clips with their depth and write the benchmark (see the module docstring):
    videos/synthetic/<id>.mp4, depth/<id>.npy (float16 metres), train.json (Video-R1 format) and
    eval.jsonl (VSI-Bench format, dataset "synthetic"). `families`: the question families kept (default all
    of SYNTH_FAMILIES; the clips are the same either way). `turn`: the (low, high) yaw rate of a turning clip
    (a low bound near 0 adds turns too slight to tell from going ahead at a glance). Returns a summary dict
    (also summary.json)."""
    families = list(SYNTH_FAMILIES) if not families else list(families)
    unknown = set(families) - set(SYNTH_FAMILIES)
    if unknown:
        raise ValueError(f"unknown question families {sorted(unknown)}; valid: {', '.join(SYNTH_FAMILIES)}")
    out = Path(out_dir)
    (out / "videos" / "synthetic").mkdir(parents=True, exist_ok=True)
    (out / "depth").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, 0x5EED])
    n_eval = int(round(n * eval_fraction))
    actions, counts = [], []
    for size_ in (n_eval, n - n_eval):  # balanced within each split: cycles, shuffled
        actions += [SYNTH_ACTIONS[i % 3] for i in rng.permutation(size_)]
        counts += [1 + i % 4 for i in rng.permutation(size_)]
    train, evaluation, balance = [], [], {}
    slot_counter = {}
    for k in range(n):
        vid = f"synth_{seed}_{k:05d}"
        crng = np.random.default_rng([seed, k])
        action, colour = actions[k], str(crng.choice(list(SYNTH_COLOURS)))
        for _ in range(20):  # resample until the counted objects are all visible
            objects = _synthetic_scene(crng, action, colour, counts[k])
            yaw = {"Turn left": 1, "Turn right": -1, "Go ahead": 0}[action] * crng.uniform(*turn)
            frames, depth, visible = render_synthetic(objects, yaw, crng.uniform(0.15, 0.25), num_frames, size)
            if _count_seen(objects, visible, colour) == counts[k]:
                break
        split = "eval" if k < n_eval else "train"
        slots = {fam: slot_counter.get((split, fam), 0) % 4 for fam in ("appearance_order", "relative_distance")}
        qs = synthetic_questions(crng, objects, visible, action, colour, slots)
        for q in qs:  # the correct letter cycles A-D within each split and family
            slot_counter[(split, q["family"])] = slot_counter.get((split, q["family"]), 0) + 1
        video.write_video(out / "videos" / "synthetic" / f"{vid}.mp4", frames, fps=8.0)
        np.save(out / "depth" / f"{vid}.npy", depth.astype(np.float16))
        for q in (q for q in qs if q["family"] in families):
            balance.setdefault(split, {}).setdefault(q["family"], {}).setdefault(q["answer"], 0)
            balance[split][q["family"]][q["answer"]] += 1
            qid = f"{vid}_{q['family']}"
            ptype = "regression" if q["family"] == "counting" else "multiple choice"
            if split == "eval":
                evaluation.append({"id": qid, "dataset": "synthetic", "scene_name": vid,
                                   "question_type": SYNTH_FAMILIES[q["family"]], "question": q["question"],
                                   "options": q["options"] or None, "ground_truth": q["answer"]})
            else:
                train.append({"problem_id": qid, "problem": q["question"], "data_type": "video",
                              "problem_type": ptype, "options": q["options"], "process": q["process"],
                              "solution": f"<answer>{q['answer']}</answer>",
                              "path": f"./videos/synthetic/{vid}.mp4", "data_source": f"synthetic/{q['family']}"})
    (out / "train.json").write_text(json.dumps(train, indent=1))
    (out / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evaluation))
    summary = {"n_clips": n, "seed": seed, "frames": num_frames, "size": size, "families": families,
               "n_train": len(train), **({"turn": list(turn)} if tuple(turn) != TURN else {}),
               "n_eval": len(evaluation), "answer_balance": balance}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    return summary


def questions_hash(folder) -> str:
    """sha256 of a synthetic benchmark's question files (train.json, eval.jsonl; its videos are rendered from the
    same seeds): what a reproduction's summary records to know its data again (missing files left out)."""
    import hashlib
    h = hashlib.sha256()
    for name in ("train.json", "eval.jsonl"):
        if (Path(folder) / name).is_file():
            h.update((Path(folder) / name).read_bytes())
    return h.hexdigest()


def _option_features(sample, option):
    """What a text-only model can see about one option: its letter, whether it repeats a colour or a
    shape named in the question, whether it repeats the question's own listing."""
    letter, text = data.split_option(option)
    q = sample.question
    return (letter, any(c in q and c in text for c in SYNTH_COLOURS),
            any(s in q and s in text for s in SYNTH_SHAPES), text in q)


def _family(sample):
    """The synthetic family of a sample, from the training file's data_source or the VSI question_type."""
    if sample.task.startswith("synthetic/"):
        return sample.task.split("/", 1)[1]
    return {v: k for k, v in SYNTH_FAMILIES.items()}.get(sample.task, sample.task)


def text_only_baseline(train, evaluation):
    """A blind baseline: it sees the question and options, never the video. Multiple choice: naive
    Bayes over `_option_features`, learnt from the training answers of the same family; numeric: the
    training median. Returns {family: (score, chance)}, chance being 1/k for k options and, for
    numeric answers, the score of the best constant answer on the evaluation set (an oracle)."""
    stats = defaultdict(lambda: defaultdict(Counter))  # family -> feature index -> (value, correct) -> n
    numeric = defaultdict(list)
    for s in train:
        for opt in s.options:
            for j, v in enumerate(_option_features(s, opt)):
                stats[_family(s)][j][(v, data.split_option(opt)[0] == s.answer)] += 1
        if not s.options:
            numeric[_family(s)].append(float(s.answer))

    def loglik(s, opt):
        c = stats[_family(s)]
        return sum(np.log((c[j][(v, True)] + 1) / (c[j][(v, True)] + c[j][(v, False)] + 2))
                   for j, v in enumerate(_option_features(s, opt)))

    results = {}
    for fam in sorted({_family(s) for s in evaluation}):
        group = [s for s in evaluation if _family(s) == fam]
        if group[0].options:
            preds = [data.split_option(max(s.options, key=lambda o: loglik(s, o)))[0] for s in group]
            chance = float(np.mean([1 / len(s.options) for s in group]))
        else:
            preds = [str(np.median(numeric[fam])) if numeric[fam] else "0"] * len(group)
            chance = max(float(np.mean([answers.score(str(c), s.answer, s.problem_type, s.source) for s in group]))
                         for c in range(0, 11))
        acc = float(np.mean([answers.score(p, s.answer, s.problem_type, s.source) for p, s in zip(preds, group)]))
        results[fam] = (acc, chance)
    return results


# --------------------------------------------------------------------------- the street clip (sample footage)
SKY_DEPTH = 1000.0  # metres, depth given to sky pixels (and the far ground)
_SUN = np.array([-0.45, 0.75, -0.5], np.float32) / np.float32(np.linalg.norm([-0.45, 0.75, -0.5]))
_ZENITH, _HORIZON = np.array([0.30, 0.52, 0.86], np.float32), np.array([0.80, 0.86, 0.92], np.float32)
_CORNERS = np.array([[(i >> 2) & 1, (i >> 1) & 1, i & 1] for i in range(8)], bool)
_EDGES = np.array([(a, b) for a in range(8) for b in range(a + 1, 8) if bin(a ^ b).count("1") == 1])


def _noise(rng, size: int, beta: float) -> np.ndarray:
    """Tileable fractal noise in [0, 1] with power spectrum ~ 1 / f**beta."""
    f = np.hypot(np.fft.fftfreq(size)[:, None], np.fft.rfftfreq(size)[None, :])
    f[0, 0] = 1.0
    spec = (rng.normal(size=f.shape) + 1j * rng.normal(size=f.shape)) / f ** (beta / 2)
    spec[0, 0] = 0.0
    n = np.fft.irfft2(spec, s=(size, size))
    return ((n - n.min()) / (n.max() - n.min())).astype(np.float32)


def _sample(tex: np.ndarray, u, v) -> np.ndarray:
    """Bilinear, wrapping lookup of a square texture at texel coordinates (u, v) (1-D)."""
    s, n = tex.shape[0], len(u)
    maps = np.zeros((2, n + (-n) % 1024), np.float32)  # cv2.remap wants 2-D maps, sides < 32767
    np.mod(u, s, out=maps[0, :n], casting="unsafe")
    np.mod(v, s, out=maps[1, :n], casting="unsafe")
    mu, mv = maps.reshape(2, -1, 1024)
    return cv2.remap(tex, mu, mv, cv2.INTER_LINEAR, borderMode=cv2.BORDER_WRAP).ravel()[:n]


def _street(rng, z_min: float, z_max: float):
    """Buildings, tree trunks and lamp posts (boxes) and tree crowns (ellipsoids)."""
    palette = np.array([[0.62, 0.32, 0.25], [0.80, 0.74, 0.62], [0.60, 0.64, 0.68],
                        [0.78, 0.62, 0.36], [0.88, 0.86, 0.80], [0.45, 0.47, 0.50]])
    boxes, crowns = [], []  # (lo, hi, rgb, windowed), (centre, radius, rgb)
    for side in (-1.0, 1.0):
        z = z_min - rng.uniform(0, 10)
        while z < z_max:  # a row of buildings with small gaps and varied setbacks
            length, x0 = rng.uniform(8, 22), 7.3 + rng.uniform(0, 3)
            xs = sorted([side * x0, side * (x0 + rng.uniform(8, 14))])
            rgb = palette[rng.integers(len(palette))] * rng.uniform(0.9, 1.1, 3)
            boxes.append(([xs[0], 0, z], [xs[1], rng.uniform(7, 26), z + length], rgb, True))
            z += length + rng.uniform(0, 4)
        tree_z = np.arange(z_min + rng.uniform(0, 6), z_max, 11.0)
        for z in tree_z + rng.uniform(-2, 2, len(tree_z)):
            x, h = side * 5.6, rng.uniform(2.2, 2.8)
            boxes.append(([x - 0.15, 0, z - 0.15], [x + 0.15, h + 0.5, z + 0.15], (0.36, 0.26, 0.18), False))
            leaf = rng.uniform(0.8, 1.1) * np.array([0.24, 0.42, 0.16])
            crowns.append(([x, h + 1.4, z], rng.uniform(1.3, 1.8), leaf))
        for z in np.arange(z_min + 5, z_max, 24.0):  # lamp post with an arm over the road
            x = side * 4.0
            boxes.append(([x - 0.08, 0, z - 0.08], [x + 0.08, 6.5, z + 0.08], (0.35, 0.36, 0.38), False))
            boxes.append(([min(x, x - side * 1.6), 6.3, z - 0.06], [max(x, x - side * 1.6), 6.45, z + 0.06],
                          (0.35, 0.36, 0.38), False))
    lo, hi, rgb, win = (np.array(a, np.float32) for a in zip(*boxes))
    cen, rad, crgb = (np.array(a, np.float32) for a in zip(*crowns))
    return lo, hi, rgb, win.astype(bool), cen, rad, crgb


def _screen_rects(lo, hi, cam, rot, f, h, w, near):
    """Pixel rectangles (r0, r1, c0, c1) bounding each AABB's projection (clipped to z > near)."""
    pc = (np.where(_CORNERS[None], hi[:, None], lo[:, None]) - cam) @ rot  # camera coords
    a, b = pc[:, _EDGES[:, 0]], pc[:, _EDGES[:, 1]]
    with np.errstate(divide="ignore", invalid="ignore"):  # edges parallel to the image plane
        s = (near - a[..., 2]) / (b[..., 2] - a[..., 2])
        pts = np.concatenate([pc, a + s[..., None] * (b - a)], 1)
    ok = np.concatenate([pc[..., 2] >= near, (s > 0) & (s < 1)], 1)
    z = np.where(ok, pts[..., 2], 1.0)
    u, v = f * pts[..., 0] / z + w / 2, h / 2 - f * pts[..., 1] / z
    c0, c1 = np.where(ok, u, np.inf).min(1), np.where(ok, u, -np.inf).max(1)
    r0, r1 = np.where(ok, v, np.inf).min(1), np.where(ok, v, -np.inf).max(1)
    rects = np.stack([np.floor(r0), np.ceil(r1) + 1, np.floor(c0), np.ceil(c1) + 1], 1)
    rects = np.clip(np.nan_to_num(rects, posinf=0, neginf=0), 0, [h, h, w, w]).astype(int)
    zmin = np.where(ok, pts[..., 2], np.inf).min(1)
    return rects, zmin


def _smooth(e0: float, e1: float, x):
    t = np.clip((x - e0) / (e1 - e0), 0, 1)
    return t * t * (3 - 2 * t)


def _facade(p, axis, base, lam, top, detail):
    """Wall colour with a window grid (upper floors) and shop windows (ground floor)."""
    s, y, side = np.where(axis == 0, p[:, 2], p[:, 0]), p[:, 1], axis != 1
    fy, fs = (y / 3.2) % 1, (s / 2.6) % 1
    upper = (y > 3.2) & (y < top - 0.8) & (fy > 0.3) & (fy < 0.78) & (fs > 0.22) & (fs < 0.78)
    shop = (y > 0.3) & (y < 2.6) & (fs > 0.08) & (fs < 0.92)
    glass = side & (upper | shop)
    refl = np.where(shop, (y - 0.3) / 2.3, (fy - 0.3) / 0.48)
    cell = np.floor(y / 3.2) * 12.99 + np.floor(s / 2.6) * 78.23 + base[0] * 37.7
    rnd = np.modf(np.sin(cell) * 43758.55)[0]  # per-window hash: some panes brighter
    tint = np.array([0.9, 1.0, 1.15], np.float32)  # bluish glass reflecting the sky
    glass_rgb = (0.12 + 0.22 * refl + 0.08 * np.abs(rnd))[:, None] * tint
    wall = base * (0.9 + 0.2 * _sample(detail, s * 8, y * 8))[:, None]
    wall[y < 3.2] *= 0.8
    wall[~side] = 0.42  # flat grey roofs
    return np.where(glass[:, None], glass_rgb * (0.75 + 0.25 * lam[:, None]), wall * lam[:, None])


def _ground(cam, dx, dy, dz, f, detail, fine):
    """Road with lane markings, curbs, tiled sidewalks and grass on the plane y = 0."""
    t = np.minimum(cam[1] / -dy, SKY_DEPTH)
    gx, gz = cam[0] + t * dx, cam[2] + t * dz
    ax, fx, fz = np.abs(gx), t / f, t * t / (f * cam[1])  # pixel footprint across/along the road
    grain = (_sample(fine, gx * 40, gz * 40) - 0.5) * np.clip(1 - t / 25, 0, 1)
    blot = _sample(detail, gx * 4, gz * 4) - 0.5
    asphalt = 0.34 + 0.1 * blot + 0.14 * grain - 0.03 * np.exp(-(np.abs(ax - 1.75) - 0.85) ** 2 / 0.05)
    paint = np.maximum(np.clip((0.075 - ax) / fx + 0.5, 0, 1) * (gz % 9 < 3),
                       np.clip((0.075 - np.abs(ax - 3.25)) / fx + 0.5, 0, 1))
    road = asphalt * (1 - paint) + (0.86 + 0.1 * grain) * paint
    tu, tv = gx / 0.6, gz / 0.6  # 0.6 m paving tiles: checker tint plus grout lines
    checker = ((np.floor(tu) + np.floor(tv)) % 2 * 2 - 1) * np.clip(1 - fz / 0.3, 0, 1)
    grout = np.maximum((np.abs(tu - np.round(tu)) < 0.04) * np.clip(1 - fx / 0.05, 0, 1),
                       (np.abs(tv - np.round(tv)) < 0.04) * np.clip(1 - fz / 0.05, 0, 1))
    walk = (0.6 + 0.04 * checker + 0.06 * blot + 0.08 * grain) * (1 - 0.25 * grout)
    green = np.array([0.27, 0.42, 0.15], np.float32)
    grass = np.clip(0.8 + 0.7 * blot + 0.6 * grain, 0.3, 1.5)[:, None] * green
    grey = np.select([ax < 3.5, ax < 3.65, ax < 7.0], [road, np.full_like(ax, 0.72), walk], 0)
    rgb = np.where((ax < 7.0)[:, None], grey[:, None] * np.array([1.0, 0.99, 0.96], np.float32), grass)
    return rgb, t


def _front_to_back(rects, zmin):
    """(index, pixel window) of each shape whose screen rectangle is not empty, the nearest first."""
    for i in np.argsort(zmin):
        r0, r1, c0, c1 = rects[i]
        if r0 < r1 and c0 < c1:
            yield i, np.s_[r0:r1, c0:c1]


def _render(scene, tex, cam, rot, dirs, f, near=0.05):
    """Ray-cast one frame; returns float RGB in [0, 1] and planar depth in metres."""
    lo, hi, rgb, win, cen, rad, crgb = scene
    cloud, detail, fine = tex
    h, w = dirs.shape[:2]
    d = dirs @ rot.T  # world directions with unit camera-z, so ray parameter = planar depth
    d[d == 0] = 1e-9
    inv = 1 / d
    norm = np.linalg.norm(d, axis=-1)
    dx, dy, dz = d[..., 0], d[..., 1], d[..., 2]
    e = dy / norm  # sine of elevation
    img = _HORIZON + (_ZENITH - _HORIZON) * (np.clip(e / 0.5, 0, 1) ** 0.7)[..., None]
    up = e > 0.005  # clouds on a plane 900 m up
    n = _sample(cloud, (dx[up] * 900 / dy[up] + cam[0]) / 12, (dz[up] * 900 / dy[up] + cam[2]) / 12)
    cover = (_smooth(0.5, 0.8, n) * _smooth(0.01, 0.12, e[up]))[:, None]
    img[up] = img[up] * (1 - cover) + (0.84 + 0.14 * n)[:, None] * cover
    depth = np.full((h, w), SKY_DEPTH, np.float32)
    g = dy < 0
    img[g], depth[g] = _ground(cam, dx[g], dy[g], dz[g], f, detail, fine)
    sky = ~g
    rects, zmin = _screen_rects(lo, hi, cam, rot, f, h, w, near)
    for i, px in _front_to_back(rects, zmin):  # boxes
        D, zb = d[px], depth[px]
        t1, t2 = (lo[i] - cam) * inv[px], (hi[i] - cam) * inv[px]
        tmin, tmax = np.minimum(t1, t2), np.maximum(t1, t2)
        tn = np.maximum(np.maximum(tmin[..., 0], tmin[..., 1]), tmin[..., 2])
        tf = np.minimum(np.minimum(tmax[..., 0], tmax[..., 1]), tmax[..., 2])
        hit = (tn < tf) & (tn > near) & (tn < zb)
        if not hit.any():
            continue
        th, Dh, axis = tn[hit], D[hit], tmin[hit].argmax(-1)
        normal = np.zeros_like(Dh)
        normal[np.arange(len(th)), axis] = -np.sign(Dh[np.arange(len(th)), axis])
        lam = 0.55 + 0.6 * np.clip(normal @ _SUN, 0, None)
        col = (_facade(cam + th[:, None] * Dh, axis, rgb[i], lam, hi[i, 1], detail) if win[i]
               else rgb[i] * lam[:, None])
        img[px][hit], zb[hit], sky[px][hit] = col, th, False
    scale = np.array([1.0, 0.8, 1.0], np.float32)  # crowns are ellipsoids 1.25x taller than wide
    ext = rad[:, None] / scale
    rects, zmin = _screen_rects(cen - ext, cen + ext, cam, rot, f, h, w, near)
    for j, px in _front_to_back(rects, zmin):  # tree crowns
        D, zb = d[px], depth[px]
        Ds, oc = D * scale, (cam - cen[j]) * scale
        a, b = (Ds * Ds).sum(-1), Ds @ oc
        disc = b * b - a * (oc @ oc - rad[j] ** 2)
        t = (-b - np.sqrt(np.maximum(disc, 0))) / a
        hit = (disc > 0) & (t > near) & (t < zb)
        if not hit.any():
            continue
        th = t[hit]
        nrm = (cam + th[:, None] * D[hit] - cen[j]) * scale ** 2
        nrm /= np.linalg.norm(nrm, axis=-1, keepdims=True)
        leaf = _sample(detail, (nrm[:, 0] + nrm[:, 2]) * 25 + 37 * j, nrm[:, 1] * 25)
        lam = 0.45 + 0.65 * np.clip(nrm @ _SUN, 0, None)
        img[px][hit] = crgb[j] * ((0.5 + leaf) * lam)[:, None]
        zb[hit], sky[px][hit] = th, False
    haze = np.where(sky, np.float32(0), 1 - np.exp(-depth * norm / 450))[..., None]
    return img * (1 - haze) + _HORIZON * haze, depth


def sample_clip(num_frames: int = 16, height: int = 256, width: int = 256, seed: int = 0,
                supersample: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Procedural street scene seen from a camera moving down the road.

    Returns ``(frames, depth)``: uint8 ``[T, H, W, 3]`` RGB and float32 ``[T, H, W]``
    planar depth in metres (sky: ``SKY_DEPTH``).  The camera (1.5 m high, 70 degree
    field of view on the longer side) drives 0.6 m per frame in the right lane and
    sways and yaws gently.  ``supersample`` renders at that factor and area-averages
    (default 2 up to 320x320 pixels, else 1); depth takes the nearest sub-sample.
    """
    if num_frames < 1 or height < 1 or width < 1:
        raise ValueError(f"need positive num_frames/height/width, got {num_frames}/{height}/{width}")
    rng = np.random.default_rng(seed)
    scene = _street(rng, -30.0, 0.6 * num_frames + 220.0)
    tex = (_noise(rng, 256, 3.2), _noise(rng, 256, 2.0), _noise(rng, 256, 0.3))
    phase = rng.uniform(0, 2 * np.pi)
    ss = int(supersample or (2 if height * width <= 320 * 320 else 1))
    hs, ws = height * ss, width * ss
    f = 0.5 * max(hs, ws) / math.tan(math.radians(35))
    u, v = np.meshgrid((np.arange(ws) + 0.5 - ws / 2) / f, (hs / 2 - np.arange(hs) - 0.5) / f)
    dirs = np.stack([u, v, np.ones_like(u)], -1).astype(np.float32)
    frames = np.empty((num_frames, height, width, 3), np.uint8)
    depth = np.empty((num_frames, height, width), np.float32)
    for i in range(num_frames):
        yaw, pitch = 0.06 * math.sin(phase + 0.25 * i), -0.06
        cy, sy, cp, sp = math.cos(yaw), math.sin(yaw), math.cos(pitch), math.sin(pitch)
        rot = (np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
               @ np.array([[1, 0, 0], [0, cp, -sp], [0, sp, cp]])).astype(np.float32)
        cam = np.array([1.75 + 0.3 * math.sin(0.5 * phase + 0.15 * i), 1.5 + 0.02 * math.sin(1.3 * i),
                        0.6 * i], np.float32)
        img, dep = _render(scene, tex, cam, rot, dirs, f)
        img = (np.clip(img, 0, 1) * 255).astype(np.float32)
        if ss > 1:
            img = cv2.resize(img, (width, height), interpolation=cv2.INTER_AREA)
            dep = dep.reshape(height, ss, width, ss).min((1, 3))
        frames[i] = np.clip(img + 0.5, 0, 255).astype(np.uint8)
        depth[i] = dep
    return frames, depth


PHOTOS = ("rocket", "camera")  # scikit-image's bundled outdoor photographs (no download)
# scikit-image's bundled photographs by the kind of footage they stand for (no download): under a sky, close-ups
# with no sky (a cup on a cafe table, a cat, a portrait: what an indoor or hand-held camera sees near), and
# surfaces seen from above (what a drone looking down sees)
PHOTO_KINDS = {"rocket": "sky", "camera": "sky", "coffee": "close-up", "chelsea": "close-up",
               "astronaut": "close-up", "grass": "top-down", "gravel": "top-down", "brick": "top-down"}


def _photo(image) -> np.ndarray:
    """An RGB uint8 [H, W, 3] photograph: the array given (grey is stacked to RGB) or a bundled one by name."""
    if isinstance(image, str):
        if image not in PHOTO_KINDS:
            raise ValueError(f"unknown photo {image!r}; bundled: {', '.join(PHOTO_KINDS)}")
        import skimage.data

        image = getattr(skimage.data, image)()
    img = np.asarray(image)
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, 2)
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"need a uint8 [H, W] or [H, W, 3] image, got {img.dtype} {img.shape}")
    return img


def photo_clip(image="rocket", num_frames: int = 16, size: int = 224, zoom: float = 0.012,
               pan: tuple = (0.010, 0.004)) -> np.ndarray:
    """A clip of real photographic content: a smooth pan and zoom over one still photograph.

    ``image`` is an RGB or grey array (uint8 [H, W(, 3)]) or the name of one of scikit-image's bundled
    photographs (``PHOTO_KINDS``: ``rocket``, a launch pad under a dusk sky; ``camera``, the cameraman on a lawn
    under a bright grey sky; close-ups without sky; grey surfaces that read as top-down views; scikit-image is
    imported only then). Frame t is a square window of side
    ``s_t = 0.9 min(H, W) (1 - zoom t)`` whose centre moves by ``pan`` (fractions of W and H) per frame,
    resampled to ``size`` x ``size`` (anti-aliased, sub-pixel: the motion is smooth). Returns uint8
    [num_frames, size, size, 3]. No depth comes with it: the engine's proxy is what a real clip gets."""
    img = _photo(image)
    if num_frames < 1 or size < 8:
        raise ValueError(f"need num_frames >= 1 and size >= 8, got {num_frames}, {size}")
    H, W = img.shape[:2]
    t = np.arange(num_frames) - (num_frames - 1) / 2  # centred on the middle frame
    sides = 0.9 * min(H, W) * (1 - zoom * (t + (num_frames - 1) / 2))
    blur = max(0.0, 0.45 * (float(sides.max()) / size - 1))  # pre-filter for the downscale
    src = cv2.GaussianBlur(img, (0, 0), blur) if blur > 0.05 else img
    out = np.empty((num_frames, size, size, 3), np.uint8)
    for i, (ti, s) in enumerate(zip(t, sides)):
        cx = np.clip(W / 2 + pan[0] * W * ti, s / 2, W - s / 2)
        cy = np.clip(H / 2 + pan[1] * H * ti, s / 2, H - s / 2)
        k = s / size  # output pixel -> source pixel
        m = np.float32([[k, 0, cx - s / 2 + 0.5 * k - 0.5], [0, k, cy - s / 2 + 0.5 * k - 0.5]])
        out[i] = cv2.warpAffine(src, m, (size, size), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                                borderMode=cv2.BORDER_REFLECT_101)
    return out


def write_sample_video(path, fps: float = 8.0, **kw) -> str:
    """Write :func:`sample_clip` (``kw`` are its arguments) as an mp4; returns the path."""
    return video.write_video(path, sample_clip(**kw)[0], fps=fps)


# --------------------------------------------------------------------------- command line
def main(argv=None):
    ap = cli.ArgumentParser(description="Render the synthetic embodied benchmark (videos, depth, "
                                             "Video-R1 train.json, VSI-Bench eval.jsonl).")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--n", type=int, default=200, help="number of clips")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--frames", type=int, default=16, help="frames per clip")
    ap.add_argument("--size", type=int, default=112, help="frame side in pixels")
    ap.add_argument("--eval-fraction", type=float, default=0.25, help="share of clips in eval.jsonl")
    ap.add_argument("--turn", default=",".join(map(str, TURN)), help="a turning clip's yaw rate range, LOW,HIGH "
                    "(rad/frame)")
    cli.add_debug_flag(ap)
    args = ap.parse_args(argv)
    cli.out_dir(args.out)
    summary = make_synthetic(args.out, n=args.n, seed=args.seed, num_frames=args.frames, size=args.size,
                             eval_fraction=args.eval_fraction, turn=parse_turn(args.turn))
    print(json.dumps({k: v for k, v in summary.items() if k != "answer_balance"}))
    print("answer balance:", json.dumps(summary["answer_balance"], sort_keys=True))
    out = Path(args.out)
    blind = text_only_baseline(data.load_video_r1(out / "train.json")[0],
                               data.load_vsibench(out / "eval.jsonl", out / "videos")[0])
    print("text-only baseline on eval (score, chance or best constant):",
          json.dumps({k: [round(a, 3), round(c, 3)] for k, (a, c) in sorted(blind.items())}))
    return 0


if __name__ == "__main__":
    cli.run(main)
