"""perturb.py: the 12 perturbations of Table 8, the spec (Eq. 4), B/C maps (Sec. 3.1), shuffle (Eq. 1-2)."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from machinery.corruption import depth
import perturb
from machinery import video
from machinery.corruption import perturb_cli, scene
from machinery.datasets import synthetic

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def clip():
    frames, depth = synthetic.sample_clip(8, 72, 96, seed=1)
    return frames, depth


@pytest.fixture(scope="module")
def still():
    """One frame held for 16 frames: any change between frames comes from the perturbation itself."""
    frames, _ = synthetic.sample_clip(16, 96, 96, seed=2)
    return np.repeat(frames[:1], 16, axis=0)


def mad(a, b):
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


# ----------------------------------------------------------------------------- taxonomy and spec

def test_taxonomy_is_table_8():
    assert perturb.CATEGORIES == {
        "lighting": ("dusk", "night", "overexposure", "shadow"),
        "camera": ("translation", "zoom", "rotation"),
        "occlusion": ("static", "dynamic"),
        "weather": ("fog", "rain", "snow"),
    }
    assert len(perturb.SUBTYPES) == 12
    assert perturb.DEFAULT_ETA == 0.7


@pytest.mark.parametrize("sub", perturb.SUBTYPES)
def test_spec_json_round_trip_is_small_and_regenerates(sub, clip):
    frames, _ = clip
    spec = perturb.PerturbSpec(sub, eta=0.55, seed=123456789, shuffle=True)
    text = spec.to_json()
    assert len(text.encode()) < 400
    back = perturb.PerturbSpec.from_dict(json.loads(text))
    assert back == spec and back.category == perturb.CATEGORY_OF[sub]
    assert np.array_equal(perturb.apply(frames, back), perturb.apply(frames, spec))


def test_params_override_and_validation():
    spec = perturb.PerturbSpec("fog", params={"beta": 1.25})
    assert spec.params["beta"] == 1.25 and "airlight" in spec.params
    with pytest.raises(ValueError, match="unknown params"):
        perturb.PerturbSpec("fog", params={"density": 1.0})
    with pytest.raises(ValueError, match="does not match"):
        perturb.PerturbSpec("fog", category="lighting")
    with pytest.raises(ValueError, match="unknown PerturbSpec fields"):
        perturb.PerturbSpec.from_dict({"subtype": "fog", "colour": 1})
    with pytest.raises(ValueError, match="no 'subtype'"):
        perturb.PerturbSpec.from_dict({"eta": 0.5})


@pytest.mark.parametrize("sub", perturb.SUBTYPES)
def test_deterministic_in_any_call_order(sub, clip):
    frames, _ = clip
    a, b = perturb.PerturbSpec(sub, seed=1), perturb.PerturbSpec(sub, seed=2)
    first = perturb.apply(frames, a)
    perturb.apply(frames, b)  # another spec in between changes nothing: no global RNG
    perturb.apply(frames[:, ::-1].copy(), a)
    assert np.array_equal(perturb.apply(frames, a), first)
    assert not np.array_equal(perturb.apply(frames, b), first), "different seeds must differ"


def test_static_spec_is_stable_across_processes():
    code = ("import json, perturb; print(json.dumps([perturb.static_spec(v, s).to_dict() "
            "for v in ('scene0001', 'urban/42.mp4') for s in perturb.SUBTYPES]))")
    outs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(h)}).stdout for h in (1, 2)]
    assert outs[0] == outs[1]
    specs = json.loads(outs[0])
    # independent computation of the seed: SHA-256 of the ids, first 48 bits
    want = int.from_bytes(hashlib.sha256("pvrbench\x1fscene0001\x1ffog".encode()).digest()[:6], "big")
    fog = next(s for s in specs if s["subtype"] == "fog")
    assert fog["seed"] == want == perturb.static_spec("scene0001", "fog").seed
    assert len({s["seed"] for s in specs}) == len(specs)


def test_apply_is_bit_identical_across_processes(tmp_path):
    code = ("import hashlib, perturb; from machinery.datasets import synthetic; "
            "f, d = synthetic.sample_clip(6, 48, 64); h = lambda a: hashlib.sha256(a.tobytes()).hexdigest()[:12]; "
            "print(''.join(h(perturb.apply(f, perturb.static_spec('v1', s), d)) for s in perturb.SUBTYPES))")
    outs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert outs[0] == outs[1] and len(outs[0].strip()) == 12 * 12


def test_sample_spec_dynamic_protocol():
    rng = np.random.default_rng(0)
    specs = [perturb.sample_spec(rng) for _ in range(800)]
    counts = {c: sum(s.category == c for s in specs) for c in perturb.CATEGORIES}
    assert all(150 < n < 250 for n in counts.values()), counts  # Eq. 2: style uniform over 4
    assert len({s.subtype for s in specs}) == 12 and len({s.seed for s in specs}) == 800
    assert all(s.subtype in perturb.CATEGORIES["weather"] for s in
               (perturb.sample_spec(i, category="weather") for i in range(20)))
    assert perturb.sample_spec(7) == perturb.sample_spec(7)
    assert perturb.sample_spec(7, subtype="rain", eta=0.3).eta == 0.3


def test_eta_per_subtype():
    table = perturb.parse_eta("0.5, fog=0.3,night=0.45")
    assert table == {"*": 0.5, "fog": 0.3, "night": 0.45} and perturb.parse_eta("0.7") == 0.7
    assert perturb.parse_eta("fog=0.3") == {"*": perturb.DEFAULT_ETA, "fog": 0.3}
    assert perturb.static_spec("v", "fog", "0.5,fog=0.3").eta == 0.3
    assert perturb.static_spec("v", "rain", table).eta == 0.5
    # the seed does not depend on the intensity: one clip's corruption only grows or shrinks with eta
    assert perturb.static_spec("v", "fog", table).seed == perturb.static_spec("v", "fog", 0.9).seed
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    a, b = perturb.sample_spec(rng_a, eta=table), perturb.sample_spec(rng_b, eta=0.7)
    assert (a.subtype, a.seed) == (b.subtype, b.seed) and a.eta == perturb.eta_of(table, a.subtype)
    for bad in ("0.5,fgo=0.2", "high", "0.5,fog="):
        with pytest.raises(ValueError, match="eta"):
            perturb.parse_eta(bad)


# ----------------------------------------------------------------------------- effects

@pytest.mark.parametrize("sub", perturb.SUBTYPES)
def test_every_subtype_changes_the_clip_and_grows_with_eta(sub, clip):
    frames, _ = clip
    for seed in (0, 1):
        changes = [mad(perturb.apply(frames, perturb.PerturbSpec(sub, eta=e, seed=seed)), frames)
                   for e in (0.3, 0.7, 1.0)]
        assert changes[0] > 0.2, (sub, changes)
        assert changes[0] < changes[1] < changes[2], (sub, seed, changes)
    assert mad(perturb.apply(frames, perturb.PerturbSpec(sub, eta=0.0)), frames) < changes[0]


@pytest.mark.parametrize("sub", perturb.SUBTYPES)
def test_temporal_coherence(sub, still):
    """The perturbation layer (f' - f) changes much less between consecutive frames than between two
    seeds: effects are animated, never re-drawn independently per frame."""
    ratios = []
    for seed in (0, 1, 2):
        la, lb = (perturb.apply(still, perturb.PerturbSpec(sub, seed=s)).astype(np.int16) - still
                  for s in (seed, seed + 100))
        consecutive = np.abs(np.diff(la, axis=0)).mean()
        across_seeds = np.abs(la - lb).mean()
        ratios.append(consecutive / across_seeds)
    assert np.mean(ratios) < 0.5, (sub, ratios)


def test_static_occluder_is_static_and_dynamic_one_moves(still):
    s = perturb.apply(still, perturb.PerturbSpec("static", seed=3))
    assert all(np.array_equal(s[0], s[t]) for t in range(1, 16))
    for style in ("pedestrian", "vehicle"):
        B, _ = perturb.masks(still, perturb.PerturbSpec("dynamic", seed=3, params={"style": style}))
        edges = [np.nonzero(B[t].any(0))[0] for t in range(16) if B[t].any()]
        assert len(edges) >= 8, style
        for side in (0, -1):  # the leading and trailing edges, where inside the frame, move one way
            xs = np.array([e[side] for e in edges])
            steps = np.diff(xs[(xs > 0) & (xs < still.shape[2] - 1)])
            assert len(steps) >= 3 and ((steps >= 0).all() or (steps <= 0).all()), (style, xs)


# ----------------------------------------------------------------------------- B and C (Sec. 3.1)

@pytest.mark.parametrize("sub", perturb.SUBTYPES)
def test_masks_semantics(sub, clip):
    frames, depth = clip
    spec = perturb.PerturbSpec(sub, seed=4)
    out = perturb.apply(frames, spec, depth)
    B, C = perturb.masks(frames, spec, depth)
    assert B.shape == C.shape == frames.shape[:3] and B.dtype == bool and C.dtype == np.float32
    assert C.min() >= 0 and C.max() <= 1 and np.array_equal(B, C > 0)
    assert B.any()
    assert np.array_equal(out[~B], frames[~B]), "where B is 0 the pixel is unchanged"
    if perturb.CATEGORY_OF[sub] == "camera":
        assert B.mean() > 0.99 and np.all(C[B] == 1)
    if sub in ("shadow", "static", "dynamic"):
        assert 0.02 < B.mean() < 0.9, "a localised perturbation has a localised layout"
    if sub in ("fog", "rain", "snow", "shadow", "static"):  # more weight, more change
        change = np.abs(out.astype(np.int16) - frames).mean(-1)[B]
        assert np.corrcoef(C[B], change)[0, 1] > 0.3


def test_fog_follows_depth(clip):
    """Koschmieder: C = 1 - exp(-beta d), so with a true depth map, far pixels get more haze."""
    frames, _ = clip
    T, H, W = frames.shape[:3]
    depth = np.broadcast_to(np.linspace(50, 1, H, dtype=np.float32)[:, None], (T, H, W))  # far at the top
    spec = perturb.PerturbSpec("fog", params={"heterogeneity": 0.0})
    _, C = perturb.masks(frames, spec, depth)
    rows = C.mean((0, 2))
    assert (np.diff(rows) <= 1e-6).all() and rows[0] > rows[-1] + 0.3
    d = depth[0, :, 0] / (depth[0, :, 0] + np.median(depth[:, ::4, ::4]))  # hand-worked: t = exp(-beta d)
    expected = 1 - np.exp(-spec.params["beta"] * d)
    assert np.allclose(rows, expected, atol=0.05), np.abs(rows - expected).max()


@pytest.mark.parametrize("sub", ["fog", "rain", "snow"])
def test_compositing_equation(sub, clip):
    """Sec. 3.1 read as f' = (1 - B C) f + B C E with E a constant colour (airlight, rain, snow):
    solving for E pixel by pixel gives the same colour everywhere, up to uint8 rounding."""
    frames, depth = clip
    spec = perturb.PerturbSpec(sub, seed=9)
    out = perturb.apply(frames, spec, depth).astype(np.float64)
    _, C = perturb.masks(frames, spec, depth)
    sel = C > 0.1
    E = np.median((out[sel] - (1 - C[sel, None]) * frames[sel]) / C[sel, None], 0)
    model = (1 - C[..., None]) * frames + C[..., None] * E
    assert sel.sum() > 200 and np.abs(out - model).max() <= 1.0  # uint8 rounding + the estimate of E


def test_depth_proxy_puts_sky_far_and_ground_near():
    frames, depth = synthetic.sample_clip(1, 224, 224, seed=3)
    small = cv2.resize(frames[0], (56, 56), interpolation=cv2.INTER_AREA)  # as the engine calls it
    d = scene.depth_proxy(small)
    assert d.shape == (56, 56) and d.min() >= 0 and d.max() <= 1
    true = cv2.resize(depth[0], (56, 56), interpolation=cv2.INTER_NEAREST)
    assert d[true >= 999].mean() > 0.8 and d[-4:].mean() < 0.3
    assert np.corrcoef(d.ravel(), np.log(true).ravel())[0, 1] > 0.6  # agrees with the true depth


# ----------------------------------------------------------------------------- temporal shuffle (Eq. 1-2)

def test_shuffle_is_a_permutation_that_keeps_every_frame(clip):
    frames, _ = clip
    out = perturb.apply(frames, perturb.PerturbSpec(None, seed=5, shuffle=True))
    perm = perturb.temporal_permutation(len(frames), 5)
    assert sorted(perm) == list(range(len(frames))) and not np.array_equal(perm, np.arange(len(frames)))
    assert np.array_equal(out, frames[perm])
    B, C = perturb.masks(frames, perturb.PerturbSpec(None, seed=5, shuffle=True))
    assert not B.any() and not C.any()
    for T in (2, 3, 16):
        assert sorted(perturb.temporal_permutation(T, 0)) == list(range(T))


def test_shuffle_then_spatial_is_eq_2(clip):
    """V' = {f_pi(t) (.) P_t}: shuffle first; the masks stay on output time."""
    frames, _ = clip
    spec = perturb.PerturbSpec("rain", seed=6, shuffle=True)
    perm = perturb.temporal_permutation(len(frames), 6)
    plain = perturb.PerturbSpec("rain", seed=6)
    assert np.array_equal(perturb.apply(frames, spec), perturb.apply(frames[perm], plain))


# ----------------------------------------------------------------------------- torch

@pytest.mark.parametrize("sub", perturb.SUBTYPES)
def test_torch_tensors_match_numpy(sub, clip):
    torch = pytest.importorskip("torch")
    frames, depth = clip
    spec = perturb.PerturbSpec(sub, seed=8)
    x = torch.from_numpy(frames)
    out = perturb.apply(x, spec, torch.from_numpy(depth))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.uint8 and out.shape == x.shape
    assert torch.equal(out, perturb.apply(x, spec, torch.from_numpy(depth)))
    diff = np.abs(out.numpy().astype(np.int16) - perturb.apply(frames, spec, depth))
    assert diff.mean() < 0.2 and diff.max() <= 2, (diff.mean(), diff.max())
    B, C = perturb.masks(x, spec)
    assert isinstance(B, torch.Tensor) and B.dtype == torch.bool and C.dtype == torch.float32


# ----------------------------------------------------------------------------- bad input

def test_bad_inputs(clip):
    frames, _ = clip
    spec = perturb.PerturbSpec("fog")
    with pytest.raises(ValueError, match="uint8"):
        perturb.apply(frames.astype(np.float32), spec)
    with pytest.raises(ValueError, match=r"\[T,H,W,3\]"):
        perturb.apply(frames[0], spec)
    with pytest.raises(ValueError, match="3 \\(RGB\\) channels"):
        perturb.apply(np.zeros((2, 8, 8, 4), np.uint8), spec)
    with pytest.raises(ValueError, match="numpy uint8 array or a torch"):
        perturb.apply(frames.tolist(), spec)
    with pytest.raises(ValueError, match="valid subtypes: dusk, night"):
        perturb.PerturbSpec("hail")
    with pytest.raises(ValueError, match="valid subtypes"):
        perturb.static_spec("v", "blur")
    for eta in (-0.1, 1.5, float("nan"), "0.5"):
        with pytest.raises(ValueError, match="eta"):
            perturb.PerturbSpec("fog", eta=eta)
    with pytest.raises(ValueError, match="seed"):
        perturb.PerturbSpec("fog", seed=-1)
    with pytest.raises(ValueError, match="depth must have shape"):
        perturb.apply(frames, spec, depth=np.ones((3, 3)))
    with pytest.raises(ValueError, match="valid categories"):
        perturb.sample_spec(0, category="sky")


def test_tiny_and_odd_sizes_work():
    rng = np.random.default_rng(0)
    for shape in ((1, 9, 13, 3), (3, 31, 17, 3), (2, 64, 200, 3)):
        frames = rng.integers(0, 256, shape, dtype=np.uint8)
        for sub in perturb.SUBTYPES:
            out = perturb.apply(frames, perturb.PerturbSpec(sub, seed=1, shuffle=True))
            assert out.shape == frames.shape and out.dtype == np.uint8


# ----------------------------------------------------------------------------- command line

def test_cli_writes_a_corrupted_video_and_the_contact_sheet(tmp_path):
    src = synthetic.write_sample_video(tmp_path / "in.mp4", num_frames=12, height=96, width=96)
    out = tmp_path / "fog.mp4"
    run = subprocess.run([sys.executable, "perturb.py", str(src), "--subtype", "fog", "--eta", "0.7",
                          "--seed", "0", "--out", str(out), "--frames", "8", "--depth-model", "proxy"],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert '"subtype":"fog"' in run.stdout
    frames, _, _ = video.read_frames(out, num_frames=8)
    clean, _, _ = video.read_frames(src, num_frames=8)
    assert frames.shape == clean.shape and mad(frames, clean) > 5
    grid = tmp_path / "grid.png"
    run = subprocess.run([sys.executable, "perturb.py", "--grid", str(grid), "--frames", "4", "--size", "64"],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert grid.stat().st_size > 10_000
    bad = subprocess.run([sys.executable, "perturb.py", str(tmp_path / "missing.mp4"), "--grid", str(grid)],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "missing.mp4" in bad.stderr
    bad = subprocess.run([sys.executable, "perturb.py", "--subtype", "fog", "--eta", "1.5", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "eta must be a number in [0, 1]" in bad.stderr


# ----------------------------------------------------------------------------- command line: a corrupted copy

def _cli(*args, cwd=ROOT):
    """perturb.py with `args`; with the depth proxy unless they name a depth model (these tests are about the
    output, and run offline: the default for a real video, the recommended depth model, is not here)."""
    depth = () if "--depth-model" in args else ("--depth-model", "proxy")
    return subprocess.run([sys.executable, "perturb.py", *map(str, args), *depth], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": "/nonexistent/hub"})


def test_cli_a_real_video_gets_the_recommended_depth_model_or_says_how_to_get_it(tmp_path):
    """The default (--depth-model auto) for an INPUT video is depth.RECOMMENDED; offline and not cached: one line
    (exit 2) that says how to get it or to use the proxy, and no output file; the built-in clip needs no model."""
    src = synthetic.write_sample_video(tmp_path / "in.mp4", num_frames=4, height=64, width=64)
    out = tmp_path / "fog.mp4"
    run = _cli(src, "--subtype", "fog", "--out", out, "--depth-model", "auto")
    assert run.returncode == 2 and not out.exists(), run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("error: --depth-model auto") and f"hf download {depth.RECOMMENDED}" in line
    assert line.endswith("or give --depth-model proxy (perturb's depth proxy, no model)")
    run = _cli("--subtype", "fog", "--out", out, "--size", "64", "--frames", "4", "--depth-model", "auto")
    assert run.returncode == 0 and out.exists(), run.stderr


def _write_odd(path, frames, fps):
    """A native odd-size mp4 (H.264 4:4:4 accepts odd sides; video.write_video pads to even ones)."""
    from imageio_ffmpeg import write_frames

    w = write_frames(str(path), (frames.shape[2], frames.shape[1]), fps=fps, codec="libx264", pix_fmt_out="yuv444p",
                     macro_block_size=1, ffmpeg_log_level="error")
    w.send(None)
    for f in frames:
        w.send(np.ascontiguousarray(f))
    w.close()
    return path


@pytest.fixture(scope="module")
def cli_clips(tmp_path_factory):
    """An even 30-frame 160x128 clip at 15 fps and an odd 9-frame 161x97 one at 12 fps, with their decoded frames."""
    d = tmp_path_factory.mktemp("cli")
    even = video.write_video(d / "even.mp4", synthetic.sample_clip(30, 128, 160, seed=4, supersample=1)[0], fps=15.0)
    odd = _write_odd(d / "odd.mp4", synthetic.sample_clip(9, 97, 161, seed=5, supersample=1)[0], 12.0)
    return {"even": Path(even), "odd": Path(odd)}


def test_cli_out_is_a_corrupted_copy_with_every_frame_at_native_size_and_fps(cli_clips, tmp_path):
    src, out = cli_clips["even"], tmp_path / "sub" / "fog.mp4"
    run = _cli(src, "--subtype", "fog", "--out", out)
    assert run.returncode == 0, run.stderr
    assert video.probe(out) == {"frames": 30, "fps": 15.0, "height": 128, "width": 160}
    assert run.stdout.startswith(f"wrote {out}: 30 frames, 160x128, 15.0 fps (all frames of {src}, native size); "
                                 'spec={"category":"weather"')
    clean = video.read_clip(src)[0]
    got = video.read_clip(out)[0]
    want = perturb.apply(clean, perturb.PerturbSpec("fog", eta=0.7, seed=0))
    assert mad(got, clean) > 5 and mad(got, want) < 2  # the spec's corruption, frame for frame (H.264 aside)
    assert [p.name for p in out.parent.iterdir()] == ["fog.mp4"]  # no partial file left next to it


def test_cli_out_of_an_odd_size_clip_is_padded_by_one_pixel_and_says_so(cli_clips, tmp_path):
    src, out = cli_clips["odd"], tmp_path / "rain.mp4"
    assert video.probe(src)["width"] == 161
    run = _cli(src, "--subtype", "rain", "--seed", "3", "--out", out)
    assert run.returncode == 0, run.stderr
    assert video.probe(out) == {"frames": 9, "fps": 12.0, "height": 98, "width": 162}
    assert "wrote" in run.stdout and "9 frames, 162x98, 12.0 fps" in run.stdout
    assert "161x97 padded to 162x98" in run.stdout
    clean = video.read_clip(src)[0]
    want = perturb.apply(clean, perturb.PerturbSpec("rain", seed=3))
    assert mad(video.read_clip(out)[0][:, :97, :161], want) < 3


def test_cli_frames_and_max_pixels_still_sample_as_the_model_does(cli_clips, tmp_path):
    src, out = cli_clips["even"], tmp_path / "s.mp4"
    run = _cli(src, "--subtype", "dusk", "--out", out, "--frames", "8", "--max-pixels", 20000)
    assert run.returncode == 0, run.stderr
    h, w = video.smart_resize(128, 160, max_pixels=20000)
    assert video.probe(out) == {"frames": 8, "fps": 4.0, "height": h, "width": w}  # 15 fps x 8/30: the same 2 s
    assert f"8 frames, {w}x{h}, 4.0 fps (8 of the 30 frames of {src}, sampled uniformly" in run.stdout
    model, _, _ = video.read_frames(src, num_frames=8, max_pixels=20000)
    assert mad(video.read_clip(out)[0], perturb.apply(model, perturb.PerturbSpec("dusk"))) < 2


def test_cli_grid_of_a_full_length_clip_shows_a_few_sampled_frames(cli_clips, tmp_path):
    """(The same with Robust-TO's protocol: extensions/robust_to/tests/test_rt_corruptions.py.)"""
    from PIL import Image

    grid = tmp_path / "grid.png"
    run = _cli(cli_clips["even"], "--grid", grid, "--protocol", "pvrbench")
    assert run.returncode == 0, run.stderr
    h, w = video.smart_resize(128, 160, max_pixels=perturb_cli.GRID_MAX_PIXELS)
    with Image.open(grid) as im:
        assert im.size == (140 + 4 * w, 13 * h)  # 4 columns; clean + 12 rows
    assert f"x 4 frames of 16 sampled uniformly from {cli_clips['even']} (of its 30), {w}x{h} each" in run.stdout


def _mistake(tmp_path):
    """Files in tmp_path, hidden partial files included."""
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("case, phrase", [
    ("txt", "unsupported extension '.txt' (use .mp4)"),
    ("gif", "unsupported extension '.gif' (use .mp4)"),
    ("folder", "folder"),
    ("parent_is_file", "is a file, not a folder"),
    ("grid_jpg", "unsupported extension '.jpg' (use .png)"),
    ("missing", "does not exist"),
    ("corrupt", "cannot be decoded as a video"),
    ("same_as_input", "is the input video"),
    ("frames_zero", "--frames must be a positive integer"),
])
def test_cli_mistakes_are_one_line_exit_2_and_leave_no_file(case, phrase, cli_clips, tmp_path):
    src, out = cli_clips["even"], tmp_path / "out.mp4"
    flags = ["--subtype", "fog", "--out", out]
    if case in ("txt", "gif"):
        flags[-1] = tmp_path / f"out.{case}"
    elif case == "folder":
        (tmp_path / "dir").mkdir()
        flags[-1] = tmp_path / "dir"
    elif case == "parent_is_file":
        (tmp_path / "file").write_text("x")
        flags[-1] = tmp_path / "file" / "out.mp4"
    elif case == "grid_jpg":
        flags = ["--grid", tmp_path / "grid.jpg"]
    elif case == "missing":
        src = tmp_path / "missing.mp4"
    elif case == "corrupt":
        src = tmp_path / "corrupt.mp4"
        src.write_text("this is not a video\n" * 20)
    elif case == "same_as_input":
        src = tmp_path / "in.mp4"
        src.write_bytes(cli_clips["even"].read_bytes())
        flags[-1] = src
    elif case == "frames_zero":
        flags += ["--frames", "0"]
    before = _mistake(tmp_path)
    run = _cli(src, *flags)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and phrase in lines[0], run.stderr
    assert run.stdout == "" and _mistake(tmp_path) == before
    if case == "same_as_input":
        assert src.read_bytes() == cli_clips["even"].read_bytes()


def test_cli_debug_shows_the_traceback(tmp_path):
    run = _cli(tmp_path / "missing.mp4", "--subtype", "fog", "--out", tmp_path / "o.mp4", "--debug")
    assert run.returncode != 0 and "Traceback" in run.stderr and "VideoError" in run.stderr


def test_cli_refuses_a_clip_that_does_not_fit_in_memory_before_decoding(cli_clips, tmp_path, monkeypatch):
    from machinery import cli

    monkeypatch.setattr(perturb_cli, "_memory_available", lambda: 1_000_000)  # 30 x 160x128 x 3 x 2 = 3.7 MB
    monkeypatch.setattr(video, "read_clip", lambda *a, **k: pytest.fail("decoded anyway"))
    out = tmp_path / "o.mp4"
    with pytest.raises(cli.UserError, match=r"30 frames of 160x128 need about 0\.0 GB .* --frames N"):
        perturb.main([str(cli_clips["even"]), "--subtype", "fog", "--out", str(out), "--depth-model", "proxy"])
    assert not out.exists()
