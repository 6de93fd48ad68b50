"""The training clips: decoded once (an LRU cache of --video-cache clips), a missing or unreadable video skipped
and remembered, each clip's depth for the stage's corruption of it (Sec. 3.1's depth-conditioned perturbations,
perturb.apply); what the policy is shown of a clip (`Observer`); SFT's photometric jitter."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from machinery import cli, video
from machinery.corruption import depth as depths
from machinery.datasets import data
from machinery.model import policy


class Clips:
    """Decoded training clips with an LRU cache. A missing or unreadable video is skipped, and remembered
    (path -> reason) so that it is neither decoded again nor counted twice; above a share
    (max_bad_fraction) of the data's videos the run stops. `read_kwargs`: an extension's frame sampler.
    `depth_map` is a clip's depth for its corruption (--depth-model's, depth.Depth; None: perturb's proxy)."""

    def __init__(self, cfg, missing: list, n_videos: int, read_kwargs=None):
        self.cfg, self.cache, self.n_videos = cfg, OrderedDict(), n_videos
        self.bad = {path: "missing" for _, path in missing}
        self.read_kwargs = read_kwargs or {}
        self.depth = depths.Depth(cfg.depth_model, cfg.depth_cache or None)
        self.depth_of = depths.ClipMemo(self.depth)   # the last 8 clips' depth (a step's)
        self.indices = {}   # path -> the frame indices read (the depth cache's key)

    def read(self, path):
        frames, self.indices[path], _ = video.read_frames(path, num_frames=self.cfg.frames,
                                                          max_pixels=self.cfg.max_pixels, **self.read_kwargs)
        return frames

    def depth_map(self, sample, frames):
        """The clip's depth in [0, 1] for perturb.apply (Sec. 3.1: depth-conditioned perturbations; None: perturb's
        proxy)."""
        return self.depth_of(frames, data.video_identity(sample), self.indices.get(sample.video),
                             video_path=sample.video)

    def checked(self, sample):
        """A held-out question's clip for the before/after check (not cached, not counted as bad), or None when it
        cannot be read (logged)."""
        try:
            return self.read(sample.video)
        except Exception as e:  # noqa: BLE001
            cli.log(f"evaluation: skipping {sample.id}: {e}")
            return None

    def get(self, sample):
        if sample.video in self.bad:
            return None
        if sample.video in self.cache:
            self.cache.move_to_end(sample.video)
            return self.cache[sample.video]
        try:
            frames = self.read(sample.video)
        except Exception as e:  # noqa: BLE001 - a bad file is skipped, never fatal (up to max_bad_fraction)
            self.bad[sample.video] = " ".join(str(e).split())
            cli.log(f"skipping sample {sample.id}: {e}")
            if len(self.bad) > self.cfg.max_bad_fraction * max(self.n_videos, 1):
                raise cli.UserError(f"stopping: {len(self.bad)} of {self.n_videos} videos are missing or "
                                    f"unreadable (more than max_bad_fraction {self.cfg.max_bad_fraction}: --set "
                                    f"max_bad_fraction=X); last: {sample.video}") from None
            return None
        self.cache[sample.video] = frames
        if len(self.cache) > self.cfg.video_cache:
            self.cache.popitem(last=False)
        return frames


class Observer:
    """What the policy is shown of a clip, clean or corrupted: here the frames themselves (an extension's text
    policy may be shown a perception model's text of them instead)."""

    def __init__(self, cfg):
        self.cfg = cfg

    def __call__(self, sample, frames):
        return frames

    def inputs(self, processor, messages, views):
        """The model's batch for chat messages (each with one video item) and what it is shown of each."""
        return policy.make_inputs(processor, messages, views)


def jitter(frames, strength: float, seed) -> np.ndarray:
    """Photometric jitter of one SFT clip: contrast about the clip's mean and brightness each scaled by a factor
    drawn from U(1 - strength, 1 + strength) (`seed`: the same draw for a clip on every epoch and on a resumed
    run). The benchmark's corruptions are never used in SFT."""
    rng = np.random.default_rng(seed)
    contrast, gain = rng.uniform(1 - strength, 1 + strength, 2)
    x = frames.astype(np.float32)
    mean = x.mean()
    return np.clip((x - mean) * contrast + mean * gain, 0, 255).astype(np.uint8)
