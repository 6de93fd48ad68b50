"""Structured spatio-temporal corruption: PVRBench's 12 perturbations (ROVA Sec. 3.1, App. B.2, Table 8).

Four styles m in P = {lighting, camera, occlusion, weather} (Eq. 2), twelve subtypes (Table 8):

    lighting   dusk, night, overexposure, shadow
    camera     translation, zoom, rotation
    occlusion  static, dynamic
    weather    fog, rain, snow

plus temporal shuffle (Eq. 1), which combines with any of them (Eq. 2: V' = {f_pi(t) (.) P_t}).

Reading of Sec. 3.1 (docs/DESIGN.md, "Readings of the paper"): the paper's f' = f (.) P with P = B (.) C is read as
compositing, f'_t = (1 - B_t C_t) f_t + B_t C_t E_t(f_t), where B_t in {0,1} is the layout (where), C_t in
[0,1] the per-pixel strength (how much) and E_t the style's effect layer (fog airlight, rain radiance, a
darkened shadow image, an occluder's texture...). Camera motion is a geometric warp: E_t = warp_t(f_t),
C_t = 1, B_t = 1 wherever the warp moved content. `masks()` returns B and C; `apply()` returns f'. Where B
is 0 a pixel is left exactly as it was.

Every effect is animated coherently over the frames of the clip (one animation tick per frame): rain and
snow fall, fog drifts, shadows and occluders move on smooth paths, the camera shakes along a smooth random
walk, light changes slowly. Nothing is re-drawn independently per frame (sensor noise excepted, as in a
real camera). Effects are spatially aware through a depth map in [0, 1] (0 = near, 1 = far): the caller's
true depth, or a proxy (a soft sky segmentation over a ground plane whose horizon is where the sky ends),
continuous wherever the image is: no effect shows a band or a streak at a fixed row. Occluders are painted
procedurally (a walker with a planted-foot gait, a car), shaded by one light, in the scene's exposure, on a
contact shadow, and out of focus by their nearness.

A `PerturbSpec` (the paper's V~, Eq. 4) is a few hundred bytes of JSON; the same spec on the same frames
gives bit-identical output in any process and in any order of calls: all randomness comes from numpy
Generators seeded by (spec.seed, subtype, purpose), never from global state. Frames are numpy uint8
[T,H,W,3] (OpenCV kernels) or torch uint8 tensors on any device (the same effect code drives torch
kernels, so it runs on a GPU when the frames are there).

The effects registry: every subtype, Table 8's included, is one `register_effect` call.

    register_effect(subtype, category, draw_params, render)
        draw_params(d) -> dict: the subtype's knobs at intensity d.eta, drawn from d (a ParamDraw on the
            stream (seed, subtype, "params")) in an order that does not depend on eta;
        render(ctx) -> iterator of one Layer per frame (ctx: a scene.Context: sizes, ctx.p = the knobs,
            ctx.rng(*tags) = seeded streams, depth, ctx.ops = the frames' kernels).
    register_protocol(name, subtypes)   PROTOCOLS[name]: the subtypes of a benchmark's protocol.

A registered subtype is accepted wherever one of Table 8's is (PerturbSpec, static_spec with its seed by
the same rule, sample_spec by name, apply, masks, the CLI); EFFECTS lists them, Table 8's first. A new
category is not added to CATEGORIES (Table 8's four styles), so sample_spec's style draw never yields it.
Extensions register theirs on import (register_effect, register_protocol).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Callable

import cv2
import numpy as np

from machinery import cli
from machinery.corruption import kernels, occluders, perturb_cli, props, scene
from machinery.corruption.kernels import walk
from machinery.corruption.scene import UNCHANGED, Layer  # noqa: F401 - UNCHANGED: for registered effects (extensions)
from machinery.seeds import hash48  # (public too: perturb.hash48, the specs' stable seeds)

CATEGORIES = {  # Table 8
    "lighting": ("dusk", "night", "overexposure", "shadow"),
    "camera": ("translation", "zoom", "rotation"),
    "occlusion": ("static", "dynamic"),
    "weather": ("fog", "rain", "snow"),
}
SUBTYPES = tuple(s for subs in CATEGORIES.values() for s in subs)
CATEGORY_OF = {s: c for c, subs in CATEGORIES.items() for s in subs}  # + registered extensions' subtypes
PROTOCOLS = {"pvrbench": SUBTYPES}  # + register_protocol's
PHOTOMETRIC = ("lighting", "weather")   # the categories that leave the scene's geometry and motion as they are
DEFAULT_ETA = 0.7  # App. D: perturbation intensity eta = 0.7
SPEC_VERSION = 1
# The engine's look: what a spec renders. A change that draws different pixels from the same spec bumps it, so
# that a manifest or an evaluation store made with another look is never mixed with this one's clips
# (eval_pvrbench.py records it per manifest row and in its run hash). 2: the image-following depth proxy, no sky
# shadows, shaded occluders (2026-12-02). 3: walkers painted at <= 64 px tall before their defocus (was 80);
# a true depth map's median over every 4th row and column. 4: the fail-safe proxy (one gentle depth where no sky is
# seen), occluders on a ground contact or entering from the lower edge, shadows as soft-edged half-planes.
# 5: occluders by scene kind (params scene, style: indoor / aerial / street, given or inferred from the depth), static
# kinds shaded from the covered region, birds, drones and branches, edges at the clip's own sharpness, a ground
# actor hidden by nearer scenery (2026-12-05).
RENDER_VERSION = 5


# ----------------------------------------------------------------------------- the effects registry

@dataclass(frozen=True)
class Effect:
    """One registered subtype (see the module docstring)."""
    subtype: str
    category: str
    draw_params: Callable  # (ParamDraw) -> dict of knobs
    render: Callable       # (scene.Context) -> iterator of one Layer per frame


EFFECTS: dict[str, Effect] = {}  # subtype -> Effect, in registration order


class ParamDraw:
    """What draw_params(d) draws from: d.eta, d.s = 1 - (1 - eta)^2 (the perceptual strength curve of the
    lighting blends), d.u(lo, hi) a uniform float, d.pick(options) a uniform choice, d.rng the Generator."""

    def __init__(self, rng: np.random.Generator, eta: float):
        self.rng, self.eta, self.s = rng, eta, 1.0 - (1.0 - eta) ** 2

    def u(self, lo, hi) -> float:
        return float(self.rng.uniform(lo, hi))

    def pick(self, options):
        return options[int(self.rng.integers(len(options)))]


def register_effect(subtype: str, category: str, draw_params: Callable, render: Callable) -> Effect:
    """Add (or replace) one perturbation subtype; see the module docstring for the contract."""
    if CATEGORY_OF.get(subtype, category) != category:
        raise ValueError(f"subtype {subtype!r} is in category {CATEGORY_OF[subtype]!r}, not {category!r}")
    if subtype not in SUBTYPES and category in CATEGORIES:
        raise ValueError(f"category {category!r} is one of Table 8's ({', '.join(CATEGORIES)}), which are closed; "
                         f"give {subtype!r} a category of its own")
    EFFECTS[subtype] = Effect(subtype, category, draw_params, render)
    CATEGORY_OF[subtype] = category
    return EFFECTS[subtype]


def register_protocol(name: str, subtypes) -> tuple:
    """PROTOCOLS[name] = the subtypes of a benchmark's corruption protocol (each already registered)."""
    for s in subtypes:
        _check_subtype(s)
    PROTOCOLS[name] = tuple(subtypes)
    return PROTOCOLS[name]


