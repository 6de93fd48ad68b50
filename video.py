"""Video input/output and a procedural sample clip for the ROVA corruption engine.

Reading follows qwen-vl-utils / Video-R1 exactly where it matters for model
inputs: frames are decoded with decord at uniform indices
``linspace(0, total_frames - 1, n).round()`` over the whole clip and resized,
keeping the aspect ratio, so that both sides are multiples of 28 and the pixel
count fits a budget (:func:`smart_resize`); :func:`read_clip` decodes a whole clip at
its native size instead (perturb.py's corrupted copies).  Writers produce H.264 mp4, GIF and
PNG contact sheets (one labelled row per corruption condition).
:func:`sample_clip` ray-casts a small street scene (RGB plus metric depth) that
serves as the built-in sample when no video is given.  Everything is
deterministic and free of global state.
"""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from contextlib import contextmanager
from pathlib import Path

import cv2
import numpy as np

from runtime import UserError

FACTOR = 28  # Qwen2-VL patch (14) x spatial merge (2)


class VideoError(UserError, ValueError):
    """A video file is missing, empty or cannot be decoded (message names the path)."""


# --------------------------------------------------------------------------- reading
def smart_resize(height: int, width: int, factor: int = FACTOR,
                 min_pixels: int = 4 * 28 * 28, max_pixels: int = 128 * 28 * 28) -> tuple[int, int]:
    """Target ``(height, width)``, as qwen-vl-utils computes it.

    Both sides are rounded to multiples of ``factor`` (at least ``factor``); if the
    area then exceeds ``max_pixels`` the sides are scaled down (floor to the factor),
    if it is below ``min_pixels`` they are scaled up (ceil), keeping the aspect ratio.
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"height and width must be positive, got {height}x{width}")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {height}x{width}")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def uniform_indices(total_frames: int, num_frames: int) -> np.ndarray:
    """``linspace(0, total_frames - 1, num_frames).round()`` as int64.

    Computed with torch when it is importable, because qwen-vl-utils uses the
    float32 ``torch.linspace`` and float64 numpy rounds some ties differently.
    """
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a project dependency
        return np.linspace(0, total_frames - 1, num_frames).round().astype(np.int64)
    return torch.linspace(0, total_frames - 1, num_frames).round().long().numpy()


def _decode_reason(exc: BaseException, path: Path) -> str:
    """Decord's message without its log prefixes, plus ffmpeg's diagnosis of the file."""
    text = re.sub(r"\[[\d:]+\] \S+?:\d+: ", "", str(exc)).strip().splitlines()
    text = [ln.replace("1094995529", "AVERROR_INVALIDDATA").replace("541478725", "AVERROR_EOF")
            for ln in text]  # the (negated) ffmpeg error tags decord prints as numbers
    reason = f"decord: {text[-1] if text else type(exc).__name__}"
    try:
        from imageio_ffmpeg import get_ffmpeg_exe
        probe = subprocess.run([get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-v", "error",
                                "-i", str(path)], capture_output=True, text=True, timeout=20)
        lines = [re.sub(r"^\[[^\]]*\] ", "", ln).strip() for ln in probe.stderr.splitlines()]
        lines = [ln for ln in dict.fromkeys(lines) if ln and "output file" not in ln
                 and "input file" not in ln]
        if lines:
            reason += "; ffmpeg: " + "; ".join(lines[:3])
    except Exception:  # diagnosis only; never mask the original error
        pass
    return reason


def _open(path):
    """``(VideoReader, total_frames, avg_fps)`` for ``path``; :class:`VideoError` when it is missing, a
    folder, empty, undecodable or without frames."""
    import decord

    path = Path(path)
    if not path.exists():
        raise VideoError(f"video file {path} does not exist")
    if path.is_dir():
        raise VideoError(f"video path {path} is a directory, not a file")
    if path.stat().st_size == 0:
        raise VideoError(f"video file {path} is empty (0 bytes)")
    try:
        vr = decord.VideoReader(str(path), ctx=decord.cpu(0), num_threads=0)
        total, fps = len(vr), float(vr.get_avg_fps())
    except Exception as exc:  # decord raises RuntimeError or DECORDError
        raise VideoError(f"video file {path} cannot be decoded as a video "
                         f"({_decode_reason(exc, path)})") from exc
    if total <= 0:
        raise VideoError(f"video file {path} has no frames")
    return vr, total, fps


def _batch(vr, indices: list, path: Path, total: int, shown: str | None = None) -> np.ndarray:
    """Decode the frames at ``indices`` (uint8 [n, H, W, 3]); :class:`VideoError` on failure, naming
    the frames as ``shown`` (default: the list)."""
    try:
        return vr.get_batch(indices).asnumpy()
    except Exception as exc:
        raise VideoError(f"video file {path} cannot be decoded as a video (frames "
                         f"{shown or indices} of {total}: {_decode_reason(exc, path)})") from exc


@contextmanager
def held_native_stderr():
    """Hold what native code (ffmpeg, decord) writes to file descriptor 2 inside the block: replayed
    when the block ends, dropped when it raises a :class:`VideoError` (whose message carries the
    reason), so that a command line reports a bad video as one line.  Redirects the process's fd 2:
    for single-threaded command-line scripts, not for readers running in threads."""
    try:
        os.fstat(2)
    except OSError:  # no stderr at all: nothing to hold
        yield
        return
    if sys.stderr is not None:
        sys.stderr.flush()
    saved = os.dup(2)
    replay = True
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except VideoError:
            replay = False
            raise
        finally:
            if sys.stderr is not None:
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if replay and held.seek(0, os.SEEK_END):
                held.seek(0)
                os.write(2, held.read())


def _fit(raw: np.ndarray, min_pixels: int, max_pixels: int) -> np.ndarray:
    """Frames resized to :func:`smart_resize`'s size (area filter down, cubic up); unchanged if they fit."""
    h, w = raw.shape[1:3]
    nh, nw = smart_resize(h, w, FACTOR, min_pixels, max_pixels)
    if (nh, nw) == (h, w):
        return raw
    interp = cv2.INTER_AREA if nh * nw < h * w else cv2.INTER_CUBIC
    return np.stack([cv2.resize(f, (nw, nh), interpolation=interp) for f in raw])


