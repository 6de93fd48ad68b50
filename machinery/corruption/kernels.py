"""The corruption engine's kernels (perturb.py's effects draw with them): seeded randomness, smooth random walks
and noise fields, the frame operations on numpy/OpenCV (CV) and on torch tensors on any device (Torch), tone
tables, and the polygon, blur and shading helpers of the occluders. Nothing here knows a subtype."""
from __future__ import annotations

import functools
import math

import cv2
import numpy as np

from machinery import seeds


def seeded_rng(seed: int, *tags) -> np.random.Generator:
    """An independent stream per (seed, purpose): results never depend on the order of calls."""
    return np.random.default_rng([int(seed), seeds.hash48(*tags)])


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


def noise_field(rng, h: int, w: int, cells=4, octaves=3) -> np.ndarray:
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


# CV.const's images of one colour, read only, kept across applies (filling a 448x448 one costs 0.6 ms)
_PLANES = {}  # (colour, (h, w)) -> uint8 [h, w, 3]


class CV:
    """Frame kernels for numpy uint8 frames [H,W,3], on OpenCV."""

    def asarray(self, a):
        return a

    def host(self, a):
        return a

    def empty_like(self, x):
        return np.empty_like(x)

    def take(self, x, idx):
        return x[idx]

    def const(self, color, shape):
        key = (tuple(color), tuple(shape[:2]))
        plane = _PLANES.get(key)
        if plane is None:
            if len(_PLANES) >= 16:  # fog's airlight differs per spec: keep a few
                _PLANES.clear()
            plane = np.empty((shape[0], shape[1], 3), np.uint8)
            plane[:] = np.asarray(color, np.uint8)
            plane.flags.writeable = False
            _PLANES[key] = plane
        return plane

    def blend(self, f, e, w, out=None):  # f + w (e - f), written into `out` if given
        if isinstance(e, tuple):
            e = self.const(e, f.shape)
        if isinstance(w, float):
            return cv2.addWeighted(f, 1.0 - w, e, w, 0.0, dst=out)
        w = np.asarray(w, np.float32)
        return cv2.blendLinear(f, e, 1.0 - w, w, dst=out)

    def lut(self, f, table, out=None):  # table uint8 [256, 3]; frames or a whole clip
        shape = f.shape[-2:]
        if (table == table[:, :1]).all():  # one curve for all channels: a one-channel table, ~40% faster
            shape, table = (shape[0] * 3,), table[:, 0]
        dst = None if out is None else out.reshape(-1, *shape)
        return cv2.LUT(f.reshape(-1, *shape), table.reshape(256, 1, -1), dst=dst).reshape(f.shape)

    def color_matrix(self, f, m, out=None):  # m float32 [3, 4]: out = m[:, :3] @ rgb + m[:, 3]; frames or a clip
        dst = None if out is None else out.reshape(-1, *f.shape[-2:])
        return cv2.transform(f.reshape(-1, *f.shape[-2:]), m, dst=dst).reshape(f.shape)

    def warp(self, f, m):  # m [2, 3] maps output pixel -> source pixel
        h, w = f.shape[:2]
        return cv2.warpAffine(f, m, (w, h), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                              borderMode=cv2.BORDER_REFLECT_101)

    def blur(self, f, sigma):
        return cv2.GaussianBlur(f, (0, 0), sigma)

    def resize(self, f, w, h):
        shrink = w * h < f.shape[0] * f.shape[1]
        return cv2.resize(f, (w, h), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)

    def add(self, f, g, out=None):  # saturating
        return cv2.add(f, g, dst=out)

    def add_signed(self, f, g128, out=None):  # f + (g - 128), saturating; g uint8 centred on 128
        return cv2.addWeighted(f, 1.0, g128, 1.0, -128.0, dst=out)


HOST = CV()  # for host-side layers (particles), whatever the frames' backend


class Torch:
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

    def color_matrix(self, f, m, out=None):
        m = self.asarray(m)
        res = self._u8(f.float() @ m[:, :3].T + m[:, 3])
        return res if out is None else out.copy_(res)

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

    def add(self, f, g, out=None):
        res = (f.int() + self.asarray(g).int()).clamp_(0, 255).to(self.torch.uint8)
        return res if out is None else out.copy_(res)

    def add_signed(self, f, g128, out=None):
        res = (f.int() + self.asarray(g128).int() - 128).clamp_(0, 255).to(self.torch.uint8)
        return res if out is None else out.copy_(res)


def check_frames(frames):
    if isinstance(frames, np.ndarray):
        kind, ops, dtype, shape = "numpy array", CV(), frames.dtype, frames.shape
    elif type(frames).__module__.startswith("torch"):
        kind, ops, dtype, shape = "torch tensor", Torch(frames.device), frames.dtype, tuple(frames.shape)
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


def channel_mean(f):
    """f.mean(-1) of a float32 image [..., 3], the same numbers (numpy sums the channels in order, then divides by
    3), without numpy's slow reduction over a short last axis (~10x)."""
    return (f[..., 0] + f[..., 1] + f[..., 2]) / np.float32(3)


def channel_spread(f):
    """f.max(-1) - f.min(-1) of an image [..., 3], the same numbers, without the slow short-axis reductions."""
    return np.maximum(np.maximum(f[..., 0], f[..., 1]), f[..., 2]) - np.minimum(np.minimum(f[..., 0], f[..., 1]),
                                                                                f[..., 2])


