"""Video input/output: decoding model inputs, whole clips, and writers.

Reading follows qwen-vl-utils / Video-R1 exactly where it matters for model
inputs: frames are decoded with decord at uniform indices
``linspace(0, total_frames - 1, n).round()`` over the whole clip and resized,
keeping the aspect ratio, so that both sides are multiples of 28 and the pixel
count fits a budget (:func:`smart_resize`); another frame selection plugs in as a
``sampler`` callable (:func:`read_frames`). :func:`read_clip` decodes a whole clip at
its native size instead (perturb.py's corrupted copies).  Writers produce H.264 mp4 (lossless on request), GIF and
PNG contact sheets (one labelled row per corruption condition), atomically.  Everything is
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

from machinery.cli import UserError

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


def open_video(path):
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


def decode_frames(vr, indices: list, path: Path, total: int, shown: str | None = None) -> np.ndarray:
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
                min_pixels: int = 4 * 28 * 28, sampler=None) -> tuple[np.ndarray, np.ndarray, float]:
    """Decode ``num_frames`` uniformly spaced RGB frames, resized by :func:`smart_resize`.

    ``sampler``: None for the uniform indices, else a callable ``sampler(path, num_frames)`` returning
    the frame indices to read instead (e.g. an extension's key frames; T may then vary per video).
    Returns ``(frames, indices, fps)``: uint8 C-contiguous ``[T, H, W, 3]``, the
    int64 frame indices (repeated when the clip is shorter than ``num_frames``)
    and decord's average fps.  Raises :class:`VideoError` for unusable files.
    """
    if sampler is not None and not callable(sampler):
        raise ValueError(f"sampler must be None (uniform) or a callable (path, num_frames) -> indices, got {sampler!r}")
    if int(num_frames) != num_frames or num_frames < 1:
        raise ValueError(f"num_frames must be a positive integer, got {num_frames!r}")
    if max_pixels <= 0:
        raise ValueError(f"max_pixels must be positive, got {max_pixels!r}")
    path = Path(path)
    vr, total, fps = open_video(path)
    indices = (uniform_indices(total, int(num_frames)) if sampler is None
               else np.asarray(sampler(path, int(num_frames)), dtype=np.int64))
    raw = _fit(decode_frames(vr, indices.tolist(), path, total), min_pixels, max_pixels)
    return np.ascontiguousarray(raw, dtype=np.uint8), indices.astype(np.int64), fps


def probe(path) -> dict:
    """``{"frames", "fps", "height", "width"}`` of a video (decord's frame count and average fps; the
    size of its first decoded frame), without decoding the clip.  :class:`VideoError` as
    :func:`read_frames`."""
    path = Path(path)
    vr, total, fps = open_video(path)
    h, w = decode_frames(vr, [0], path, total).shape[1:3]
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
    vr, total, fps = open_video(path)
    indices = (np.arange(total, dtype=np.int64) if num_frames is None
               else uniform_indices(total, int(num_frames)).astype(np.int64))
    out = None
    for i in range(0, len(indices), chunk):
        part = indices[i:i + chunk].tolist()
        raw = decode_frames(vr, part, path, total, shown=f"{part[0]}..{part[-1]}" if len(part) > 4 else None)
        if max_pixels is not None:
            raw = _fit(raw, min_pixels, max_pixels)
        if out is None:
            out = np.empty((len(indices), *raw.shape[1:]), np.uint8)
        out[i:i + len(raw)] = raw
    return out, indices, fps


# --------------------------------------------------------------------------- writing
def as_clip(frames, what: str = "frames") -> np.ndarray:
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


def write_video(path, frames, fps: float = 8.0, quality: int = 8, lossless: bool = False) -> str:
    """Write uint8 ``[T, H, W, 3]`` frames as an H.264 mp4 and return its path.

    yuv420p (what every player reads) needs even sides, so an odd height or width is padded by repeating the
    last row or column (:func:`even_size` gives the size written); ``quality`` is imageio-ffmpeg's 0-10 scale
    (8 = crf 10). ``lossless``: H.264 in RGB at qp 0 instead (libx264rgb, any size), which decord and OpenCV
    (vLLM's loader) decode back to the very frames written (tests/test_video.py). Written under a
    temporary name and renamed at the end: a failed write leaves no empty or truncated file.
    """
    from imageio_ffmpeg import write_frames

    arr = as_clip(frames)
    path = _prepare(path, fps)
    h, w = arr.shape[1:3]
    ph, pw = (0, 0) if lossless else (h % 2, w % 2)   # the padding yuv420p needs
    pad = ((0, ph), (0, pw), (0, 0))  # per frame: a long clip is not copied whole
    codec = dict(codec="libx264rgb", pix_fmt_out="rgb24", output_params=["-qp", "0"]) if lossless else dict(
        codec="libx264", pix_fmt_out="yuv420p", quality=quality, output_params=[])
    codec["output_params"] += ["-movflags", "+faststart"]
    with _atomic(path) as tmp:
        writer = write_frames(str(tmp), (w + pw, h + ph), fps=float(fps), macro_block_size=1,
                              ffmpeg_log_level="error", **codec)
        writer.send(None)
        try:
            for frame in arr:
                writer.send(np.ascontiguousarray(np.pad(frame, pad, mode="edge") if ph or pw else frame))
        finally:
            writer.close()  # also on failure: ffmpeg is stopped before the partial file is removed
    return str(path)


def mp4_bytes(frames, fps: float) -> bytes:
    """The frames as a lossless mp4 (write_video's), in memory: eval_pvrbench.py --video-format mp4."""
    with tempfile.TemporaryDirectory() as tmp:
        return Path(write_video(Path(tmp) / "clip.mp4", frames, fps=fps, lossless=True)).read_bytes()


def write_gif(path, frames, fps: float = 8.0) -> str:
    """Write a looping GIF (Pillow; identical consecutive frames may be merged)."""
    from PIL import Image

    arr = as_clip(frames)
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

    rows = [as_clip(r, f"rows[{i}]") for i, r in enumerate(rows)]
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
