"""Embodied-R's perception stage on a CPU: the classical-vision backend ("cv", perceive.make_perceiver), with
perceive.py's interface."""
from __future__ import annotations

import re

import numpy as np

from extensions.embodied_r.backend import ACTIONS, as_images

# --------------------------------------------------------------------------- classical-vision backend (CPU stand-in)
# A model-free backend with the interface above, so that Embodied-R's pipeline (perception text -> small
# text LM, Sec. 2.2-2.3) can run and be compared offline on a laptop CPU. It is not the paper's
# Qwen2.5-VL-72B: it sees saturated colour blobs and the global image motion, nothing else, and it
# answers in a small fixed vocabulary (:func:`cv_corpus`). It reads only the pixels it is given (never
# dataset metadata), so corrupted frames (night, fog, occluders, rain, shake: perturb.py) degrade its
# text the way they degrade the images.

# Hue bins on OpenCV's 0-180 hue circle (degrees / 2), [lo, hi); red wraps around 0.
_CV_HUE_BINS = (("red", 0, 8), ("orange", 8, 20), ("yellow", 20, 35), ("green", 35, 85),
                ("blue", 85, 128), ("purple", 128, 165), ("red", 165, 180))
CV_COLOURS = ("red", "orange", "yellow", "green", "blue", "purple")
_CV_HUE_LUT = np.zeros(256, np.uint8)  # OpenCV hue (0-179) -> index into CV_COLOURS
_CV_HUE_LUT[:180] = [next(CV_COLOURS.index(n) for n, lo, hi in _CV_HUE_BINS if lo <= h < hi) for h in range(180)]
CV_SHAPES = ("tall", "flat", "wide", "boxy")
_CV_MIN_SAT = 0.45      # HSV saturation: a light-blue sky is ~0.36, grey-green ground ~0.25, haze ~0.1
_CV_MIN_CHROMA = 40     # max - min of RGB (0-255): dark, noisy pixels with a high "saturation" are not colour
_CV_MIN_VALUE = 64      # HSV value (0-255): darker is shade or night, whatever its hue (painted faces: > 85)
_CV_MAX_AREA = 0.30     # a saturated region over 30% of the frame (or across 90% of its width) is background
_CV_NEAR_ROW = 0.5      # a bottom edge below this fraction of the height is "near" (ground-plane cue)
_CV_STILL = 0.004       # flow under this many widths (half a pixel at 112 px) is no motion
_CV_LANDMARK_SHIFT = 0.035   # landmarks shifted this many widths: a rotation, when flow saw much less
_CV_LANDMARK_GROWTH = 0.08   # landmarks grown (shrunk) this much, not shifted: forward (backward)
_CV_FARNEBACK = (0.6, 5, 21, 3, 7, 1.5, 0)  # pyr_scale, levels, winsize, iterations, poly_n, poly_sigma, flags
# Question words that name the kind of object a shape word describes (Relevant:, when no colour is named).
_CV_SHAPE_NOUNS = {"tall": ("tall", "pillar", "pillars", "pole", "poles", "tower", "towers", "column", "post"),
                   "flat": ("flat", "slab", "slabs", "mat", "plate", "board", "rug"),
                   "wide": ("wide", "block", "blocks", "bench", "wall", "car", "cars"),
                   "boxy": ("boxy", "cube", "cubes", "box", "boxes", "crate")}


def _cv_image(im) -> np.ndarray:
    a = np.asarray(im)
    if a.ndim != 3 or a.shape[-1] != 3 or a.dtype != np.uint8:
        raise ValueError(f"images must be uint8 [H, W, 3] arrays, got {a.dtype} {a.shape}")
    return np.ascontiguousarray(a)


def _cv_shape(w: int, h: int) -> str:
    """A shape word from a bbox's aspect ratio h / w."""
    r = h / max(w, 1)
    return "tall" if r >= 1.6 else "flat" if r <= 0.45 else "wide" if r <= 0.8 else "boxy"