def read_frames(path, num_frames: int = 16, max_pixels: int = 128 * 28 * 28,
                min_pixels: int = 4 * 28 * 28, sampler: str = "uniform",
                keyframe_eps: float = 0.5) -> tuple[np.ndarray, np.ndarray, float]:
    """Decode ``num_frames`` uniformly spaced RGB frames, resized by :func:`smart_resize`.

    sampler "keyframes": Embodied-R's key frames instead (:func:`keyframes` at 1 fps, eps
    ``keyframe_eps``, between min(4, num_frames) and ``num_frames`` frames: T varies per video).
    Returns ``(frames, indices, fps)``: uint8 C-contiguous ``[T, H, W, 3]``, the
    int64 frame indices (repeated when the clip is shorter than ``num_frames``)
    and decord's average fps.  Raises :class:`VideoError` for unusable files.
    """
    if sampler not in ("uniform", "keyframes"):
        raise ValueError(f"sampler must be 'uniform' or 'keyframes', got {sampler!r}")
    if int(num_frames) != num_frames or num_frames < 1:
        raise ValueError(f"num_frames must be a positive integer, got {num_frames!r}")
    if max_pixels <= 0:
        raise ValueError(f"max_pixels must be positive, got {max_pixels!r}")
    path = Path(path)
    vr, total, fps = _open(path)
    if sampler == "keyframes":
        indices = keyframes(path, eps=keyframe_eps, min_frames=min(4, int(num_frames)), max_frames=int(num_frames))
    else:
        indices = uniform_indices(total, int(num_frames))
    raw = _fit(_batch(vr, indices.tolist(), path, total), min_pixels, max_pixels)
    return np.ascontiguousarray(raw, dtype=np.uint8), indices.astype(np.int64), fps


