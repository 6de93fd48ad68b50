"""Occluders that belong to the scene (perturb.py's `static` and `dynamic` subtypes): the scene kind of a clip
(indoor, aerial, street) given by its source or inferred from its depth, the occluder kinds plausible in each,
and the painters of the kinds beyond occluders.py's walker and car: the static ones (a lens smudge, a raindrop
on the lens, a near object's edge, a plant, a hand), each shaded from the light of the region it covers, and the
flying ones (a bird, another drone, a leafy branch at the frame edge), each no larger than its distance allows.

The paper: masks are "conditioned on each video's content, including depth layout, object locations, and motion
patterns", and "occlusions are placed at plausible foreground locations" (Sec. 4, App. B.2); its examples of
dynamic occlusion are pedestrians, vehicles and vegetation. A drone hundreds of metres up sees no car a third of
the frame high; a room scan sees people walk by, not traffic.
"""
from __future__ import annotations

import math

import cv2
import numpy as np

from machinery.corruption import kernels, occluders
from machinery.corruption.scene import UNCHANGED, Layer

SCENES = ("indoor", "aerial", "street")  # VSI-Bench, UrbanVideo-Bench, Video-R1's outdoor clips and the synthetic set
KINDS = {  # subtype -> scene -> the occluder kinds plausible there (a spec's `style`)
    "static": {"indoor": ("edge", "plant", "hand", "smudge"), "aerial": ("smudge", "raindrop", "plant"),
               "street": ("smudge", "raindrop", "edge", "plant", "hand")},
    "dynamic": {"indoor": ("pedestrian",), "aerial": ("bird", "drone", "foliage"),
                "street": ("pedestrian", "vehicle", "foliage")},
}
FOV = 2 * math.tan(math.radians(35))  # frame height / distance at a 70-degree vertical field of view
HEIGHT_M = {"bird": 0.3, "drone": 0.18}  # a flyer's drawn height in metres (wings up; rotors and legs)
ASPECT = {"bird": 2.2, "drone": 3.2}  # its canvas width / height


def check_scene(scene, allow_auto=True):
    if scene not in SCENES and not (allow_auto and scene == "auto"):
        raise ValueError(f"unknown scene {scene!r}; valid: {', '.join(('auto',) * allow_auto + SCENES)}")
    return scene


def pick_style(seed, subtype, scene):
    """The occluder kind of a spec in `scene`: uniform over KINDS[subtype][scene], from the stream
    (seed, subtype, "kind", scene): the same wherever it is resolved (at the spec, or at render for "auto")."""
    kinds = KINDS[subtype][check_scene(scene, allow_auto=False)]
    return kinds[int(kernels.seeded_rng(seed, subtype, "kind", scene).integers(len(kinds)))]


def spec_params(subtype, seed, scene):
    """The params a spec of `subtype` in `scene` stores: {} for "auto" (resolved at render from the depth) or
    for a subtype without occluders, else the scene and its kind."""
    if subtype not in KINDS or check_scene(scene) == "auto":
        return {}
    return {"scene": scene, "style": pick_style(seed, subtype, scene)}