# ----------------------------------------------------------------------------- the spec (V~, Eq. 4)

def _draw_params(subtype: str, eta: float, seed: int) -> dict:
    """Resolve the physical knobs of one subtype at intensity eta. The random factors are drawn in a
    fixed order that does not depend on eta, so with one seed every knob is monotone in eta."""
    knobs = EFFECTS[subtype].draw_params(ParamDraw(kernels.seeded_rng(seed, subtype, "params"), eta))
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in knobs.items()}


def _check_subtype(subtype):
    if subtype is not None and subtype not in EFFECTS:
        extra = {}  # the subtypes registered beyond Table 8, by category
        for e in EFFECTS.values():
            if e.subtype not in SUBTYPES:
                extra.setdefault(e.category, []).append(e.subtype)
        raise ValueError(f"unknown perturbation subtype {subtype!r}; valid subtypes: {', '.join(SUBTYPES)} (PVRBench)"
                         + "".join(f", {', '.join(subs)} ({cat})" for cat, subs in extra.items()))


@dataclass
class PerturbSpec:
    """The paper's V~ (Eq. 4): everything needed to regenerate one corrupted video exactly.

    subtype None means no spatial corruption (with shuffle=True: temporal corruption only, Eq. 1).
    `params` holds the resolved knobs; keys left out are drawn from (subtype, eta, seed), keys given
    override them (unknown keys are an error)."""

    subtype: str | None
    eta: float = DEFAULT_ETA
    seed: int = 0
    shuffle: bool = False
    params: dict = field(default_factory=dict)
    category: str | None = None

    def __post_init__(self):
        _check_subtype(self.subtype)
        if isinstance(self.eta, bool) or not isinstance(self.eta, (int, float)) or not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"eta must be a number in [0, 1], got {self.eta!r}")
        self.eta = float(self.eta)
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        self.seed = int(self.seed)
        self.shuffle = bool(self.shuffle)
        expected = CATEGORY_OF.get(self.subtype)
        if self.category is not None and self.category != expected:
            raise ValueError(f"category {self.category!r} does not match subtype {self.subtype!r} "
                             f"(expected {expected!r})")
        self.category = expected
        if self.subtype is None:
            if self.params:
                raise ValueError("params given for a spec without a subtype")
            return
        resolved = _draw_params(self.subtype, self.eta, self.seed)
        unknown = set(self.params) - set(resolved)
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)} for subtype {self.subtype!r}; "
                             f"valid: {sorted(resolved)}")
        resolved.update(self.params)
        self.params = resolved

    def to_dict(self) -> dict:
        return {"version": SPEC_VERSION, "category": self.category, "subtype": self.subtype,
                "eta": self.eta, "seed": self.seed, "shuffle": self.shuffle, "params": dict(self.params)}

    @classmethod
    def from_dict(cls, d: dict) -> "PerturbSpec":
        if not isinstance(d, dict):
            raise ValueError(f"a PerturbSpec dict is expected, got {type(d).__name__}")
        known = {"version", "category", "subtype", "eta", "seed", "shuffle", "params"}
        if set(d) - known:
            raise ValueError(f"unknown PerturbSpec fields {sorted(set(d) - known)}; valid: {sorted(known)}")
        if "subtype" not in d:
            raise ValueError("PerturbSpec dict has no 'subtype' field")
        if d.get("version", SPEC_VERSION) != SPEC_VERSION:
            raise ValueError(f"PerturbSpec version {d['version']} is not supported (this is {SPEC_VERSION})")
        return cls(subtype=d["subtype"], eta=d.get("eta", DEFAULT_ETA), seed=d.get("seed", 0),
                   shuffle=d.get("shuffle", False), params=dict(d.get("params") or {}),
                   category=d.get("category"))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