def colour_blobs(image, min_area: int | None = None) -> list[dict]:
    """The saturated connected regions of one RGB uint8 [H, W, 3] frame, each of one basic colour.

    The frame is first white-balanced (grey world: each channel scaled to the frame's mean grey, gains
    in [0.5, 2]), so that a colour cast (dusk, tinted light) is not taken for coloured objects. A pixel
    is colour when its HSV saturation is >= 0.45, its chroma (max - min of RGB) >= 40 and its value
    >= 64: grey or grey-green ground, haze, fog, a light-blue sky (saturation ~0.36), shade and dark
    sensor noise are not.
    Colour pixels go to hue bins (red, orange, yellow, green, blue, purple); the 8-connected regions of
    each bin are the blobs. Regions under ``min_area`` pixels (default max(4, 0.1% of the frame): 4 px at
    56x56, 13 px at 112x112) are noise, regions over 30% of the frame or across 90% of its width are
    background (a tinted sky or ground, a wall), and one-pixel-thin
    regions touching a larger region of a neighbouring hue are its anti-aliased edge. Each blob is a dict:
    ``colour``, ``bbox`` (x, y, w, h) in pixels, ``area`` (fraction of the frame), ``cx`` (centroid x in
    [0, 1]), ``shape`` (bbox aspect ratio h / w: "tall" >= 1.6, "flat" <= 0.45, "wide" <= 0.8, else
    "boxy"), ``position`` ("left" / "centre" / "right": thirds of the width) and ``distance`` ("near"
    when the bottom edge lies in the lower half of the frame, else "far": on a ground plane, lower in
    the image is nearer). Sorted left to right."""
    import cv2

    img = _cv_image(image)
    H, W = img.shape[:2]
    if min_area is None:
        min_area = max(4, round(0.001 * H * W))
    mean = np.asarray(cv2.mean(img)[:3]) + 1e-3  # grey-world white balance: a colour cast is not a colour
    gain = np.clip(mean.mean() / mean, 0.5, 2.0)
    lut = np.clip(np.arange(256)[:, None] * gain[None, :] + 0.5, 0, 255).astype(np.uint8).reshape(256, 1, 3)
    hsv = cv2.cvtColor(cv2.LUT(img, lut), cv2.COLOR_RGB2HSV)
    sat, val = hsv[..., 1].astype(np.int32), hsv[..., 2].astype(np.int32)
    colourful = ((sat >= round(_CV_MIN_SAT * 255)) & (val >= _CV_MIN_VALUE)
                 & (sat * val >= _CV_MIN_CHROMA * 255))  # chroma = max - min = S V / 255
    bins = np.where(colourful, _CV_HUE_LUT[hsv[..., 0]], 255).astype(np.uint8)
    comps, size_of = [], np.zeros((H, W), np.int32)  # size_of: each colour pixel's region size
    for c in np.unique(bins):
        if c == 255:
            continue
        n, labels, stats, cents = cv2.connectedComponentsWithStats((bins == c).astype(np.uint8), connectivity=8)
        size_of[bins == c] = stats[labels[bins == c], cv2.CC_STAT_AREA]
        comps += [(int(c), labels, i, stats[i], cents[i]) for i in range(1, n)]
    blobs = []
    for c, labels, i, st, cent in comps:
        x, y, w, h, area = (int(v) for v in st)
        if area < min_area or area > _CV_MAX_AREA * H * W or w >= 0.9 * W:  # (a band across the view: sky, ground)
            continue
        if min(w, h) <= 1 and _cv_fringe(bins, size_of, labels, i, c, (x, y, w, h)):
            continue
        cx = (float(cent[0]) + 0.5) / W
        blobs.append({"colour": CV_COLOURS[c], "bbox": (x, y, w, h), "area": area / (H * W), "cx": cx,
                      "shape": _cv_shape(w, h),
                      "position": "left" if cx < 1 / 3 else "right" if cx > 2 / 3 else "centre",
                      "distance": "near" if (y + h) / H > _CV_NEAR_ROW else "far"})
    blobs.sort(key=lambda b: (b["cx"], b["colour"], b["bbox"]))
    return blobs


def _cv_fringe(bins, size_of, labels, i, c, bbox) -> bool:
    """Whether region ``i`` of colour ``c`` (one pixel thin) is the anti-aliased edge of a larger region
    of a neighbouring hue, which it touches (red against a grey-green ground blends to orange)."""
    import cv2

    x, y, w, h = bbox
    y0, y1, x0, x1 = max(0, y - 1), min(bins.shape[0], y + h + 1), max(0, x - 1), min(bins.shape[1], x + w + 1)
    mask = (labels[y0:y1, x0:x1] == i).astype(np.uint8)
    ring = (cv2.dilate(mask, np.ones((3, 3), np.uint8)) > 0) & (mask == 0)
    near, sizes = bins[y0:y1, x0:x1][ring], size_of[y0:y1, x0:x1][ring]
    n = len(CV_COLOURS)
    return bool(np.any((sizes > int(mask.sum())) & ((near == (c + 1) % n) | (near == (c - 1) % n))))


