"""Monocular depth for the depth-conditioned corruptions (ROVA Sec. 3.1 and Sec. 4, Table 1: "spatially aware"
perturbations), optional and cached.

perturb.py grades fog, rain and snow layers, shadows and occluders by scene depth. `--depth-model` (perturb.py,
train.py, eval_pvrbench.py; class Depth) says where it comes from: `auto` (the default) a clip's own depth where it
has one (the synthetic benchmark's) and else the recommended model below; `proxy` none (scene.depth_proxy: a sky
over a ground plane, or one gentle depth where no sky is seen); NAME a transformers depth-estimation model, loaded
by name or local folder with the Auto classes (AutoImageProcessor + AutoModelForDepthEstimation, safetensors
weights only). Recommended:

    depth-anything/Depth-Anything-V2-Small-hf   (25M parameters; `hf download` it where the hub is reachable)

The rule (larger = farther, perturb.py's convention). Depth Anything (relative), DPT and Depth Pro predict
relative inverse depth (disparity, larger = nearer, affine-invariant); it is turned into depth per clip:

    n = max(disparity, 0) / max over the whole clip's disparity     in [0, 1] (one scale for all frames: no flicker)
    depth = 1 / (n + EPS), EPS = 0.02                                 nearest ~1, zero disparity (sky) 1/EPS = 50

so the sky (disparity ~0) is the farthest, and the unknown scale cancels (perturb normalises depth per clip as
d / (d + median d)). Models that predict metric depth (GLPN, ZoeDepth, Depth Anything with
depth_estimation_type "metric") are used as they are, clipped at 0. The prediction is resized bilinearly to the
frame size and rounded to float16 before anything uses it, so what corrupts a clip, what is cached and what
`eval_pvrbench.py --export` writes are the same numbers (Eq. 4: the spec, the clean frames and the exported depth
regenerate a corrupted clip bit for bit, without the model; the model itself, rerun on other hardware or library
versions, may differ in the last bits).

The cache: one float16 .npy per clip, DIR/<k[:2]>/<k>.npy, k = sha256 of (model, video identity, frame indices,
the frames' shape and content, the rule's version); DIR is --depth-cache (default $XDG_CACHE_HOME/rova/depth,
i.e. ~/.cache/rova/depth). A local model folder is identified by its path and its files' sizes and mtimes, a hub
id by its name. Files are written atomically (a temporary file, then os.replace); an unreadable or malformed one
is recomputed with a warning that names it, never used.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np

from machinery import cli, hub

RECOMMENDED = "depth-anything/Depth-Anything-V2-Small-hf"
AUTO, PROXY = "auto", "proxy"   # --depth-model's values besides a model's name or folder
EPS = 0.02                          # depth = 1 / (normalised disparity + EPS): the far limit is 1 / EPS
RULE_VERSION = 1                    # in the cache key: a change of the rule above never reuses old maps
METRIC_TYPES = ("glpn", "zoedepth")  # model types whose predicted_depth is depth, not disparity
F16_MAX = float(np.finfo(np.float16).max)


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "rova" / "depth"


def check_source(name: str, cache: str = "", what: str = "--depth-model", needs_model: bool = True):
    """One line now, before any work, when the model `name` asks for cannot be loaded (hub.model_source):
    for `auto` (the recommended model, which a clip without its own depth needs: `needs_model`), a line that says
    how to get it or to use the proxy. `cache` (--depth-cache) with the proxy is a mistake too."""
    name = name or PROXY
    if cache and name == PROXY:
        raise cli.UserError(f"--depth-cache {cache} is where {what}'s maps are kept: give {what} auto or NAME")
    if name == AUTO and needs_model:
        try:
            hub.model_source(RECOMMENDED, f"{what} auto (the default for footage without its own depth) loads")
        except cli.UserError as e:
            raise cli.UserError(f"{e}; or give {what} proxy (perturb's depth proxy, no model)") from None
    elif name not in (AUTO, PROXY):
        hub.model_source(name, what)


def describe(name: str):
    """The manifest's record of a depth source: "proxy" (scene.depth_proxy), or {"model": NAME}."""
    return {"model": name} if name and name != PROXY else "proxy"


def own_depth_file(video_path):
    """The depth a clip comes with, or None: the synthetic benchmark's `<root>/depth/<id>.npy` beside its video
    `<root>/videos/synthetic/<id>.mp4` (synthetic.make_synthetic: float16 metres, one map per frame)."""
    if not video_path:
        return None
    p = Path(video_path)
    f = p.parent.parent.parent / "depth" / f"{p.stem}.npy"
    return f if p.parent.name == "synthetic" and p.parent.parent.name == "videos" and f.is_file() else None


def own_depth(path, frames, indices=None) -> np.ndarray:
    """A clip's own depth (own_depth_file) at the frames read: the maps of `indices` (default: the first T),
    resized to the frames' size, float16 [T,H,W]."""
    import cv2

    d = read(path)
    T, H, W = frames.shape[:3]
    idx = list(range(T)) if indices is None else [int(i) for i in indices]
    if len(idx) != T or max(idx) >= len(d):
        raise cli.UserError(f"depth file {path}: {len(d)} maps, the clip read frames {idx[:4]}... ({T})")
    return np.stack([cv2.resize(d[i].astype(np.float32), (W, H), interpolation=cv2.INTER_LINEAR)
                     for i in idx]).astype(np.float16)


