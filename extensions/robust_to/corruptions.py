"""Robust-TO's sensor corruptions, plugged into perturb.py: motion blur and Gaussian (sensor) noise.

Robust-TO's corruption protocol is motion blur, Gaussian noise, glare, occlusion and low light. The last
three map onto PVRBench subtypes (glare = overexposure: its glare source and bloom; occlusion = a static lens
occluder; low light = night); the first two are PVRBench's missing ones, here as EXTRA_SUBTYPES of category
"sensor". Importing this module registers them (perturb.register_effect) and the "robust-to" protocol
(perturb.register_protocol):

    import extensions.robust_to.corruptions  # registers motion_blur, noise and PROTOCOLS["robust-to"]

after which perturb's PerturbSpec, static_spec (seeded by the same rule as Table 8's subtypes), sample_spec
(by name only), apply and masks accept them, on numpy and torch frames alike. "sensor" is not a key of
perturb.CATEGORIES (Table 8 has four styles), so the dynamic protocol's style draw never yields them.

    python -m extensions.robust_to.corruptions [perturb.py's flags]   # perturb.py's CLI, with them known
"""
from __future__ import annotations

import functools
import math

import cv2
import numpy as np

import perturb
from machinery import cli

EXTRA_SUBTYPES = ("motion_blur", "noise")
CATEGORY = "sensor"
# Robust-TO's five corruption types on this engine: motion blur, Gaussian noise (heteroscedastic sensor
# noise), glare = overexposure, occlusion = a static lens occluder, low light = night.
PROTOCOL = ("motion_blur", "noise", "overexposure", "static", "night")


# ----------------------------------------------------------------------------- kernels (numpy/OpenCV and torch)

def _u8(x):  # a float torch tensor -> uint8, rounded and saturated, as perturb's torch kernels do
    import torch

    return x.round_().clamp_(0, 255).to(torch.uint8)


def _filter(f, pieces):
    """Correlation of a frame [H,W,3] with a kernel given as pieces (y0, x0, K): out(y, x) = sum over pieces
    of sum K[v, u] f(y + y0 + v, x + x0 + u), reflect-101 border. OpenCV filters a uint8 image with a kernel
    of up to ~11x11 by direct summation over its non-zero taps (cheap for a thin line) and with a DFT above
    that (~15x slower at 448 px), so a long kernel comes as small pieces, each filtered on a window of the
    padded frame, summed in 16-bit fixed point (1/64), rounded once. A torch frame gets the pieces summed
    into one kernel, one depthwise convolution."""
    if not isinstance(f, np.ndarray):
        return _filter_torch(f, pieces)
    h, w = f.shape[:2]
    r = max(0, *(max(-y0, -x0, y0 + k.shape[0] - 1, x0 + k.shape[1] - 1) for y0, x0, k in pieces))
    padded = cv2.copyMakeBorder(f, r, r, r, r, cv2.BORDER_REFLECT_101) if r else f

    def corr(y0, x0, k, ddepth):
        win = padded[r + y0:r + y0 + h + k.shape[0] - 1, r + x0:r + x0 + w + k.shape[1] - 1]
        return cv2.filter2D(win, ddepth, k, anchor=(0, 0))[:h, :w]

    if len(pieces) == 1:
        return np.ascontiguousarray(corr(*pieces[0], -1))
    acc = None
    for y0, x0, k in pieces:
        g = corr(y0, x0, k * np.float32(64), cv2.CV_16S)
        acc = g if acc is None else cv2.add(acc, g)
    return cv2.convertScaleAbs(acc, alpha=1 / 64)


def _filter_torch(f, pieces):
    import torch
    import torch.nn.functional as F

    h, w = f.shape[:2]
    y0 = min(p[0] for p in pieces)
    x0 = min(p[1] for p in pieces)
    y1 = max(p[0] + p[2].shape[0] for p in pieces)
    x1 = max(p[1] + p[2].shape[1] for p in pieces)
    kernel = np.zeros((y1 - y0, x1 - x0), np.float32)
    for py, px, k in pieces:
        kernel[py - y0:py - y0 + k.shape[0], px - x0:px - x0 + k.shape[1]] += k
    r = max(0, -y0, -x0, y1 - 1, x1 - 1)
    img = f.permute(2, 0, 1)[None].float()
    if r:
        img = F.pad(img, (r, r, r, r), mode="reflect")  # = OpenCV's BORDER_REFLECT_101
    win = img[..., r + y0:r + y1 - 1 + h, r + x0:r + x1 - 1 + w]
    k = torch.from_numpy(kernel).to(f.device)[None, None].expand(3, 1, -1, -1)
    return _u8(F.conv2d(win, k, groups=3)[0].permute(1, 2, 0))


