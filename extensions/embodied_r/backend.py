"""What every perception backend of Embodied-R's perception stage shares (perceive.py's VLMs, perceive_cv.py's
classical vision): the action vocabulary it writes a pair of key frames' motion in, and the frames it reads."""
from __future__ import annotations

import numpy as np

# The camera/agent motions a pair of key frames can show: translations along the three axes, yaw
# (rotate) and pitch (tilt) - the moves of UrbanVideo-Bench's drones and VSI-Bench's walk-throughs.
# "stay" (no motion between the frames) is our addition: the paper names no vocabulary at all, and a
# hovering drone or a paused walker otherwise has to be forced into a motion it did not make.
ACTIONS = ("move forward", "move backward", "move left", "move right", "move up", "move down",
           "rotate left", "rotate right", "tilt up", "tilt down", "stay")


def as_images(images) -> list[np.ndarray]:
    """A backend's frames: uint8 [H, W, 3] arrays, contiguous (ValueError otherwise); None: none."""
    out = []
    for im in images or []:
        a = np.asarray(im)
        if a.ndim != 3 or a.shape[-1] != 3 or a.dtype != np.uint8:
            raise ValueError(f"images must be uint8 [H, W, 3] arrays, got {a.dtype} {a.shape}")
        out.append(np.ascontiguousarray(a))
    return out