def smoothstep(e0, e1, x):
    """0 below e0, 1 above e1, a smooth (C1) cubic in between: soft thresholds, no steps."""
    u = np.clip((np.asarray(x, np.float32) - e0) / (e1 - e0), 0, 1)
    return u * u * (3 - 2 * u)


def tone_table(gains, gamma=1.0, knee=None) -> np.ndarray:
    """Per-channel tone curve 255 * (g_c x)^gamma, with an optional soft shoulder above `knee`."""
    x = np.arange(256, dtype=np.float64)[:, None] / 255.0
    y = (np.asarray(gains)[None] * x) ** gamma
    if knee is not None:  # highlights roll off smoothly into clipping (overexposure)
        over = np.maximum(y - knee, 0)
        y = np.where(y > knee, knee + (1 - knee) * (1 - np.exp(-over / (1 - knee))), y)
    return np.clip(np.round(255 * y), 0, 255).astype(np.uint8)


@functools.lru_cache(maxsize=9)
def noise_bank(h, w, sigma):
    """Gaussian sensor noise (luminance + weaker chroma), uint8 centred on 128. A fixed seed: a pure
    function of its arguments, cached because drawing normals is the slow part."""
    r = np.random.default_rng(seeds.hash48("sensor-noise", h, w))
    n = r.standard_normal((h, w, 1), np.float32) * sigma + r.standard_normal((h, w, 3), np.float32) * sigma * 0.4
    return np.clip(np.round(128 + n), 0, 255).astype(np.uint8)


def weighted_quantile(values, weights, q):
    """The q-quantile of `values` where each counts by its weight (all equal when the weights sum to ~0)."""
    order = np.argsort(values, axis=None)
    w = np.asarray(weights, np.float64).ravel()[order] + 1e-6
    return float(values.ravel()[order][min(np.searchsorted(np.cumsum(w), q * w.sum()), w.size - 1)])


def moved(m, H, W):
    """B for a warp: every pixel whose source is not itself (what the warp moved)."""
    m = np.asarray(m, np.float64)
    ys, xs = np.mgrid[0:H, 0:W].astype(np.float64)
    dx = m[0, 0] * xs + m[0, 1] * ys + m[0, 2] - xs
    dy = m[1, 0] * xs + m[1, 1] * ys + m[1, 2] - ys
    return dx * dx + dy * dy > 1e-10


def blob(rng, n=72, wobble=0.45) -> np.ndarray:
    """An organic closed outline around the origin, radius 1 + sum_k a_k cos(k phi + phi_k)."""
    phi = np.linspace(0, 2 * np.pi, n, endpoint=False)
    k = np.arange(2, 6)[:, None]
    r = 1 + (rng.uniform(0, wobble, (4, 1)) / k * np.cos(k * phi + rng.uniform(0, 2 * np.pi, (4, 1)))).sum(0)
    return np.stack([r * np.cos(phi), r * np.sin(phi)], 1)


def fill_polys(shape, polys) -> np.ndarray:
    m = np.zeros(shape, np.uint8)
    cv2.fillPoly(m, [np.round(q * 4).astype(np.int32) for q in polys], 255, cv2.LINE_AA, shift=2)
    return m


def roi_of(alpha):
    """(y0, y1, x0, x1): the bounding box of alpha > 0, or None."""
    inside = alpha > 0
    ys, xs = np.flatnonzero(inside.any(1)), np.flatnonzero(inside.any(0))
    return (int(ys[0]), int(ys[-1]) + 1, int(xs[0]), int(xs[-1]) + 1) if len(ys) else None


def rounded_shade(outline, shape, radius, light):
    """[h,w] shading of a rounded object (a fingertip, a leaf) with this outline (px, in the [h,w] box): lit
    on one side, in its own shadow on the other, computed at about 64 px across and upscaled."""
    q = max(1.0, radius / 32)
    small = (max(1, int(math.ceil(shape[0] / q))), max(1, int(math.ceil(shape[1] / q))))
    return cv2.resize(emboss(fill_polys(small, [outline / q]), 0.5 * radius / q, light), (shape[1], shape[0]))


def blur_reach(sigma):
    """How far (px) a Gaussian blur of `sigma` on uint8 spreads a pixel: its kernel's radius (OpenCV's size,
    round(6 sigma + 1) | 1), rounded up."""
    return int(3 * sigma) + 2


def wide_blur(ops, f, sigma):
    """A wide Gaussian blur at a fraction of the cost: blur a downscaled copy, then upscale it."""
    h, w = f.shape[:2]
    k = max(1, math.ceil(sigma / 2))  # an integer factor keeps INTER_AREA on its fast path
    small = ops.resize(f, max(1, w // k), max(1, h // k))
    return ops.resize(ops.blur(small, sigma / k), w, h)


def emboss(mask, radius, light):
    """Shading [h,w] of a rounded body whose silhouette is `mask` (0/255): Lambert under the unit light
    direction (x right, y down, z toward the camera) on the normals of a pillow (the mask blurred over
    `radius` px: 45 degrees at the silhouette's edge, facing the camera inside), plus an ambient 0.35."""
    b = cv2.GaussianBlur(np.asarray(mask, np.float32), (0, 0), max(radius, 0.5), borderType=cv2.BORDER_CONSTANT)
    b *= np.float32(2.5 * radius / (8 * 255))
    gx, gy = cv2.Sobel(b, cv2.CV_32F, 1, 0), cv2.Sobel(b, cv2.CV_32F, 0, 1)
    lam = (light[2] - gx * light[0] - gy * light[1]) / np.sqrt(1 + gx * gx + gy * gy)
    return 0.35 + 0.8 * np.maximum(lam, 0)