def infer_scene(ctx) -> str:
    """The scene kind of a clip from the depth used (Sec. 4: "conditioned on ... depth layout"): ground receding
    under a sky is a street; with a true depth map, a ceiling (depth rising from the top row down) or near walls
    (the sides nearer than the middle) is indoor, a far, flat ground filling the view (little spread of depth) is
    aerial, anything else a street. The depth proxy sees no geometry without a sky, so there it reads the image:
    one colour and texture over the whole frame (a surface seen from far above) is aerial, else indoor (a close-up,
    a room)."""
    t = ctx.T // 2
    sky = float(ctx.sky_small(t).mean())
    if ctx.ground >= 0.5 and sky > 0.02:
        return "street"
    if ctx.true_depth:
        d = ctx.depth_small(t)
        h, w = d.shape
        ceiling = float(np.median(d[h // 2] - d[0]))
        walls = float(np.median(d[:, w // 2]) - np.median(np.r_[d[:, 0], d[:, -1]]))
        if max(ceiling, walls) > 0.04:
            return "indoor"
        flat = float(np.quantile(d, 0.9) - np.quantile(d, 0.1)) < 0.15
        return "aerial" if flat and sky < 0.02 else "street"
    return "aerial" if homogeneous(ctx.small_frame) else "indoor"


def homogeneous(small) -> bool:
    """Whether a small frame shows one colour and one texture all over (a 4x4 grid of blocks: their mean colours
    within 0.03 of each other, their gradient energy within 40%): grass, gravel, a roof seen from above (at 0.006-0.016
    and 14-32% on scikit-image's; its close-ups at 0.059-0.19 and 34-43%)."""
    f = small.astype(np.float32) / 255
    lum = f.mean(-1)
    g = np.abs(cv2.Sobel(lum, cv2.CV_32F, 1, 0)) + np.abs(cv2.Sobel(lum, cv2.CV_32F, 0, 1))
    h, w = (s // 4 * 4 for s in lum.shape)
    energy = g[:h, :w].reshape(4, h // 4, 4, w // 4).mean((1, 3))
    colour = f[:h, :w].reshape(4, h // 4, 4, w // 4, 3).mean((1, 3))
    return float(colour.std((0, 1)).mean()) < 0.03 and float(energy.std() / max(energy.mean(), 1e-3)) < 0.4


def resolve(ctx):
    """(scene, kind) of an occlusion spec at render: the spec's, or inferred / picked where it says "auto"."""
    scene = check_scene(ctx.p["scene"]) if ctx.p["scene"] != "auto" else infer_scene(ctx)
    style = ctx.p["style"] if ctx.p["style"] != "auto" else pick_style(ctx.spec.seed, ctx.spec.subtype, scene)
    if style not in {k for kinds in KINDS[ctx.spec.subtype].values() for k in kinds}:
        raise ValueError(f"unknown {ctx.spec.subtype} style {style!r}; valid: {KINDS[ctx.spec.subtype]}")
    return scene, style


def softness(frame) -> float:
    """The clip's own blur, a Gaussian sigma in px, from one frame: an edge blurred by sigma has its steepest
    gradient ~ 1/sigma, and ~ 1/sqrt(sigma^2 + 1.5^2) after 1.5 px more, so their ratio r gives
    sigma = 1.5 r / sqrt(1 - r^2) (on the strongest edges: the 99.5th percentile, over the middle 224 x 224 px at
    most). A sprite's edges are softened to it: a blurry clip gets blurry occluders."""
    h, w = frame.shape[:2]
    y0, x0 = max(0, (h - 224) // 2), max(0, (w - 224) // 2)
    g = cv2.cvtColor(np.ascontiguousarray(frame[y0:y0 + 224, x0:x0 + 224]), cv2.COLOR_RGB2GRAY).astype(np.float32)

    def peak(img):
        m = (np.abs(cv2.Sobel(img, cv2.CV_32F, 1, 0)) + np.abs(cv2.Sobel(img, cv2.CV_32F, 0, 1))).ravel()
        k = int(0.995 * (len(m) - 1))
        return float(np.partition(m, k)[k])

    r = min(0.97, peak(cv2.GaussianBlur(g, (0, 0), 1.5)) / max(peak(g), 1e-3))
    return float(np.clip(1.5 * r / math.sqrt(1 - r * r), 0.3, 6.0))


def region_light(small, cover):
    """The mean colour (0-255, float32 [3]) of what `cover` (a [h,w] weight at the small frame's scale) hides."""
    w = cover.astype(np.float32)
    return (small.reshape(-1, 3).astype(np.float32) * w.reshape(-1, 1)).sum(0) / max(float(w.sum()), 1e-3)


# ----------------------------------------------------------------------------- static kinds: the outline

def outline(kind, rng, H, W):
    """The polygons (px at scale 1, i.e. before fitting to the area) of a static kind and whether it grows as the
    square root of its scale (a blob) or linearly (a bar across the frame): (make(scale) -> [polys], power)."""
    if kind in ("smudge", "raindrop"):  # on the lens, anywhere; a drop is rounder
        shape = kernels.blob(rng, wobble=0.45 if kind == "smudge" else 0.12) * [rng.uniform(0.8, 1.3), 1.0]
        at = np.array([rng.uniform(0.2, 0.8) * W, rng.uniform(0.2, 0.75) * H])
        return (lambda s: [shape * s + at]), 0.5
    if kind == "edge":  # a pillar or door frame at a side, or a railing along the bottom
        if rng.random() < 0.65:
            side, lean = rng.integers(2), rng.uniform(-0.06, 0.06) * W
            x = 0.0 if side == 0 else float(W)
            sign = 1 if side == 0 else -1
            return (lambda s: [np.array([[x - sign, -1], [x + sign * s + lean, -1], [x + sign * s - lean, H + 1],
                                         [x - sign, H + 1]])]), 1.0
        posts = rng.uniform(0.1, 0.9, 3) * W
        y = rng.uniform(0.72, 0.85) * H

        def railing(s):
            bar = np.array([[-1, y - 0.35 * s], [W + 1, y - 0.35 * s], [W + 1, y + 0.15 * s], [-1, y + 0.15 * s]])
            return [bar] + [np.array([[p - 0.12 * s, y], [p + 0.12 * s, y], [p + 0.12 * s, H + 1],
                                      [p - 0.12 * s, H + 1]]) for p in posts]
        return railing, 1.0
    corner = np.array([rng.choice([0.0, W]), float(H)])
    if kind == "plant":  # leaves fanning out of a lower corner
        n = 7
        angles = rng.uniform(-np.pi * 0.95, -np.pi * 0.05, n)
        lengths, widths = rng.uniform(0.6, 1.0, n), rng.uniform(0.18, 0.3, n)
        leaf = np.stack([np.linspace(0, 1, 12), np.sin(np.linspace(0, np.pi, 12))], 1)

        def leaves(s):
            out = []
            for a, ln, wd in zip(angles, lengths, widths, strict=True):
                u, v = np.array([math.cos(a), math.sin(a)]), np.array([-math.sin(a), math.cos(a)])
                side = np.r_[leaf, leaf[::-1] * [1, -1]]
                out.append(corner + s * ln * (side[:, :1] * u + side[:, 1:] * wd * v))
            return out
        return leaves, 0.5
    # a hand: a palm rising out of the lower edge and four fingers (a fifth, the thumb, to one side)
    x0 = rng.uniform(0.15, 0.85) * W
    tilt = rng.uniform(-0.4, 0.4)

    def hand(s):
        rot = np.array([[math.cos(tilt), -math.sin(tilt)], [math.sin(tilt), math.cos(tilt)]])
        palm = np.array([[-0.45, 0.0], [0.45, 0.0], [0.5, -0.9], [-0.5, -0.9]])
        fingers = [np.array([[c - 0.1, -0.85], [c + 0.1, -0.85], [c + 0.08, -0.85 - ln], [c - 0.08, -0.85 - ln]])
                   for c, ln in ((-0.36, 0.55), (-0.12, 0.7), (0.12, 0.66), (0.36, 0.5))]
        thumb = np.array([[0.45, -0.3], [0.5, -0.6], [0.95, -0.95], [0.85, -1.05]])
        return [(p * s) @ rot.T + (x0, H + 0.1 * s) for p in (palm, *fingers, thumb)]
    return hand, 0.5


def fit(make, power, area, H, W, small):
    """The polygons of `make` at the scale that covers `area` of the frame (found at `small` = (h, w) scale)."""
    scale = math.sqrt(area * H * W) if power == 0.5 else area * W
    k = small[1] / W
    for _ in range(4):
        cover = kernels.fill_polys(small, [p * k for p in make(scale)]).mean() / 255
        scale *= (area / max(cover, 1e-3)) ** power
    return make(scale)


# ----------------------------------------------------------------------------- static kinds: the look

BASE = {"plant": (52, 86, 40), "hand": (205, 150, 120)}  # a leaf's green, a skin tone: before the clip's light


def static_look(kind, rng, cover_small, small, shading):
    """The image (float32 [h,w,3]) of a solid static kind in the clip's own light, under `shading` [h,w]: a near
    object's edge is the covered region's own mean colour, darker (a near thing in front of the lit scene is seen
    against the light) and shaded across; a plant or a hand its own colour in the scene's light (exposure, cast,
    chroma: occluders.scene_light) and as bright as the region it covers."""
    mean = region_light(small, cover_small)
    h, w = shading.shape
    tex = 0.92 + 0.16 * cv2.resize(kernels.noise_field(rng, 16, 16), (w, h))
    if kind == "edge":
        base = np.clip(mean * rng.uniform(0.4, 0.6) + 8, 0, 255)
    else:
        base = occluders.lit(np.asarray(BASE[kind], np.float32) * rng.uniform(0.85, 1.15), occluders.scene_light(small))
        base = base * np.clip(float(mean.mean()) / max(float(base.mean()), 1.0), 0.5, 1.4) ** 0.6
        base = base * np.clip(mean / max(float(mean.mean()), 1.0), 0.6, 1.5) ** 0.35  # the light's cast there
    planes = [(tex * c).astype(np.float32, copy=False) for c in base]  # by channel: numpy's broadcast over a
    for plane in planes:                                                # short last axis is ~5x slower
        plane *= shading
    return cv2.merge(planes)


def shade(polys, roi, roundness, light):
    """[h,w] shading of the roi's solid drawn from `polys` (full-frame px), a rounded body lit by one light,
    computed at about 64 px across (kernels.emboss) and upscaled."""
    y0, y1, x0, x1 = roi
    q = max(1.0, max(y1 - y0, x1 - x0) / 64)
    size = (max(1, math.ceil((y1 - y0) / q)), max(1, math.ceil((x1 - x0) / q)))
    mask = kernels.fill_polys(size, [(p - (x0, y0)) / q for p in polys])
    return cv2.resize(kernels.emboss(mask, max(0.5, roundness / q), light), (x1 - x0, y1 - y0))


def static_layers(ctx, kind):
    """The Layers of a static occluder of `kind` (KINDS["static"]), the same in every frame: fitted to cover
    `area` of the frame, out of focus by its nearness and never sharper than the clip (softness)."""
    p, ops, H, W = ctx.p, ctx.ops, ctx.H, ctx.W
    rng = ctx.rng("layout", kind)
    make, power = outline(kind, rng, H, W)
    polys = fit(make, power, p["area"], H, W, (ctx.sh * 2, ctx.sw * 2))
    radius = math.sqrt(p["area"] * H * W / np.pi)
    focus = {"smudge": 0.12, "raindrop": 0.04}.get(kind, 0.03) * radius  # a smudge is a veil, a drop a lens
    defocus = math.hypot(focus, softness(ops.host(ctx.frames[ctx.T // 2])))
    alpha = kernels.wide_blur(kernels.HOST, kernels.fill_polys((H, W), polys).astype(np.float32) / 255, defocus)
    alpha[alpha < 1 / 255] = 0
    roi = kernels.roi_of(alpha)
    if roi is None:
        return [UNCHANGED] * ctx.T
    y0, y1, x0, x1 = roi
    a = alpha[y0:y1, x0:x1]
    cover_small = cv2.resize(alpha, (ctx.sw, ctx.sh), interpolation=cv2.INTER_AREA)
    if kind == "smudge":  # a greasy veil that blurs what is behind it, as bright and coloured as what it covers
        veil = 0.55 + 0.45 * cv2.resize(kernels.noise_field(rng, 24, 24, cells=3), (x1 - x0, y1 - y0))
        haze = tuple(int(v) for v in np.clip(region_light(ctx.small_frame, cover_small) * 1.15 + 25, 0, 255))
        sigma = max(1.0, 0.08 * radius)
        layer = Layer(a * veil * np.float32(p["opacity"]), lambda f: ops.blend(kernels.wide_blur(ops, f, sigma),
                                                                              haze, 0.3), roi)
        return [layer] * ctx.T
    if kind == "raindrop":
        return [Layer(a * np.float32(min(1.0, p["opacity"] + 0.3)), raindrop(ops, a, radius), roi)] * ctx.T
    light = np.array([rng.uniform(-0.8, 0.8), -0.8, 0.6])
    shading = shade(polys, roi, 0.3 * radius, light / np.linalg.norm(light))
    img = static_look(kind, rng, cover_small, ctx.small_frame, shading)
    img = cv2.GaussianBlur(np.clip(img, 0, 255).astype(np.uint8), (0, 0), defocus)
    return [Layer(a * np.float32(min(1.0, p["opacity"] + 0.45)), img, roi)] * ctx.T  # a solid thing is opaque


def raindrop(ops, a, radius):
    """A water drop on the lens as the effect of its roi: a small lens, it shows the view behind it upside down and
    blurred, darker toward its rim, with a highlight on its upper side: the clip's own pixels, so its own light
    (uint8 OpenCV operations throughout: it is redone every frame)."""
    h, w = a.shape
    rim = np.repeat(np.clip(255 * (0.7 + 0.3 * np.clip(a * 1.6 - 0.3, 0, 1)), 0, 255).astype(np.uint8)[..., None], 3, 2)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    glint = 60 * np.exp(-((xx - 0.35 * w) ** 2 + (yy - 0.28 * h) ** 2) / (2 * (0.08 * max(h, w)) ** 2))
    glint = np.repeat(glint.astype(np.uint8)[..., None], 3, 2)
    sigma = max(1.0, 0.05 * radius)

    def effect(region):
        x = kernels.wide_blur(kernels.HOST, cv2.flip(np.ascontiguousarray(ops.host(region)), -1), sigma)
        return ops.asarray(cv2.add(cv2.multiply(x, rim, scale=1 / 255), glint))
    return effect


# ----------------------------------------------------------------------------- flying kinds

def distance(nearness):
    """A flyer's distance from the camera in metres at `nearness` (dynamic's knob, 0.45..1): 4.3 m .. 1 m."""
    return 1.0 + 6.0 * (1.0 - nearness)


def allowed_height(kind, nearness, H):
    """The largest height in px a flyer may be drawn at its distance: its size in metres over the frame's height
    at that distance (a 70-degree field of view)."""
    return H * HEIGHT_M[kind] / (distance(nearness) * FOV)


def paint_bird(paint, phase):
    """A bird seen from behind or ahead, wings beating (phase: 2 pi per beat): body, head, two wings whose tips
    sweep from 0.45 units above the body to 0.35 below; the canvas origin is its centre."""
    up = math.sin(phase)
    paint.ellipse([0, 0.02], (0.09, 0.12), (70, 66, 62))
    paint.disc([0, -0.1], 0.06, (60, 56, 52))
    for side in (-1, 1):
        joint, tip = [0.45 * side, -0.18 * math.sin(phase - 0.5)], [1.0 * side, -0.42 * up]
        paint.poly([[0.02 * side, -0.06], joint, tip, [joint[0], joint[1] + 0.09], [0.02 * side, 0.08]], (88, 84, 78))
    paint.part(0.04)


def paint_drone(paint):
    """A small quadcopter seen from the side: body, arms, legs, gimbal, and four spinning rotors (translucent
    discs: painted apart by the caller); the canvas origin is the body's centre."""
    paint.ellipse([0, 0], (0.35, 0.15), (55, 57, 62))
    for side in (-1, 1):
        paint.capsule([0.2 * side, -0.02], [1.1 * side, -0.1], 0.05, 0.04, (45, 46, 50))
        paint.capsule([0.25 * side, 0.1], [0.35 * side, 0.58], 0.03, 0.025, (40, 40, 44))
        paint.capsule([1.1 * side, -0.1], [1.1 * side, -0.2], 0.05, 0.04, (45, 46, 50))
    paint.disc([0, 0.22], 0.1, (30, 30, 33))
    paint.part(0.06)


def flyer_sprite(kind, unit, phase, light):
    """(img, alpha) float32 of a bird or a drone `unit` px tall, and the canvas row of its centre."""
    h, w = math.ceil(1.1 * unit) + 2, math.ceil(ASPECT[kind] * unit) + 2
    origin = (w / 2, 0.48 * h if kind == "bird" else 0.3 * unit + 1)
    paint = occluders.Paint(h, w, unit, origin, light)
    if kind == "bird":
        paint_bird(paint, phase)
        return paint.img, paint.alpha, origin[1]
    paint_drone(paint)
    rotors = occluders.Paint(h, w, unit, origin, light)
    for side in (-1, 1):
        rotors.ellipse([1.1 * side, -0.2], (0.45, 0.05), (150, 152, 156))
    rotors.part(0.02)
    behind = ((paint.alpha < 0.5) & (rotors.alpha > 0))[..., None]  # blurred blades: seen through
    paint.img = np.where(behind, rotors.img, paint.img)
    paint.alpha = np.maximum(paint.alpha, rotors.alpha * np.float32(0.45))
    return paint.img, paint.alpha, origin[1]


def flyer_layers(ctx, kind, soft):
    """A bird or a drone crossing the view on a gently bobbing path in the upper two thirds, drawn exactly as tall
    as its distance allows (allowed_height), in the scene's light, out of focus by its nearness, never sharper
    than the clip, and motion-blurred by its speed (the shutter open 15% of a frame interval: px per frame at the
    clip's own frame rate). A bird beats its wings; a drone is rigid (one image for the clip)."""
    p, H, W, T = ctx.p, ctx.H, ctx.W, ctx.T
    rng = ctx.rng("actor", kind)
    height = allowed_height(kind, p["nearness"], H)
    k = max(1.0, height / 64)
    y_path = rng.uniform(0.15, 0.6) * H + 0.03 * H * np.sin(rng.uniform(0, 2 * np.pi) + np.arange(T) * 0.7)
    speed = (1.2 * W + ASPECT[kind] * height) / T
    sigma = math.hypot(max(0.6, 0.03 * height), soft) / k
    streak = 0.15 * speed / k
    light = np.array([rng.uniform(-0.5, 0.5), -0.85, 0.5])
    light, tone, cache = light / np.linalg.norm(light), occluders.scene_light(ctx.small_frame), {}
    beat, phase0 = rng.uniform(1.2, 2.2), rng.uniform(0, 2 * np.pi)
    for t in range(T):
        if kind == "bird" or t == 0:
            img, alpha, cy = flyer_sprite(kind, height / k, phase0 + beat * t, light)
            none = np.zeros_like(alpha)
            weight, effect, (ox, oy) = occluders.defocus(occluders.lit(img, tone), alpha, none, sigma, streak, k,
                                                         cache)
        frac = (t + 0.5) / T
        cx = -0.1 * W - 0.5 * ASPECT[kind] * height + speed * T * (frac if p["direction"] > 0 else 1 - frac)
        top = int(np.rint(y_path[t] - cy * k)) + oy
        left = int(np.rint(cx - 0.5 * alpha.shape[1] * k)) + ox
        yield occluders.placed(weight, effect, top, left, H, W)


def foliage_layers(ctx, soft):
    """A leafy branch reaching into the view from the top or a side edge, very near (a take-off among trees, a
    tree at the kerb): leaves on a bending stem in the scene's light, far out of focus, swaying on the wind and
    sliding out of the view as the camera moves past it. One image for the clip, moved per frame."""
    p, H, W, T = ctx.p, ctx.H, ctx.W, ctx.T
    rng = ctx.rng("actor", "foliage")
    length = (0.35 + 0.4 * p["nearness"]) * max(H, W)
    k = max(1.0, length / 96)
    unit = length / k
    side = int(rng.integers(3))  # 0 top, 1 left, 2 right: the branch grows from there toward the middle
    angle = [np.pi / 2, 0.0, np.pi][side] + rng.uniform(-0.5, 0.5)
    u, v = np.array([math.cos(angle), math.sin(angle)]), np.array([-math.sin(angle), math.cos(angle)])
    size = math.ceil(2.2 * unit)
    origin = np.array([size / 2, size / 2])
    paint = occluders.Paint(size, size, unit, origin - 0.5 * unit * u, np.array([0.3, -0.8, 0.5]))
    stem = [0.0, 0.0]
    for i in range(9):
        s = (i + 1) / 9
        bend = 0.12 * s * s
        tip = u * s + v * bend
        paint.capsule(stem, tip, 0.012, 0.01, (70, 55, 40))
        for leaf_side in (-1, 1):
            at = tip + v * leaf_side * 0.07
            paint.ellipse(at, (0.09 * (1.2 - s * 0.4), 0.035), (46 + 20 * rng.random(), 84, 36),
                          angle=math.degrees(angle) + leaf_side * 40)
        stem = tip
    paint.part(0.03)
    img = occluders.lit(paint.img, occluders.scene_light(ctx.small_frame))
    sigma = math.hypot(0.02 * unit * k, soft) / k
    weight, effect, (ox, oy) = occluders.defocus(img, paint.alpha, np.zeros_like(paint.alpha), sigma, 0.0, k, {})
    root = np.array([[W * rng.uniform(0.2, 0.8), 0.0], [0.0, H * rng.uniform(0.1, 0.6)],
                     [float(W), H * rng.uniform(0.1, 0.6)]][side])
    sway = 0.02 * H * np.sin(rng.uniform(0, 2 * np.pi) + np.arange(T) * rng.uniform(0.5, 1.0))
    slide = -0.25 * length * u * (np.arange(T) / max(T - 1, 1))[:, None]  # leaving the view by its own edge
    for t in range(T):
        at = root + slide[t] + v * sway[t]
        top = int(np.rint(at[1] - (origin[1] - 0.5 * unit * u[1]) * k)) + oy
        left = int(np.rint(at[0] - (origin[0] - 0.5 * unit * u[0]) * k)) + ox
        yield occluders.placed(weight, effect, top, left, H, W)