def parse_eta(text) -> float | dict:
    """--eta's value: one intensity for every subtype ("0.7"), or per subtype ("0.5,fog=0.3,night=0.4": the
    first number is the others' intensity), each in [0, 1] (the grammar: perturb_cli.parse_eta). Returns a float
    or {subtype: eta, "*": the others'}."""
    if isinstance(text, (int, float, dict)):
        return text
    return perturb_cli.parse_eta(text, EFFECTS, DEFAULT_ETA)


eta_arg = perturb_cli.EtaArg(EFFECTS, DEFAULT_ETA)   # argparse's type= (eval_pvrbench.py): one line naming --eta


def eta_of(eta, subtype: str) -> float:
    """The intensity of `subtype` under `eta` (a number, or parse_eta's table)."""
    return float(eta.get(subtype, eta.get("*", DEFAULT_ETA))) if isinstance(eta, dict) else eta


def sample_spec(seed_or_rng, category=None, subtype=None, eta=DEFAULT_ETA, shuffle=False, scene="auto") -> PerturbSpec:
    """Dynamic protocol (training, Sec. 4): a fresh spec per iteration. The style is uniform over the
    four categories (Eq. 2, App. B.2.1), the subtype uniform within it, unless given. The draw never
    yields a subtype registered outside Table 8; one of them is used only when asked for by name.
    `eta`: a number or a per-subtype table (parse_eta). `scene`: the clip's kind (props.SCENES) for the
    occluders' kinds, stored in an occlusion spec's params; "auto": inferred from the depth at render."""
    rng = seed_or_rng if isinstance(seed_or_rng, np.random.Generator) else np.random.default_rng(seed_or_rng)
    _check_subtype(subtype)
    if category is not None and category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}; valid categories: {', '.join(CATEGORIES)}")
    if subtype is None:
        category = category or list(CATEGORIES)[int(rng.integers(len(CATEGORIES)))]
        subtype = CATEGORIES[category][int(rng.integers(len(CATEGORIES[category])))]
    seed = int(rng.integers(2 ** 48))
    return PerturbSpec(subtype=subtype, eta=eta_of(parse_eta(eta), subtype), seed=seed, shuffle=shuffle,
                       params=props.spec_params(subtype, seed, scene), category=category)


def static_spec(video_id, subtype, eta=DEFAULT_ETA, shuffle=False, scene="auto") -> PerturbSpec:
    """Static protocol (PVRBench, Sec. 4): one fixed spec per (video, subtype), the same on every
    machine and Python version (the seed is a SHA-256 of the ids, never Python's salted hash()).
    Registered extensions' subtypes get their seeds by the same rule. `eta`: a number or parse_eta's table.
    `scene`: the source's kind (props.SCENES; eval_pvrbench.SCENES), stored with the occluder kind it picks."""
    _check_subtype(subtype)
    seed = hash48("pvrbench", video_id, subtype)
    return PerturbSpec(subtype=subtype, eta=eta_of(parse_eta(eta), subtype), seed=seed, shuffle=shuffle,
                       params=props.spec_params(subtype, seed, scene))


def with_scene(spec, frames, depth=None) -> PerturbSpec:
    """`spec` with its occluders' scene, where it says "auto", resolved from the clip as apply does (props.resolve):
    the same pixels, and a stored spec that names its scene (a user's clip: the CLI's --scene)."""
    if spec.subtype not in props.KINDS or spec.params["scene"] != "auto":
        return spec
    x, spec, depth, ops = _prepare(frames, spec, depth)
    kind, style = props.resolve(scene.Context(x, spec, depth, ops))
    return PerturbSpec(spec.subtype, spec.eta, spec.seed, spec.shuffle, {**spec.params, "scene": kind, "style": style})


def temporal_permutation(T: int, seed: int) -> np.ndarray:
    """Eq. 1: pi, a uniformly random permutation of the T frames (never the identity when T > 1)."""
    perm = kernels.seeded_rng(seed, "shuffle", T).permutation(T)
    if T > 1 and np.array_equal(perm, np.arange(T)):
        perm = np.roll(perm, 1)
    return perm


# ----------------------------------------------------------------------------- one frame's corruption


# ----------------------------------------------------------------------------- lighting

