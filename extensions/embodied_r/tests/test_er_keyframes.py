"""Embodied-R's key frames (Sec. 2.1, extensions/embodied_r/keyframes.py) on clips with known camera motion:
a pan over a textured canvas."""
import json

import numpy as np
import pytest

from machinery import video
from extensions.embodied_r import keyframes as kf


def canvas(seed=0):
    import cv2
    rng = np.random.default_rng(seed)
    img = cv2.resize(rng.integers(0, 255, (60, 400, 3)).astype(np.uint8), (2400, 360), interpolation=cv2.INTER_NEAREST)
    for _ in range(200):
        x, y = int(rng.integers(0, 2350)), int(rng.integers(0, 330))
        cv2.rectangle(img, (x, y), (x + int(rng.integers(10, 60)), y + int(rng.integers(10, 40))),
                      tuple(int(c) for c in rng.integers(0, 255, 3)), -1)
    return img


def pan(speed, T=16, size=160, seed=0):
    """The camera pans sideways by `speed` frame widths per frame (overlap with the previous frame 1 - speed)."""
    img = canvas(seed)
    return np.stack([img[100:100 + size, int(t * speed * size):int(t * speed * size) + size] for t in range(T)])


def test_a_static_clip_gives_min_frames_evenly_spaced():
    assert kf.keyframes(pan(0.0), min_frames=4).tolist() == [0, 5, 10, 15]


def test_faster_camera_motion_gives_more_key_frames():
    counts = [len(kf.keyframes(pan(s), min_frames=2)) for s in (0.05, 0.3, 0.6)]
    assert counts[0] < counts[1] < counts[2], counts
    # at 0.6 widths per frame every frame overlaps its predecessor by 0.4 < eps: (nearly) all are key
    assert counts[2] >= 14


def test_first_and_last_kept_and_max_frames_thins_evenly():
    idx = kf.keyframes(pan(0.6, T=24), min_frames=2, max_frames=6)
    assert len(idx) == 6 and idx[0] == 0 and idx[-1] == 23 and np.all(np.diff(idx) > 0)


def test_unmatchable_frames_become_key_frames():
    rng = np.random.default_rng(1)
    flat = np.zeros((6, 64, 64, 3), np.uint8)  # no ORB features anywhere: nothing can be matched
    assert kf.keyframes(flat, min_frames=1).tolist() == [0, 1, 2, 3, 4, 5]
    assert kf.keyframes(rng.integers(0, 255, (3, 64, 64, 3)).astype(np.uint8), min_frames=1)[0] == 0


def test_a_video_file_is_pre_sampled_at_one_fps(tmp_path):
    clip = pan(0.05, T=32)
    path = video.write_video(tmp_path / "pan.mp4", clip, fps=8.0)
    idx = kf.keyframes(path, min_frames=2)
    assert idx[0] == 0 and idx[-1] == 31 and all(i % 8 == 0 for i in idx[:-1])  # candidates 0, 8, 16, 24 (+ last)
    same = kf.keyframes(clip, fps=8.0, min_frames=2)  # an array with its fps: the same candidates
    assert set(same.tolist()) <= {0, 8, 16, 24, 31}


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="eps"):
        kf.keyframes(pan(0.1), eps=0)
    with pytest.raises(ValueError, match="min_frames"):
        kf.keyframes(pan(0.1), min_frames=5, max_frames=4)
    with pytest.raises(video.VideoError, match="does not exist"):
        kf.keyframes(tmp_path / "missing.mp4")


def test_read_frames_with_the_keyframe_sampler(tmp_path):
    path = video.write_video(tmp_path / "pan.mp4", pan(0.3, T=40), fps=8.0)
    frames, idx, fps = video.read_frames(path, num_frames=4, max_pixels=112 * 112, sampler=kf.keyframe_sampler())
    assert frames.shape[0] == len(idx) <= 4 and idx.tolist() == kf.keyframes(path, max_frames=4).tolist()
    with pytest.raises(ValueError, match="sampler"):
        video.read_frames(path, sampler="random")


def test_train_and_eval_run_with_key_frames(tmp_path, tiny_path, synthetic_factory):
    """Training and evaluation read key frames end to end (Embodied-R's entry points, --frame-sampler keyframes)."""
    from extensions.embodied_r import eval as er_eval
    from extensions.embodied_r import train as er_train
    tiny = tiny_path
    synth = synthetic_factory(n=4, seed=2, num_frames=8, size=56, eval_fraction=0.5)
    er_train.main(["--model", str(tiny), "--data", str(synth / "train.json"), "--out",
                   str(tmp_path / "run"), "--policy", "vlm", "--mode", "grpo-aug", "--frames", "4", "--max-pixels",
                   str(56 * 56), "--sft-epochs", "0", "--rl-steps", "1", "--batch-size", "2", "--group-size", "2",
                   "--max-new-tokens", "4", "--frame-sampler", "keyframes"])
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    er_eval.main(["--model", str(tiny), "--benchmark", f"synthetic={synth}", "--out",
                  str(tmp_path / "eval"), "--limit", "2", "--subtypes", "fog", "--judge", "none",
                  "--frames", "4", "--frame-sampler", "keyframes", "--max-new-tokens", "4"])
    res = json.loads(next((tmp_path / "eval").glob("*/*_results.json")).read_text())
    assert res["n_errors"] == 0 and res["n_samples"] == 4
