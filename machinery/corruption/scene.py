"""What an effect knows of the scene: the depth proxy (a soft sky segmentation over a ground plane whose horizon
is where the sky ends; one gentle depth when no sky is seen) and the `Context` every effect renders from
(sizes, its knobs, seeded streams, depth and sky at working and full scale, the clip's tone tables), the
`Layer` an effect yields per frame, the `Compositor` that draws them into `apply`'s output, and the particle
layers rain and snow share."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import cv2
import numpy as np

from machinery.corruption import kernels


# The depth proxy's ground plane: non-sky content at the horizon is at PROXY_FAR (upright structure at the
# distance of the horizon), the ground at the bottom row at PROXY_NEAR; the sky alone is at 1. PROXY_FAR is
# beyond the farthest rain / snow layer (0.75 + its fade), so that they fall in front of distant structure,
# and below the sky rule's onset (sky_of_depth: 0.85), so that it is never taken for sky (at 0.72, heavy
# rain hid no object of the synthetic scene from a colour-blob perceiver: an extension's tests).
PROXY_FAR, PROXY_NEAR, PROXY_EYE_LEVEL = 0.84, 0.12, 0.45


# With no sky in view (indoors, a close-up, a view from above) the proxy cannot tell near from far: one depth for
# the whole frame, at the middle of the rain / snow layers (a homogeneous haze, no edge at any row).
PROXY_UNIFORM = 0.45


def sky_score(f: np.ndarray) -> np.ndarray:
    """How sky-like each pixel looks, [h,w] in [0,1], a smooth function of colour and local texture (no hard
    threshold, so a smooth image gives a smooth score): untextured and bluish (clear, hazy or dusk sky, even
    a dark one) or untextured, bright and grey (overcast)."""
    lum = kernels.channel_mean(f)
    grad = np.abs(cv2.Sobel(lum, cv2.CV_32F, 1, 0)) + np.abs(cv2.Sobel(lum, cv2.CV_32F, 0, 1))
    smooth = 1 - kernels.smoothstep(1.0, 3.0, cv2.blur(grad, (3, 3)))  # only strong texture: clouds are sky
    grey = kernels.smoothstep(0.6, 0.75, lum) * (1 - kernels.smoothstep(0.1, 0.2, kernels.channel_spread(f)))
    return smooth * np.maximum(bluish(f, lum), grey)


def bluish(f: np.ndarray, lum: np.ndarray | None = None) -> np.ndarray:
    """[h,w] in [0,1]: blue over red, not black (a clear, hazy or dusk sky's colour). `lum`: f's channel mean if
    known."""
    lum = kernels.channel_mean(f) if lum is None else lum
    return kernels.smoothstep(0.02, 0.09, f[..., 2] - f[..., 0]) * kernels.smoothstep(0.06, 0.16, lum)


def sky_from_top(score: np.ndarray) -> np.ndarray:
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
    return kernels.smoothstep(0.3, 0.7, conn[:, 1:-1])  # clear sky is exactly 1, a weak candidate 0


def sky_seen(sky: np.ndarray, blue: np.ndarray) -> float:
    """How sure the proxy is that the frame shows a sky above a horizon, in [0,1]: the sky found must fill most
    of the top rows (a sky is above everything in view; a bright wall or a light background behind a close-up
    fills them only in part), or a good part of them with a blue sky (between buildings, a street's sky fills a
    third to a half of them; a wall is rarely sky blue); and a few % of the frame. A smooth function of the
    segmentation and the colour."""
    rows = slice(0, max(1, len(sky) // 12))
    top, top_blue = float(sky[rows].mean()), float((sky * blue)[rows].mean())
    evidence = max(kernels.smoothstep(0.5, 0.7, top), kernels.smoothstep(0.15, 0.35, top_blue))
    return float(evidence * kernels.smoothstep(0.01, 0.05, float(sky.mean())))


def proxy(frame: np.ndarray):
    """(depth [h,w], sky [h,w], horizon as a fraction of the height, sky seen in [0,1]) of depth_proxy."""
    f = frame.astype(np.float32) / 255.0
    h, w = f.shape[:2]
    sky = sky_from_top(sky_score(f))
    seen = sky_seen(sky, bluish(f))
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
    (1). When the sky found fills the top rows (sky_seen), everything else stands on a ground plane seen from
    eye height: depth falls from PROXY_FAR at the horizon as for a flat ground (~ 1/(y - y_h), normalised as a
    true depth map is), reaching PROXY_NEAR at the bottom row when the horizon is at eye level (a camera pitched
    up sees less ground, and no nearer), and content above the horizon is upright structure at the horizon's
    distance; the horizon is where the sky ends (its lower edge over most columns). With no sky in
    view (indoors, a close-up, a surface seen from above) there is no horizon to measure from, and the proxy
    fails safe: one depth, PROXY_UNIFORM, for the whole frame (between the two, a blend by how sure it is).
    Depth is a continuous function of the image: no step at any row, an edge only where the sky's edge is."""
    return proxy(frame)[0]


def normalise_depth(depth: np.ndarray) -> np.ndarray:
    """A true depth map in any unit -> [0,1], d / (d + median d): unit-free, 0.5 at the median depth. The
    median is taken over every 4th row and column (a scale needs no more, and a clip's exact median was 2/3
    of a fog apply's time with a depth model)."""
    d = np.maximum(np.asarray(depth, np.float32), 0)
    return d / (d + max(float(np.median(d[..., ::4, ::4])), 1e-6))


def sky_of_depth(d: np.ndarray, top: float) -> np.ndarray:
    """Sky (or as good as infinitely far) in [0,1] from a normalised depth map whose far limit is `top`:
    within 3-15% of the far limit, when the far limit itself is far (at least 4x the median depth)."""
    return kernels.smoothstep(0.85, 0.97, d / max(top, 1e-6)) * kernels.smoothstep(0.75, 0.85, top)


def ground_of_depth(d: np.ndarray) -> float:
    """Whether a normalised depth map's lower half shows ground receding upward, in [0,1]: over the columns,
    the median rise of depth from the bottom row to the middle row (a floor or a road seen from eye height rises
    by a good part of the scale; a wall, a close-up or a surface seen from above hardly at all)."""
    h = len(d)
    rise = float(np.median(d[h // 2] - d[h - 1]))
    return float(kernels.smoothstep(0.04, 0.12, rise))


class Context:
    """What every effect needs: sizes, params, seeded streams, depth at frame and at working scale.

    Depth is the caller's true depth (normalised per clip) or the proxy of the middle frame; either is
    computed on first use (the camera effects never need it). `sky(t)` and `sky_small(t)` are where the
    depth used says the sky is: within a few % of its far limit (the proxy's sky is at 1; a true depth map's
    sky at its largest values, when those are far)."""

    def __init__(self, frames, spec, depth, ops, composite=None):
        self.spec, self.p, self.ops, self.frames, self.composite = spec, spec.params, ops, frames, composite
        self.out = None if composite is None else composite.out
        self._clips = {}
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
            d, _, horizon, seen = proxy(self.small_frame)
            return [d], 1.0, float(np.clip(horizon, 0.2, 0.8)), seen  # the proxy's sky is at 1
        self._full_given = normalise_depth(self._given)
        small = [cv2.resize(self._full_given[t], (self.sw, self.sh), interpolation=cv2.INTER_AREA)
                 for t in range(self.T)]
        top = max(float(m.max()) for m in small)
        below = np.nonzero(sky_of_depth(np.median(small[0], axis=1), top) < 0.5)[0]
        horizon = float(np.clip((below[0] if len(below) else PROXY_EYE_LEVEL * self.sh) / self.sh, 0.2, 0.8))
        return small, top, horizon, ground_of_depth(small[self.T // 2])

    @property
    def _small(self):
        return self._maps[0]

    @property
    def horizon(self):
        return self._maps[2]

    @property
    def ground(self):
        """How sure the depth used is that the lower frame shows ground receding toward a horizon, in [0,1]: the
        proxy's sky-seen; for a true depth map, ground_of_depth."""
        return self._maps[3]

    @property
    def true_depth(self):
        """Whether the depth used is the caller's (else the proxy's)."""
        return self._given is not None

    def rng(self, *tags):
        return kernels.seeded_rng(self.spec.seed, self.spec.subtype, *tags)

    def drift(self, tag, amount, fmin, fmax):
        """[T]: 1 + amount x a smooth walk, for slow changes over the clip (light, exposure, density)."""
        return 1 + amount * kernels.walk(self.rng(tag), self.T, 1, fmin, fmax)[0]

    def clip_map(self, key, make, t):
        """Frame t of make(frames, out), a per-pixel map of the whole clip (a tone table, a colour matrix), kept
        under `key`. One call for the clip (each OpenCV call per frame costs its threads' start, ~0.1 ms), the
        first one written into `apply`'s output buffer: frame t of it is read as E_t, then overwritten by the
        composite of frame t (a fresh 10 MB buffer per call costs page faults, measured up to +50%)."""
        if key not in self._clips:
            self._clips[key] = make(self.frames, None if self._clips else self.out)
        return self._clips[key][t]

    def clip_lut(self, table, t):
        """Frame t of the whole clip through a tone table (clip_map)."""
        return self.clip_map(table.tobytes(), lambda x, out: self.ops.lut(x, table, out=out), t)

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
        """Where the depth used says sky, at working scale, in [0,1] (sky_of_depth)."""
        return self.per_map("sky small", t, lambda t: sky_of_depth(self.depth_small(t), self._maps[1]))

    def sky(self, t):
        """The same at full resolution: exactly 1 wherever depth(t) is within 3% of the far limit."""
        return self.per_map("sky", t, lambda t: sky_of_depth(self.depth(t), self._maps[1]))

    def depth(self, t):
        """Full-resolution depth of frame t in [0,1]."""
        return self.per_map("depth", t, lambda t: self._full_given[t] if self._given is not None else
                            cv2.resize(self.depth_small(t), (self.W, self.H), interpolation=cv2.INTER_LINEAR))

    def upsample(self, m, out=None):
        return cv2.resize(m, (self.W, self.H), dst=out, interpolation=cv2.INTER_LINEAR)

    def weights(self):
        """float32 [H,W] to write the weight map of the frame being rendered into, once per frame: in `apply`, the
        compositor's own buffer (Compositor.slot: no copy there), else a new array."""
        return np.empty((self.H, self.W), np.float32) if self.composite is None else self.composite.slot()


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


class Compositor:
    """`apply`'s compositing into `out`, layer by layer: f'_t = f_t + w (E_t - f_t) inside the roi, or the warp.
    E_t may be out[t] (Context.clip_map), never another frame of `out`. On OpenCV, consecutive whole-frame layers
    with a weight map are blended CHUNK frames per call (E_t gathered in out[t], the weights in a buffer, where an
    effect may write them: slot): each call costs its threads' start (~0.1 ms), and 4 frames of weights stay in
    cache (measured on 448x448: 13% less time than a call per frame; 16 frames a call, 10% more). The blend is per
    pixel: the same pixels either way."""
    CHUNK = 4

    def __init__(self, x, ops, out):
        self.x, self.ops, self.out, self.queue = x, ops, out, []  # queue: (t, E_t's colour or None: in out[t])
        self.w = self.w1 = None  # the queued frames' weights and 1 - weights
        if isinstance(ops, kernels.CV):
            self.w, self.w1 = np.empty((2, self.CHUNK) + x.shape[1:3], np.float32)

    def slot(self):
        """Where the next queued frame's weight map goes: an effect that writes it there (Context.weights) saves
        its copy."""
        return np.empty(self.x.shape[1:3], np.float32) if self.w is None else self.w[len(self.queue)]

    def add(self, t, layer):
        ops, f, out = self.ops, self.x[t], self.out
        if self.w is not None and layer.roi is None and layer.warp is None and not isinstance(layer.weight, float):
            return self._enqueue(t, layer)
        self.flush()
        if layer.warp is not None:
            out[t] = ops.warp(f, layer.warp)
        elif isinstance(layer.weight, float) and layer.weight == 0.0:  # UNCHANGED (what the blend would give)
            out[t] = f
        elif layer.roi is None:
            ops.blend(f, layer.effect_on(f), layer.weight, out=out[t])
        else:
            out[t] = f
            y0, y1, x0, x1 = layer.roi
            region = f[y0:y1, x0:x1]
            ops.blend(region, layer.effect_on(region), layer.weight, out=out[t, y0:y1, x0:x1])

    def _enqueue(self, t, layer):
        i, e = len(self.queue), layer.effect_on(self.x[t])
        if not _same_array(layer.weight, self.w[i]):
            np.copyto(self.w[i], layer.weight)
        np.subtract(np.float32(1), self.w[i], out=self.w1[i])
        if not isinstance(e, tuple) and not _same_array(e, self.out[t]):
            self.out[t] = e
        self.queue.append((t, e if isinstance(e, tuple) else None))
        if len(self.queue) == self.CHUNK:
            self.flush()

    def flush(self):
        """Blend the queued frames, in one call."""
        if not self.queue:
            return
        (c, _), k, H = self.queue[0], len(self.queue), self.x.shape[1]

        def rows(a):  # its first k frames as one tall image
            return a[:k].reshape(k * H, *a.shape[2:])
        colours = {colour for _, colour in self.queue}
        if len(colours) == 1 and None not in colours:  # rain, snow, fog: one colour
            e = self.ops.const(colours.pop(), (k * H, self.x.shape[2]))
        else:
            for t, colour in self.queue:
                if colour is not None:
                    self.out[t] = self.ops.const(colour, self.x.shape[1:3])
            e = rows(self.out[c:])
        cv2.blendLinear(rows(self.x[c:]), e, rows(self.w1), rows(self.w), dst=rows(self.out[c:]))
        self.queue = []


def _same_array(a, b):
    """Whether a is the very array b (the same memory, shape and strides)."""
    return getattr(a, "__array_interface__", None) == b.__array_interface__


def particles(ctx, layers, strokes, soften, reach, veil, color):
    """Rain and snow: depth layers of particles that persist between frames. `strokes(layer, u)` turns a
    layer's particles (u: [n, 6] uniform numbers each) into line groups (points [T, n, 2, 2] in fixed point
    with 2 fractional bits, grey level, thickness) for all frames at once, one draw call per group and frame;
    `soften(layer, image)` blurs the drawn layer (or a band of its rows), spreading a pixel by at most
    `reach(layer)` px (None: it needs the whole frame). A layer at depth z is hidden where the scene is nearer
    than z (fade_behind: faded over a small depth range, never cut along a row): only the rows where it shows
    are drawn (the particles that can reach them) and blurred (with `reach` rows around them), the same pixels
    as drawing it all. A veil (mist, haze) grows with scene depth: P = 1 - (1 - veil)(1 - particles)."""
    area = ctx.H * ctx.W / 448 ** 2
    rng = ctx.rng("particles")
    lines = []
    for layer in layers:  # the full density-1.15 population; lower densities take a prefix
        u = rng.random((int(math.ceil(layer[1] * 1.15 * area)), 6))
        lines.append([(pts, level, thick, _row_span(pts)) for pts, level, thick in
                      strokes(layer, u[:int(round(layer[1] * min(ctx.p["density"], 1.15) * area))])])

    def maps(t):  # what hides each layer, the rows where it shows, the veil, and what the veil leaves clear
        d = ctx.depth(t)
        veil_map = (veil * (1 - np.exp(-2.5 * d))).astype(np.float32)
        hidden = [fade_behind(d, layer[0]) for layer in layers]
        return hidden, [_shown_rows(h) for h in hidden], veil_map, (1 - veil_map) * np.float32(1 / 255)

    for t in range(ctx.T):
        hidden, shown, veil_map, clear_map = ctx.per_map("particles", t, maps)
        acc = np.zeros((ctx.H, ctx.W), np.uint8)
        for layer, groups, behind, (r0, r1) in zip(layers, lines, hidden, shown, strict=True):
            if r0 < r1:
                margin = reach(layer)
                a, b = (0, ctx.H) if margin is None else (max(0, r0 - margin), min(ctx.H, r1 + margin))
                band = soften(layer, _drawn(groups, t, a, b, ctx.H, ctx.W)[a:b])[r0 - a:r1 - a]
                np.maximum(acc[r0:r1], cv2.min(band, behind[r0:r1]), out=acc[r0:r1])
        weight = np.multiply(acc, clear_map, out=ctx.weights())
        weight += veil_map
        yield Layer(weight, color)


def _row_span(pts):
    """([T, n], [T, n]): the lowest and highest y (fixed point) of each stroke in each frame."""
    y = pts[..., 1]
    return np.minimum(y[..., 0], y[..., 1]), np.maximum(y[..., 0], y[..., 1])


def _shown_rows(behind):
    """(r0, r1): the rows where a particle layer shows at all (behind > 0); (0, 0) if none."""
    rows = np.flatnonzero(behind.max(1))
    return (int(rows[0]), int(rows[-1]) + 1) if len(rows) else (0, 0)


def _drawn(groups, t, a, b, H, W):
    """uint8 [H,W]: frame t of a particle layer's line groups, exact in rows a..b: the strokes that can reach them
    (within their thickness and the antialiasing) are drawn, in order, the others skipped."""
    buf = np.zeros((H, W), np.uint8)
    for pts, level, thick, (lo, hi) in groups:
        drawn = pts[t]
        if a > 0 or b < H:
            drawn = drawn[(hi[t] >= 4 * (a - thick - 2)) & (lo[t] <= 4 * (b + thick + 2))]
        if len(drawn):
            cv2.polylines(buf, drawn, False, level, thick, cv2.LINE_AA, shift=2)
    return buf


def fade_behind(d, z):
    """uint8 [H,W], 255 where the scene is farther than a particle layer at depth z, 0 where nearer, a ramp
    over +-0.04 of depth between: a layer fades out where a smooth depth gradient crosses z (never a cut
    along one row), and stops at the edges of what stands in front of it."""
    return np.clip((d - z) * (255 / 0.08) + 127.5, 0, 255).astype(np.uint8)
