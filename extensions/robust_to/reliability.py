"""Per-frame reliability and question-aware frame selection (Robust-TO's first stage).

Robust-TO ("Blind Trust Problem") scores every frame for trustworthiness, combines that with the
frame's relevance to the question into a *reliability-relevance score*, hands only the selected
frames to the perception tools, and shows the planner a *disturbance profile* of those frames,
"blur={avg_blur}, brightness={avg_bright}, occlusion={avg_occl}" (decomposer prompt). Its synthesis
prompt sorts evidence into three tiers with fixed thresholds on the same scale:

    HIGH:   confidence >= 0.7 and disturbance < 0.3
    LOW:    confidence <  0.3 or  disturbance >= 0.7
    MEDIUM: everything else

The paper gives no formulas for any of the scores; everything below that is not one of those
quoted facts is our reading, marked "(ours)". Our mappings are calibrated to the tier thresholds:
a clean frame scores < 0.3 on every axis, a frame a person would call badly degraded >= 0.7.

Disturbance, per frame, four axes in [0, 1] (0 = clean, 1 = fully disturbed), all (ours). Helpers:
ramp(x; lo -> hi) = clip((x - lo) / (hi - lo), 0, 1), and knee(x; lo -> hi), which is 0 at x <= 0,
rises gently to 0.1 at lo (deviations a clean frame may have: they add little, but a worse frame
still ranks worse) and then linearly to 1 at hi.

* blur       Crete et al.'s re-blur ratio B ("The blur effect", 2007): re-blur the luminance with a
             ~9 px box filter along one direction and measure how much of the gradient along that
             direction survives, B = 1 - sum max(0, |D f| - |D f_b|) / sum |D f| over the edge pixels
             (|D f| > 0.25 x its 99th percentile), maximum over 0, 90, 45 and 135 degrees (so motion
             blur in any direction counts). B is a ratio of gradient energies, so it does not depend
             on contrast or exposure; sharp content gives B ~0.22-0.35, a Gaussian blur of sigma 1.6 px
             ~0.6, of 2.4 px ~0.78. Absolute part a = knee(B - 0.22; 0.10 -> 0.60) (B = 0.32 -> 0.1,
             B >= 0.82 -> 1). Clip-relative part r = ramp(B - B_ref; 0.06 -> 0.40), B_ref the 25th
             percentile of B over the clip: its sharpest frames show how sharp this camera and this
             scene get, which normalises away content (a frame far softer than them is blurred even
             when the absolute B is middling). blur = max(a, r): a uniformly blurred clip (r ~ 0) is
             caught by a, a frame much softer than its neighbours by r.
* brightness luminance Y in [0, 1]: exposure error in stops e = log2(mean Y / 0.45); under =
             knee(-e; 0.3 -> 2.2), over = knee(e; 0.35 -> 1.1); clipping c = knee(fraction of Y <= 0.02
             or >= 0.98; 0.05 -> 0.5); low contrast l = knee(0.45 - (p95 - p5 of Y); 0.15 -> 0.40).
             brightness = 1 - (1 - under)(1 - over)(1 - c)(1 - l) (noisy-or). Fog and haze land here
             (whiter and flatter), as does glare (clipping).
* occlusion  the share of the frame covered by something fixed to the camera. On a <= 64 px copy whose
             contrast is normalised per frame (p2..p98 -> 0..1), crushed (Y <= 0.06) and blown-out
             (>= 0.98) pixels left to the brightness axis:
             - static pixels: within 0.006 + sigma_n (the copy's noise, Immerkaer) of their value in
               >= 75% of the frames at least T/8 away (a checkerboard sliding past matches in only
               ~half), or in >= 75% of the T/4 frames just before, or just after (an occluder over
               part of the clip);
             - candidate regions: connected static regions >= 2% of the frame, less the sky (static
               pixels in the top 55% connected to the top border, or bands across the whole width);
             - each region is weighted by how persistent the edges on its outline are (the fraction of
               frames, over the clip or the T/4 before / after, with an edge there; ramp 0.6 -> 0.95):
               a lens obstruction has a fixed outline, a uniform surface that only looks static
               (asphalt, a wall, a checker square) is bounded by edges that move;
             - trust in the temporal cue = ramp(share of the textured scene outside the regions that
               changed; 0.3 -> 0.6): a still or slow camera leaves too much unchanged to tell. For the
               untrusted part, the spatial cue: untextured regions (smoothed gradient < 0.35 x the
               clip's median) >= 2% touching the bottom or a side border, at half weight.
             A = trust x sum(weight x area) + (1 - trust) x 0.5 x sum(area of border regions);
             occlusion = 1 - exp(-A / 0.2) (a quarter of the frame covered -> 0.71).
             Known limits (measured, see the tests' report): a translucent lens smudge or raindrop
             (perturb.py's static "smudge" and "raindrop" kinds) lets the moving scene through and is
             hardly seen; moving occluders
             (perturb.py's "dynamic") are not static and are not seen; a slow camera over large
             uniform surfaces can read as occluded (up to ~0.5 on checkerboard clips at 0.02 rad/frame).
* noise      Immerkaer's operator N = [[1,-2,1],[-2,4,-2],[1,-2,1]] ("Fast noise variance estimation",
             1996; it cancels constant and linear image content, and for white noise of std sigma its
             response has std 6 sigma), robust version: sigma = 1.4826 median |N * Y| / 6 over the
             flattest 40% of the unclipped pixels (by the gradient of a Gaussian-smoothed copy), in
             grey levels (0-255) of luminance. noise = 1 - exp(-max(0, sigma - 1) / 8):
             sigma 2 -> 0.12, 5 -> 0.39, 10 -> 0.68, 17 -> 0.86.

Frames whose long side exceeds 256 px are area-downscaled to 256 px first (ours): the scores are
per-frame-size quantities (and the work per frame stays bounded).

reliability = 1 - min(1, ||d||_4), d the four disturbances (ours): a soft maximum, so one bad axis
decides (a 4-norm of one non-zero value is that value) and several moderate ones add up a little
(four axes at 0.3 give 0.42). It keeps the tier semantics: reliability > 0.7 iff the combined
disturbance is < 0.3.

Relevance in [0, 1] (see :func:`relevance`), and the reliability-relevance score (ours)

    score = reliability^alpha * relevance^(1 - alpha),   alpha = 0.5 by default,

a weighted geometric mean: a frame that is unusable (reliability 0) is never chosen however relevant,
and with no information on relevance (all 0.5) frames rank by reliability alone.
"""
from __future__ import annotations