def ego_motion(prev, cur) -> tuple[str, float]:
    """The camera's motion from frame ``prev`` to frame ``cur`` (RGB uint8 [H, W, 3]): ``(action,
    confidence)``, the action one of :data:`ACTIONS` (Embodied-R Sec. 2.2: the action inferred from the
    change between two key frames), the confidence in [0, 1] (how consistent the evidence is).

    Two cues, both from the pixels alone:

    * dense optical flow (Farneback, grayscale) of the textured pixels, fitted by u = a + d_u x and
      v = b + d_v y (x, y from the image centre, in widths): a is the common horizontal shift, b the
      vertical one, d_u + d_v the divergence. Fitting the divergence apart keeps the radial flow of a
      forward motion (whose focus is at the horizon, not the centre) out of a and b. Decision, first
      match: a horizontal shift -> rotation; expansion / contraction -> "move forward" / "move backward";
      a vertical shift -> tilt; else "stay". Confidence: the share of textured pixels whose flow agrees
      with the decision (for "stay": whose flow is negligible).
    * landmarks: colour blobs (:func:`colour_blobs`) matched by colour between the frames. A blob that
      grows by s (sqrt of its area ratio) moves outward by (s - 1) x under a forward motion; the rest of
      its displacement is the rotation. They work when the frames are far apart, where flow on a repetitive
      ground texture (a checkerboard, tiles) locks onto the wrong period. They overrule the flow only
      when clear: a shift of >= 3.5% of the width (twice what flow saw, or the other way), or a growth
      of >= 8% with no shift (seen on >= 3 blobs when flow says rotation). Confidence: the share of
      matched blobs that agree.

    Signs: when the camera turns left, image content moves RIGHT (a > 0) -> "rotate left", and content
    moving left -> "rotate right"; content moving DOWN -> "tilt up", up -> "tilt down". A turn made while
    walking forward is a rotation (the turn is the decision). Sideways and vertical moves ("move left",
    "move up"...) are never reported: without depth one camera cannot tell them from rotation and tilt."""
    a0, a1 = _cv_image(prev), _cv_image(cur)
    return _ego_motion(a0, a1, colour_blobs(a0), colour_blobs(a1))


def _ego_motion(prev, cur, blobs0, blobs1) -> tuple[str, float]:
    action, conf, shift_flow = _flow_motion(prev, cur)
    lm = _landmark_motion(blobs0, blobs1, prev.shape[1])
    if lm is None:
        return action, conf
    shift, growth, n_growing, agree = lm
    if abs(shift) >= _CV_LANDMARK_SHIFT and (abs(shift) >= 2 * abs(shift_flow) or shift * shift_flow < 0):
        return ("rotate left" if shift > 0 else "rotate right"), agree
    if abs(shift) < 0.5 * _CV_LANDMARK_SHIFT and abs(growth) >= _CV_LANDMARK_GROWTH:
        move = "move forward" if growth > 0 else "move backward"
        if action != move and n_growing >= (3 if action.startswith("rotate") else 1):
            return move, agree
    return action, conf


def _landmark_motion(blobs0, blobs1, width):
    """(rotation shift in widths, growth, how many blobs show that growth, agreement) from the blobs
    matched by colour (the same number of that colour in both frames, paired left to right; blobs cut
    by a side edge skipped), or None when nothing matches. Growth is the sqrt of the area ratio (less
    quantised than a small bbox's height)."""
    est = []
    for c in CV_COLOURS:
        p = [b for b in blobs0 if b["colour"] == c]
        q = [b for b in blobs1 if b["colour"] == c]
        if not p or len(p) != len(q):
            continue
        for u, v in zip(p, q):
            if any(b["bbox"][0] <= 0 or b["bbox"][0] + b["bbox"][2] >= width for b in (u, v)):
                continue
            s = (v["area"] / u["area"]) ** 0.5
            est.append(((v["cx"] - 0.5) - s * (u["cx"] - 0.5), s - 1.0))
    if not est:
        return None
    e = np.asarray(est)
    shift, growth = float(np.median(e[:, 0])), float(np.median(e[:, 1]))
    n_growing = int(np.sum((np.sign(e[:, 1]) == np.sign(growth)) & (np.abs(e[:, 1]) >= _CV_LANDMARK_GROWTH / 2)))
    col = e[:, 0] if abs(shift) >= _CV_LANDMARK_SHIFT else e[:, 1]
    agree = round(float(np.mean(np.sign(col) == np.sign(np.median(col)))), 3)
    return shift, growth, n_growing, agree


