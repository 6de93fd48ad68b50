"""Tests for video.py: resizing maths, decoding, samplers, writers and contact sheets (on synthetic.py's street
clip)."""
import math
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from machinery import video
from machinery.datasets.synthetic import sample_clip
from machinery.video import (VideoError, contact_sheet, read_frames, smart_resize, uniform_indices, write_gif,
                             write_video)

MAX_PIXELS, MIN_PIXELS = 128 * 28 * 28, 4 * 28 * 28


@pytest.fixture(scope="module")
def street():
    """40 frames of the sample street at 144x192 (no supersampling, for speed)."""
    return sample_clip(40, 144, 192, seed=1, supersample=1)


@pytest.fixture(scope="module")
def street_mp4(street, tmp_path_factory):
    return write_video(tmp_path_factory.mktemp("mp4") / "street.mp4", street[0], fps=10.0)


def _resized(frames, h, w):
    """Reference resize of source frames, the way read_frames resizes decoded ones."""
    interp = cv2.INTER_AREA if h * w < frames.shape[1] * frames.shape[2] else cv2.INTER_CUBIC
    return np.stack([cv2.resize(f, (w, h), interpolation=interp) for f in frames])


# ----------------------------------------------------------------------------- smart_resize
@pytest.mark.parametrize("hw, expected", [
    ((480, 640), (252, 364)),    # 476x644 is over budget: beta=sqrt(307200/100352), floor to 28
    ((1080, 1920), (224, 420)),  # beta=4.546: 237.6 -> 224, 422.4 -> 420
    ((224, 448), (224, 448)),    # exactly max_pixels: kept
    ((144, 192), (140, 196)),    # only rounded to multiples of 28
    ((10, 10), (56, 56)),        # 28x28 < min_pixels: beta=5.6, ceil(56/28)*28
])
def test_smart_resize_hand_worked(hw, expected):
    h, w = smart_resize(*hw, factor=28, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    assert (h, w) == expected
    assert h % 28 == 0 and w % 28 == 0 and h >= 28 and w >= 28
    assert MIN_PIXELS <= h * w <= MAX_PIXELS
    # aspect ratio kept up to the rounding of each side to the factor
    assert abs(math.log((h / w) / (hw[0] / hw[1]))) < math.log((h + 28) / h) + math.log((w + 28) / w)


def test_smart_resize_rejects_extreme_aspect_ratio():
    with pytest.raises(ValueError):
        smart_resize(1, 500)


def test_uniform_indices_match_linspace_round():
    idx = uniform_indices(40, 16)
    assert idx.dtype == np.int64 and len(idx) == 16
    assert idx[0] == 0 and idx[-1] == 39 and np.all(np.diff(idx) > 0)
    assert np.array_equal(idx, np.linspace(0, 39, 16).round())
    assert uniform_indices(4, 3).tolist() == [0, 2, 3]  # 1.5 rounds half to even
    short = uniform_indices(5, 16)  # fewer frames than requested: repeats
    assert len(short) == 16 and short[0] == 0 and short[-1] == 4 and np.all(np.diff(short) >= 0)


# ----------------------------------------------------------------------------- read_frames
def test_read_frames_shape_indices_fps_and_content(street, street_mp4):
    frames, indices, fps = read_frames(street_mp4, num_frames=16)
    assert frames.dtype == np.uint8 and frames.flags.c_contiguous
    assert frames.shape == (16, 140, 196, 3)
    assert isinstance(fps, float) and fps == pytest.approx(10.0, rel=1e-3)
    assert indices.dtype == np.int64
    assert indices[0] == 0 and indices[-1] == 39 and np.all(np.diff(indices) > 0)
    assert np.array_equal(indices, np.linspace(0, 39, 16).round())
    expected = _resized(street[0][indices], 140, 196)
    assert np.abs(frames.astype(float) - expected).mean() < 12


def test_read_frames_downscales_to_pixel_budget(street, street_mp4):
    frames, indices, _ = read_frames(street_mp4, num_frames=8, max_pixels=16 * 28 * 28)
    assert frames.shape == (8, 84, 112, 3)
    assert frames.shape[1] * frames.shape[2] <= 16 * 28 * 28
    expected = _resized(street[0][indices], 84, 112)
    assert np.abs(frames.astype(float) - expected).mean() < 12


def test_write_read_round_trip_all_frames(tmp_path):
    # odd sides are padded to even for yuv420p; torch tensors are accepted
    torch = pytest.importorskip("torch")
    src, _ = sample_clip(6, 55, 83, seed=2, supersample=1)
    path = write_video(tmp_path / "deep" / "dir" / "odd.mp4", torch.from_numpy(src), fps=8.0)
    frames, indices, fps = read_frames(path, num_frames=6, min_pixels=28 * 28)
    assert indices.tolist() == list(range(6)) and fps == pytest.approx(8.0)
    assert frames.shape == (6, *smart_resize(56, 84, min_pixels=28 * 28), 3)
    padded = np.pad(src, ((0, 0), (0, 1), (0, 1), (0, 0)), mode="edge")
    assert np.abs(frames.astype(float) - _resized(padded, 56, 84)).mean() < 12


def test_a_lossless_video_reads_back_bit_for_bit(tmp_path):
    """lossless=True (eval_pvrbench.py --export, the lmms-eval task's videos): decord and OpenCV (vLLM's video
    loader) give back the frames written, at any size, with the frame rate written."""
    import cv2
    import decord

    src = np.random.default_rng(3).integers(0, 256, (7, 57, 83, 3), dtype=np.uint8)  # noise: the hardest case
    path = write_video(tmp_path / "clip.mp4", src, fps=0.75, lossless=True)
    reader = decord.VideoReader(path)
    assert np.array_equal(reader.get_batch(list(range(len(reader)))).asnumpy(), src)
    cap, frames = cv2.VideoCapture(path), []
    while (grabbed := cap.read())[0]:
        frames.append(grabbed[1][..., ::-1])
    assert np.array_equal(np.stack(frames), src) and cap.get(cv2.CAP_PROP_FPS) == pytest.approx(0.75)
    lossy = decord.VideoReader(write_video(tmp_path / "lossy.mp4", src, fps=0.75)).get_batch(list(range(7))).asnumpy()
    assert np.abs(lossy[:, :57, :83].astype(int) - src).max() > 2   # (the default is not lossless: a real check)


def test_read_frames_short_clip_repeats_indices(tmp_path):
    src, _ = sample_clip(5, 64, 64, supersample=1)
    frames, indices, _ = read_frames(write_video(tmp_path / "short.mp4", src), num_frames=16)
    assert frames.shape[0] == 16
    assert indices.tolist() == np.linspace(0, 4, 16).round().astype(int).tolist()


def test_probe_and_read_clip_every_frame_at_native_size(street, street_mp4):
    assert video.probe(street_mp4) == {"frames": 40, "fps": 10.0, "height": 144, "width": 192}
    frames, indices, fps = video.read_clip(street_mp4, chunk=7)  # chunks need not divide the clip
    assert frames.shape == (40, 144, 192, 3) and frames.dtype == np.uint8 and frames.flags.c_contiguous
    assert indices.tolist() == list(range(40)) and fps == pytest.approx(10.0)
    assert np.abs(frames.astype(float) - street[0]).mean() < 4
    native, _, _ = video.read_clip(street_mp4, num_frames=5)
    assert native.shape == (5, 144, 192, 3) and np.array_equal(native, frames[uniform_indices(40, 5)])


@pytest.mark.parametrize("num_frames, max_pixels", [(16, MAX_PIXELS), (7, 3000), (50, 40_000)])
def test_read_clip_with_both_options_equals_read_frames(street_mp4, num_frames, max_pixels):
    want = read_frames(street_mp4, num_frames=num_frames, max_pixels=max_pixels)
    got = video.read_clip(street_mp4, num_frames=num_frames, max_pixels=max_pixels, chunk=3)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[2] == want[2]


def test_read_clip_and_probe_raise_video_error(tmp_path, street_mp4):
    for kind in ("missing", "text"):
        path = _bad_file(kind, tmp_path, street_mp4)
        for fn in (video.probe, video.read_clip):
            with pytest.raises(VideoError, match=str(path)):
                fn(path)
    with pytest.raises(ValueError):
        video.read_clip(street_mp4, num_frames=0)


def test_read_frames_with_a_sampler(street_mp4):
    def picks(path, num_frames):  # any callable (path, num_frames) -> frame indices
        assert Path(path) == Path(street_mp4) and num_frames == 4
        return [0, 5, 5, 39]
    frames, indices, _ = read_frames(street_mp4, num_frames=4, sampler=picks)
    every, _, _ = read_frames(street_mp4, num_frames=40)
    assert indices.tolist() == [0, 5, 5, 39] and indices.dtype == np.int64
    assert np.array_equal(frames, every[[0, 5, 5, 39]])
    with pytest.raises(ValueError, match="sampler"):
        read_frames(street_mp4, sampler="keyframes")


def test_read_frames_argument_checks(street_mp4):
    with pytest.raises(ValueError):
        read_frames(street_mp4, num_frames=0)
    with pytest.raises(ValueError):
        read_frames(street_mp4, max_pixels=0)


def _bad_file(kind, tmp_path, good_mp4):
    path = tmp_path / f"{kind}.mp4"
    if kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        data = Path(good_mp4).read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "text":
        path.write_text("this is not a video\n" * 20)
    return path


@pytest.mark.parametrize("kind, phrase", [
    ("missing", "does not exist"),
    ("directory", "is a directory"),
    ("empty", "is empty"),
    ("truncated", "cannot be decoded as a video"),
    ("text", "cannot be decoded as a video"),
])
def test_read_frames_bad_files_raise_video_error(kind, phrase, tmp_path, street_mp4):
    path = _bad_file(kind, tmp_path, street_mp4)
    with pytest.raises(VideoError) as info:
        read_frames(path)
    assert str(path) in str(info.value) and phrase in str(info.value)
    assert isinstance(info.value, ValueError)


# ----------------------------------------------------------------------------- writers
def test_write_gif_is_multi_frame_and_loops(street, tmp_path):
    frames = street[0][:6]
    path = write_gif(tmp_path / "gif" / "clip.gif", frames, fps=5)
    with Image.open(path) as im:
        assert im.format == "GIF" and im.n_frames == 6 and im.info.get("loop") == 0
        assert im.size == (192, 144) and im.info["duration"] == 200


def test_writers_validate_input(tmp_path):
    with pytest.raises(ValueError):
        write_video(tmp_path / "a.mp4", np.zeros((4, 8, 8, 3), np.float32))
    with pytest.raises(ValueError):
        write_gif(tmp_path / "a.gif", np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(ValueError):
        write_video(tmp_path / "a.mp4", np.zeros((4, 8, 8, 3), np.uint8), fps=0)


def test_even_size():
    assert video.even_size(97, 161) == (98, 162) and video.even_size(128, 160) == (128, 160)


@pytest.mark.parametrize("name", ["clip.gif", "clip.txt"])
def test_a_failed_write_leaves_no_file_and_keeps_an_existing_one(tmp_path, name):
    frames = np.zeros((3, 16, 16, 3), np.uint8)
    with pytest.raises((VideoError, OSError)):  # ffmpeg's mp4 encoder cannot write GIF or pick a .txt format
        write_video(tmp_path / name, frames)
    assert list(tmp_path.iterdir()) == []  # no 0-byte file, no partial one
    (tmp_path / name).write_text("keep me")
    with pytest.raises((VideoError, OSError)):
        write_video(tmp_path / name, frames)
    assert [p.name for p in tmp_path.iterdir()] == [name] and (tmp_path / name).read_text() == "keep me"


def test_atomic_write_renames_at_the_end_or_removes(tmp_path):
    target = tmp_path / "a.mp4"
    with pytest.raises(RuntimeError):
        with video._atomic(target) as tmp:
            assert tmp.parent == tmp_path and tmp.suffix == ".mp4" and tmp != target
            tmp.write_bytes(b"half a video")
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []
    with video._atomic(target) as tmp:
        tmp.write_bytes(b"a video")
        assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["a.mp4"] and target.read_bytes() == b"a video"


def test_held_native_stderr_replays_or_drops(capfd):
    import os

    with video.held_native_stderr():
        os.write(2, b"native warning\n")
        assert capfd.readouterr().err == ""  # held while inside
    assert capfd.readouterr().err == "native warning\n"
    with pytest.raises(VideoError):
        with video.held_native_stderr():
            os.write(2, b"ffmpeg: moov atom not found\n")
            raise VideoError("video file x.mp4 cannot be decoded")
    assert capfd.readouterr().err == ""


def test_contact_sheet_layout(street, tmp_path):
    clean = street[0][:10]
    other = np.ascontiguousarray(255 - clean[:, ::2, ::2])  # different size: resized to the first
    path = contact_sheet([clean, other, clean], ["clean", "inverted, half size", "again"],
                         tmp_path / "sheets" / "s.png", num_cols=4)
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size == (140 + 4 * 192, 3 * 144)
        sheet = np.asarray(im.convert("RGB"))
    label = sheet[:, :140]
    assert (label < 100).any() and (label == 255).mean() > 0.8  # dark text on white
    assert np.array_equal(sheet[:144, 140:140 + 192], clean[0])  # first cell is frame 0
    assert np.array_equal(sheet[:144, -192:], clean[9])  # last cell is the last frame
    path = contact_sheet([clean], ["small"], tmp_path / "small.png", num_cols=3, cell_width=96)
    with Image.open(path) as im:
        assert im.size == (140 + 3 * 96, 72)


def test_contact_sheet_validates(street, tmp_path):
    with pytest.raises(ValueError):
        contact_sheet([street[0]], ["a", "b"], tmp_path / "x.png")
    with pytest.raises(ValueError):
        contact_sheet([], [], tmp_path / "x.png")