class Depth:
    """What --depth-model NAME gives a clip: `depth(frames, video_id, indices, video_path)` -> float16 [T,H,W],
    or None for perturb's proxy. NAME is
    - `auto` (the default): the clip's own depth where it has one (own_depth_file: the synthetic benchmark's true
      depth), else the RECOMMENDED model's (real footage: PVRBench is depth-conditioned, Sec. 4);
    - `proxy`: none (scene.depth_proxy: a sky over a ground plane, or one depth without a sky);
    - a model's hub id or folder: that model's (Source), also for clips with their own depth."""

    def __init__(self, name: str = AUTO, cache_dir=None):
        self.name = name or PROXY
        model = RECOMMENDED if self.name == AUTO else None if self.name == PROXY else self.name
        self.source = Source(model, cache_dir) if model else None

    def kind(self, video_path=None) -> str:
        """"own", "model" or "proxy": where a clip's depth comes from."""
        if self.name == AUTO and own_depth_file(video_path):
            return "own"
        return "model" if self.source is not None else "proxy"

    def describe(self, video_path=None):
        """The manifest's record: "proxy", {"model": NAME} or {"own": "depth/<id>.npy"}."""
        kind = self.kind(video_path)
        if kind == "own":
            return {"own": f"depth/{Path(video_path).stem}.npy"}
        return describe(self.source.name) if kind == "model" else "proxy"

    def key(self) -> str:
        """What identifies this choice in a run hash: the name, and the model's identity (model_id)."""
        return self.name if self.source is None else f"{self.name}:{self.source.id}"

    def __call__(self, frames, video_id: str = "", indices=None, video_path=None):
        kind = self.kind(video_path)
        if kind == "own":
            return own_depth(own_depth_file(video_path), np.asarray(frames), indices)
        return self.source(frames, video_id, indices) if kind == "model" else None


def model_id(name: str) -> str:
    """What identifies a depth model in the cache key and in eval's run hash: a hub id by its name, a local
    folder by its resolved path and its files' names, sizes and mtimes (a rebuilt model is a new model)."""
    path = Path(name).expanduser()
    if not path.is_dir():
        return name
    files = [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(path.iterdir()) if f.is_file()]
    return json.dumps([str(path.resolve()), files])


def is_metric(config) -> bool:
    """True when the model predicts depth (larger = farther), False when it predicts disparity."""
    return config.model_type in METRIC_TYPES or getattr(config, "depth_estimation_type", None) == "metric"


def to_depth(pred: np.ndarray, metric: bool, top: float | None = None) -> np.ndarray:
    """The model's prediction -> depth, float16, larger = farther (the module docstring's rule). `top`: the
    clip's maximum disparity (default: pred's own), so that the chunks of one clip share one scale."""
    pred = np.asarray(pred, np.float32)
    if not np.isfinite(pred).all():
        raise ValueError("the depth model predicted non-finite values")
    if metric:
        return np.clip(pred, 0, F16_MAX).astype(np.float16)
    disp = np.maximum(pred, 0)
    top = float(disp.max()) if top is None else top
    n = disp / top if top > 0 else disp   # (no disparity anywhere: everything at the far limit)
    return (1.0 / (n + EPS)).astype(np.float16)


def read(path, shape=None) -> np.ndarray:
    """A depth file (the cache's, or one eval_pvrbench.py --export wrote): float16 [T,H,W], finite, >= 0, of
    `shape` if given. Anything else is a UserError naming the file (no pickle is ever loaded)."""
    try:
        d = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise cli.UserError(f"depth file {path}: unreadable ({type(e).__name__}: {e})") from None
    if d.dtype != np.float16 or d.ndim != 3:
        raise cli.UserError(f"depth file {path}: expected float16 [T,H,W], got {d.dtype} {list(d.shape)}")
    if shape is not None and tuple(d.shape) != tuple(shape):
        raise cli.UserError(f"depth file {path}: shape {list(d.shape)}, the clip needs {list(shape)}")
    if not np.isfinite(d).all() or (d < 0).any():
        raise cli.UserError(f"depth file {path}: non-finite or negative values")
    return d