def probe(path) -> dict:
    """``{"frames", "fps", "height", "width"}`` of a video (decord's frame count and average fps; the
    size of its first decoded frame), without decoding the clip.  :class:`VideoError` as
    :func:`read_frames`."""
    path = Path(path)
    vr, total, fps = _open(path)
    h, w = _batch(vr, [0], path, total).shape[1:3]
    return {"frames": int(total), "fps": fps, "height": int(h), "width": int(w)}


def read_clip(path, num_frames: int | None = None, max_pixels: int | None = None,
              min_pixels: int = 4 * 28 * 28, chunk: int = 32) -> tuple[np.ndarray, np.ndarray, float]:
    """Decode a whole clip: every frame at its native size by default.

    ``num_frames``: only that many, at :func:`uniform_indices` (as :func:`read_frames`, repeated when
    the clip is shorter); ``max_pixels``: resized by :func:`smart_resize` (``min_pixels`` its floor),
    as :func:`read_frames`.  With both given the result equals :func:`read_frames`'.  Decoded
    ``chunk`` frames at a time into one preallocated array, so the peak memory is the clip's own
    ``T * H * W * 3`` bytes plus a chunk.  Returns ``(frames, indices, fps)`` like :func:`read_frames`."""
    if num_frames is not None and (int(num_frames) != num_frames or num_frames < 1):
        raise ValueError(f"num_frames must be a positive integer, got {num_frames!r}")
    if max_pixels is not None and max_pixels <= 0:
        raise ValueError(f"max_pixels must be positive, got {max_pixels!r}")
    path = Path(path)
    vr, total, fps = _open(path)
    indices = (np.arange(total, dtype=np.int64) if num_frames is None
               else uniform_indices(total, int(num_frames)).astype(np.int64))
    out = None
    for i in range(0, len(indices), chunk):
        part = indices[i:i + chunk].tolist()
        raw = _batch(vr, part, path, total, shown=f"{part[0]}..{part[-1]}" if len(part) > 4 else None)
        if max_pixels is not None:
            raw = _fit(raw, min_pixels, max_pixels)
        if out is None:
            out = np.empty((len(indices), *raw.shape[1:]), np.uint8)
        out[i:i + len(raw)] = raw
    return out, indices, fps


# --------------------------------------------------------------------------- key frames (Embodied-R)
def _overlap(ref_gray: np.ndarray, cur_gray: np.ndarray, orb, matcher) -> float | None:
    """Share of the reference frame covered by the current frame warped into it: ORB key points,
    brute-force Hamming matching with cross-check, RANSAC homography M (cur -> ref), the current
    frame's four corners mapped by M, and the area of their intersection with the reference frame's
    rectangle over the frame's area (Embodied-R Sec. 2.1). None when the frames cannot be matched."""
    k1, d1 = orb.detectAndCompute(ref_gray, None)
    k2, d2 = orb.detectAndCompute(cur_gray, None)
    if d1 is None or d2 is None or len(k1) < 4 or len(k2) < 4:
        return None
    matches = matcher.match(d2, d1)
    if len(matches) < 4:
        return None
    src = np.float32([k2[m.queryIdx].pt for m in matches]).reshape(-1, 1, 2)
    dst = np.float32([k1[m.trainIdx].pt for m in matches]).reshape(-1, 1, 2)
    M, _ = cv2.findHomography(src, dst, cv2.RANSAC, 5.0)
    if M is None or not np.all(np.isfinite(M)):
        return None
    h, w = cur_gray.shape
    corners = np.float32([[0, 0], [w, 0], [w, h], [0, h]]).reshape(-1, 1, 2)
    quad = cv2.perspectiveTransform(corners, M).reshape(-1, 2)
    if not np.all(np.isfinite(quad)) or not cv2.isContourConvex(quad.astype(np.float32)):
        return None  # a folded or degenerate warp: no usable overlap
    rect = np.float32([[0, 0], [w, 0], [w, h], [0, h]])
    area, _ = cv2.intersectConvexConvex(rect, quad.astype(np.float32))
    return float(max(area, 0.0) / (w * h))