def _flow_motion(prev, cur) -> tuple[str, float, float]:
    """(action, confidence, horizontal shift in widths) from Farneback flow (see :func:`ego_motion`)."""
    import cv2

    g0 = cv2.cvtColor(prev, cv2.COLOR_RGB2GRAY)
    g1 = cv2.cvtColor(cur, cv2.COLOR_RGB2GRAY)
    if g1.shape != g0.shape:
        g1 = cv2.resize(g1, (g0.shape[1], g0.shape[0]), interpolation=cv2.INTER_AREA)
    H, W = g0.shape
    if max(H, W) != 96:  # flow at 96 px on the long side: enough support per pyramid level, and fast
        k = 96.0 / max(H, W)
        size = (max(8, round(W * k)), max(8, round(H * k)))
        interp = cv2.INTER_LINEAR if k > 1 else cv2.INTER_AREA
        g0, g1 = cv2.resize(g0, size, interpolation=interp), cv2.resize(g1, size, interpolation=interp)
        H, W = g0.shape
    flow = cv2.calcOpticalFlowFarneback(g0, g1, None, *_CV_FARNEBACK) / W  # in widths
    # Textured pixels only (a flat sky or face carries no motion), away from the border.
    eig = cv2.cornerMinEigenVal(g0.astype(np.float32) / 255.0, 5)
    m = max(2, round(0.04 * min(H, W)))
    valid = np.zeros((H, W), bool)
    valid[m:H - m, m:W - m] = True
    valid &= eig > max(1e-4, 0.05 * float(eig.max()))
    if valid.sum() < 16:  # a blank, black or fogged-out pair: nothing seen to move
        return "stay", 0.0, 0.0
    ys, xs = np.nonzero(valid)
    x, y = (xs + 0.5 - W / 2) / W, (ys + 0.5 - H / 2) / W
    u, v = flow[..., 0][valid], flow[..., 1][valid]
    a, du = _robust_line(x, u)
    b, dv = _robust_line(y, v)
    div = 0.25 * 0.5 * (du + dv)  # the radial flow a quarter width away from the focus of expansion
    if abs(a) >= _CV_STILL and abs(a) >= 0.5 * abs(div) and abs(a) >= 0.7 * abs(b):
        action = "rotate left" if a > 0 else "rotate right"
        agree = np.sign(u - du * x) == np.sign(a)
    elif abs(div) >= _CV_STILL:
        action = "move forward" if div > 0 else "move backward"
        x0 = -a / du if abs(du) > 1e-9 else 0.0
        y0 = -b / dv if abs(dv) > 1e-9 else 0.0
        agree = np.sign(u * (x - x0) + v * (y - y0)) == np.sign(div)
    elif abs(b) >= _CV_STILL:
        action = "tilt up" if b > 0 else "tilt down"
        agree = np.sign(v - dv * y) == np.sign(b)
    else:
        action = "stay"
        agree = np.hypot(u, v) < _CV_STILL
    return action, round(float(np.mean(agree)), 3), a


def _robust_line(x, y, iters: int = 3) -> tuple[float, float]:
    """(intercept, slope) of y ~ c + s x: least squares, reweighted (Huber) against outliers."""
    A = np.stack([np.ones_like(x), x], 1)
    w = np.ones_like(x)
    coef = np.zeros(2)
    for _ in range(iters):
        sw = np.sqrt(w)
        coef = np.linalg.lstsq(A * sw[:, None], y * sw, rcond=None)[0]
        r = np.abs(y - A @ coef)
        scale = 1.4826 * float(np.median(r)) + 1e-9
        w = np.minimum(1.0, 1.5 * scale / np.maximum(r, 1e-12))
    return float(coef[0]), float(coef[1])


def _blob_phrase(b: dict) -> str:
    where = "in the centre" if b["position"] == "centre" else f"on the {b['position']}"
    article = "an" if b["colour"][0] in "aeiou" else "a"
    return f"{article} {b['colour']} {b['shape']} object {where}, {b['distance']}"