def _dusk(ctx):
    """Warm, dim light from a low sun; the sky keeps more light than the ground; slowly darkening."""
    p = ctx.p
    warm = p["warmth"]
    table = kernels.tone_table((0.62, 0.46 - 0.1 * warm, 0.36 - 0.18 * warm), gamma=1.25)
    y = (np.arange(ctx.sh, dtype=np.float32) + 0.5) / ctx.sh
    above = 0.5 * np.clip(1 - y / max(ctx.horizon, 0.05), 0, 1)[:, None]
    drift = ctx.drift("drift", 0.08, 0.005, 0.02)
    for t in range(ctx.T):  # lighter where the depth used says sky is, and a little toward the top; grad <= 1
        grad = ctx.per_map("dusk", t, lambda t: ctx.upsample(1 - p["sky_lift"] * np.maximum(ctx.sky_small(t), above)))
        weight = np.multiply(grad, np.float32(min(1.0, p["strength"] * drift[t])), out=ctx.weights())
        yield Layer(weight, lambda f, t=t: ctx.clip_lut(table, t))


def _night(ctx):
    """Low-light sensor model: ~6x less light with partial auto-gain, scotopic desaturation, a colour
    cast (moonlight blue or sodium orange), crushed blacks, and read noise re-drawn each frame; a few
    pools of artificial light (street lamps) where the scene keeps more of its colour."""
    p, ops = ctx.p, ctx.ops
    rng = ctx.rng("lamps")
    yy, xx = np.mgrid[0:ctx.sh, 0:ctx.sw].astype(np.float32)
    pools = np.zeros((ctx.sh, ctx.sw), np.float32)
    for _ in range(p["lamps"]):  # a lamp lights a pool on the ground below the horizon
        cx, cy = rng.uniform(0, ctx.sw), rng.uniform(ctx.horizon, 1.0) * ctx.sh
        r = rng.uniform(0.12, 0.3) * max(ctx.sh, ctx.sw)
        pools = np.maximum(pools, rng.uniform(0.35, 0.6) * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r)))
    dark = ctx.upsample(1 - pools)
    tint = np.array((0.75, 0.9, 1.3) if p["tint"] == "moon" else (1.3, 0.95, 0.55), np.float32)
    desat = 0.6
    lum = np.array([0.299, 0.587, 0.114], np.float32)
    m = np.zeros((3, 4), np.float32)
    m[:, :3] = p["gain"] * tint[:, None] * ((1 - desat) * np.eye(3) + desat * lum[None])
    m[:, 3] = 3.0  # black level lift of a boosted sensor
    gamma = kernels.tone_table((1.0, 1.0, 1.0), gamma=1.15)
    noise = kernels.noise_bank(ctx.H + 16, ctx.W + 16, p["noise"])
    rng = ctx.rng("noise")
    offs = rng.integers(0, 16, (ctx.T, 2))
    drift = ctx.drift("drift", 0.05, 0.01, 0.04)

    def dim(x, out):  # the sensor's response, the whole clip at once
        return ops.lut(ops.color_matrix(x, m, out=out), gamma, out=out)

    def effect(t):  # the read noise, per frame (written over the clip's map, which is read once)
        oy, ox = offs[t]
        e = ctx.clip_map("night", dim, t)
        return ops.add_signed(e, noise[oy:oy + ctx.H, ox:ox + ctx.W], out=e)

    for t in range(ctx.T):
        weight = np.multiply(dark, np.float32(min(1.0, p["strength"] * drift[t])), out=ctx.weights())
        yield Layer(weight, lambda f, t=t: effect(t))