import math
import re

import cv2
import numpy as np

AXES = ("blur", "brightness", "occlusion", "noise")
DEFAULT_ALPHA = 0.5          # weight of reliability in the reliability-relevance score (ours)
TIER_HIGH = 0.3              # Robust-TO synthesis prompt: HIGH needs disturbance < 0.3 ...
TIER_LOW = 0.7               # ... and LOW is disturbance >= 0.7 (or confidence < 0.3; HIGH confidence >= 0.7)
MAX_SIDE = 256               # analysis resolution cap (ours)
NORM_P = 4                   # reliability = 1 - ||d||_p (ours)

# blur (ours)
_BLUR_TAPS = 9
_BLUR_TAPS_DIAG = 7
_BLUR_EDGE_FRAC = 0.25
_BLUR_ABS = (0.22, 0.32, 0.82)  # B where it starts to count, the knee (0.1), full blur
_BLUR_REL = (0.06, 0.40)
_BLUR_REF_Q = 25
# brightness (ours)
_MID_GREY = 0.45
_UNDER_STOPS = (0.3, 2.2)
_OVER_STOPS = (0.35, 1.1)
_CLIP_LEVELS = (0.02, 0.98)
_CLIP_FRAC = (0.05, 0.5)
_CONTRAST = 0.45
_CONTRAST_SPAN = (0.15, 0.40)
_KNEE = 0.1
# occlusion (ours)
_OCC_SIDE = 64
_OCC_TEX_REL = 0.35
_OCC_STATIC = 0.006
_OCC_SAME = 0.75
_OCC_MAX_REFS = 16
_OCC_MOVING = (0.3, 0.6)
_OCC_EDGE_REL = 1.0
_OCC_PERSIST = (0.6, 0.95)
_OCC_SPATIAL_WEIGHT = 0.5
_OCC_SKY_ROWS = 0.55
_OCC_NOISE_K = 1.0
_OCC_DARK = 0.06
_OCC_MIN_AREA = 0.02
_OCC_SCALE = 0.2
# noise (ours): Immerkaer (1996), "Fast noise variance estimation"
_IMMERKAER = np.array([[1, -2, 1], [-2, 4, -2], [1, -2, 1]], np.float32)
_NOISE_FLAT_Q = 40
_NOISE_FLOOR = 1.0
_NOISE_SCALE = 8.0


# ----------------------------------------------------------------------------- input