def _add_noise(f, std, n):
    """f + std[f] * n, rounded, saturating; std float32 [256, 3] (a standard deviation per level and channel),
    n float32 [H,W,3], both on the frame's device."""
    if isinstance(f, np.ndarray):
        return cv2.add(f, cv2.multiply(cv2.LUT(f, std.reshape(256, 1, 3)), n), dtype=cv2.CV_8U)
    return _u8(f.float() + std.gather(0, f.reshape(-1, 3).long()).reshape(f.shape) * n)


# ----------------------------------------------------------------------------- motion blur

_LUMA = np.array([0.299, 0.587, 0.114], np.float32)


def _capture_order(ctx) -> np.ndarray:
    """cap[t]: the capture index of output frame t. With shuffle (Eq. 1) frame t is capture perm[t]."""
    return perturb.temporal_permutation(ctx.T, ctx.spec.seed) if ctx.spec.shuffle else np.arange(ctx.T)


def _global_motion(ctx, cap) -> np.ndarray:
    """Global image motion at each output frame, [T, 2] (x, y) in px per frame: phase correlation
    (cv2.phaseCorrelate, Hann window) of consecutive frames in capture order, on greyscale frames
    block-averaged to <= 64 px, each step weighted by the confidence of its correlation peak (a scene
    cut or unrelated frames give a low peak and no motion); a frame's motion is the mean of the steps
    into and out of it. In capture order because blur happens at capture: under shuffle a frame keeps
    its own blur."""
    T, H, W, ops = ctx.T, ctx.H, ctx.W, ctx.ops
    k = max(1, math.ceil(max(H, W) / 64))  # an integer factor: both backends average the same blocks
    hs, ws = H // k, W // k
    if T < 2 or min(hs, ws) < 8:
        return np.zeros((T, 2))
    where = np.argsort(cap)  # capture i is output frame where[i]
    grey = []
    for i in range(T):
        f = ctx.frames[int(where[i])][:hs * k, :ws * k]
        grey.append(ops.host(ops.resize(f, ws, hs) if k > 1 else f).astype(np.float32) @ _LUMA)
    window = cv2.createHanningWindow((ws, hs), cv2.CV_32F)
    steps = np.zeros((T - 1, 2))
    for i in range(T - 1):
        (dx, dy), peak = cv2.phaseCorrelate(grey[i], grey[i + 1], window)
        steps[i] = np.array([dx, dy]) * k * float(np.clip((peak - 0.1) / 0.2, 0, 1))
    ends = np.vstack([steps[:1], steps, steps[-1:]])
    return (0.5 * (ends[:-1] + ends[1:]))[cap]


