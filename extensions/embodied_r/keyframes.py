"""Embodied-R's key frames (its Sec. 2.1): keep a frame when it overlaps the last key frame by less than eps.

Plugs into the core's frame reading through ``video.read_frames(..., sampler=keyframe_sampler(eps))``:
between min(4, num_frames) and ``num_frames`` key frames of the video at 1 fps (T varies per video).
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from machinery import video


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
    rect = np.float32([[0, 0], [w, 0], [w, h], [0, h]])
    quad = cv2.perspectiveTransform(rect.reshape(-1, 1, 2), M).reshape(-1, 2)
    if not np.all(np.isfinite(quad)) or not cv2.isContourConvex(quad.astype(np.float32)):
        return None  # a folded or degenerate warp: no usable overlap
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


def _candidates(source, sample_fps: float, fps: float | None):
    """(candidate indices, their frames) of a video path or a uint8 [T, H, W, 3] array."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        reader, total, file_fps = video.open_video(path)
        cand = _presample(total, file_fps, sample_fps)
        return cand, video.decode_frames(reader, cand, path, total)
    frames = video.as_clip(source)
    cand = _presample(len(frames), fps, sample_fps) if fps else list(range(len(frames)))
    return cand, frames[cand]


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
    source (video frame numbers for a path, array positions for an array). A bad file raises
    ``video.VideoError``."""
    if not 0.0 < eps <= 1.0:
        raise ValueError(f"eps must be in (0, 1], got {eps!r}")
    if min_frames < 1 or max_frames < min_frames:
        raise ValueError(f"need 1 <= min_frames <= max_frames, got {min_frames}, {max_frames}")
    cand, frames = _candidates(source, sample_fps, fps)
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


def keyframe_sampler(eps: float = 0.5):
    """A ``video.read_frames`` sampler: ``sampler(path, num_frames)`` -> the :func:`keyframes` of the
    video at 1 fps with overlap threshold ``eps``, between min(4, num_frames) and num_frames of them."""
    def sampler(path, num_frames: int) -> np.ndarray:
        return keyframes(path, eps=eps, min_frames=min(4, int(num_frames)), max_frames=int(num_frames))
    return sampler