def _as_frames(frames) -> np.ndarray:
    """uint8 [T, H, W, 3] numpy array from numpy or a torch tensor (any device); ValueError otherwise."""
    if hasattr(frames, "detach") and hasattr(frames, "cpu"):
        frames = frames.detach().cpu().numpy()
    if isinstance(frames, (list, tuple)):
        frames = np.stack([np.asarray(f) for f in frames]) if len(frames) else np.zeros((0,), np.uint8)
    if not isinstance(frames, np.ndarray):
        raise ValueError(f"frames must be a uint8 [T, H, W, 3] numpy array or torch tensor, "  # noqa: TRY004
                         f"got {type(frames).__name__}")
    if frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 [T, H, W, 3], got dtype {frames.dtype}")
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must have shape [T, H, W, 3] (RGB), got {frames.shape}")
    if frames.shape[0] < 1 or min(frames.shape[1:3]) < 8:
        raise ValueError(f"frames must hold at least one frame of at least 8x8 pixels, got {frames.shape}")
    return np.ascontiguousarray(frames)


def _luma(frames: np.ndarray) -> np.ndarray:
    """Luminance Y in [0, 1], float32 [T, h, w], at most MAX_SIDE px on the long side."""
    T, H, W = frames.shape[:3]
    k = min(1.0, MAX_SIDE / max(H, W))
    size = (max(8, round(W * k)), max(8, round(H * k)))
    out = np.empty((T, size[1], size[0]), np.float32)
    for t in range(T):
        g = cv2.cvtColor(frames[t], cv2.COLOR_RGB2GRAY)
        if k < 1.0:
            g = cv2.resize(g, size, interpolation=cv2.INTER_AREA)
        out[t] = g
    return out * np.float32(1 / 255)


def _ramp(x, lo, hi):
    return np.clip((np.asarray(x, np.float64) - lo) / (hi - lo), 0.0, 1.0)


def _knee(x, lo, hi, floor=_KNEE):
    """0 at x <= 0, rising gently to `floor` at lo (deviations a clean frame can have: they still rank),
    then linearly to 1 at hi."""
    x = np.asarray(x, np.float64)
    return np.where(x < lo, floor * np.clip(x / lo, 0.0, 1.0), floor + (1 - floor) * _ramp(x, lo, hi))


# ----------------------------------------------------------------------------- the four axes

def _line_kernel(taps: int, dx: int, dy: int) -> np.ndarray:
    k = np.zeros((taps, taps), np.float32)
    c = taps // 2
    for u in range(-c, c + 1):
        k[c + u * dy, c + u * dx] = 1.0
    return k / k.sum()


# (derivative, re-blur) kernel pairs along 0, 90, 45 and 135 degrees: Sobel-type derivatives, box
# re-blur of ~9 px (7 taps on the diagonals, whose step is sqrt(2) px)
_SOBEL_X = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], np.float32)
_SOBEL_D = np.array([[-2, -1, 0], [-1, 0, 1], [0, 1, 2]], np.float32)
_CRETE_KERNELS = (
    (_SOBEL_X, _line_kernel(_BLUR_TAPS, 1, 0)),
    (_SOBEL_X.T.copy(), _line_kernel(_BLUR_TAPS, 0, 1)),
    (_SOBEL_D, _line_kernel(_BLUR_TAPS_DIAG, 1, 1)),
    (_SOBEL_D[:, ::-1].copy(), _line_kernel(_BLUR_TAPS_DIAG, -1, 1)),
)


def _crete(g: np.ndarray) -> float:
    """Crete et al.'s blur effect B in [0, 1] (0 sharp) of one luminance image: the maximum over four
    directions of 1 - (gradient lost by a re-blur along that direction) / (gradient), on edge pixels."""
    m = _BLUR_TAPS // 2 + 1
    if min(g.shape) <= 2 * m + 2:
        return 0.0
    worst = 0.0
    for deriv, box in _CRETE_KERNELS:
        s = np.abs(cv2.filter2D(g, cv2.CV_32F, deriv))[m:-m, m:-m]
        b = np.abs(cv2.filter2D(cv2.filter2D(g, cv2.CV_32F, box), cv2.CV_32F, deriv))[m:-m, m:-m]
        top = float(np.percentile(s, 99))
        if top < 1e-4:  # no structure along this direction at all: nothing to judge
            continue
        edges = s > _BLUR_EDGE_FRAC * top
        m1 = float(s[edges].sum())
        m2 = float(np.maximum(s - b, 0)[edges].sum())
        worst = max(worst, (m1 - m2) / m1)
    return worst