def _thin(indices: list, k: int) -> list:
    """k of the sorted indices, the first and last kept, the rest evenly spaced (constrained uniform)."""
    if len(indices) <= k:
        return list(indices)
    pos = np.unique(np.round(np.linspace(0, len(indices) - 1, k)).astype(int))
    return [indices[i] for i in pos]


def _presample(total: int, fps: float, sample_fps: float) -> list:
    """Frame indices at about ``sample_fps`` out of ``total`` frames at ``fps`` (every frame when the fps
    is unknown or not above ``sample_fps``), the last frame always included."""
    step = max(float(fps) / sample_fps, 1.0) if fps and fps > 0 else 1.0
    return sorted(set(np.round(np.arange(0, total, step)).astype(int).clip(0, total - 1).tolist()) | {total - 1})


def keyframes(source, eps: float = 0.5, min_frames: int = 4, max_frames: int = 32, sample_fps: float = 1.0,
              fps: float | None = None, match_size: int = 320) -> np.ndarray:
    """Embodied-R's key-frame extractor (Sec. 2.1): the indices of the frames to keep.

    source: a video path (pre-sampled at ``sample_fps`` using the file's fps) or a uint8 [T,H,W,3]
    array (pre-sampled likewise when ``fps`` is given, else every frame is a candidate). Walking the
    candidates, each is compared with the last key frame: if the overlap of its homography-warped
    frame with the key frame (:func:`_overlap`) is below ``eps``, or the two cannot be matched, it
    becomes the new key frame; else it is skipped and the next is compared with the same key frame.
    The first and last candidates are always kept. Fewer than ``min_frames`` are topped up with evenly
    spaced candidates; more than ``max_frames`` are thinned evenly (first and last kept). Frames are
    matched at most ``match_size`` pixels on their long side. Returns sorted int64 indices into the
    source (video frame numbers for a path, array positions for an array)."""
    if not 0.0 < eps <= 1.0:
        raise ValueError(f"eps must be in (0, 1], got {eps!r}")
    if min_frames < 1 or max_frames < min_frames:
        raise ValueError(f"need 1 <= min_frames <= max_frames, got {min_frames}, {max_frames}")
    if isinstance(source, (str, Path)):
        import decord

        path = Path(source)
        if not path.is_file():
            raise VideoError(f"video file {path} does not exist")
        try:
            vr = decord.VideoReader(str(path), ctx=decord.cpu(0), num_threads=0)
            total, vfps = len(vr), float(vr.get_avg_fps())
        except Exception as exc:
            raise VideoError(f"video file {path} cannot be decoded as a video ({_decode_reason(exc, path)})") from exc
        cand = _presample(total, vfps, sample_fps)
        try:
            frames = vr.get_batch(cand).asnumpy()
        except Exception as exc:
            raise VideoError(f"video file {path} cannot be decoded ({_decode_reason(exc, path)})") from exc
    else:
        frames = _as_clip(source)
        total = len(frames)
        cand = _presample(total, fps, sample_fps) if fps else list(range(total))
        frames = frames[cand]
    h, w = frames.shape[1:3]
    scale = min(1.0, match_size / max(h, w))
    gray = [cv2.cvtColor(cv2.resize(f, (max(1, round(w * scale)), max(1, round(h * scale))),
                                    interpolation=cv2.INTER_AREA) if scale < 1 else f, cv2.COLOR_RGB2GRAY)
            for f in frames]
    orb = cv2.ORB_create(nfeatures=500, edgeThreshold=15, patchSize=15)
    matcher = cv2.BFMatcher(cv2.NORM_HAMMING, crossCheck=True)
    keep = [0]
    for i in range(1, len(cand)):
        c = _overlap(gray[keep[-1]], gray[i], orb, matcher)
        if c is None or c < eps:
            keep.append(i)
    if keep[-1] != len(cand) - 1:
        keep.append(len(cand) - 1)
    if len(keep) < min_frames:  # top up with evenly spaced candidates
        keep = sorted(set(keep) | set(_thin(list(range(len(cand))), min_frames)))
    keep = _thin(sorted(keep), max_frames)
    return np.asarray([cand[i] for i in keep], dtype=np.int64)