def _line_pieces(bx: float, by: float, max_area: int = 121) -> list:
    """Linear motion-blur kernel along the vector (bx, by) px, centred on the pixel: the segment from
    -b/2 to +b/2 sampled at 4 points per px, bilinearly splatted, summing to 1. Returned as pieces
    (y0, x0, K float32) along the segment, each with at most max_area taps (see _filter)."""
    length = math.hypot(bx, by)
    n = max(2, math.ceil(4 * length) + 1)
    for m in range(1, n + 1):
        nn = m * math.ceil(n / m)
        s = (np.arange(nn) + 0.5) / nn - 0.5
        pieces = []
        for idx in np.split(np.arange(nn), m):
            xs, ys = s[idx] * bx, s[idx] * by
            ix, iy = np.floor(xs).astype(int), np.floor(ys).astype(int)
            fx, fy = xs - ix, ys - iy
            x0, y0 = ix.min(), iy.min()
            k = np.zeros((iy.max() - y0 + 2, ix.max() - x0 + 2))
            for dy, wy in ((0, 1 - fy), (1, fy)):
                for dx, wx in ((0, 1 - fx), (1, fx)):
                    np.add.at(k, (iy - y0 + dy, ix - x0 + dx), wy * wx / nn)
            rows, cols = np.nonzero(k.any(1))[0], np.nonzero(k.any(0))[0]  # trim all-zero borders
            k = k[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
            pieces.append((int(y0 + rows[0]), int(x0 + cols[0]), k.astype(np.float32)))
        if all(k.size <= max_area for _, _, k in pieces):
            return pieces
    raise AssertionError("unreachable: a piece of one sample has at most 4 taps")


def _motion_blur(ctx):
    """Each frame is blurred with a linear kernel along the camera's motion during the exposure,
    b_t = shutter * v_t + shake_t. v_t is the global image motion measured between consecutive frames
    (_global_motion); shake_t a hand-shake component on a smooth random walk (length 0.4..1 x `shake` of
    the longer side, direction wandering +-0.6 rad about a random one), so a static clip still gets blur
    whose direction and length drift smoothly. A line kernel has no sign, so the shake's sign is free: it
    is chosen once per clip to point along the clip's mean motion, so that a steady pan is never cancelled
    by the shake for a whole clip. Both terms scale with eta (through `shutter` and `shake`): eta = 0 is no
    change. The length is capped at 0.1 of the longer side. E_t = the blurred frame, C = 1 (like a camera
    warp: every pixel is replaced by a mix of its neighbours), B = 1 wherever there is blur."""
    p, T, H, W = ctx.p, ctx.T, ctx.H, ctx.W
    cap = _capture_order(ctx)
    rng = ctx.rng("shake")
    theta0 = rng.uniform(0, np.pi)
    walk = perturb.walk(rng, T, 2, 0.02, 0.06)  # over capture time, like the motion
    shake = p["shake"] * max(H, W)
    motion = _global_motion(ctx, cap) if p["shutter"] > 0 else np.zeros((T, 2))
    cap_len = min(0.1 * max(H, W), 2.0 * (min(H, W) - 3))  # the kernel also stays inside a reflection
    if motion.sum(0) @ np.array([math.cos(theta0), math.sin(theta0)]) < 0:  # order-free: a sum over frames
        theta0 += np.pi
    for t in range(T):
        c = cap[t]
        theta = theta0 + 0.6 * walk[1, c]
        direction = np.array([math.cos(theta), math.sin(theta)])
        b = p["shutter"] * motion[t] + shake * (0.7 + 0.3 * walk[0, c]) * direction
        length = float(np.hypot(*b))
        if cap_len <= 0 or length < 1e-3:
            yield perturb.UNCHANGED
            continue
        if length > cap_len:
            b *= cap_len / length
        pieces = _line_pieces(float(b[0]), float(b[1]))
        yield perturb.Layer(1.0, lambda f, pieces=pieces: _filter(f, pieces))


# ----------------------------------------------------------------------------- sensor noise

_NOISE_PAD = 32  # frame t reads the bank at one of (_NOISE_PAD + 1)^2 offsets


@functools.lru_cache(maxsize=5)
def _unit_noise_bank(h, w):
    """Sensor noise of unit variance per channel, float32 [h, w, 3]: a luminance part shared by the
    three channels and a weaker (0.4) independent chroma part, as perturb's night effect draws its noise.
    A fixed seed: a pure function of its arguments, cached."""
    r = np.random.default_rng(perturb.hash48("sensor-noise-unit", h, w))
    n = r.standard_normal((h, w, 1), np.float32) + r.standard_normal((h, w, 3), np.float32) * np.float32(0.4)
    return n * np.float32(1 / math.sqrt(1 + 0.4 ** 2))


def _noise(ctx):
    """Gaussian noise as a sensor makes it: shot noise (Poisson, variance proportional to the signal) plus
    read noise, f' = f + sqrt(shot * f + read^2) n, n ~ N(0, 1) per pixel (so bright pixels are noisier
    than dark ones), both terms growing with eta. Drawn fresh per frame like the night effect's noise:
    each frame reads a fixed noise bank at its own offset (all distinct within a clip up to 1089 frames)
    with its own sign, both from the spec's seeded stream, so the clip is deterministic given the spec.
    E_t = the noisy frame, C = 1, B = 1 (when eta > 0)."""
    p, ops, T, H, W = ctx.p, ctx.ops, ctx.T, ctx.H, ctx.W
    if p["shot"] <= 0 and p["read"] <= 0:
        yield from (perturb.UNCHANGED for _ in range(T))
        return
    level = np.arange(256, dtype=np.float32)[:, None]
    std = np.repeat(np.sqrt(np.float32(p["shot"]) * level + np.float32(p["read"]) ** 2), 3, 1)
    std = {1: ops.asarray(std), -1: ops.asarray(-std)}
    bank = ops.asarray(_unit_noise_bank(H + _NOISE_PAD, W + _NOISE_PAD))  # on the frames' device, once
    rng = ctx.rng("noise")
    side = _NOISE_PAD + 1
    offsets = rng.choice(side * side, T, replace=T > side * side)
    signs = rng.choice([-1, 1], T)
    for t in range(T):
        oy, ox = divmod(int(offsets[t]), side)
        nz = bank[oy:oy + H, ox:ox + W]
        yield perturb.Layer(1.0, lambda f, nz=nz, s=std[int(signs[t])]: _add_noise(f, s, nz))


# ----------------------------------------------------------------------------- registration

# motion_blur: the fraction of the frame interval the shutter is open (scales the measured camera motion into
# blur), and the length of the hand-shake blur as a fraction of the longer frame side.
perturb.register_effect("motion_blur", CATEGORY,
                        lambda d: dict(shutter=d.eta * d.u(0.5, 0.8), shake=0.035 * d.eta * d.u(0.85, 1.15)),
                        _motion_blur)
# noise: var = shot * I + read^2 (I and read in 0..255 units).
perturb.register_effect("noise", CATEGORY,
                        lambda d: dict(shot=2.5 * d.eta * d.u(0.85, 1.15), read=6.0 * d.eta * d.u(0.85, 1.15)),
                        _noise)
perturb.register_protocol("robust-to", PROTOCOL)

if __name__ == "__main__":
    cli.run(perturb.main)
