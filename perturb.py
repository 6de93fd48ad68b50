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
        render(ctx) -> iterator of one Layer per frame (ctx: a _Context: sizes, ctx.p = the knobs,
            ctx.rng(*tags) = seeded streams, depth, ctx.ops = the frames' kernels).
    register_protocol(name, subtypes)   PROTOCOLS[name]: the subtypes of a benchmark's protocol.

A registered subtype is accepted wherever one of Table 8's is (PerturbSpec, static_spec with its seed by
the same rule, sample_spec by name, apply, masks, the CLI); EFFECTS lists them, Table 8's first. A new
category is not added to CATEGORIES (Table 8's four styles), so sample_spec's style draw never yields it.
Extensions register on import (Robust-TO's motion_blur and noise: extensions/robust_to/corruptions.py).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import cv2
import numpy as np

from machinery import runtime
from machinery import video

CATEGORIES = {  # Table 8
    "lighting": ("dusk", "night", "overexposure", "shadow"),
    "camera": ("translation", "zoom", "rotation"),
    "occlusion": ("static", "dynamic"),
    "weather": ("fog", "rain", "snow"),
}
SUBTYPES = tuple(s for subs in CATEGORIES.values() for s in subs)
CATEGORY_OF = {s: c for c, subs in CATEGORIES.items() for s in subs}  # + registered extensions' subtypes
PROTOCOLS = {"pvrbench": SUBTYPES}  # + register_protocol's
DEFAULT_ETA = 0.7  # App. D: perturbation intensity eta = 0.7
SPEC_VERSION = 1
# The engine's look: what a spec renders. A change that draws different pixels from the same spec bumps it, so
# that a manifest or an evaluation store made with another look is never mixed with this one's clips
# (eval_pvrbench.py records it per manifest row and in its run hash). 2: the image-following depth proxy, no sky
# shadows, shaded occluders (2026-12-02). 3: walkers painted at <= 64 px tall before their defocus (was 80);
# a true depth map's median over every 4th row and column. 4: the fail-safe proxy (one gentle depth where no sky is
# seen), occluders on a ground contact or entering from the lower edge, shadows as soft-edged half-planes.
RENDER_VERSION = 4


# ----------------------------------------------------------------------------- the effects registry

@dataclass(frozen=True)
class Effect:
    """One registered subtype (see the module docstring)."""
    subtype: str
    category: str
    draw_params: Callable  # (ParamDraw) -> dict of knobs
    render: Callable       # (_Context) -> iterator of one Layer per frame


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


# ----------------------------------------------------------------------------- randomness

def hash48(*parts) -> int:
    """Stable 48-bit hash of strings (Python's hash() is salted per process; this is not)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:6], "big")


def _rng(seed: int, *tags) -> np.random.Generator:
    """An independent stream per (seed, purpose): results never depend on the order of calls."""
    return np.random.default_rng([int(seed), hash48(*tags)])


def walk(rng, T: int, dims: int, fmin=0.02, fmax=0.08, k=3) -> np.ndarray:
    """Smooth random walk in [-1, 1], shape [dims, T]: a sum of k sinusoids per dimension with random
    frequencies in [fmin, fmax] cycles per frame, random phases and 1/f amplitudes. Band-limited, so
    consecutive frames move little; a function of the frame index, so a longer clip extends it."""
    freq = rng.uniform(fmin, fmax, (dims, k))
    phase = rng.uniform(0, 2 * np.pi, (dims, k))
    amp = 1.0 / freq
    amp /= amp.sum(1, keepdims=True)
    t = np.arange(T)
    return (amp[..., None] * np.sin(2 * np.pi * freq[..., None] * t + phase[..., None])).sum(1)


def _noise_field(rng, h: int, w: int, cells=4, octaves=3) -> np.ndarray:
    """Smooth value noise in [0, 1], [h, w] float32 (fog banks, shadow shapes, smudges)."""
    acc = np.zeros((h, w), np.float32)
    amp = 1.0
    for o in range(octaves):
        n = cells * 2 ** o + 1
        grid = rng.random((n, n)).astype(np.float32)
        acc += amp * cv2.resize(grid, (w, h), interpolation=cv2.INTER_CUBIC)
        amp *= 0.5
    acc -= acc.min()
    return acc / max(float(acc.max()), 1e-6)



# ----------------------------------------------------------------------------- the spec (V~, Eq. 4)

def _draw_params(subtype: str, eta: float, seed: int) -> dict:
    """Resolve the physical knobs of one subtype at intensity eta. The random factors are drawn in a
    fixed order that does not depend on eta, so with one seed every knob is monotone in eta."""
    knobs = EFFECTS[subtype].draw_params(ParamDraw(_rng(seed, subtype, "params"), eta))
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
    first number is the others' intensity). Returns a float or {subtype: eta, "*": the others'}."""
    if isinstance(text, (int, float, dict)):
        return text
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    try:
        if len(parts) == 1 and "=" not in parts[0]:
            return float(parts[0])
        table = {"*": DEFAULT_ETA}
        for p in parts:
            name, _, value = p.rpartition("=")
            if name:
                _check_subtype(name)
            table[name or "*"] = float(value)
    except ValueError as e:
        raise ValueError(f"eta {text!r}: expected a number or 'X,subtype=Y,...' ({e})") from None
    return table


def eta_of(eta, subtype: str) -> float:
    """The intensity of `subtype` under `eta` (a number, or parse_eta's table)."""
    return float(eta.get(subtype, eta.get("*", DEFAULT_ETA))) if isinstance(eta, dict) else eta


def sample_spec(seed_or_rng, category=None, subtype=None, eta=DEFAULT_ETA, shuffle=False) -> PerturbSpec:
    """Dynamic protocol (training, Sec. 4): a fresh spec per iteration. The style is uniform over the
    four categories (Eq. 2, App. B.2.1), the subtype uniform within it, unless given. The draw never
    yields a subtype registered outside Table 8; one of them is used only when asked for by name.
    `eta`: a number or a per-subtype table (parse_eta)."""
    rng = seed_or_rng if isinstance(seed_or_rng, np.random.Generator) else np.random.default_rng(seed_or_rng)
    _check_subtype(subtype)
    if category is not None and category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}; valid categories: {', '.join(CATEGORIES)}")
    if subtype is None:
        category = category or list(CATEGORIES)[int(rng.integers(len(CATEGORIES)))]
        subtype = CATEGORIES[category][int(rng.integers(len(CATEGORIES[category])))]
    return PerturbSpec(subtype=subtype, eta=eta_of(parse_eta(eta), subtype), seed=int(rng.integers(2 ** 48)),
                       shuffle=shuffle, category=category)


def static_spec(video_id, subtype, eta=DEFAULT_ETA, shuffle=False) -> PerturbSpec:
    """Static protocol (PVRBench, Sec. 4): one fixed spec per (video, subtype), the same on every
    machine and Python version (the seed is a SHA-256 of the ids, never Python's salted hash()).
    Registered extensions' subtypes get their seeds by the same rule. `eta`: a number or parse_eta's table."""
    _check_subtype(subtype)
    return PerturbSpec(subtype=subtype, eta=eta_of(parse_eta(eta), subtype), seed=hash48("pvrbench", video_id, subtype),
                       shuffle=shuffle)


def temporal_permutation(T: int, seed: int) -> np.ndarray:
    """Eq. 1: pi, a uniformly random permutation of the T frames (never the identity when T > 1)."""
    perm = _rng(seed, "shuffle", T).permutation(T)
    if T > 1 and np.array_equal(perm, np.arange(T)):
        perm = np.roll(perm, 1)
    return perm

# ----------------------------------------------------------------------------- kernels (numpy/OpenCV and torch)

class _CV:
    """Frame kernels for numpy uint8 frames [H,W,3], on OpenCV."""

    def __init__(self):
        self._const = {}

    def asarray(self, a):
        return a

    def host(self, a):
        return a

    def empty_like(self, x):
        return np.empty_like(x)

    def take(self, x, idx):
        return x[idx]

    def const(self, color, shape):
        key = (tuple(color), shape[:2])
        if key not in self._const:
            self._const[key] = np.empty((shape[0], shape[1], 3), np.uint8)
            self._const[key][:] = np.asarray(color, np.uint8)
        return self._const[key]

    def blend(self, f, e, w, out=None):  # f + w (e - f), written into `out` if given
        if isinstance(e, tuple):
            e = self.const(e, f.shape)
        if isinstance(w, float):
            return cv2.addWeighted(f, 1.0 - w, e, w, 0.0, dst=out)
        w = np.asarray(w, np.float32)
        return cv2.blendLinear(f, e, 1.0 - w, w, dst=out)

    def lut(self, f, table, out=None):  # table uint8 [256, 3]; frames or a whole clip
        dst = None if out is None else out.reshape(-1, *f.shape[-2:])
        return cv2.LUT(f.reshape(-1, *f.shape[-2:]), table.reshape(256, 1, 3), dst=dst).reshape(f.shape)

    def color_matrix(self, f, m):  # m float32 [3, 4]: out = m[:, :3] @ rgb + m[:, 3]
        return cv2.transform(f, m)

    def warp(self, f, m):  # m [2, 3] maps output pixel -> source pixel
        h, w = f.shape[:2]
        return cv2.warpAffine(f, m, (w, h), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                              borderMode=cv2.BORDER_REFLECT_101)

    def blur(self, f, sigma):
        return cv2.GaussianBlur(f, (0, 0), sigma)

    def resize(self, f, w, h):
        shrink = w * h < f.shape[0] * f.shape[1]
        return cv2.resize(f, (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)

    def add(self, f, g):  # saturating
        return cv2.add(f, g)

    def add_signed(self, f, g128):  # f + (g - 128), saturating; g uint8 centred on 128
        return cv2.addWeighted(f, 1.0, g128, 1.0, -128.0)


_HOST = _CV()  # for host-side layers (particles), whatever the frames' backend


class _Torch:
    """The same kernels for torch uint8 tensors [H,W,3] on any device."""

    def __init__(self, device):
        import torch
        import torch.nn.functional as F
        self.torch, self.F, self.device = torch, F, device

    def asarray(self, a):
        if isinstance(a, np.ndarray):
            return self.torch.from_numpy(np.ascontiguousarray(a)).to(self.device)
        return a

    def host(self, a):
        return a.cpu().numpy()

    def empty_like(self, x):
        return self.torch.empty_like(x)

    def take(self, x, idx):
        return x[self.torch.as_tensor(idx, device=x.device)]

    def _u8(self, x):
        return x.round_().clamp_(0, 255).to(self.torch.uint8)

    def blend(self, f, e, w, out=None):
        f32 = f.float()
        e = (self.torch.tensor(e, dtype=self.torch.float32, device=f.device) if isinstance(e, tuple)
             else self.asarray(e).float())
        if not isinstance(w, float):
            w = self.asarray(np.asarray(w, np.float32))[..., None]
        res = self._u8(f32 + w * (e - f32))
        return res if out is None else out.copy_(res)

    def lut(self, f, table, out=None):
        res = self.asarray(table).gather(0, f.reshape(-1, 3).long()).reshape(f.shape)
        return res if out is None else out.copy_(res)

    def color_matrix(self, f, m):
        m = self.asarray(m)
        return self._u8(f.float() @ m[:, :3].T + m[:, 3])

    def warp(self, f, m):
        torch = self.torch
        h, w = f.shape[:2]
        m = torch.as_tensor(m, dtype=torch.float32, device=f.device)
        ys, xs = torch.meshgrid(torch.arange(h, device=f.device, dtype=torch.float32),
                                torch.arange(w, device=f.device, dtype=torch.float32), indexing="ij")
        sx = m[0, 0] * xs + m[0, 1] * ys + m[0, 2]
        sy = m[1, 0] * xs + m[1, 1] * ys + m[1, 2]
        grid = torch.stack([(2 * sx + 1) / w - 1, (2 * sy + 1) / h - 1], -1)[None]
        img = f.permute(2, 0, 1)[None].float()
        out = self.F.grid_sample(img, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
        return self._u8(out[0].permute(1, 2, 0))

    def blur(self, f, sigma):
        from torchvision.transforms.v2.functional import gaussian_blur
        k = 2 * math.ceil(3 * sigma) + 1
        return self._u8(gaussian_blur(f.permute(2, 0, 1).float(), [k, k], [sigma, sigma]).permute(1, 2, 0))

    def resize(self, f, w, h):
        mode = "area" if w * h < f.shape[0] * f.shape[1] else "bilinear"
        kw = {} if mode == "area" else {"align_corners": False}
        out = self.F.interpolate(f.permute(2, 0, 1)[None].float(), size=(h, w), mode=mode, **kw)
        return self._u8(out[0].permute(1, 2, 0))

    def add(self, f, g):
        return (f.int() + self.asarray(g).int()).clamp_(0, 255).to(self.torch.uint8)

    def add_signed(self, f, g128):
        return (f.int() + self.asarray(g128).int() - 128).clamp_(0, 255).to(self.torch.uint8)


def _check_frames(frames):
    if isinstance(frames, np.ndarray):
        kind, ops, dtype, shape = "numpy array", _CV(), frames.dtype, frames.shape
    elif type(frames).__module__.startswith("torch"):
        kind, ops, dtype, shape = "torch tensor", _Torch(frames.device), frames.dtype, tuple(frames.shape)
        if str(dtype) != "torch.uint8":
            raise ValueError(f"frames must be uint8 [T,H,W,3], got a {kind} of dtype {dtype}")
        return frames.contiguous(), ops
    else:
        raise ValueError(f"frames must be a numpy uint8 array or a torch uint8 tensor [T,H,W,3], "
                         f"got {type(frames).__name__}")
    if dtype != np.uint8:
        raise ValueError(f"frames must be uint8 [T,H,W,3], got a {kind} of dtype {dtype}")
    if len(shape) != 4:
        raise ValueError(f"frames must have shape [T,H,W,3], got {len(shape)} dims {shape}")
    if shape[3] != 3:
        raise ValueError(f"frames must have 3 (RGB) channels in the last dim, got shape {shape}")
    if min(shape[:3]) < 1:
        raise ValueError(f"frames must be non-empty, got shape {shape}")
    return np.ascontiguousarray(frames), ops


# ----------------------------------------------------------------------------- depth (spatial awareness)

def _smoothstep(e0, e1, x):
    """0 below e0, 1 above e1, a smooth (C1) cubic in between: soft thresholds, no steps."""
    u = np.clip((np.asarray(x, np.float32) - e0) / (e1 - e0), 0, 1)
    return u * u * (3 - 2 * u)


# The depth proxy's ground plane: non-sky content at the horizon is at PROXY_FAR (upright structure at the
# distance of the horizon), the ground at the bottom row at PROXY_NEAR; the sky alone is at 1. PROXY_FAR is
# beyond the farthest rain / snow layer (0.75 + its fade), so that they fall in front of distant structure,
# and below the sky rule's onset (_sky_of_depth: 0.85), so that it is never taken for sky (at 0.72, heavy
# rain hid no object of the synthetic scene from a colour-blob perceiver: extensions/embodied_r's tests).
PROXY_FAR, PROXY_NEAR, PROXY_EYE_LEVEL = 0.84, 0.12, 0.45
# With no sky in view (indoors, a close-up, a view from above) the proxy cannot tell near from far: one depth for
# the whole frame, at the middle of the rain / snow layers (a homogeneous haze, no edge at any row).
PROXY_UNIFORM = 0.45


def _sky_score(f: np.ndarray) -> np.ndarray:
    """How sky-like each pixel looks, [h,w] in [0,1], a smooth function of colour and local texture (no hard
    threshold, so a smooth image gives a smooth score): untextured and bluish (clear, hazy or dusk sky, even
    a dark one) or untextured, bright and grey (overcast)."""
    lum = f.mean(-1)
    grad = np.abs(cv2.Sobel(lum, cv2.CV_32F, 1, 0)) + np.abs(cv2.Sobel(lum, cv2.CV_32F, 0, 1))
    smooth = 1 - _smoothstep(1.0, 3.0, cv2.blur(grad, (3, 3)))  # only strong texture: clouds are sky
    grey = _smoothstep(0.6, 0.75, lum) * (1 - _smoothstep(0.1, 0.2, f.max(-1) - f.min(-1)))
    return smooth * np.maximum(_bluish(f), grey)


def _bluish(f: np.ndarray) -> np.ndarray:
    """[h,w] in [0,1]: blue over red, not black (a clear, hazy or dusk sky's colour)."""
    return _smoothstep(0.02, 0.09, f[..., 2] - f[..., 0]) * _smoothstep(0.06, 0.16, f.mean(-1))


def _sky_from_top(score: np.ndarray) -> np.ndarray:
    """Soft sky segmentation: the sky-like pixels reachable from the top edge through sky-like pixels (fuzzy
    reconstruction: a pixel's value is the best path's weakest score, paths going down or diagonally)."""
    conn = np.zeros((score.shape[0], score.shape[1] + 2), np.float32)  # a zero column each side
    conn[:, 1:-1] = score
    spread = np.empty(score.shape[1], np.float32)
    for y in range(1, len(conn)):
        above = conn[y - 1]
        np.maximum(above[1:-1], above[2:], out=spread)
        np.maximum(spread, above[:-2], out=spread)
        np.minimum(conn[y, 1:-1], spread, out=conn[y, 1:-1])
    return _smoothstep(0.3, 0.7, conn[:, 1:-1])  # clear sky is exactly 1, a weak candidate 0


def _sky_seen(sky: np.ndarray, blue: np.ndarray) -> float:
    """How sure the proxy is that the frame shows a sky above a horizon, in [0,1]: the sky found must fill most
    of the top rows (a sky is above everything in view; a bright wall or a light background behind a close-up
    fills them only in part), or a good part of them with a blue sky (between buildings, a street's sky fills a
    third to a half of them; a wall is rarely sky blue); and a few % of the frame. A smooth function of the
    segmentation and the colour."""
    rows = slice(0, max(1, len(sky) // 12))
    top, top_blue = float(sky[rows].mean()), float((sky * blue)[rows].mean())
    evidence = max(_smoothstep(0.5, 0.7, top), _smoothstep(0.15, 0.35, top_blue))
    return float(evidence * _smoothstep(0.01, 0.05, float(sky.mean())))


def _proxy(frame: np.ndarray):
    """(depth [h,w], sky [h,w], horizon as a fraction of the height, sky seen in [0,1]) of depth_proxy."""
    f = frame.astype(np.float32) / 255.0
    h, w = f.shape[:2]
    sky = _sky_from_top(_sky_score(f))
    seen = _sky_seen(sky, _bluish(f))
    extent = sky.sum(0) / h  # per column: how far down the sky reaches
    horizon = (1 - seen) * PROXY_EYE_LEVEL + seen * float(np.clip(np.quantile(extent, 0.8), 0.25, 0.8))
    y = (np.arange(h, dtype=np.float32) + 0.5) / h
    below = (y - horizon) / (1 - PROXY_EYE_LEVEL)  # the view angle below the horizon sets a ground row's depth
    soft = 0.04 * np.logaddexp(0, below / 0.04)  # softplus: the ground starts at the horizon without a kink
    ground = PROXY_FAR / (1 + (PROXY_FAR / PROXY_NEAR - 1) * soft)  # ~1/(y - y_h), normalised as true depth is
    d = seen * (sky + (1 - sky) * ground[:, None]) + (1 - seen) * PROXY_UNIFORM
    return cv2.GaussianBlur(d.astype(np.float32), (0, 0), 0.8), seen * sky, float(horizon), seen


def depth_proxy(frame: np.ndarray) -> np.ndarray:
    """Depth without a depth model, [h,w] float32 in [0,1] (0 near, 1 far), from one small RGB frame.

    Sky (untextured, bluish or bright grey, connected to the top edge; a soft segmentation) is infinitely far
    (1). When the sky found fills the top rows (_sky_seen), everything else stands on a ground plane seen from
    eye height: depth falls from PROXY_FAR at the horizon as for a flat ground (~ 1/(y - y_h), normalised as a
    true depth map is), reaching PROXY_NEAR at the bottom row when the horizon is at eye level (a camera pitched
    up sees less ground, and no nearer), and content above the horizon is upright structure at the horizon's
    distance; the horizon is where the sky ends (its lower edge over most columns). With no sky in
    view (indoors, a close-up, a surface seen from above) there is no horizon to measure from, and the proxy
    fails safe: one depth, PROXY_UNIFORM, for the whole frame (between the two, a blend by how sure it is).
    Depth is a continuous function of the image: no step at any row, an edge only where the sky's edge is."""
    return _proxy(frame)[0]


def _normalise_depth(depth: np.ndarray) -> np.ndarray:
    """A true depth map in any unit -> [0,1], d / (d + median d): unit-free, 0.5 at the median depth. The
    median is taken over every 4th row and column (a scale needs no more, and a clip's exact median was 2/3
    of a fog apply's time with a depth model)."""
    d = np.maximum(np.asarray(depth, np.float32), 0)
    return d / (d + max(float(np.median(d[..., ::4, ::4])), 1e-6))


def _sky_of_depth(d: np.ndarray, top: float) -> np.ndarray:
    """Sky (or as good as infinitely far) in [0,1] from a normalised depth map whose far limit is `top`:
    within 3-15% of the far limit, when the far limit itself is far (at least 4x the median depth)."""
    return _smoothstep(0.85, 0.97, d / max(top, 1e-6)) * _smoothstep(0.75, 0.85, top)


def _ground_of_depth(d: np.ndarray) -> float:
    """Whether a normalised depth map's lower half shows ground receding upward, in [0,1]: over the columns,
    the median rise of depth from the bottom row to the middle row (a floor or a road seen from eye height rises
    by a good part of the scale; a wall, a close-up or a surface seen from above hardly at all)."""
    h = len(d)
    rise = float(np.median(d[h // 2] - d[h - 1]))
    return float(_smoothstep(0.04, 0.12, rise))


class _Context:
    """What every effect needs: sizes, params, seeded streams, depth at frame and at working scale.

    Depth is the caller's true depth (normalised per clip) or the proxy of the middle frame; either is
    computed on first use (the camera effects never need it). `sky(t)` and `sky_small(t)` are where the
    depth used says the sky is: within a few % of its far limit (the proxy's sky is at 1; a true depth map's
    sky at its largest values, when those are far)."""

    def __init__(self, frames, spec, depth, ops, out=None):
        self.spec, self.p, self.ops, self.frames, self.out = spec, spec.params, ops, frames, out
        self._luts = {}
        self.T, self.H, self.W = (int(s) for s in frames.shape[:3])
        self.sh, self.sw = max(24, round(self.H / 8)), max(24, round(self.W / 8))  # grid of the smooth maps
        self._given, self._full = depth, {}

    @functools.cached_property
    def small_frame(self):
        """The middle frame at the smooth maps' scale, host uint8 [sh, sw, 3]."""
        return self.ops.host(self.ops.resize(self.frames[self.T // 2], self.sw, self.sh))

    @functools.cached_property
    def _maps(self):
        """(depth at working scale per frame, its far limit, horizon as a fraction of the height, ground)."""
        if self._given is None:
            d, _, horizon, seen = _proxy(self.small_frame)
            return [d], 1.0, float(np.clip(horizon, 0.2, 0.8)), seen  # the proxy's sky is at 1
        self._full_given = _normalise_depth(self._given)
        small = [cv2.resize(self._full_given[t], (self.sw, self.sh), interpolation=cv2.INTER_AREA)
                 for t in range(self.T)]
        top = max(float(m.max()) for m in small)
        below = np.nonzero(_sky_of_depth(np.median(small[0], axis=1), top) < 0.5)[0]
        horizon = float(np.clip((below[0] if len(below) else PROXY_EYE_LEVEL * self.sh) / self.sh, 0.2, 0.8))
        return small, top, horizon, _ground_of_depth(small[self.T // 2])

    @property
    def _small(self):
        return self._maps[0]

    @property
    def horizon(self):
        return self._maps[2]

    @property
    def ground(self):
        """How sure the depth used is that the lower frame shows ground receding toward a horizon, in [0,1]: the
        proxy's sky-seen; for a true depth map, _ground_of_depth."""
        return self._maps[3]

    def rng(self, *tags):
        return _rng(self.spec.seed, self.spec.subtype, *tags)

    def drift(self, tag, amount, fmin, fmax):
        """[T]: 1 + amount x a smooth walk, for slow changes over the clip (light, exposure, density)."""
        return 1 + amount * walk(self.rng(tag), self.T, 1, fmin, fmax)[0]

    def clip_lut(self, table, t):
        """Frame t of the whole clip through a tone table. One call for the clip (faster than per frame),
        written into `apply`'s output buffer: frame t of it is read as E_t, then overwritten by the
        composite of frame t (a fresh 10 MB buffer per call costs page faults, measured up to +50%)."""
        key = table.tobytes()
        if key not in self._luts:
            self._luts[key] = self.ops.lut(self.frames, table, out=None if self._luts else self.out)
        return self._luts[key][t]

    def per_map(self, name, t, make):
        """make(t), computed once per depth map used (one for the proxy, one per frame for a true depth map)
        and kept, under `name`, for this call of apply."""
        key = (name, t if len(self._small) > 1 else 0)
        if key not in self._full:
            self._full[key] = make(t)
        return self._full[key]

    def depth_small(self, t):
        return self._small[t if len(self._small) > 1 else 0]

    def sky_small(self, t):
        """Where the depth used says sky, at working scale, in [0,1] (_sky_of_depth)."""
        return self.per_map("sky small", t, lambda t: _sky_of_depth(self.depth_small(t), self._maps[1]))

    def sky(self, t):
        """The same at full resolution: exactly 1 wherever depth(t) is within 3% of the far limit."""
        return self.per_map("sky", t, lambda t: _sky_of_depth(self.depth(t), self._maps[1]))

    def depth(self, t):
        """Full-resolution depth of frame t in [0,1]."""
        return self.per_map("depth", t, lambda t: self._full_given[t] if self._given is not None else
                            cv2.resize(self.depth_small(t), (self.W, self.H), interpolation=cv2.INTER_LINEAR))

    def upsample(self, m):
        return cv2.resize(m, (self.W, self.H), interpolation=cv2.INTER_LINEAR)


@dataclass(frozen=True)
class Layer:
    """One frame's corruption: f' = f + w (E - f) inside roi (Sec. 3.1, w = B (.) C), or a warp."""
    weight: object = 1.0        # float (uniform) or float32 map [h, w] of the roi / frame
    effect: object = None       # colour tuple, host uint8 image, or callable(frame_region) -> image
    roi: tuple | None = None    # (y0, y1, x0, x1) or None for the whole frame
    warp: np.ndarray | None = None  # [2,3] output->source map: E = warp(f), C = 1

    def effect_on(self, region):
        return self.effect(region) if callable(self.effect) else self.effect


UNCHANGED = Layer(0.0, (0, 0, 0))  # a frame left exactly as it was


# ----------------------------------------------------------------------------- lighting

def _tone_table(gains, gamma=1.0, knee=None) -> np.ndarray:
    """Per-channel tone curve 255 * (g_c x)^gamma, with an optional soft shoulder above `knee`."""
    x = np.arange(256, dtype=np.float64)[:, None] / 255.0
    y = (np.asarray(gains)[None] * x) ** gamma
    if knee is not None:  # highlights roll off smoothly into clipping (overexposure)
        over = np.maximum(y - knee, 0)
        y = np.where(y > knee, knee + (1 - knee) * (1 - np.exp(-over / (1 - knee))), y)
    return np.clip(np.round(255 * y), 0, 255).astype(np.uint8)


def _dusk(ctx):
    """Warm, dim light from a low sun; the sky keeps more light than the ground; slowly darkening."""
    p = ctx.p
    warm = p["warmth"]
    table = _tone_table((0.62, 0.46 - 0.1 * warm, 0.36 - 0.18 * warm), gamma=1.25)
    y = (np.arange(ctx.sh, dtype=np.float32) + 0.5) / ctx.sh
    above = 0.5 * np.clip(1 - y / max(ctx.horizon, 0.05), 0, 1)[:, None]
    drift = ctx.drift("drift", 0.08, 0.005, 0.02)
    for t in range(ctx.T):  # lighter where the depth used says sky is, and a little toward the top; grad <= 1
        grad = ctx.per_map("dusk", t, lambda t: ctx.upsample(1 - p["sky_lift"] * np.maximum(ctx.sky_small(t), above)))
        yield Layer(grad * np.float32(min(1.0, p["strength"] * drift[t])), lambda f, t=t: ctx.clip_lut(table, t))


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
    gamma = _tone_table((1.0, 1.0, 1.0), gamma=1.15)
    noise = _noise_bank(ctx.H + 16, ctx.W + 16, p["noise"])
    rng = ctx.rng("noise")
    offs = rng.integers(0, 16, (ctx.T, 2))
    drift = ctx.drift("drift", 0.05, 0.01, 0.04)
    for t in range(ctx.T):
        oy, ox = offs[t]
        nz = noise[oy:oy + ctx.H, ox:ox + ctx.W]
        yield Layer(dark * np.float32(min(1.0, p["strength"] * drift[t])),
                    lambda f, nz=nz: ops.add_signed(ops.lut(ops.color_matrix(f, m), gamma), nz))


@functools.lru_cache(maxsize=9)
def _noise_bank(h, w, sigma):
    """Gaussian sensor noise (luminance + weaker chroma), uint8 centred on 128. A fixed seed: a pure
    function of its arguments, cached because drawing normals is the slow part."""
    r = np.random.default_rng(hash48("sensor-noise", h, w))
    n = r.standard_normal((h, w, 1), np.float32) * sigma + r.standard_normal((h, w, 3), np.float32) * sigma * 0.4
    return np.clip(np.round(128 + n), 0, 255).astype(np.uint8)


def _overexposure(ctx):
    """Exposure error: +0.9..1.5 stops with highlights rolling off into clipping, bloom around bright
    regions, an optional drifting glare source, and auto-exposure hunting over time."""
    p, ops = ctx.p, ctx.ops
    table = _tone_table((2 ** p["stops"],) * 3, knee=0.75)
    bright = np.clip((np.arange(256) - 215) * 2.5, 0, 255).astype(np.uint8)  # bright pass of the bloom
    bw, bh = max(4, ctx.W // 8), max(4, ctx.H // 8)
    rng = ctx.rng("glare")
    gx, gy = rng.uniform(0.15, 0.85) * bw, rng.uniform(0.0, 0.35) * ctx.horizon * bh
    path = walk(rng, ctx.T, 2, 0.01, 0.03) * 0.08 * bw
    yy, xx = np.mgrid[0:bh, 0:bw].astype(np.float32)
    hunt = ctx.drift("hunt", 0.12, 0.02, 0.06)

    def effect(f, t):
        e = ctx.clip_lut(table, t)
        small = ops.host(ops.resize(e, bw, bh))
        halo = cv2.GaussianBlur(cv2.LUT(small, bright).astype(np.float32), (0, 0), max(1.0, bw / 24)) * \
            (0.5 * p["bloom"])
        if p["glare"] > 0.4:  # a low sun just inside the frame
            r2 = (xx - gx - path[0, t]) ** 2 + (yy - gy - path[1, t]) ** 2
            halo += (200 * (p["glare"] - 0.2) * np.exp(-r2 / (2 * (0.1 * bw) ** 2)))[..., None] * \
                np.array((1.0, 0.95, 0.8), np.float32)
        return ops.add(e, ops.resize(ops.asarray(np.clip(halo, 0, 255).astype(np.uint8)), ctx.W, ctx.H))

    for t in range(ctx.T):
        yield Layer(float(min(1.0, p["strength"] * hunt[t])), lambda f, t=t: effect(f, t))


def _weighted_quantile(values, weights, q):
    """The q-quantile of `values` where each counts by its weight (all equal when the weights sum to ~0)."""
    order = np.argsort(values, axis=None)
    w = np.asarray(weights, np.float64).ravel()[order] + 1e-6
    return float(values.ravel()[order][min(np.searchsorted(np.cumsum(w), q * w.sum()), w.size - 1)])


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
    edge = _weighted_quantile(across, 1 - ctx.sky_small(ctx.T // 2), 1 - min(max(p["coverage"], 0.01), 0.95))
    drift = (p["speed"] * 0.004 * (np.arange(ctx.T) - (ctx.T - 1) / 2)).astype(np.float32)   # frame heights
    penumbra = 0.08
    table = _tone_table((0.3, 0.34, 0.44))
    for t in range(ctx.T):
        alpha = ctx.upsample(np.clip((across - edge + drift[t]) / penumbra + 0.5, 0, 1) * np.float32(p["darkness"]))
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


def _moved(m, H, W):
    """B for a warp: every pixel whose source is not itself (what the warp moved)."""
    m = np.asarray(m, np.float64)
    ys, xs = np.mgrid[0:H, 0:W].astype(np.float64)
    dx = m[0, 0] * xs + m[0, 1] * ys + m[0, 2] - xs
    dy = m[1, 0] * xs + m[1, 1] * ys + m[1, 2] - ys
    return dx * dx + dy * dy > 1e-10


# ----------------------------------------------------------------------------- occlusion

def _blob(rng, n=72, wobble=0.45) -> np.ndarray:
    """An organic closed outline around the origin, radius 1 + sum_k a_k cos(k phi + phi_k)."""
    phi = np.linspace(0, 2 * np.pi, n, endpoint=False)
    k = np.arange(2, 6)[:, None]
    r = 1 + (rng.uniform(0, wobble, (4, 1)) / k * np.cos(k * phi + rng.uniform(0, 2 * np.pi, (4, 1)))).sum(0)
    return np.stack([r * np.cos(phi), r * np.sin(phi)], 1)


def _fill(shape, polys) -> np.ndarray:
    m = np.zeros(shape, np.uint8)
    cv2.fillPoly(m, [np.round(q * 4).astype(np.int32) for q in polys], 255, cv2.LINE_AA, shift=2)
    return m


def _roi_of(alpha):
    ys, xs = np.nonzero(alpha > 0)
    return (int(ys.min()), int(ys.max()) + 1, int(xs.min()), int(xs.max()) + 1) if len(ys) else None


def _static(ctx):
    """Lens obstruction, fixed for the whole clip: an out-of-focus foreground object (a finger, a leaf,
    a strap) entering from the lower border, rounded and shaded by one light in the scene's exposure, or a
    lens smear that blurs and veils what is behind it."""
    p, ops, H, W = ctx.p, ctx.ops, ctx.H, ctx.W
    rng = ctx.rng("layout")
    outline = _blob(rng) * np.array([rng.uniform(0.7, 1.4), 1.0])
    if p["style"] == "object":  # attached to the lens: anchored on the lower or side borders
        side = rng.integers(3)
        u = rng.uniform(0.1, 0.9)
        anchor = [(u * W, H), (0.0, (0.4 + 0.6 * u) * H), (W, (0.4 + 0.6 * u) * H)][side]
    else:
        anchor = (rng.uniform(0.2, 0.8) * W, rng.uniform(0.25, 0.75) * H)
    sh, sw = ctx.sh * 2, ctx.sw * 2  # find the size that covers `area` of the frame, at low resolution
    radius = math.sqrt(p["area"] * H * W / np.pi)
    for _ in range(3):
        cover = _fill((sh, sw), [(outline * radius + anchor) * (sw / W)]).mean() / 255
        radius *= math.sqrt(p["area"] / max(cover, 1e-3))
    defocus = max(0.8, 0.035 * radius if p["style"] == "object" else 0.12 * radius)
    alpha = _wide_blur(_HOST, _fill((H, W), [outline * radius + anchor]).astype(np.float32) / 255, defocus)
    alpha[alpha < 1 / 255] = 0
    roi = _roi_of(alpha)
    if roi is None:
        yield from (UNCHANGED for _ in range(ctx.T))
        return
    y0, y1, x0, x1 = roi
    a = alpha[y0:y1, x0:x1]
    if p["style"] == "object":
        base = np.array([(70, 52, 40), (38, 52, 30), (46, 46, 50), (90, 66, 52)][int(rng.integers(4))], np.float32)
        tex = 0.9 + 0.2 * cv2.resize(_noise_field(rng, 16, 16), (x1 - x0, y1 - y0))
        light = np.array([rng.uniform(-0.8, 0.8), -0.8, 0.6])
        shade = _rounded_shade(outline * radius + anchor - (x0, y0), (y1 - y0, x1 - x0), radius,
                               light / np.linalg.norm(light))
        img = _lit(base * (shade * tex)[..., None], _scene_light(ctx.small_frame))
        img = cv2.GaussianBlur(np.clip(img, 0, 255).astype(np.uint8), (0, 0), defocus)
        w = a * np.float32(min(1.0, p["opacity"] + 0.45))  # an object on the lens is (almost) opaque
        yield from (Layer(w, img, roi) for _ in range(ctx.T))
    else:
        smudge = 0.55 + 0.45 * cv2.resize(_noise_field(rng, 24, 24, cells=3), (x1 - x0, y1 - y0))
        w = a * smudge * np.float32(p["opacity"])
        haze = tuple(int(v) for v in rng.integers(200, 236, 3))
        sigma = max(1.0, 0.08 * radius)
        for _ in range(ctx.T):
            yield Layer(w, lambda f: ops.blend(_wide_blur(ops, f, sigma), haze, 0.3), roi)


def _rounded_shade(outline, shape, radius, light):
    """[h,w] shading of a rounded object (a fingertip, a leaf) with this outline (px, in the [h,w] box): lit
    on one side, in its own shadow on the other, computed at about 64 px across and upscaled."""
    q = max(1.0, radius / 32)
    small = (max(1, int(math.ceil(shape[0] / q))), max(1, int(math.ceil(shape[1] / q))))
    return cv2.resize(_emboss(_fill(small, [outline / q]), 0.5 * radius / q, light), (shape[1], shape[0]))


def _wide_blur(ops, f, sigma):
    """A wide Gaussian blur at a fraction of the cost: blur a downscaled copy, then upscale it."""
    h, w = f.shape[:2]
    k = max(1, math.ceil(sigma / 2))  # an integer factor keeps INTER_AREA on its fast path
    small = ops.resize(f, max(1, w // k), max(1, h // k))
    return ops.resize(ops.blur(small, sigma / k), w, h)


def _emboss(mask, radius, light):
    """Shading [h,w] of a rounded body whose silhouette is `mask` (0/255): Lambert under the unit light
    direction (x right, y down, z toward the camera) on the normals of a pillow (the mask blurred over
    `radius` px: 45 degrees at the silhouette's edge, facing the camera inside), plus an ambient 0.35."""
    b = cv2.GaussianBlur(np.asarray(mask, np.float32), (0, 0), max(radius, 0.5), borderType=cv2.BORDER_CONSTANT)
    b *= np.float32(2.5 * radius / (8 * 255))
    gx, gy = cv2.Sobel(b, cv2.CV_32F, 1, 0), cv2.Sobel(b, cv2.CV_32F, 0, 1)
    lam = (light[2] - gx * light[0] - gy * light[1]) / np.sqrt(1 + gx * gx + gy * gy)
    return 0.35 + 0.8 * np.maximum(lam, 0)


_HALF_TURN_CS = [(math.cos(a), math.sin(a)) for a in np.linspace(-np.pi / 2, np.pi / 2, 7)]  # a capsule's end


class _Paint:
    """A sprite painted part by part, each part a rounded body shaded under the light and laid over the parts
    before it: img float32 [h,w,3] (0-255), alpha float32 [h,w]. Coordinates are in units of `unit` px (the
    object's height) from `origin` px."""

    def __init__(self, h, w, unit, origin, light):
        self.img, self.alpha = np.zeros((h, w, 3), np.float32), np.zeros((h, w), np.float32)
        self.unit, self.origin, self.light = unit, np.asarray(origin, np.float64), light
        self.canvas = np.zeros((h, w, 4), np.uint8)  # the part being drawn: colour and coverage

    def _pt(self, p):  # units -> fixed point (2 fractional bits)
        return np.rint((self.origin + self.unit * np.asarray(p, np.float64)) * 4).astype(np.int32)

    @staticmethod
    def _rgba(colour):  # (an rgba tuple already made is passed through)
        if isinstance(colour, tuple) and len(colour) == 4:
            return colour
        return tuple(min(255, max(0, int(v))) for v in colour) + (255,)

    def poly(self, pts, colour):
        cv2.fillPoly(self.canvas, [self._pt(pts)], self._rgba(colour), cv2.LINE_AA, shift=2)

    def disc(self, c0, r, colour):
        cv2.circle(self.canvas, tuple(self._pt(c0).tolist()), max(1, int(r * self.unit * 4)), self._rgba(colour), -1,
                   cv2.LINE_AA, shift=2)

    def ellipse(self, c0, axes, colour, angle=0.0):
        ax = tuple(max(1, int(a * self.unit * 4)) for a in axes)
        cv2.ellipse(self.canvas, tuple(self._pt(c0).tolist()), ax, angle, 0, 360, self._rgba(colour), -1,
                    cv2.LINE_AA, 2)

    def capsule(self, a, b, ra, rb, colour):
        """A tapered limb from a (radius ra) to b (radius rb), in units: one outline, two half-discs joined (in
        plain floats: 14 points, where numpy's per-call cost would dominate)."""
        ax, ay, bx, by = float(a[0]), float(a[1]), float(b[0]), float(b[1])
        n = math.hypot(bx - ax, by - ay)
        c0, s0 = ((bx - ax) / n, (by - ay) / n) if n > 0 else (1.0, 0.0)  # the axis; turned by _HALF_TURN_CS
        turn = [(c0 * c - s0 * s, s0 * c + c0 * s) for c, s in _HALF_TURN_CS]
        self.poly([(bx + rb * x, by + rb * y) for x, y in turn] + [(ax - ra * x, ay - ra * y) for x, y in turn],
                  colour)

    def part(self, roundness, dim=1.0):
        """Shade what was drawn since the last part as one body (`roundness` in units) and lay it on top."""
        x, y, w, h = cv2.boundingRect(np.ascontiguousarray(self.canvas[..., 3]))
        if w == 0:
            return
        roi = (slice(y, y + h), slice(x, x + w))  # only where it was drawn (the blur is zero-padded)
        part, img = self.canvas[roi], self.img[roi]
        a = part[..., 3].astype(np.float32)
        shade = _emboss(a, roundness * self.unit, self.light) * np.float32(dim)
        a *= np.float32(1 / 255)
        img += a[..., None] * (part[..., :3] * shade[..., None] - img)
        np.maximum(self.alpha[roi], a, out=self.alpha[roi])
        part[:] = 0


_LEG, _STEP = 0.225, 0.34  # thigh = shin length, step length: fractions of the walker's height


def _knee(hip, ankle):
    """Two-bone IK: the knee of a leg from hip to ankle (bones _LEG), bent forward (+x); the ankle is pulled
    in when out of reach."""
    d = ankle - hip
    n = float(np.hypot(*d))
    if n > 2 * _LEG * 0.999:
        d, n = d * (2 * _LEG * 0.999 / n), 2 * _LEG * 0.999
    return hip + d / 2 + np.array([d[1], -d[0]]) / max(n, 1e-6) * math.sqrt(_LEG ** 2 - (n / 2) ** 2), hip + d


def _gait(phase):
    """Joints of a walker at gait phase `phase` (2 pi per stride of two steps), in units of its height: x
    forward from the hip, y down from the top of the head. Each foot is planted for half the stride (it moves
    back under the hip exactly as fast as the body advances), then swung forward and lifted; the hip vaults
    over the planted foot; knees bend forward; each arm swings against the leg on its side.
    Returns {"hip", "knee", "ankle" (near, far), "elbow", "wrist" (near, far), "dy" (the body's bob)}."""
    feet = []
    for leg in (0, 1):  # near, far: half a stride apart
        u = (phase + np.pi * leg) % (2 * np.pi)
        if u < np.pi:
            feet.append((_STEP / 2 - _STEP * u / np.pi, 0.0))
        else:
            s = (u - np.pi) / np.pi
            feet.append((-_STEP / 2 + _STEP * (1 - math.cos(np.pi * s)) / 2, 0.06 * math.sin(np.pi * s)))
    planted = min(feet, key=lambda f: f[1])[0]
    reach = 2 * _LEG * 0.99
    dy = reach - math.sqrt(reach ** 2 - planted ** 2)  # the hip vaults: lowest with the feet apart
    hip = np.array([0.0, 0.965 - reach + dy])
    j = {"hip": hip, "dy": dy - 0.015, "knee": [], "ankle": [], "elbow": [], "wrist": []}
    shoulder = np.array([0.02, 0.195 + j["dy"]])
    for x, lift in feet:
        knee, ankle = _knee(hip, np.array([x, 0.965 - lift]))
        theta = -1.5 * x  # the arm on this side swings back as the leg goes forward
        phi = theta + 0.2 + 0.6 * max(theta, 0.0)  # the elbow bends more in the forward swing
        elbow = shoulder + 0.17 * np.array([math.sin(theta), math.cos(theta)])
        j["knee"].append(knee)
        j["ankle"].append(ankle)
        j["elbow"].append(elbow)
        j["wrist"].append(elbow + 0.145 * np.array([math.sin(phi), math.cos(phi)]))
    j["shoulder"] = shoulder
    return j


_TORSO = np.array([[-0.08, 0.18], [0.0, 0.165], [0.07, 0.195], [0.085, 0.27], [0.075, 0.38], [0.08, 0.46],
                   [0.085, 0.535], [-0.08, 0.535], [-0.07, 0.44], [-0.06, 0.37], [-0.085, 0.27]])  # jacket
_PELVIS = np.array([[0.075, 0.47], [0.07, 0.56], [-0.075, 0.56], [-0.07, 0.47]])


def _walker(paint, phase, look):
    """A walking adult in profile, facing +x, head 1/7.4 of the height: far arm and leg (in the body's own
    shadow), near leg, torso and head, near arm; each limb a tapered, shaded capsule."""
    j = _gait(phase)
    jacket, trousers, skin, hair, shoes = (look[k] for k in ("jacket", "trousers", "skin", "hair", "shoes"))
    sleeve = skin if look["short_sleeves"] else jacket

    def arm(i):
        paint.capsule(j["shoulder"], j["elbow"][i], 0.034, 0.027, jacket)
        paint.capsule(j["elbow"][i], j["wrist"][i], 0.026, 0.02, sleeve)
        paint.disc(j["wrist"][i] + (j["wrist"][i] - j["elbow"][i]) * 0.2, 0.022, skin)

    def leg(i):
        paint.capsule(j["hip"] + [0.0, 0.01], j["knee"][i], 0.05, 0.037, trousers)
        paint.capsule(j["knee"][i], j["ankle"][i], 0.036, 0.027, trousers)
        paint.capsule(j["ankle"][i] + [-0.025, 0.012], j["ankle"][i] + [0.1, 0.022], 0.024, 0.018, shoes)

    arm(1)
    leg(1)
    paint.part(0.035, dim=0.58)
    leg(0)
    paint.poly(_PELVIS + [0, j["dy"]], trousers)
    paint.part(0.04)
    lean = np.array([0.0, j["dy"]])
    paint.poly(_TORSO + lean, jacket)
    paint.capsule([0.012, 0.125 + j["dy"]], [0.0, 0.19 + j["dy"]], 0.027, 0.03, skin)  # neck
    paint.ellipse([0.012, 0.068 + j["dy"]], (0.06, 0.068), hair)  # the head, its hair at the back and top
    paint.ellipse([0.03, 0.082 + j["dy"]], (0.047, 0.056), skin, angle=-10)
    paint.poly([[0.07, 0.065 + j["dy"]], [0.088, 0.09 + j["dy"]], [0.066, 0.095 + j["dy"]]], skin)  # nose
    paint.part(0.05)
    arm(0)
    paint.part(0.03)


_CAR = np.array([[0.02, 0.52], [0.07, 0.4], [0.5, 0.37], [0.72, 0.08], [1.5, 0.06], [1.9, 0.36], [2.42, 0.42],
                 [2.57, 0.5], [2.58, 0.72], [2.5, 0.84], [0.06, 0.84], [0.0, 0.72]])  # side view, front at +x
_GLASS = np.array([[0.62, 0.36], [0.8, 0.13], [1.46, 0.12], [1.76, 0.36]])
_WHEELS = (0.55, 2.02)  # axle x, in car heights


def _car_body(paint, look):
    """A car in side view, facing +x, without its wheels: a rounded body lit from above, dark wheel arches,
    glass reflecting the sky (light at the top), door gaps, head- and tail-lights."""
    body = look["paint"]
    paint.poly(_CAR, body)
    paint.poly([[0.01, 0.62], [2.58, 0.62], [2.58, 0.72], [2.5, 0.84], [0.06, 0.84], [0.0, 0.72]],
               np.multiply(body, 0.72))  # the lower panels face the ground: darker
    paint.poly([[0.08, 0.395], [2.3, 0.41], [2.3, 0.425], [0.08, 0.41]], np.minimum(np.multiply(body, 1.3) + 25, 255))
    for x in _WHEELS:
        paint.disc([x, 0.8], 0.235, np.multiply(body, 0.25))  # the arch's shadow inside the body
    paint.part(0.14)
    glass = _Paint(*paint.img.shape[:2], paint.unit, paint.origin, paint.light)
    glass.poly(_GLASS, (70, 82, 96))
    glass.part(0.02)
    ramp = np.linspace(1.5, 0.6, len(paint.img), dtype=np.float32)[:, None, None]
    paint.img += glass.alpha[..., None] * (glass.img * ramp - paint.img)
    for x in (1.17, 1.8):  # door gaps
        paint.poly([[x, 0.38], [x + 0.012, 0.38], [x + 0.012, 0.8], [x, 0.8]], np.multiply(body, 0.55))
    paint.ellipse([2.5, 0.5], (0.06, 0.035), (235, 230, 205))
    paint.ellipse([0.06, 0.47], (0.03, 0.045), (170, 22, 22))
    paint.part(0.01)


def _wheels(paint):
    """Tyres and dished rims with a hub (a wheel rolling this fast shows no spokes on video: motion blur)."""
    for x in _WHEELS:
        paint.disc([x, 0.8], 0.2, (24, 24, 26))
        paint.disc([x, 0.8], 0.125, (150, 152, 158))
        paint.disc([x, 0.8], 0.09, (105, 107, 112))
        paint.disc([x, 0.8], 0.035, (135, 137, 142))
    paint.part(0.05)


def _actor_look(rng, walker):
    """Colours and the light direction of one actor, from its seeded stream."""
    side = 1.0 if rng.random() < 0.5 else -1.0
    light = np.array([side * rng.uniform(0.3, 0.8), -0.8, 0.6])
    look = {"light": light / np.linalg.norm(light)}
    pick = lambda options: np.asarray(options[int(rng.integers(len(options)))], np.float64)  # noqa: E731
    if not walker:
        look["paint"] = np.clip(pick([(215, 215, 212), (165, 168, 172), (28, 29, 32), (95, 97, 100), (150, 22, 26),
                                      (30, 55, 125), (30, 60, 45), (170, 150, 115)]) * rng.uniform(0.9, 1.1, 3), 0, 255)
        return look
    import colorsys

    hsv = rng.uniform(0, 1), rng.uniform(0.15, 0.7), rng.uniform(0.2, 0.8)  # any hue, muted to vivid, dark to light
    look["jacket"] = 255 * np.array(colorsys.hsv_to_rgb(*hsv))
    look["trousers"] = np.clip(pick([(50, 65, 100), (30, 30, 34), (140, 125, 95), (90, 90, 95), (80, 60, 45)])
                               * rng.uniform(0.85, 1.15), 0, 255)
    look["skin"] = (235, 195, 170) + rng.uniform(0, 1) * np.subtract((95, 62, 45), (235, 195, 170))
    look["hair"] = pick([(25, 20, 18), (60, 40, 25), (120, 90, 50), (190, 160, 110), (140, 140, 140)])
    look["shoes"] = pick([(30, 28, 28), (30, 28, 28), (70, 45, 30), (210, 210, 205)])
    look["short_sleeves"] = bool(rng.random() < 0.3)
    return look


def _scene_light(small):
    """What puts an actor in the scene's light, from the middle frame: a per-channel gain (its exposure and
    colour cast: a person at dusk is as dim and as blue as the dusk around them) and a chroma factor (as
    colourful as the scene: grey in a black-and-white clip)."""
    f = small[len(small) // 3:].reshape(-1, 3).astype(np.float32) / 255  # the light down where it stands
    m = f.mean(0)
    lum = max(float(m.mean()), 1e-3)
    gain = np.clip((lum / 0.45) ** 0.8, 0.25, 1.25) * np.clip((m / lum) ** 0.4, 0.8, 1.25)
    return gain.astype(np.float32), np.float32(np.clip((f.max(1) - f.min(1)).mean() / 0.12, 0, 1))


_CLOTHES = ("jacket", "trousers", "skin", "hair", "shoes")


def _lit(img, light):
    """Colours [..., 3] in the scene's light (_scene_light): linear in them."""
    gain, chroma = light
    grey = img.mean(-1, keepdims=True)
    return (grey + chroma * (img - grey)) * gain


def _actor_frame(walker, unit, phase, look, face, cache):
    """One frame of an actor `unit` px tall: (img, alpha, contact shadow) float32 maps and the canvas x (px)
    of its centre; the ground contact is the canvas row `unit`. Faces +x, mirrored when face < 0. `cache`
    keeps what does not change between frames (the shadow)."""
    if walker:
        h, w, cx, origin = int(math.ceil(1.05 * unit)), int(math.ceil(0.9 * unit)), 0.45 * unit, 0.45 * unit
    else:
        h, w, cx, origin = int(math.ceil(1.06 * unit)), int(math.ceil(2.75 * unit)), 1.37 * unit, 0.08 * unit
    light = look["light"] * [face, 1, 1]
    paint = _Paint(h, w, unit, (origin, 0), light)
    if walker:
        _walker(paint, phase, look)
    else:
        _car_body(paint, look)
        _wheels(paint)
    if "shadow" not in cache:  # on the ground under it, offset away from the light
        half, thick, dark = (0.25, 0.03, 0.6) if walker else (1.3, 0.06, 0.75)
        shadow = np.zeros((h, w), np.uint8)
        cv2.ellipse(shadow, (int((cx - light[0] * 0.08 * unit) * 4), int(0.995 * unit * 4)),
                    (int(half * unit * 4), max(1, int(thick * unit * 4))), 0, 0, 360, 255, -1, cv2.LINE_AA, 2)
        cache["shadow"] = cv2.GaussianBlur(shadow.astype(np.float32) * np.float32(dark / 255), (0, 0),
                                           max(0.7, 0.02 * unit))
    img, alpha, shadow = paint.img, paint.alpha, cache["shadow"]
    img *= np.linspace(1.08, 0.85, h, dtype=np.float32)[:, None, None]  # lit from above: darker toward the ground
    if face < 0:
        img, alpha, shadow, cx = img[:, ::-1], alpha[:, ::-1], shadow[:, ::-1], w - cx
    return img, alpha, shadow, cx


def _defocus(img, alpha, shadow, sigma, streak, k, cache):
    """The actor out of focus (sigma px) and motion-blurred (a horizontal streak px), cropped to where it
    weighs anything and upscaled k times: the Layer's weight (the actor over its darkened contact shadow),
    its effect (premultiplied colour over that weight: the blur leaves no dark fringe), and the crop's
    offset (x, y) from the canvas's corner in upscaled px (it reaches past the canvas by the blur). The
    shadow is the same in every frame: blurred once, in `cache`."""
    sx = math.sqrt(sigma ** 2 + streak ** 2 / 12)
    px, py = int(math.ceil(3 * sx)), int(math.ceil(3 * sigma))  # room for the blur around the canvas
    h, w = alpha.shape
    blur = lambda m: cv2.GaussianBlur(m, (0, 0), sigmaX=sx, sigmaY=sigma)  # noqa: E731
    stack = np.zeros((h + 2 * py, w + 2 * px, 4), np.float32)
    inner = stack[py:py + h, px:px + w]
    inner[..., :3] = img * alpha[..., None]
    inner[..., 3] = alpha
    stack = blur(stack)
    if "blurred shadow" not in cache:
        cache["blurred shadow"] = np.clip(blur(cv2.copyMakeBorder(shadow, py, py, px, px, cv2.BORDER_CONSTANT)), 0, 1)
    a, s = np.clip(stack[..., 3], 0, 1), cache["blurred shadow"]
    weight = a + (1 - a) * s
    x, y, cw, ch = cv2.boundingRect((weight > 1e-3).view(np.uint8))
    if cw == 0:
        return None, None, (0, 0)
    weight, stack = weight[y:y + ch, x:x + cw], stack[y:y + ch, x:x + cw]
    effect = np.clip(stack[..., :3] / np.maximum(weight, 1e-3)[..., None] + 0.5, 0, 255).astype(np.uint8)
    size = (max(1, int(round(cw * k))), max(1, int(round(ch * k))))
    return (cv2.resize(weight, size, interpolation=cv2.INTER_LINEAR),
            cv2.resize(effect, size, interpolation=cv2.INTER_LINEAR),
            (int(round((x - px) * k)), int(round((y - py) * k))))


def _ground_contact(ctx, walker):
    """(ground contact row, height) of a dynamic actor in px, from its nearness. Where the depth used shows
    ground (ctx.ground), on the ground plane seen by a camera 1.5 m high (a 1.75 m walker's head just above the
    horizon, a 1.45 m car's roof just below it). Where it does not (a close-up, a wall, a view from above), the
    actor passes just in front of the camera with its contact below the frame, cut by the lower edge, its size
    set by its nearness: it never stands on a row where nothing says there is ground."""
    H, n = ctx.H, ctx.p["nearness"]
    if ctx.ground < 0.5:
        height = H * ((0.8 + 0.9 * n) if walker else (0.35 + 0.35 * n))
        return H + (0.2 if walker else 0.15) * height, height   # below the edge by more than the lane's 0.05 H
    hor = float(np.clip(ctx.horizon, 0.3, 0.6)) * H
    if walker:  # 1 / distance: 4 m away at nearness 0.45, 1.5 m at 1, a frame high at ~2.3 m
        base = hor + (H - hor) * 2.5 / (6 - 4.5 * n)
    else:  # a car's roof stays at the horizon: its size grows more slowly
        base = hor + (H - hor) * (0.35 + 0.6 * n)
    return base, max(0.25 * H, (base - hor) * (1.75 / 1.5 if walker else 1.45 / 1.5))


def _placed(weight, effect, top, left, H, W):
    """The Layer of an actor image whose corner is at (top, left) px, cropped to the frame."""
    if weight is None:
        return UNCHANGED
    y0, y1 = max(top, 0), min(top + weight.shape[0], H)
    x0, x1 = max(left, 0), min(left + weight.shape[1], W)
    if y0 >= y1 or x0 >= x1:
        return UNCHANGED
    sl = (slice(y0 - top, y1 - top), slice(x0 - left, x1 - left))
    return Layer(np.ascontiguousarray(weight[sl]), np.ascontiguousarray(effect[sl]), (y0, y1, x0, x1))


def _dynamic(ctx):
    """A pedestrian or a vehicle close to the camera crossing the view along a smooth path. Placed on the
    ground plane: its feet/wheels stand on the row of its distance, its size follows from it; shaded by one
    light (a lit and a shadowed side), in the scene's exposure, over a soft contact shadow; out of focus by
    its nearness (blur ~ its size) and motion-blurred. A walker's feet stay planted while the body passes
    over them (the gait's phase advances with the distance walked)."""
    p, W, T = ctx.p, ctx.W, ctx.T
    rng = ctx.rng("actor")
    walker = p["style"] == "pedestrian"
    look = _actor_look(rng, walker)
    base, height = _ground_contact(ctx, walker)
    lane = rng.uniform(-0.05, 0.05) * ctx.H
    speed = 1.2 * W / T  # px per frame
    rate = min(1.5, np.pi * speed / (_STEP * height))  # gait phase per frame: the planted foot stays put
    phase0 = rng.uniform(0, 2 * np.pi)
    k = max(1.0, height / 64)  # drawn at <= 64 px tall, then upscaled: it is out of focus anyway
    sigma, streak = max(0.6, 0.014 * height) / k, 0.15 * speed / k  # shutter open 15% of a frame interval
    light, cache = _scene_light(ctx.small_frame), {}
    if walker:  # _lit is linear: lighting the clothes is lighting the painted walker, at no cost per frame
        look.update({key: _Paint._rgba(_lit(np.asarray(look[key], np.float32), light)) for key in _CLOTHES})
    for t in range(T):
        if walker or t == 0:  # a car is rigid: one image for the clip
            img, alpha, shadow, cx_px = _actor_frame(walker, height / k, phase0 + rate * t, look, p["direction"],
                                                     cache)
            weight, effect, (ox, oy) = _defocus(img if walker else _lit(img, light), alpha, shadow, sigma, streak, k,
                                                cache)
        frac = (t + 0.5) / T
        cx = (-0.1 + 1.2 * (frac if p["direction"] > 0 else 1 - frac)) * W
        yield _placed(weight, effect, int(round(base + lane - height)) + oy, int(round(cx - cx_px * k)) + ox,
                      ctx.H, W)


# ----------------------------------------------------------------------------- weather

def _fog(ctx):
    """Koschmieder's law I = J t + A (1 - t), t = exp(-beta d): depth-graded haze, thick toward the
    horizon and on the sky, with fog banks (heterogeneous density) drifting on the wind."""
    p = ctx.p
    rng = ctx.rng("banks")
    pad = max(ctx.sh, ctx.sw)
    banks = _noise_field(rng, ctx.sh + pad, ctx.sw + pad, cells=3, octaves=2)
    wind = rng.uniform(-1, 1, 2) * pad / 64
    start = pad / 2 - wind * ctx.T / 2
    cast = rng.uniform(-0.03, 0.03, 3)
    airlight = tuple(int(round(255 * min(1.0, p["airlight"] * (1 + c)))) for c in cast)
    breathe = ctx.drift("breathe", 0.1, 0.01, 0.04)
    for t in range(ctx.T):
        m = np.float32([[1, 0, start[0] + wind[0] * t], [0, 1, start[1] + wind[1] * t]])
        bank = cv2.warpAffine(banks, m, (ctx.sw, ctx.sh), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP)
        beta = p["beta"] * breathe[t] * (1 + p["heterogeneity"] * 2 * (bank - 0.5))  # smooth: low resolution
        trans = cv2.exp(-ctx.upsample(beta.astype(np.float32)) * ctx.depth(t))  # depth edges: full resolution
        yield Layer(1 - trans, airlight)  # C = 1 - t


# (depth z of the layer, drops per 448x448 at density 1, fall speed and streak length in frame heights
#  per frame, line thickness, opacity): far layers are dense, thin and slow on screen, near ones sparse.
_RAIN_LAYERS = ((0.75, 700, 0.030, 0.050, 1, 0.35), (0.45, 260, 0.050, 0.085, 1, 0.55),
                (0.15, 60, 0.085, 0.140, 2, 0.45))
# (depth z, flakes per 448x448 at density 1, fall speed in frame heights per frame, radius px at 448, opacity)
_SNOW_LAYERS = ((0.75, 900, 0.006, 0.8, 0.75), (0.45, 350, 0.012, 1.6, 0.9), (0.15, 70, 0.022, 3.2, 0.8))


def _particles(ctx, layers, strokes, soften, veil, color):
    """Rain and snow: depth layers of particles that persist between frames. `strokes(layer, u)` turns a
    layer's particles (u: [n, 6] uniform numbers each) into line groups (points [T, n, 2, 2] in fixed point
    with 2 fractional bits, grey level, thickness) for all frames at once, one draw call per group and frame;
    `soften(layer, image)` blurs the drawn layer. A layer at depth z is hidden where the scene is nearer than
    z (_behind: faded over a small depth range, never cut along a row); a veil (mist, haze) grows with scene
    depth: P = 1 - (1 - veil)(1 - particles)."""
    area = ctx.H * ctx.W / 448 ** 2
    rng = ctx.rng("particles")
    lines = []
    for layer in layers:  # the full density-1.15 population; lower densities take a prefix
        u = rng.random((int(math.ceil(layer[1] * 1.15 * area)), 6))
        lines.append(strokes(layer, u[:int(round(layer[1] * min(ctx.p["density"], 1.15) * area))]))
    def maps(t):  # what hides each layer, the veil, and what the veil leaves clear
        d = ctx.depth(t)
        veil_map = (veil * (1 - np.exp(-2.5 * d))).astype(np.float32)
        return [_behind(d, layer[0]) for layer in layers], veil_map, (1 - veil_map) * np.float32(1 / 255)

    for t in range(ctx.T):
        hidden, veil_map, clear_map = ctx.per_map("particles", t, maps)
        acc = None
        for layer, groups, behind in zip(layers, lines, hidden, strict=True):
            buf = np.zeros((ctx.H, ctx.W), np.uint8)
            for pts, level, thick in groups:
                cv2.polylines(buf, pts[t], False, level, thick, cv2.LINE_AA, shift=2)
            buf = cv2.min(soften(layer, buf), behind)
            acc = buf if acc is None else cv2.max(acc, buf)
        yield Layer(veil_map + acc * clear_map, color)


def _behind(d, z):
    """uint8 [H,W], 255 where the scene is farther than a particle layer at depth z, 0 where nearer, a ramp
    over +-0.04 of depth between: a layer fades out where a smooth depth gradient crosses z (never a cut
    along one row), and stops at the edges of what stands in front of it."""
    return np.clip((d - z) * (255 / 0.08) + 127.5, 0, 255).astype(np.uint8)


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

    yield from _particles(ctx, _RAIN_LAYERS, strokes, soften, ctx.p["mist"], (200, 205, 214))


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

    def soften(layer, buf):  # round flakes; the nearest layer is also out of focus
        z, _, _, radius, _ = layer
        diam = 2 * radius * scale * ctx.p["flake"]
        return _wide_blur(_HOST, buf, radius * scale) if z < 0.3 else cv2.GaussianBlur(buf, (0, 0), 0.3 * diam)

    yield from _particles(ctx, _SNOW_LAYERS, strokes, soften, ctx.p["haze"], (238, 241, 246))


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
    "static": (lambda d: dict(area=(0.06 + 0.3 * d.eta) * d.u(0.85, 1.15), style=d.pick(("object", "smear")),
                              opacity=0.55 + 0.43 * d.eta), _static),
    "dynamic": (lambda d: dict(nearness=0.45 + 0.55 * d.eta * d.u(0.85, 1.0), style=d.pick(("pedestrian", "vehicle")),
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
    x, ops = _check_frames(frames)
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
    for t, layer in enumerate(EFFECTS[spec.subtype].render(_Context(x, spec, depth, ops, out))):
        f = x[t]
        if layer.warp is not None:
            out[t] = ops.warp(f, layer.warp)
        elif layer.roi is None:
            ops.blend(f, layer.effect_on(f), layer.weight, out=out[t])
        else:
            out[t] = f
            y0, y1, x0, x1 = layer.roi
            region = f[y0:y1, x0:x1]
            out[t, y0:y1, x0:x1] = ops.blend(region, layer.effect_on(region), layer.weight)
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
        for t, layer in enumerate(EFFECTS[spec.subtype].render(_Context(x, spec, depth, ops))):
            if layer.warp is not None:
                C[t] = _moved(layer.warp, H, W)
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

OUT_SUFFIXES = (".mp4",)  # H.264 via video.write_video; GIF is not offered (it merges equal frames, rounds the fps)
GRID_FRAMES, GRID_MAX_PIXELS = 16, 256 * 28 * 28  # the --grid's sampled clip (the sheet shows 4 of its frames)
SAMPLE_FRAMES, SAMPLE_FPS = 16, 8.0  # the built-in clip

_CLI_EPILOG = (
    "--out writes a corrupted copy of INPUT: every frame, at its native size and fps (an odd width or height "
    "is padded by one pixel, repeating the edge: H.264 / yuv420p needs even sides). --frames and --max-pixels "
    "opt in to sampling as the model does (qwen-vl-utils' uniform indices, smart_resize). Memory: the clip is "
    "decoded and corrupted whole (the effects animate over all its frames), about 2 x frames x width x height "
    "x 3 bytes (a minute of 1080p at 30 fps: ~22 GB, 3x with --shuffle); a clip that does not fit in the "
    "available memory is refused before decoding. The --grid contact sheet samples a short clip (--frames, "
    f"default {GRID_FRAMES} or the clip's length if shorter, at --max-pixels, default {GRID_MAX_PIXELS}) and shows "
    "4 of its frames per row.")


def _check_cli_args(args):
    """The flag values, before any work: one-line UserErrors."""
    for flag, value in (("--frames", args.frames), ("--max-pixels", args.max_pixels), ("--size", args.size)):
        if value is not None and value < 1:
            raise runtime.UserError(f"{flag} must be a positive integer, got {value}")
    if args.out and not args.subtype:
        raise runtime.UserError(f"--out {args.out} needs --subtype NAME, the perturbation to apply")
    if args.max_pixels is not None and not args.input:
        raise runtime.UserError("--max-pixels resizes an INPUT video; the built-in clip's side is --size")
    try:
        PerturbSpec(args.subtype, eta=args.eta, seed=args.seed)
    except ValueError as e:
        raise runtime.UserError(str(e)) from None


def _memory_available():
    """Bytes of memory available now (Linux's MemAvailable, else the physical memory); None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _check_memory(path, info, num_frames, max_pixels, copies):
    """Refuse, before decoding, a clip whose `copies` (decoded + corrupted [+ shuffled]) cannot fit, at the
    size video.read_clip decodes it for these options."""
    n, h, w = num_frames or info["frames"], info["height"], info["width"]
    if max_pixels is not None:
        try:
            h, w = video.smart_resize(h, w, max_pixels=max_pixels)
        except ValueError as e:
            raise runtime.UserError(f"--max-pixels {max_pixels}: {e}") from None
    need, have = copies * n * h * w * 3, _memory_available()
    if have is not None and need > have:
        raise runtime.UserError(
            f"{path}: {n} frames of {w}x{h} need about {need / 1e9:.1f} GB of memory (the clip is decoded and "
            f"corrupted whole), {have / 1e9:.1f} GB are available; sample it with --frames N and/or shrink it "
            f"with --max-pixels P, or cut it first (ffmpeg -ss START -t SECONDS)")


def _fps_text(fps):
    return f"{round(float(fps), 3)}"


def _read(path, num_frames, max_pixels):
    """video.read_clip, ffmpeg's own messages about a bad file held back (the VideoError says it)."""
    with video.held_native_stderr():
        return video.read_clip(path, num_frames, max_pixels)


def _read_for_out(args, info):
    """INPUT for --out: (frames, their indices in INPUT, fps to write, what they are in words)."""
    copies = (3 if args.shuffle else 2) + (args.depth_model != "proxy")   # (+ float16 depth: 2 of 3 bytes a pixel)
    _check_memory(args.input, info, args.frames, args.max_pixels, copies)
    frames, indices, fps = _read(args.input, args.frames, args.max_pixels)
    frames, fps, what = _describe_out(args, info, frames, fps)
    return frames, indices, fps, what


def _describe_out(args, info, frames, fps):
    """(frames, fps to write, what they are in words) of INPUT's frames read for --out."""
    name, total, T = args.input, info["frames"], len(frames)
    if args.frames is None:
        what = f"all frames of {name}"
    else:
        what = f"{T} of the {total} frames of {name}, sampled uniformly" + (" (some repeated)" if T > total else "")
    if args.max_pixels is None:
        what += ", native size"
    else:
        what += f", resized from {info['width']}x{info['height']} by smart_resize (max_pixels={args.max_pixels})"
    if not fps > 0:  # a stream without a frame rate: decord reports 0
        return frames, SAMPLE_FPS, f"{what}; {name} has no frame rate, written at {SAMPLE_FPS} fps"
    if args.frames is not None:
        what += f"; its {_fps_text(fps)} fps scaled by {T}/{total} to keep its {total / fps:.2f} s"
        fps = fps * T / total
    return frames, fps, what


def _depth(args, frames, video_id, indices, given, what):
    """(depth for `apply`, `what` + where it comes from), by --depth-model: auto, the clip's own (`given`: the
    built-in clip's true depth) or else the recommended model's; proxy, none (perturb.depth_proxy); NAME, that
    model's (depth.py, cached)."""
    from machinery import depth as depth_model   # (torch and transformers load only with a depth model)

    name = args.depth_model or depth_model.PROXY
    if name == depth_model.PROXY:
        return None, what
    if name == depth_model.AUTO and given is not None:
        return given, f"{what}, with its true depth"
    source = depth_model.Depth(name, args.depth_cache or None).source
    return source(frames, video_id, indices), f"{what}; depth by {source.name}"


def _write_out(args, out, frames, fps, depth, what):
    spec = PerturbSpec(args.subtype, eta=args.eta, seed=args.seed, shuffle=args.shuffle)
    video.write_video(out, apply(frames, spec, depth), fps=fps)
    T, h, w = frames.shape[:3]
    eh, ew = video.even_size(h, w)
    if (eh, ew) != (h, w):
        what += f"; {w}x{h} padded to {ew}x{eh}, repeating the edge: H.264 needs even sides"
    print(f"wrote {out}: {T} frames, {ew}x{eh}, {_fps_text(fps)} fps ({what}); spec={spec.to_json()}")


def _write_grid(args, grid, frames, depth, what):
    rows, labels = [frames], ["clean"]
    for sub in PROTOCOLS[args.protocol]:
        spec = PerturbSpec(sub, eta=args.eta, seed=args.seed, shuffle=args.shuffle)
        rows.append(apply(frames, spec, depth))
        labels.append(f"{CATEGORY_OF[sub]}/{sub}")
    cols = 4
    video.contact_sheet(rows, labels, grid, num_cols=cols)
    h, w = frames.shape[1:3]
    print(f"wrote {grid}: clean + {len(rows) - 1} subtypes ({args.protocol}) x {min(cols, len(frames))} frames "
          f"of {what}, {w}x{h} each; eta={args.eta}, seed={args.seed}")


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Corrupt a video with one of PVRBench's 12 perturbations (Table 8) or a registered "
                    "extension's, or render the contact sheet of a protocol's subtypes. "
                    "With no INPUT, a procedural street clip (with its true depth) generated by the project "
                    "is used.", epilog=_CLI_EPILOG)
    ap.add_argument("input", nargs="?", help="input video (mp4, ...); default: the built-in sample clip")
    ap.add_argument("--subtype", choices=tuple(EFFECTS),
                    help="perturbation subtype (Table 8, or a registered extension's)")
    ap.add_argument("--eta", type=float, default=DEFAULT_ETA, help="intensity in [0,1] (App. D: 0.7)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the spec (the layout and animation)")
    ap.add_argument("--shuffle", action="store_true", help="also shuffle the frames (Eq. 1-2)")
    ap.add_argument("--out", help="output .mp4 for --subtype: the corrupted copy of INPUT (all frames, native "
                                  "size and fps unless --frames / --max-pixels)")
    ap.add_argument("--grid", help="output .png: the contact sheet of clean + the protocol's subtypes")
    ap.add_argument("--protocol", choices=sorted(PROTOCOLS), default="pvrbench",
                    help="subtypes of the --grid: pvrbench (Table 8's 12, default) or a registered protocol")
    ap.add_argument("--frames", type=int, metavar="N",
                    help="sample N frames uniformly from INPUT, as the model does (the fps written is scaled "
                         f"to keep the clip's duration); default: all of them for --out, {GRID_FRAMES} for "
                         f"--grid; with no INPUT, the built-in clip's length ({SAMPLE_FRAMES})")
    ap.add_argument("--max-pixels", type=int, metavar="P",
                    help="resize INPUT's frames to this pixel budget, as the model does (smart_resize: sides "
                         f"multiples of 28); default: native size for --out, {GRID_MAX_PIXELS} for --grid")
    ap.add_argument("--size", type=int, default=448, help="side of the built-in sample clip")
    ap.add_argument("--depth-model", default="auto", metavar="NAME",
                    help="depth of the depth-graded effects: auto (the built-in clip's true depth; for INPUT "
                         "depth-anything/Depth-Anything-V2-Small-hf, cached: depth.py), proxy (the depth proxy, no "
                         "model), or a transformers depth-estimation model's hub id or folder")
    ap.add_argument("--depth-cache", default="", metavar="DIR",
                    help="where --depth-model's maps are cached (default $XDG_CACHE_HOME/rova/depth, i.e. "
                         "~/.cache/rova/depth)")
    runtime.add_debug_flag(ap)
    args = ap.parse_args(argv)
    if not args.grid and not (args.subtype and args.out):
        ap.error("give --grid OUT.png, or --subtype NAME --out OUT.mp4")
    _check_cli_args(args)
    out = runtime.out_file(args.out, OUT_SUFFIXES, "--out") if args.out else None
    grid = runtime.out_file(args.grid, (".png",), "--grid") if args.grid else None
    from machinery import depth as depth_model   # (torch and transformers load only to run a depth model)

    depth_model.check_source(args.depth_model, args.depth_cache, needs_model=False)   # one line now (auto: below)
    return _on_input(args, out, grid) if args.input else _on_sample(args, out, grid)


def _on_input(args, out, grid):
    """--out and/or --grid of INPUT (depth: --depth-model's: by default the recommended model's)."""
    with video.held_native_stderr():
        info = video.probe(args.input)  # a VideoError names the file
    if out is not None and out.resolve() == Path(args.input).resolve():
        raise runtime.UserError(f"--out {args.out} is the input video; give another file name")
    from machinery import depth as depth_model

    depth_model.check_source(args.depth_model, args.depth_cache)   # auto: a real video needs the model
    video_id = str(Path(args.input).resolve())
    if out is not None:
        frames, indices, fps, what = _read_for_out(args, info)
        _write_out(args, out, frames, fps, *_depth(args, frames, video_id, indices, None, what))
        del frames
    if grid is not None:
        n, mp = args.frames or min(GRID_FRAMES, info["frames"]), args.max_pixels or GRID_MAX_PIXELS
        frames, indices, _ = _read(args.input, n, mp)
        what = f"{n} sampled uniformly from {args.input} (of its {info['frames']})"
        _write_grid(args, grid, frames, *_depth(args, frames, video_id, indices, None, what))
    return 0


def _on_sample(args, out, grid):
    """--out and/or --grid of the built-in clip (depth: its true depth, or --depth-model's)."""
    from machinery import synthetic  # the built-in clip (imported here: synthetic imports data, which the engine needs not)

    frames, true_depth = synthetic.sample_clip(args.frames or SAMPLE_FRAMES, args.size, args.size)
    video_id, indices = f"perturb-sample-clip/{args.size}", range(len(frames))
    depth, what = _depth(args, frames, video_id, indices, true_depth, "the built-in sample clip")
    if out is not None:
        _write_out(args, out, frames, SAMPLE_FPS, depth, what)
    if grid is not None:
        _write_grid(args, grid, frames, depth, f"{what} ({len(frames)} frames)")
    return 0


if __name__ == "__main__":
    runtime.run(main)