def _blur(Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(blur score, raw Crete B) per frame."""
    B = np.array([_crete(g) for g in Y])
    absolute = _knee(B - _BLUR_ABS[0], _BLUR_ABS[1] - _BLUR_ABS[0], _BLUR_ABS[2] - _BLUR_ABS[0])
    ref = float(np.percentile(B, _BLUR_REF_Q))
    relative = _ramp(B - ref, *_BLUR_REL)
    return np.maximum(absolute, relative), B


def _brightness(Y: np.ndarray) -> np.ndarray:
    out = np.empty(len(Y))
    lo_lvl, hi_lvl = _CLIP_LEVELS
    for t, g in enumerate(Y):
        mean = float(g.mean())
        stops = math.log2(max(mean, 1e-3) / _MID_GREY)
        under = _knee(-stops, *_UNDER_STOPS)
        over = _knee(stops, *_OVER_STOPS)
        clipped = float(np.mean((g <= lo_lvl) | (g >= hi_lvl)))
        clip = _knee(clipped, *_CLIP_FRAC)
        p5, p95 = np.percentile(g, (5, 95))
        low_contrast = _knee(_CONTRAST - (p95 - p5), *_CONTRAST_SPAN)
        out[t] = 1 - (1 - under) * (1 - over) * (1 - clip) * (1 - low_contrast)
    return out


def _noise_sigma(g: np.ndarray) -> float:
    """Immerkaer's noise std (grey levels 0-255) from the flattest unclipped pixels, robust (MAD)."""
    g255 = g * np.float32(255)
    resp = cv2.filter2D(g255, -1, _IMMERKAER, borderType=cv2.BORDER_REFLECT)[1:-1, 1:-1]
    smooth = cv2.GaussianBlur(g255, (0, 0), 1.5)
    grad = (np.abs(cv2.Sobel(smooth, cv2.CV_32F, 1, 0)) + np.abs(cv2.Sobel(smooth, cv2.CV_32F, 0, 1)))[1:-1, 1:-1]
    inner = g255[1:-1, 1:-1]
    ok = (inner > 3) & (inner < 252)
    if ok.sum() < 64:
        return 0.0
    flat = ok & (grad <= np.percentile(grad[ok], _NOISE_FLAT_Q))
    if flat.sum() < 32:
        return 0.0
    return float(1.4826 * np.median(np.abs(resp[flat])) / 6.0)


def _noise(Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sigma = np.array([_noise_sigma(g) for g in Y])
    return 1 - np.exp(-np.maximum(0.0, sigma - _NOISE_FLOOR) / _NOISE_SCALE), sigma


def _occlusion(Y: np.ndarray) -> np.ndarray:
    """Per-frame occlusion score (module docstring): static regions bounded by persistent edges while
    the scene moves, else (still camera) large untextured regions on the bottom / side borders."""
    T, H, W = Y.shape
    k = min(1.0, _OCC_SIDE / max(H, W))
    size = (max(8, round(W * k)), max(8, round(H * k)))
    h, w = size[1], size[0]
    small = np.empty((T, h, w), np.float32)
    tex = np.empty_like(small)
    clipped = np.empty((T, h, w), bool)
    for t in range(T):
        s = cv2.resize(Y[t], size, interpolation=cv2.INTER_AREA) if k < 1 else Y[t]
        clipped[t] = (s <= _OCC_DARK) | (s >= _CLIP_LEVELS[1])  # crushed / blown out: brightness's
        lo, hi = np.percentile(s, (2, 98))
        s = ((s - lo) / max(float(hi - lo), 0.02)).astype(np.float32)  # contrast-normalised: night, fog
        small[t] = s
        tex[t] = cv2.GaussianBlur(np.abs(cv2.Sobel(s, cv2.CV_32F, 1, 0)) + np.abs(cv2.Sobel(s, cv2.CV_32F, 0, 1)),
                                  (0, 0), 2.0)
    untextured = tex < _OCC_TEX_REL * max(float(np.median(tex)), 1e-3)
    static = np.zeros((T, h, w), bool)
    if T >= 3:
        # "unchanged": within a noise-adaptive tolerance of its value in >= 75% of the frames at
        # least T/8 away (a checkerboard sliding past is the same in only ~half of them)
        sigma = float(np.median([_noise_sigma(s) for s in small])) / 255.0
        tol = _OCC_STATIC + _OCC_NOISE_K * sigma
        gap = max(1, T // 8)
        reach = max(gap + 2, T // 4)
        for t in range(T):
            refs = [r for r in range(T) if abs(r - t) >= gap]
            if len(refs) > _OCC_MAX_REFS:  # an even subset: O(T) in all
                refs = [refs[i] for i in np.linspace(0, len(refs) - 1, _OCC_MAX_REFS).round().astype(int)]
            diff = np.abs(small[refs] - small[t])
            m = round(_OCC_SAME * (len(refs) - 1))
            static[t] = np.partition(diff, m, axis=0)[m] < tol
            for side in (-1, 1):  # an occluder in part of the clip: unchanged over the frames just before / after
                near = [i for i, r in enumerate(refs) if 0 < side * (r - t) <= reach]
                if len(near) >= 3:
                    m = round(_OCC_SAME * (len(near) - 1))
                    static[t] |= np.partition(diff[near], m, axis=0)[m] < tol
    # persistent edges: where the frame has an edge in most frames (the outline of something fixed to
    # the camera); the boundary of a region that is static only because it is uniform moves instead
    # (over the clip, or over the frames just before / after: an occluder in part of the clip)
    edges = tex >= _OCC_EDGE_REL * max(float(np.median(tex)), 1e-3)
    csum = np.concatenate([np.zeros((1, h, w)), np.cumsum(edges, axis=0)])
    reach = max(3, T // 4)

    def persistent(t):
        freq = csum[T] / T
        for lo, hi in ((max(0, t - reach), t + 1), (t, min(T, t + reach + 1))):
            if hi - lo >= 4:
                freq = np.maximum(freq, (csum[hi] - csum[lo]) / (hi - lo))
        return _ramp(freq, *_OCC_PERSIST)

    ring_kernel = np.ones((5, 5), np.uint8)
    out = np.empty(T)
    for t in range(T):
        regions = _regions(static[t] & ~clipped[t], small[t], h, w) if T >= 3 else []
        textured = ~untextured[t]
        for _, _, region in regions:  # the scene: outside the candidates and their soft edges
            textured &= cv2.dilate(region.astype(np.uint8), ring_kernel) == 0
        moving = 1.0 - float(static[t][textured].mean()) if T >= 3 and textured.any() else 0.0
        trust = float(_ramp(moving, *_OCC_MOVING))  # how much of the scene the motion has swept
        a_static = a_spatial = 0.0
        if trust > 0.0 and regions:
            pers = persistent(t)
            for frac, _, region in regions:
                ring = (cv2.dilate(region.astype(np.uint8), ring_kernel) > 0) & ~region
                a_static += frac * (float(pers[ring].mean()) if ring.any() else 1.0)
        if trust < 1.0:  # a still camera: no temporal cue; large untextured regions on the bottom / side borders
            a_spatial = _OCC_SPATIAL_WEIGHT * sum(frac for frac, border, _ in
                                                  _regions(untextured[t] & ~clipped[t], small[t], h, w) if border)
        area = trust * a_static + (1.0 - trust) * a_spatial
        out[t] = 1 - math.exp(-area / _OCC_SCALE)
    return out


def _regions(mask: np.ndarray, lum: np.ndarray, h: int, w: int) -> list:
    """The candidate occluder regions of a mask: (area fraction, touches the bottom / a side border,
    boolean mask) for the connected regions of >= _OCC_MIN_AREA, after removing the sky: candidate
    pixels in the upper part of the frame, at least as bright as the frame's median, connected to the
    top border or forming a band across its whole width there (a horizon, haze, the banding of a
    bright sky): far away, not on the lens. (Brightness keeps a dark occluder that touches the sky.)"""
    upper = mask & (lum >= np.median(lum))
    upper[round(_OCC_SKY_ROWS * h):] = False
    n, labels, stats, _ = cv2.connectedComponentsWithStats(upper.astype(np.uint8), connectivity=8)
    sky = [i for i in range(1, n) if stats[i, cv2.CC_STAT_TOP] == 0 or stats[i, cv2.CC_STAT_WIDTH] >= 0.9 * w]
    if sky:
        mask = mask & ~np.isin(labels, sky)
    n, labels, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    out = []
    for i in range(1, n):
        x, y, bw, bh, a = (int(v) for v in stats[i])
        if a >= _OCC_MIN_AREA * h * w:
            out.append((a / (h * w), y + bh >= h or x == 0 or x + bw >= w, labels == i))
    return out


# ----------------------------------------------------------------------------- public API

def disturbance(frames) -> dict[str, np.ndarray]:
    """Per-frame disturbance of a clip (uint8 [T, H, W, 3], numpy or torch): ``{"blur", "brightness",
    "occlusion", "noise"}`` -> float64 [T] in [0, 1], 0 = clean, 1 = fully disturbed (formulas in the
    module docstring; all ours, calibrated to Robust-TO's 0.3 / 0.7 tier thresholds). Deterministic.
    The blur and occlusion scores use the whole clip (its sharpest frames, what moves): a frame's
    score can change when other frames of the clip change."""
    x = _as_frames(frames)
    Y = _luma(x)
    blur, _ = _blur(Y)
    noise, _ = _noise(Y)
    return {"blur": blur, "brightness": _brightness(Y), "occlusion": _occlusion(Y), "noise": noise}


def combine(d: dict) -> np.ndarray:
    """Reliability from a :func:`disturbance` dict: 1 - min(1, (sum_axes d^4)^(1/4)) (ours)."""
    stack = np.stack([np.asarray(d[a], np.float64) for a in AXES])
    return 1.0 - np.minimum(1.0, (stack ** NORM_P).sum(0) ** (1.0 / NORM_P))


def reliability(frames) -> np.ndarray:
    """Per-frame reliability in [0, 1], 1 = trustworthy: ``1 - min(1, ||disturbance||_4)`` (ours; a
    soft maximum of the four axes, see the module docstring). float64 [T]."""
    return combine(disturbance(frames))


# ----------------------------------------------------------------------------- relevance

def _question_terms(question: str) -> tuple[set, set]:
    """The basic colours and shape classes a question names (perceive's vocabulary)."""
    from extensions.embodied_r import perceive_cv

    words = set(re.findall(r"[a-z]+", str(question).lower()))
    colours = {c for c in perceive_cv.CV_COLOURS if c in words}
    shapes = {s for s, nouns in perceive_cv._CV_SHAPE_NOUNS.items() if words & set(nouns)}
    return colours, shapes


def _proxy_relevance(frames: np.ndarray, question: str) -> np.ndarray:
    """The classical fallback (a proxy, ours): how much of the question's named colours / shape words a
    frame shows, from perceive_cv.colour_blobs."""
    from extensions.embodied_r import perceive_cv

    T = len(frames)
    colours, shapes = _question_terms(question)
    if not colours and not shapes:
        return np.full(T, 0.5)
    evidence = np.zeros(T)
    for t in range(T):
        for b in perceive_cv.colour_blobs(frames[t]):
            if colours and b["colour"] not in colours:
                continue
            if not colours and b["shape"] not in shapes:
                continue
            w = min(1.0, math.sqrt(b["area"] / 0.005))  # a blob of 0.5% of the frame is plainly visible
            if colours and shapes and b["shape"] in shapes:
                w *= 1.5
            evidence[t] += w
    if evidence.max() <= 0:
        return np.full(T, 0.5)
    evidence = 1 - np.exp(-evidence)  # several matching blobs: more evidence, saturating
    return 0.25 + 0.75 * evidence / evidence.max()


def relevance(frames, question: str, scorer=None, *, min_scale: float = 0.02) -> np.ndarray:
    """Per-frame relevance to ``question``, float64 [T] in [0, 1].

    With ``scorer`` (a callable ``(frames, text) -> T similarities``, e.g. :func:`hf_clip_scorer`, or the
    VLM's own image-text similarity): the similarities s are made clip-relative (ours),
    ``0.5 + 0.5 tanh((s - median s) / max(std s, min_scale))``; a frame the scorer likes as much as
    the clip's typical frame gets 0.5, equal similarities give all 0.5. ``min_scale`` is in the
    scorer's units (0.02 suits cosine similarities) and keeps tiny differences from being blown up.

    Without a scorer, a CLASSICAL PROXY (ours, not the paper's, which leaves its relevance model
    unspecified): a frame that shows more of the colours the question names (red, orange, yellow,
    green, blue, purple) and of its shape words (pillar, cube, block, slab, ... in perceive's
    vocabulary), as found by :func:`perceive_cv.colour_blobs`, scores higher: 0.25 for a frame showing
    none of them up to 1.0 for the frame showing the most. When the question names none, or no frame
    shows any, every frame gets 0.5 (uniform: no information). It knows nothing about other objects,
    actions or text, and under heavy corruption it sees fewer colours."""
    x = _as_frames(frames)
    if scorer is None:
        return _proxy_relevance(x, question)
    s = np.asarray(scorer(x, question), np.float64).reshape(-1)
    if s.shape != (len(x),):
        raise ValueError(f"scorer must return one similarity per frame ({len(x)}), got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError("scorer returned non-finite similarities")
    scale = max(float(s.std()), float(min_scale), 1e-12)
    return 0.5 + 0.5 * np.tanh((s - np.median(s)) / scale)


def hf_clip_scorer(model_name_or_path, device=None, batch_size: int = 16, dtype=None):
    """A ``scorer`` for :func:`relevance` from a CLIP-style dual encoder on the Hugging Face hub or on disk
    (CLIP, SigLIP, ...: anything ``AutoModel`` loads with ``get_image_features`` / ``get_text_features``).
    Returns ``score(frames, text) -> float64 [T]``, the cosine similarity of each frame's embedding with
    the text's. Loads the model once; nothing is downloaded until this is called."""
    import torch
    from transformers import AutoModel, AutoProcessor

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    kwargs = {"dtype": dtype} if dtype is not None else {}
    model = AutoModel.from_pretrained(model_name_or_path, **kwargs).to(device).eval()
    processor = AutoProcessor.from_pretrained(model_name_or_path)
    siglip = "siglip" in str(getattr(model.config, "model_type", "")).lower()

    def _features(out):  # transformers >= 5 returns a ModelOutput whose pooler_output is projected
        return out if torch.is_tensor(out) else out.pooler_output

    @torch.no_grad()
    def score(frames, text: str) -> np.ndarray:
        x = _as_frames(frames)
        tok = processor(text=[text], return_tensors="pt", truncation=True,
                        padding="max_length" if siglip else True)
        tok = {k: v.to(device) for k, v in tok.items() if k in ("input_ids", "attention_mask", "position_ids")}
        tf = _features(model.get_text_features(**tok)).float()
        tf = tf / tf.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        sims = []
        for i in range(0, len(x), batch_size):
            batch = [np.array(f) for f in x[i:i + batch_size]]  # writable copies for torch.from_numpy
            px = processor(images=batch, return_tensors="pt")["pixel_values"]
            f = _features(model.get_image_features(pixel_values=px.to(device, model.dtype))).float()
            f = f / f.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            sims.append((f @ tf.T)[:, 0].cpu())
        return torch.cat(sims).double().numpy()

    return score


# ----------------------------------------------------------------------------- selection

def frame_scores(frames, question: str = "", scorer=None, alpha: float = DEFAULT_ALPHA) -> dict:
    """Everything :func:`select_frames` uses, per frame: the four disturbances, ``reliability``,
    ``relevance`` and ``score`` = reliability^alpha * relevance^(1 - alpha) (ours), all float64 [T]."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    x = _as_frames(frames)
    d = disturbance(x)
    rel = combine(d)
    relv = relevance(x, question, scorer)
    eps = 1e-6
    score = (rel + eps) ** alpha * (relv + eps) ** (1 - alpha)
    return {**d, "reliability": rel, "relevance": relv, "score": np.clip(score, 0.0, 1.0)}


def _pick(score: np.ndarray, k: int, tie_tol: float) -> np.ndarray:
    """Greedy: the best remaining score, ties (within tie_tol of it) broken by the largest distance
    to the frames already chosen (the first pick: nearest the clip's middle), then by score, then index."""
    T = len(score)
    chosen: list[int] = []
    free = np.ones(T, bool)
    idx = np.arange(T)
    for _ in range(k):
        best = score[free].max()
        cand = idx[free & (score >= best - tie_tol)]
        if chosen:
            spread = np.min(np.abs(cand[:, None] - np.asarray(chosen)[None]), axis=1).astype(float)
        else:
            spread = -np.abs(cand - (T - 1) / 2.0)
        order = np.lexsort((cand, -score[cand], -spread))  # last key is primary
        i = int(cand[order[0]])
        chosen.append(i)
        free[i] = False
    return np.array(sorted(chosen), np.int64)


def select_frames(frames, question: str = "", k: int = 8, scorer=None, alpha: float = DEFAULT_ALPHA,
                  tie_tol: float = 0.01, scores: dict | None = None) -> np.ndarray:
    """Robust-TO's frame selection: the ``k`` frames with the highest reliability-relevance score, as
    int64 indices in temporal order. Scores within ``tie_tol`` of the best remaining one count as tied
    (ours: differences that small are below what the scores resolve) and the tie goes to the frame
    farthest in time from those already chosen, so equal scores give frames spread over the clip,
    not a run of neighbours. ``k >= T`` returns every frame. ``scores``: a :func:`frame_scores` dict
    already computed for these frames (skips the work)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if not 0.0 <= tie_tol:
        raise ValueError(f"tie_tol must be >= 0, got {tie_tol!r}")
    x = _as_frames(frames)
    T = len(x)
    if k >= T:
        return np.arange(T, dtype=np.int64)
    s = (scores or frame_scores(x, question, scorer, alpha))["score"]
    if len(s) != T:
        raise ValueError(f"scores are for {len(s)} frames, the clip has {T}")
    return _pick(np.asarray(s, np.float64), int(k), float(tie_tol))


def profile(frames, indices=None, *, scores: dict | None = None) -> dict:
    """The disturbance profile Robust-TO's decomposer prompt shows ("blur={avg_blur}, brightness=
    {avg_bright}, occlusion={avg_occl}"; we add avg_noise): the mean of each axis over the frames at
    ``indices`` (default: all), rounded to 2 decimals. Disturbance is computed on the whole clip (blur
    and occlusion use temporal context), then averaged over the selection. ``scores``: a
    :func:`disturbance` or :func:`frame_scores` dict for these frames, to skip the work."""
    x = _as_frames(frames)
    d = scores if scores is not None else disturbance(x)
    T = len(x)
    if indices is None:
        idx = np.arange(T)
    else:
        idx = np.asarray(indices).reshape(-1)
        if idx.size == 0 or not np.issubdtype(idx.dtype, np.integer) or idx.min() < -T or idx.max() >= T:
            raise ValueError(f"indices must be a non-empty list of frame indices in [0, {T}), got {indices!r}")
    names = {"avg_blur": "blur", "avg_bright": "brightness", "avg_occl": "occlusion", "avg_noise": "noise"}
    return {key: round(float(np.mean(np.asarray(d[axis])[idx])), 2) for key, axis in names.items()}


def format_profile(p: dict) -> str:
    """The profile as the decomposer prompt writes it: "blur=0.12, brightness=0.40, occlusion=0.05"."""
    return f"blur={p['avg_blur']:.2f}, brightness={p['avg_bright']:.2f}, occlusion={p['avg_occl']:.2f}"


# ----------------------------------------------------------------------------- CLI

def _read_clip(path, num_frames: int):
    """``(frames, video frame indices, total frames)``: ``num_frames`` frames decoded uniformly
    (video.read_frames), at most the clip's own count and never the same frame twice."""
    from machinery import video

    with video.held_native_stderr():  # ffmpeg's lines about a bad file: the VideoError says it in one
        total = video.probe(path)["frames"]
        frames, src, _ = video.read_frames(path, num_frames=min(int(num_frames), total))
    _, first = np.unique(src, return_index=True)  # uniform rounding can still repeat one: keep it once
    keep = np.sort(first)
    return frames[keep], src[keep], total


def main(argv=None) -> int:
    from machinery import cli

    ap = cli.ArgumentParser(description="Per-frame disturbance, reliability, relevance and Robust-TO frame "
                                             "selection for one video.")
    ap.add_argument("video", help="video file")
    ap.add_argument("--question", default="", help="question (relevance: colour / shape words, a proxy)")
    ap.add_argument("--k", type=int, default=8, help="frames to select")
    ap.add_argument("--num-frames", type=int, default=16,
                    help="frames decoded uniformly (video.read_frames); a shorter clip gives all its frames, "
                         "none twice")
    ap.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="weight of reliability in the score")
    cli.add_debug_flag(ap)
    args = ap.parse_args(argv)
    if args.k < 1 or args.num_frames < 1:
        raise cli.UserError(f"--k and --num-frames must be positive integers, got {args.k}, {args.num_frames}")
    if not 0.0 <= args.alpha <= 1.0:
        raise cli.UserError(f"--alpha must be in [0, 1], got {args.alpha}")
    frames, src, total = _read_clip(args.video, args.num_frames)  # a VideoError names the file
    s = frame_scores(frames, args.question, alpha=args.alpha)
    chosen = sorted(select_frames(frames, args.question, args.k, alpha=args.alpha, scores=s).tolist())
    head = ("t", "frame", "blur", "bright", "occl", "noise", "reliab", "relev", "score", "sel")
    print("{:>3} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>3}".format(*head))
    for t in range(len(frames)):
        row = [s[a][t] for a in ("blur", "brightness", "occlusion", "noise", "reliability", "relevance", "score")]
        print(f"{t:>3} {int(src[t]):>6} " + " ".join(f"{v:6.2f}" for v in row) + f" {'*' if t in chosen else '':>3}")
    p = profile(frames, chosen, scores=s)
    print(f"selected {chosen} (video frames {[int(src[t]) for t in chosen]}, {len(frames)} of the clip's {total} "
          f"decoded); disturbance profile: {format_profile(p)}, noise={p['avg_noise']:.2f}")
    return 0


if __name__ == "__main__":
    from machinery import cli

    cli.run(main)