# --------------------------------------------------------------------------- writing
def _as_clip(frames, what: str = "frames") -> np.ndarray:
    """uint8 ``[T, H, W, 3]`` numpy array from numpy or a (CPU/GPU) torch tensor."""
    if hasattr(frames, "detach"):
        frames = frames.detach().cpu().numpy()
    arr = np.asarray(frames)
    if arr.ndim != 4 or arr.shape[-1] != 3 or 0 in arr.shape:
        raise ValueError(f"{what} must be a non-empty [T, H, W, 3] array, got shape {arr.shape}")
    if arr.dtype != np.uint8:
        raise ValueError(f"{what} must be uint8, got {arr.dtype}")
    return np.ascontiguousarray(arr)


def _prepare(path, fps: float | None = None) -> Path:
    """Check ``fps`` (if given) and create the output's parent folders."""
    if fps is not None and not fps > 0:
        raise ValueError(f"fps must be positive, got {fps!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def _atomic(path):
    """Yield a temporary name next to ``path`` (same extension, so writers pick the same format);
    renamed to ``path`` once the write is done, removed if it fails or writes nothing, so that a failed
    write leaves neither an empty nor a truncated file (nor replaces an existing one)."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.partial{path.suffix}")
    try:
        yield tmp
        if not tmp.is_file() or tmp.stat().st_size == 0:
            raise VideoError(f"writing {path} failed: nothing was written (see the writer's message above)")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def even_size(height: int, width: int) -> tuple[int, int]:
    """``(height, width)`` as :func:`write_video` writes it: odd sides padded by one pixel."""
    return height + height % 2, width + width % 2


def write_video(path, frames, fps: float = 8.0, quality: int = 8) -> str:
    """Write uint8 ``[T, H, W, 3]`` frames as an H.264 / yuv420p mp4 and return its path.

    yuv420p needs even sides, so an odd height or width is padded by repeating the
    last row or column (:func:`even_size` gives the size written).  ``quality`` is
    imageio-ffmpeg's 0-10 scale (8 = crf 10).  Written under a temporary name and
    renamed at the end: a failed write leaves no empty or truncated file.
    """
    from imageio_ffmpeg import write_frames

    arr = _as_clip(frames)
    path = _prepare(path, fps)
    h, w = arr.shape[1:3]
    pad = ((0, h % 2), (0, w % 2), (0, 0))  # per frame: a long clip is not copied whole
    with _atomic(path) as tmp:
        writer = write_frames(str(tmp), (w + w % 2, h + h % 2), fps=float(fps), codec="libx264",
                              pix_fmt_out="yuv420p", quality=quality, macro_block_size=1,
                              ffmpeg_log_level="error", output_params=["-movflags", "+faststart"])
        writer.send(None)
        try:
            for frame in arr:
                writer.send(np.ascontiguousarray(np.pad(frame, pad, mode="edge") if h % 2 or w % 2 else frame))
        finally:
            writer.close()  # also on failure: ffmpeg is stopped before the partial file is removed
    return str(path)


def write_gif(path, frames, fps: float = 8.0) -> str:
    """Write a looping GIF (Pillow; identical consecutive frames may be merged)."""
    from PIL import Image

    arr = _as_clip(frames)
    path = _prepare(path, fps)
    images = [Image.fromarray(f) for f in arr]
    with _atomic(path) as tmp:
        images[0].save(tmp, format="GIF", save_all=True, append_images=images[1:],
                       duration=max(20, round(1000 / fps)), loop=0)
    return str(path)


def contact_sheet(rows, labels, path, num_cols: int = 4, cell_width: int | None = None,
                  label_width: int = 140) -> str:
    """Save a PNG grid: one row per clip in ``rows`` with its label on the left.

    Each row shows ``num_cols`` frames at uniform indices.  Cells take the first
    clip's frame size (other clips are resized to it), or ``cell_width`` wide
    with the same aspect ratio.  Image size: ``(label_width + num_cols * cell_w,
    len(rows) * cell_h)``.
    """
    from PIL import Image, ImageDraw, ImageFont

    rows = [_as_clip(r, f"rows[{i}]") for i, r in enumerate(rows)]
    labels = [str(s) for s in labels]
    if not rows or len(rows) != len(labels):
        raise ValueError(f"need one label per row and at least one row, got {len(rows)} rows "
                         f"and {len(labels)} labels")
    if num_cols < 1:
        raise ValueError(f"num_cols must be positive, got {num_cols}")
    h, w = rows[0].shape[1:3]
    cw = int(cell_width) if cell_width else w
    ch = max(1, round(h * cw / w))
    sheet = Image.new("RGB", (label_width + num_cols * cw, len(rows) * ch), "white")
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default(size=16)
    for r, (clip, label) in enumerate(zip(rows, labels)):
        for c, t in enumerate(np.linspace(0, len(clip) - 1, num_cols).round().astype(int)):
            frame = clip[t]
            if frame.shape[:2] != (ch, cw):
                interp = cv2.INTER_AREA if cw < frame.shape[1] else cv2.INTER_CUBIC
                frame = cv2.resize(frame, (cw, ch), interpolation=interp)
            sheet.paste(Image.fromarray(frame), (label_width + c * cw, r * ch))
        text = textwrap.fill(label, width=max(4, (label_width - 12) // 9))  # ~9 px per character
        box = draw.multiline_textbbox((0, 0), text, font=font)
        y = r * ch + max(0, (ch - (box[3] - box[1])) // 2)
        draw.multiline_text((6, y), text, fill=(20, 20, 20), font=font)
    path = _prepare(path)
    with _atomic(path) as tmp:
        sheet.save(tmp, format="PNG")
    return str(path)


# --------------------------------------------------------------------------- sample clip
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
    for i in np.argsort(zmin):  # boxes, front to back
        r0, r1, c0, c1 = rects[i]
        if r0 >= r1 or c0 >= c1:
            continue
        D, zb = d[r0:r1, c0:c1], depth[r0:r1, c0:c1]
        t1, t2 = (lo[i] - cam) * inv[r0:r1, c0:c1], (hi[i] - cam) * inv[r0:r1, c0:c1]
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
        img[r0:r1, c0:c1][hit], zb[hit], sky[r0:r1, c0:c1][hit] = col, th, False
    scale = np.array([1.0, 0.8, 1.0], np.float32)  # crowns are ellipsoids 1.25x taller than wide
    ext = rad[:, None] / scale
    rects, zmin = _screen_rects(cen - ext, cen + ext, cam, rot, f, h, w, near)
    for j in np.argsort(zmin):
        r0, r1, c0, c1 = rects[j]
        if r0 >= r1 or c0 >= c1:
            continue
        D, zb = d[r0:r1, c0:c1], depth[r0:r1, c0:c1]
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
        img[r0:r1, c0:c1][hit] = crgb[j] * ((0.5 + leaf) * lam)[:, None]
        zb[hit], sky[r0:r1, c0:c1][hit] = th, False
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


def write_sample_video(path, fps: float = 8.0, **kw) -> str:
    """Write :func:`sample_clip` (``kw`` are its arguments) as an mp4; returns the path."""
    return write_video(path, sample_clip(**kw)[0], fps=fps)