def _question_of(prompt: str) -> str:
    """The question in one of our prompts (the "Question:" line up to the next blank line), else the
    whole prompt."""
    m = re.search(r"^[ \t]*Question:[ \t]*(.*?)(?:\n[ \t]*\n|\Z)", str(prompt or ""), re.MULTILINE | re.DOTALL)
    return m.group(1) if m else str(prompt or "")


class CVPerceiver:
    """Classical-vision perception backend (OpenCV + numpy, no model): a CPU stand-in for Embodied-R's
    frozen VLM (Sec. 2.2), with the same call shape ``backend(prompt, images) -> str``.

    One image (frame 0): the blobs of :func:`colour_blobs` (at most ``max_objects``, the largest, listed
    left to right) as "a red tall object on the left, near; a blue boxy object in the centre, far", or
    "no distinct objects". Two images (previous, current; of more, the last two): the three lines
    :data:`PAIR_PROMPT` asks for (Eq. 1's action, new information, question-related content):
    ``Action:`` :func:`ego_motion`'s action; ``New:`` the current frame's blobs of a colour seen more
    often than in the previous frame (those farthest from the previous frame's blobs of that colour;
    every blob of a colour the previous frame lacked), or "nothing new"; ``Relevant:`` the current
    frame's blobs whose colour the question names (when it names none: whose kind of shape it names,
    e.g. "pillar" -> tall), or "none". The question is read from the prompt's "Question:" line (the
    whole prompt when there is none). Deterministic; a few milliseconds a call at 112x112. Every word it
    writes is in :func:`cv_corpus`. ``name`` = "cv:v1" (the cache key; bump the version when the output
    changes). Same-colour objects that touch in the image merge into one blob, so counts run low."""

    version = "v1"

    def __init__(self, max_objects: int = 8):
        self.max_objects = int(max_objects)
        self.name = f"cv:{self.version}" + (f"|max_objects={self.max_objects}" if self.max_objects != 8 else "")

    def __repr__(self):
        return f"CVPerceiver(max_objects={self.max_objects})"

    def _list(self, blobs) -> str:
        keep = sorted(sorted(blobs, key=lambda b: -b["area"])[:self.max_objects], key=lambda b: b["cx"])
        return "; ".join(_blob_phrase(b) for b in keep)

    def __call__(self, prompt: str, images) -> str:
        frames = as_images(images)
        if not frames:
            raise ValueError("CVPerceiver needs one or two images")
        cur = frames[-1]
        blobs = colour_blobs(cur)
        if len(frames) == 1:
            return self._list(blobs) or "no distinct objects"
        prev = frames[-2]
        before = colour_blobs(prev)
        action, _ = _ego_motion(prev, cur, before, blobs)
        new = []
        for c in CV_COLOURS:
            now = [b for b in blobs if b["colour"] == c]
            then = [b["cx"] for b in before if b["colour"] == c]
            if len(now) > len(then):  # the extra ones: those farthest from where that colour was
                now.sort(key=lambda b: -min((abs(b["cx"] - x) for x in then), default=1.0))
                new += now[:len(now) - len(then)]
        q = _question_of(prompt).lower()
        named = [c for c in CV_COLOURS if re.search(rf"\b{c}\b", q)]
        if named:
            relevant = [b for b in blobs if b["colour"] in named]
        else:
            kinds = {s for s, nouns in _CV_SHAPE_NOUNS.items() if any(re.search(rf"\b{w}\b", q) for w in nouns)}
            relevant = [b for b in blobs if b["shape"] in kinds]
        return (f"Action: {action}\nNew: {self._list(new) or 'nothing new'}\n"
                f"Relevant: {self._list(relevant) or 'none'}")


def cv_corpus() -> list[str]:
    """Strings that together hold every word :class:`CVPerceiver` can write (for a tiny tokenizer)."""
    blobs = [f"{'an' if c[0] in 'aeiou' else 'a'} {c} {s} object {where}, {d}" for c, s, where, d in
             zip(CV_COLOURS * 2, CV_SHAPES * 3, ("on the left", "in the centre", "on the right") * 4,
                 ("near", "far") * 6)]
    return (["; ".join(blobs[:6]), "; ".join(blobs[6:]), "no distinct objects"]
            + [f"Action: {a}\nNew: nothing new\nRelevant: none" for a in ACTIONS])