def _overexposure(ctx):
    """Exposure error: +0.9..1.5 stops with highlights rolling off into clipping, bloom around bright
    regions, an optional drifting glare source, and auto-exposure hunting over time."""
    p, ops = ctx.p, ctx.ops
    table = kernels.tone_table((2 ** p["stops"],) * 3, knee=0.75)
    bright = np.clip((np.arange(256) - 215) * 2.5, 0, 255).astype(np.uint8)  # bright pass of the bloom
    bw, bh = max(4, ctx.W // 8), max(4, ctx.H // 8)
    rng = ctx.rng("glare")
    gx, gy = rng.uniform(0.15, 0.85) * bw, rng.uniform(0.0, 0.35) * ctx.horizon * bh
    path = walk(rng, ctx.T, 2, 0.01, 0.03) * 0.08 * bw
    yy, xx = np.mgrid[0:bh, 0:bw].astype(np.float32)
    hunt = ctx.drift("hunt", 0.12, 0.02, 0.06)

    def effect(f, t):  # E_t: the exposed frame, its bloom added in place (it is read once)
        e = ctx.clip_lut(table, t)
        small = ops.host(ops.resize(e, bw, bh))
        halo = cv2.GaussianBlur(cv2.LUT(small, bright).astype(np.float32), (0, 0), max(1.0, bw / 24)) * \
            (0.5 * p["bloom"])
        if p["glare"] > 0.4:  # a low sun just inside the frame
            r2 = (xx - gx - path[0, t]) ** 2 + (yy - gy - path[1, t]) ** 2
            halo += (200 * (p["glare"] - 0.2) * np.exp(-r2 / (2 * (0.1 * bw) ** 2)))[..., None] * \
                np.array((1.0, 0.95, 0.8), np.float32)
        return ops.add(e, ops.resize(ops.asarray(np.clip(halo, 0, 255).astype(np.uint8)), ctx.W, ctx.H), out=e)

    for t in range(ctx.T):
        yield Layer(float(min(1.0, p["strength"] * hunt[t])), lambda f, t=t: effect(f, t))


def _shadow(ctx):
    """The cast shadow of something outside the view (a building, a wall, a tree line): the shaded side of one
    soft edge across the frame, a half-plane whose boundary bends gently, with a wide penumbra, lit only by
    bluish skylight, drifting slowly as the light moves; it covers `coverage` of what is not sky. The shade
    always reaches a border of the frame (what casts it is out there), so no dark shape floats in the view with
    nothing to cast it; never on the sky (where the depth used puts it: C is 0 there), and nowhere else
    attenuated by depth (no fixed-row streak)."""
    p = ctx.p
    rng = ctx.rng("shape")
    angle = rng.uniform(0, 2 * np.pi)
    normal = np.array([np.cos(angle), np.sin(angle)], np.float32)   # into the shade, in frame heights
    yy, xx = np.mgrid[0:ctx.sh, 0:ctx.sw].astype(np.float32)
    xx, yy = (xx + 0.5) / ctx.sh - 0.5 * ctx.sw / ctx.sh, (yy + 0.5) / ctx.sh - 0.5
    along = -xx * normal[1] + yy * normal[0]   # position along the edge
    bend = 0.04 * np.interp(along, np.linspace(-1, 1, 9), rng.uniform(-1, 1, 9)).astype(np.float32)
    across = xx * normal[0] + yy * normal[1] + bend   # signed distance into the shade, bent
    edge = kernels.weighted_quantile(across, 1 - ctx.sky_small(ctx.T // 2), 1 - min(max(p["coverage"], 0.01), 0.95))
    drift = (p["speed"] * 0.004 * (np.arange(ctx.T) - (ctx.T - 1) / 2)).astype(np.float32)   # frame heights
    penumbra = 0.08
    table = kernels.tone_table((0.3, 0.34, 0.44))
    for t in range(ctx.T):
        alpha = ctx.upsample(np.clip((across - edge + drift[t]) / penumbra + 0.5, 0, 1) * np.float32(p["darkness"]),
                             out=ctx.weights())
        alpha *= ctx.per_map("not sky", t, lambda t: 1 - ctx.sky(t))  # never on the sky
        yield Layer(alpha, lambda f, t=t: ctx.clip_lut(table, t))


# ----------------------------------------------------------------------------- camera motion

def _camera(ctx):
    """Shake: a smooth random walk of translation, zoom or roll (never independent per-frame jitter),
    with the crop-in of electronic stabilisation so that no border is ever revealed."""
    p, sub, H, W = ctx.p, ctx.spec.subtype, ctx.H, ctx.W
    path = walk(ctx.rng("walk"), ctx.T, 3, 0.015, 0.06)
    c = np.array([(W - 1) / 2, (H - 1) / 2])
    for t in range(ctx.T):
        shift = np.zeros(2)
        angle = 0.0
        if sub == "translation":
            a = p["amplitude"]
            scale = 1 + 2 * a
            shift = a * np.array([W * path[0, t], 0.8 * H * path[1, t]])
        elif sub == "zoom":
            scale = 1 + p["amplitude"] * (0.5 + 0.5 * path[0, t])
            shift = 0.4 * (1 - 1 / scale) * np.array([W, H]) * path[1:, t]  # the centre wanders, inside the crop
        else:
            max_rad = math.radians(p["degrees"])
            scale = math.cos(max_rad) + math.sin(max_rad) * max(W / H, H / W)  # covers the frame at any roll
            angle = max_rad * path[0, t]
        ca, sa = math.cos(angle) / scale, math.sin(angle) / scale
        a2 = np.array([[ca, -sa], [sa, ca]])  # output -> source: rotate and shrink about the centre
        m = np.hstack([a2, (c + shift - a2 @ c)[:, None]])
        yield Layer(warp=m.astype(np.float32))


# ----------------------------------------------------------------------------- occlusion

def _static(ctx):
    """Something between the lens and the scene, fixed for the whole clip, of a kind plausible in the clip's scene
    (machinery/corruption/props.py: indoor, aerial or street, the spec's or inferred from the depth): a lens smudge that
    blurs and veils, a raindrop on the lens, a near pillar, door frame or railing, a plant, a hand; each shaded from the
    light of what it covers (its mean colour and brightness), out of focus, never sharper than the clip (Sec. 4:
    "occlusions are placed at plausible foreground locations")."""
    yield from props.static_layers(ctx, props.resolve(ctx)[1])


def _dynamic(ctx):
    """Something crossing the view close to the camera, of a kind plausible in the clip's scene (props.KINDS:
    indoor, people walking by; aerial, a bird, another drone, a branch at the frame edge; street, pedestrians,
    vehicles, vegetation; Sec. 4: masks "conditioned on each video's content, including depth layout"). A walker
    or a car is placed on the ground plane: its feet/wheels stand on the row of its distance, its size follows
    from it; shaded by one light (a lit and a shadowed side), in the scene's exposure, over a soft contact
    shadow; out of focus by its nearness (blur ~ its size) and motion-blurred, and hidden where the depth says
    the scene is nearer than its ground contact. A walker's feet stay planted while the body passes over them
    (the gait's phase advances with the distance walked)."""
    p, W, T = ctx.p, ctx.W, ctx.T
    style, soft = props.resolve(ctx)[1], props.softness(ctx.ops.host(ctx.frames[T // 2]))
    if style not in ("pedestrian", "vehicle"):
        yield from props.foliage_layers(ctx, soft) if style == "foliage" else props.flyer_layers(ctx, style, soft)
        return
    rng = ctx.rng("actor")
    walker = style == "pedestrian"
    look = occluders.actor_look(rng, walker)
    base, height = occluders.ground_contact(ctx, walker)
    lane = rng.uniform(-0.05, 0.05) * ctx.H
    speed = 1.2 * W / T  # px per frame
    rate = min(1.5, np.pi * speed / (occluders.STEP * height))  # gait phase per frame: the planted foot stays put
    phase0 = rng.uniform(0, 2 * np.pi)
    k = max(1.0, height / 64)  # drawn at <= 64 px tall, then upscaled: it is out of focus anyway
    sigma, streak = math.hypot(max(0.6, 0.014 * height), soft) / k, 0.15 * speed / k  # shutter: 15% of a frame
    light, cache = occluders.scene_light(ctx.small_frame), {}
    if walker:  # lit() is linear: lighting the clothes is lighting the painted walker, at no cost per frame
        look.update({key: occluders.Paint.rgba(occluders.lit(np.asarray(look[key], np.float32), light))
                     for key in occluders.CLOTHES})
    for t in range(T):
        if walker or t == 0:  # a car is rigid: one image for the clip
            img, alpha, shadow, cx_px = occluders.actor_frame(walker, height / k, phase0 + rate * t, look,
                                                              p["direction"], cache)
            lit = img if walker else occluders.lit(img, light)
            weight, effect, (ox, oy) = occluders.defocus(lit, alpha, shadow, sigma, streak, k, cache)
        frac = (t + 0.5) / T
        cx = (-0.1 + 1.2 * (frac if p["direction"] > 0 else 1 - frac)) * W
        top, left = int(round(base + lane - height)) + oy, int(round(cx - cx_px * k)) + ox
        yield occluders.behind_nearer(ctx, occluders.placed(weight, effect, top, left, ctx.H, W), t, base + lane)


# ----------------------------------------------------------------------------- weather

def _fog(ctx):
    """Koschmieder's law I = J t + A (1 - t), t = exp(-beta d): depth-graded haze, thick toward the
    horizon and on the sky, with fog banks (heterogeneous density) drifting on the wind."""
    p = ctx.p
    rng = ctx.rng("banks")
    pad = max(ctx.sh, ctx.sw)
    banks = kernels.noise_field(rng, ctx.sh + pad, ctx.sw + pad, cells=3, octaves=2)
    wind = rng.uniform(-1, 1, 2) * pad / 64
    start = pad / 2 - wind * ctx.T / 2
    cast = rng.uniform(-0.03, 0.03, 3)
    airlight = tuple(int(round(255 * min(1.0, p["airlight"] * (1 + c)))) for c in cast)
    breathe = ctx.drift("breathe", 0.1, 0.01, 0.04)
    for t in range(ctx.T):
        m = np.float32([[1, 0, start[0] + wind[0] * t], [0, 1, start[1] + wind[1] * t]])
        bank = cv2.warpAffine(banks, m, (ctx.sw, ctx.sh), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP)
        beta = p["beta"] * breathe[t] * (1 + p["heterogeneity"] * 2 * (bank - 0.5))  # smooth: low resolution
        c = ctx.upsample(beta.astype(np.float32), out=ctx.weights())  # depth edges: full resolution, in place
        np.negative(c, out=c)
        c *= ctx.depth(t)
        cv2.exp(c, dst=c)  # t = exp(-beta d)
        yield Layer(np.subtract(1, c, out=c), airlight)  # C = 1 - t


# (depth z of the layer, drops per 448x448 at density 1, fall speed and streak length in frame heights
#  per frame, line thickness, opacity): far layers are dense, thin and slow on screen, near ones sparse.
_RAIN_LAYERS = ((0.75, 700, 0.030, 0.050, 1, 0.35), (0.45, 260, 0.050, 0.085, 1, 0.55),
                (0.15, 60, 0.085, 0.140, 2, 0.45))
# (depth z, flakes per 448x448 at density 1, fall speed in frame heights per frame, radius px at 448, opacity)
_SNOW_LAYERS = ((0.75, 900, 0.006, 0.8, 0.75), (0.45, 350, 0.012, 1.6, 0.9), (0.15, 70, 0.022, 3.2, 0.8))


def _rain(ctx):
    """Slanted, motion-blurred rain streaks in three depth layers, falling between frames, with mist."""
    H, W, T = ctx.H, ctx.W, ctx.T
    theta = math.radians(ctx.p["angle"])
    direction = np.array([math.sin(theta), math.cos(theta)])
    scale = H / 448

    def strokes(layer, u):  # a streak per drop, from its tail to its head
        z, _, speed, length, thick, opacity = layer
        v = speed * H * ctx.p["speed"] * (0.9 + 0.2 * u[:, 2])
        ln = length * H * (0.7 + 0.6 * u[:, 3])
        ext = np.array([W + 2 * length * H, H + length * H])  # wrap-around extent: rain never stops
        head = np.mod(u[:, :2] * ext + (np.arange(T)[:, None, None] * v[:, None]) * direction, ext)
        head = head - [length * H, 0]
        pts = np.round(np.stack([head - ln[:, None] * direction, head], 2) * 4).astype(np.int32)
        faint = u[:, 4] < 0.5  # drops differ in brightness: two groups
        width = max(1, int(round(thick * scale)))
        return [(pts[:, faint], int(255 * (0.55 * opacity)), width), (pts[:, ~faint], int(255 * opacity), width)]

    def soften(layer, buf):  # near drops are out of focus
        return cv2.GaussianBlur(buf, (0, 0), 0.8 * scale) if layer[0] < 0.3 else buf

    def reach(layer):
        return kernels.blur_reach(0.8 * scale) if layer[0] < 0.3 else 0

    yield from scene.particles(ctx, _RAIN_LAYERS, strokes, soften, reach, ctx.p["mist"], (200, 205, 214))


def _snow(ctx):
    """Snow flakes of varying size in three depth layers, falling and drifting side to side, near
    flakes large and out of focus, with a whitening haze."""
    H, W, T = ctx.H, ctx.W, ctx.T
    wind = ctx.p["wind"] * 0.004 * W
    scale = H / 448
    t = np.arange(T)[:, None]

    def strokes(layer, u):  # a zero-length thick line per flake, grouped by flake size
        z, _, speed, radius, opacity = layer
        fall = speed * H * (0.8 + 0.4 * u[:, 2])
        sway = (0.5 + u[:, 3]) * radius * scale * 4 * np.sin((0.15 + 0.25 * u[:, 4]) * t + 2 * np.pi * u[:, 5])
        ext = np.array([W + 20 * scale, H + 20 * scale])
        pos = np.mod(u[:, :2] * ext + np.stack([wind * (1 - z) * t + sway, fall * t], 2), ext) - 10 * scale
        q = np.round(pos * 4).astype(np.int32)
        size = np.clip(np.round(2 * radius * scale * ctx.p["flake"] * (0.6 + 0.8 * u[:, 2])), 1, None).astype(int)
        return [(np.stack([q[:, size == d]] * 2, 2), int(255 * opacity), int(d)) for d in np.unique(size)]

    def sigma(layer):  # round flakes: blurred over 0.3 of their diameter
        return 0.3 * (2 * layer[3] * scale * ctx.p["flake"])

    def soften(layer, buf):  # the nearest layer is also out of focus
        z, _, _, radius, _ = layer
        if z < 0.3:
            return kernels.wide_blur(kernels.HOST, buf, radius * scale)
        return cv2.GaussianBlur(buf, (0, 0), sigma(layer))

    def reach(layer):  # the wide blur works on a downscaled frame: the whole of it
        return None if layer[0] < 0.3 else kernels.blur_reach(sigma(layer))

    yield from scene.particles(ctx, _SNOW_LAYERS, strokes, soften, reach, ctx.p["haze"], (238, 241, 246))


# ----------------------------------------------------------------------------- Table 8's effects, registered

# The knobs of each subtype at intensity eta (d: ParamDraw; App. B.2). Lighting: E is the full-strength look,
# C = strength (Sec. 3.1 "per-pixel effect intensity"); camera: amplitudes of the shake (fractions of the frame
# side, degrees); occlusion: covered area (static), size by nearness (dynamic).
_TABLE_8 = {
    "dusk": (lambda d: dict(strength=d.s * d.u(0.85, 1.0), warmth=d.u(0.6, 1.0), sky_lift=d.u(0.2, 0.45)), _dusk),
    "night": (lambda d: dict(strength=d.s * d.u(0.9, 1.0), gain=d.u(0.14, 0.22), noise=d.u(3.0, 5.0),
                             tint=d.pick(("moon", "sodium")), lamps=int(d.rng.integers(1, 4))), _night),
    "overexposure": (lambda d: dict(strength=d.s * d.u(0.85, 1.0), stops=d.u(0.9, 1.5), bloom=d.u(0.4, 0.8),
                                    glare=d.u(0.0, 1.0)), _overexposure),
    "shadow": (lambda d: dict(coverage=(0.15 + 0.35 * d.eta) * d.u(0.85, 1.15),
                              darkness=(0.35 + 0.6 * d.eta) * d.u(0.9, 1.0), speed=d.u(0.3, 1.0)), _shadow),
    "translation": (lambda d: dict(amplitude=0.06 * d.eta * d.u(0.85, 1.15)), _camera),
    "zoom": (lambda d: dict(amplitude=0.22 * d.eta * d.u(0.85, 1.15)), _camera),
    "rotation": (lambda d: dict(degrees=7.0 * d.eta * d.u(0.85, 1.15)), _camera),
    "static": (lambda d: dict(area=(0.06 + 0.3 * d.eta) * d.u(0.85, 1.15), scene="auto", style="auto",
                              opacity=0.55 + 0.43 * d.eta), _static),
    "dynamic": (lambda d: dict(nearness=0.45 + 0.55 * d.eta * d.u(0.85, 1.0), scene="auto", style="auto",
                               direction=d.pick((-1, 1))), _dynamic),
    "fog": (lambda d: dict(beta=3.6 * d.eta * d.u(0.85, 1.15), airlight=d.u(0.75, 0.9),
                           heterogeneity=d.u(0.3, 0.6)), _fog),
    "rain": (lambda d: dict(density=d.eta * d.u(0.85, 1.15), angle=d.u(-22.0, 22.0), speed=d.u(0.85, 1.15),
                            mist=0.3 * d.eta * d.u(0.85, 1.15)), _rain),
    "snow": (lambda d: dict(density=d.eta * d.u(0.85, 1.15), wind=d.u(-1.0, 1.0), flake=d.u(0.85, 1.2),
                            haze=0.4 * d.eta * d.u(0.85, 1.15)), _snow),
}
for _sub in SUBTYPES:
    register_effect(_sub, CATEGORY_OF[_sub], *_TABLE_8[_sub])
del _sub


# ----------------------------------------------------------------------------- public API

def _prepare(frames, spec, depth):
    if isinstance(spec, dict):
        spec = PerturbSpec.from_dict(spec)
    if not isinstance(spec, PerturbSpec):
        raise ValueError(f"spec must be a PerturbSpec or its dict, got {type(spec).__name__}")
    x, ops = kernels.check_frames(frames)
    T, H, W = (int(s) for s in x.shape[:3])
    if depth is not None:
        depth = depth.detach().cpu().numpy() if hasattr(depth, "detach") else np.asarray(depth)
        if depth.shape == (H, W):
            depth = np.broadcast_to(depth, (T, H, W))
        if depth.shape != (T, H, W):
            raise ValueError(f"depth must have shape [T,H,W] = {(T, H, W)} or [H,W], got {depth.shape}")
    if spec.shuffle:  # Eq. 1 / Eq. 2: frames are re-ordered first, the spatial masks follow output time
        perm = temporal_permutation(T, spec.seed)
        x = ops.take(x, perm)
        depth = None if depth is None else depth[perm]
    return x, spec, depth, ops


def apply(frames, spec, depth=None):
    """Corrupt a clip: V' = {f_pi(t) (.) P_t} (Eq. 2), read as f' = f + B C (E - f) (Sec. 3.1).

    frames: uint8 [T,H,W,3] numpy array or torch tensor (any device); spec: PerturbSpec or its dict;
    depth: optional true depth [T,H,W] or [H,W] in any unit (else depth_proxy of the middle frame is used).
    Returns a new clip of the same shape, dtype, type and device. Deterministic in (frames, spec)."""
    x, spec, depth, ops = _prepare(frames, spec, depth)
    if spec.subtype is None:
        return x.clone() if hasattr(x, "clone") else x.copy()
    out = ops.empty_like(x)
    composite = scene.Compositor(x, ops, out)
    for t, layer in enumerate(EFFECTS[spec.subtype].render(scene.Context(x, spec, depth, ops, composite))):
        composite.add(t, layer)
    composite.flush()
    return out


def masks(frames, spec, depth=None):
    """The layout B [T,H,W] (bool: True = corrupted) and strength C [T,H,W] (float32 in [0,1]) of
    Sec. 3.1, as numpy arrays, or torch tensors on the frames' device. P = B (.) C is the weight of the
    effect layer in `apply`; where B is False `apply` leaves the pixel unchanged. Temporal shuffle
    alone (no subtype) corrupts no pixel, so B is all False."""
    x, spec, depth, ops = _prepare(frames, spec, depth)
    T, H, W = (int(s) for s in x.shape[:3])
    C = np.zeros((T, H, W), np.float32)
    if spec.subtype is not None:
        for t, layer in enumerate(EFFECTS[spec.subtype].render(scene.Context(x, spec, depth, ops))):
            if layer.warp is not None:
                C[t] = kernels.moved(layer.warp, H, W)
            elif layer.roi is None:
                C[t] = layer.weight
            else:
                y0, y1, x0, x1 = layer.roi
                C[t, y0:y1, x0:x1] = layer.weight
    B = C > 0
    if isinstance(x, np.ndarray):
        return B, C
    return ops.asarray(B), ops.asarray(C)


# ----------------------------------------------------------------------------- command line

def main(argv=None):
    """Corrupt a video, or draw a protocol's contact sheet (the flags, reading, writing: perturb_cli.py)."""
    args = perturb_cli.parse_args(argv, tuple(EFFECTS), PROTOCOLS, DEFAULT_ETA)
    for job in perturb_cli.jobs(args):   # --out's clip, then --grid's; --scene auto: resolved from the clip, stored
        specs = [PerturbSpec(s, args.eta, args.seed, args.shuffle, props.spec_params(s, args.seed, args.scene))
                 for s in job.subtypes]
        specs = [with_scene(spec, job.frames, job.depth) for spec in specs]
        job.write([(spec, apply(job.frames, spec, job.depth)) for spec in specs], CATEGORY_OF)
    return 0


if __name__ == "__main__":
    cli.run(main)