def write(path, depth: np.ndarray) -> Path:
    """Write float16 depth to `path` (.npy) atomically: a temporary file in the same folder, then os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as f:
        np.save(f, np.ascontiguousarray(depth, np.float16), allow_pickle=False)
    os.replace(tmp, path)
    return path


class Source:
    """A depth model with its disk cache. `source(frames, video_id, indices)` -> float16 [T,H,W] depth of a
    uint8 [T,H,W,3] clip (cached); the model is loaded on the first cache miss (thread-safe)."""

    def __init__(self, name: str, cache_dir=None, device=None, batch_size: int = 8):
        self.name, self.id, self.batch_size = name, model_id(name), max(1, batch_size)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache()
        self.device, self.model, self.processor, self.metric = device, None, None, False
        self.lock = threading.Lock()

    def describe(self) -> dict:
        """The manifest's record of this depth source (eval_pvrbench.py)."""
        return describe(self.name)

    def key(self, frames, video_id: str, indices=None) -> str:
        frames = np.ascontiguousarray(frames)
        fields = {"model": self.id, "video": str(video_id), "shape": list(frames.shape), "rule": RULE_VERSION,
                  "indices": None if indices is None else [int(i) for i in indices],
                  "frames": hashlib.sha256(frames.data).hexdigest()}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    def path(self, key: str) -> Path:
        return self.cache_dir / key[:2] / f"{key}.npy"

    def __call__(self, frames, video_id: str = "", indices=None) -> np.ndarray:
        frames = frames.detach().cpu().numpy() if hasattr(frames, "detach") else np.asarray(frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
            raise ValueError(f"depth: frames must be uint8 [T,H,W,3], got {frames.dtype} {list(frames.shape)}")
        path = self.path(self.key(frames, video_id, indices))
        depth = self._cached(path, frames.shape[:3])
        if depth is None:
            with self.lock:   # (the eval corrupts clips in threads: one model call at a time)
                depth = self._cached(path, frames.shape[:3], quiet=True)   # (another thread's, meanwhile)
                if depth is None:
                    depth = self.estimate(frames)
                    write(path, depth)
        return depth

    @staticmethod
    def _cached(path, shape, quiet=False):
        """The cached depth, or None: not there, or unreadable / malformed (a warning names the file)."""
        if not path.is_file():
            return None
        try:
            return read(path, shape)
        except cli.UserError as e:
            if not quiet:
                warnings.warn(f"{e}; recomputing it", stacklevel=3)
            return None

    def load(self):
        """The processor and model (safetensors only), on `device` (default: CUDA if available, else CPU)."""
        if self.model is not None:
            return
        import torch
        from transformers import AutoImageProcessor, AutoModelForDepthEstimation

        kwargs = hub.model_source(self.name, "--depth-model")
        try:
            with hub.no_hf_progress_bars():
                self.processor = AutoImageProcessor.from_pretrained(self.name, **kwargs)
                model = AutoModelForDepthEstimation.from_pretrained(self.name, use_safetensors=True,
                                                                    dtype=torch.float32, **kwargs)
        except (OSError, ValueError, KeyError) as e:
            raise cli.UserError(f"--depth-model {self.name}: not a loadable depth-estimation model "
                                f"(safetensors weights): {' '.join(str(e).split())[:300]}") from None
        self.device = torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model, self.metric = model.eval().to(self.device), is_metric(model.config)

    def estimate(self, frames: np.ndarray) -> np.ndarray:
        """The model's depth of a clip, no cache: batches of `batch_size` frames, resized to the frame size,
        converted by the rule (one disparity scale for the clip), float16."""
        import torch

        self.load()
        T, H, W = frames.shape[:3]
        raw = self._predict(frames)   # [T,h,w] at the model's resolution
        top = float(raw.clamp(min=0).max()) if len(raw) else 0.0
        out = np.empty((T, H, W), np.float16)
        for k in range(0, T, self.batch_size):
            part = torch.nn.functional.interpolate(raw[k:k + self.batch_size, None], size=(H, W), mode="bilinear",
                                                   align_corners=False)[:, 0]
            out[k:k + self.batch_size] = to_depth(part.numpy(), self.metric, top)
        return out

    def _predict(self, frames):
        import torch

        preds = []
        with torch.no_grad():
            for k in range(0, len(frames), self.batch_size):
                inputs = self.processor(images=list(frames[k:k + self.batch_size]), return_tensors="pt")
                preds.append(self.model(**inputs.to(self.device)).predicted_depth.float().cpu())
        return torch.cat(preds) if preds else torch.zeros((0, 1, 1))


class ClipMemo:
    """`source`'s depth of the last `size` clean clips, by clip object: a caller that corrupts one clip under many
    specs (eval_pvrbench.py: a subtype each; train.py: a spec per rollout group) hashes the clip and reads its
    cache file once, not once per spec. A hit needs the very frames object seen before (`is`), so a new
    read of the video (new frames, even equal ones) asks `source` again. Thread-safe."""

    def __init__(self, source: Source, size: int = 8):
        self.source, self.size, self.items, self.lock = source, max(1, size), OrderedDict(), threading.Lock()
        self.computing = [threading.Lock() for _ in range(16)]   # a clip's computation holds its video id's lock

    def __call__(self, frames, video_id: str = "", indices=None, **kwargs) -> np.ndarray:
        with self.computing[hash(video_id) % len(self.computing)]:   # its other specs at the same time: wait for it
            with self.lock:
                hit = self.items.get(video_id)
            if hit is not None and hit[0] is frames:
                return hit[1]
            d = self.source(frames, video_id, indices, **kwargs)
            with self.lock:
                self.items[video_id] = (frames, d)
                self.items.move_to_end(video_id)
                while len(self.items) > self.size:
                    self.items.popitem(last=False)
        return d
