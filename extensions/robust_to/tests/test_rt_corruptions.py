"""extensions/robust_to/corruptions.py: Robust-TO's additions to PVRBench (EXTRA_SUBTYPES: motion_blur, noise)
and its protocol, registered with perturb.py's effects registry.

Robust-TO's corruption protocol is motion blur, Gaussian noise, glare, occlusion and low light; the
last three map onto PVRBench subtypes (overexposure, static, night), the first two are new here."""
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

import extensions.robust_to.corruptions as C  # registers motion_blur, noise and PROTOCOLS["robust-to"]
import perturb
from machinery import video
from machinery.corruption import perturb_cli
from machinery.datasets import synthetic

ROOT = Path(__file__).resolve().parents[3]
EXTRAS = C.EXTRA_SUBTYPES


@pytest.fixture(scope="module")
def clip():
    frames, depth = synthetic.sample_clip(8, 56, 64, seed=1)
    return frames, depth


@pytest.fixture(scope="module")
def still():
    """One frame held for 16 frames: a static camera, so any blur comes from the shake component."""
    frames, _ = synthetic.sample_clip(1, 64, 64, seed=2)
    return np.repeat(frames, 16, axis=0)


@pytest.fixture(scope="module")
def texture():
    """An isotropic texture (blurred white noise) large enough to pan a 64x64 window across."""
    rng = np.random.default_rng(0)
    return cv2.GaussianBlur(rng.integers(0, 256, (160, 160, 3), dtype=np.uint8), (0, 0), 1.2)


def pan(texture, dx, dy, T=8, size=64):
    """A camera panning at (dx, dy) px per frame over `texture` (a pure translation of the view)."""
    return np.stack([texture[40 + dy * t:40 + dy * t + size, 40 + dx * t:40 + dx * t + size] for t in range(T)])


def mad(a, b):
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def sharpness(frames):
    """Per-frame variance of the Laplacian of the grey image (falls as blur grows)."""
    return np.array([cv2.Laplacian(cv2.cvtColor(f, cv2.COLOR_RGB2GRAY), cv2.CV_64F).var() for f in frames])


def gradient_energy(frames):
    """Mean squared horizontal (d/dx) and vertical (d/dy) differences of the grey clip."""
    g = frames.astype(np.float64).mean(-1)
    return (np.diff(g, axis=2) ** 2).mean(), (np.diff(g, axis=1) ** 2).mean()


def smoothness(series):
    """Mean step between consecutive values over the mean gap between any two values: ~1 for a series
    re-drawn independently per frame, small for one that drifts smoothly."""
    s = np.asarray(series, np.float64)
    pairs = np.abs(s[:, None] - s[None, :])[np.triu_indices(len(s), 1)]
    return np.abs(np.diff(s)).mean() / max(pairs.mean(), 1e-12)


# ----------------------------------------------------------------------------- taxonomy: PVRBench unchanged

def test_pvrbench_taxonomy_is_unchanged_and_extras_are_apart():
    assert perturb.CATEGORIES == {
        "lighting": ("dusk", "night", "overexposure", "shadow"),
        "camera": ("translation", "zoom", "rotation"),
        "occlusion": ("static", "dynamic"),
        "weather": ("fog", "rain", "snow"),
    }
    assert len(perturb.SUBTYPES) == 12 and C.EXTRA_SUBTYPES == ("motion_blur", "noise")
    assert not set(EXTRAS) & set(perturb.SUBTYPES)
    for sub in EXTRAS:
        assert perturb.CATEGORY_OF[sub] == "sensor" and "sensor" not in perturb.CATEGORIES
    assert all(perturb.CATEGORY_OF[s] in perturb.CATEGORIES for s in perturb.SUBTYPES)
    assert perturb.PROTOCOLS["pvrbench"] == perturb.SUBTYPES
    assert perturb.PROTOCOLS["robust-to"] == ("motion_blur", "noise", "overexposure", "static", "night")


def test_sample_spec_never_draws_an_extra():
    rng = np.random.default_rng(0)
    specs = [perturb.sample_spec(rng) for _ in range(2000)]
    assert {s.subtype for s in specs} == set(perturb.SUBTYPES)
    assert all(perturb.sample_spec(i, category=c).subtype in perturb.CATEGORIES[c]
               for i in range(50) for c in perturb.CATEGORIES)
    with pytest.raises(ValueError, match="valid categories"):
        perturb.sample_spec(0, category="sensor")
    assert perturb.sample_spec(3, subtype="noise").category == "sensor"  # only when asked for by name


@pytest.mark.parametrize("sub", EXTRAS)
def test_spec_round_trip_and_static_spec(sub, clip):
    frames, _ = clip
    spec = perturb.PerturbSpec(sub, eta=0.55, seed=123456789, shuffle=True)
    assert spec.category == "sensor" and len(spec.to_json().encode()) < 400
    back = perturb.PerturbSpec.from_dict(spec.to_dict())
    assert back == spec and np.array_equal(perturb.apply(frames, back), perturb.apply(frames, spec))
    s = perturb.static_spec("scene0001", sub)
    assert s == perturb.static_spec("scene0001", sub) and s.seed != perturb.static_spec("scene0002", sub).seed
    assert s.seed == perturb.hash48("pvrbench", "scene0001", sub)
    with pytest.raises(ValueError, match="unknown params"):
        perturb.PerturbSpec(sub, params={"beta": 1.0})
    with pytest.raises(ValueError, match="does not match"):
        perturb.PerturbSpec(sub, category="weather")


def test_error_message_lists_both_sets():
    want = r"valid subtypes: dusk, night.*snow \(PVRBench\), motion_blur, noise \(sensor\)$"
    with pytest.raises(ValueError, match=want):
        perturb.PerturbSpec("hail")


# ----------------------------------------------------------------------------- determinism, identity, eta

@pytest.mark.parametrize("sub", EXTRAS)
def test_deterministic_in_any_call_order(sub, clip):
    frames, _ = clip
    a, b = perturb.PerturbSpec(sub, seed=1), perturb.PerturbSpec(sub, seed=2)
    first = perturb.apply(frames, a)
    perturb.apply(frames, b)
    perturb.apply(frames[:, ::-1].copy(), a)
    perturb.apply(frames, perturb.PerturbSpec("rain", seed=1))
    assert np.array_equal(perturb.apply(frames, a), first)
    assert np.array_equal(perturb.apply(frames, perturb.PerturbSpec.from_dict(a.to_dict())), first)
    assert not np.array_equal(perturb.apply(frames, b), first), "different seeds must differ"


@pytest.mark.parametrize("sub", EXTRAS)
def test_eta_zero_is_identity(sub, clip):
    frames, _ = clip
    spec = perturb.PerturbSpec(sub, eta=0.0, seed=5)
    assert np.array_equal(perturb.apply(frames, spec), frames)
    B, C = perturb.masks(frames, spec)
    assert not B.any() and not C.any()


def test_motion_blur_sharpness_falls_with_eta(clip, texture):
    frames, _ = clip
    for source in (frames, pan(texture, 3, 1)):
        for seed in (0, 1, 2):
            sharp = [sharpness(perturb.apply(source, perturb.PerturbSpec("motion_blur", eta=e, seed=seed))).mean()
                     for e in (0.0, 0.25, 0.5, 0.75, 1.0)]
            assert all(a > b for a, b in zip(sharp, sharp[1:])), (seed, sharp)
            assert sharp[-1] < 0.7 * sharp[0], (seed, sharp)


def test_noise_grows_with_eta(clip):
    frames, _ = clip
    for seed in (0, 1, 2):
        std = [(perturb.apply(frames, perturb.PerturbSpec("noise", eta=e, seed=seed)).astype(np.float64)
                - frames).std() for e in (0.0, 0.25, 0.5, 0.75, 1.0)]
        assert std[0] == 0 and all(a < b for a, b in zip(std, std[1:])), (seed, std)
        assert 8 < std[3] < 25, std  # a clearly visible but not destructive noise at eta = 0.75


# ----------------------------------------------------------------------------- motion blur: coherence, direction

def test_motion_blur_is_temporally_coherent_on_a_static_clip(still):
    """A still clip (no camera motion) is still blurred, by the shake, and its blur drifts smoothly:
    the per-frame sharpness and the x/y balance of the blur change little between frames."""
    clean = sharpness(still)
    ex, ey = gradient_energy(still[:1])
    for seed in (0, 1, 2):
        out = perturb.apply(still, perturb.PerturbSpec("motion_blur", eta=0.8, seed=seed))
        sharp = sharpness(out) / clean
        assert sharp.max() < 0.9, sharp  # every frame is blurred
        balance = []
        for f in out:
            bx, by = gradient_energy(f[None])
            balance.append(np.log((bx / ex) / (by / ey)))  # > 0: blur mostly vertical, < 0: horizontal
        assert smoothness(sharp) < 0.4 and smoothness(balance) < 0.4, (seed, sharp, balance)
        assert np.abs(np.diff(sharp)).max() < 0.15, sharp


def test_noise_is_not_temporally_coherent_but_motion_blur_is(still):
    """The contrast: noise is re-drawn per frame (a sensor), blur follows a smooth walk."""
    noisy = perturb.apply(still, perturb.PerturbSpec("noise", seed=1)).astype(np.float64) - still
    corr = [np.corrcoef(noisy[t].ravel(), noisy[t + 1].ravel())[0, 1] for t in range(len(still) - 1)]
    assert np.abs(corr).max() < 0.1, corr
    residual = noisy.std((1, 2, 3))
    assert residual.std() < 0.05 * residual.mean()  # the same strength in every frame


def test_motion_blur_follows_the_camera_motion(texture):
    """A horizontal pan blurs horizontal gradients (d/dx) much more than vertical ones, a vertical pan
    the reverse. Pure motion blur (no shake) first, then the default mix of motion and shake."""
    def losses(clip, spec):
        ex, ey = gradient_energy(clip)
        bx, by = gradient_energy(perturb.apply(clip, spec))
        return 1 - bx / ex, 1 - by / ey

    horizontal, vertical = pan(texture, 6, 0), pan(texture, 0, 6)
    for seed in (0, 1, 2):
        spec = perturb.PerturbSpec("motion_blur", eta=1.0, seed=seed, params={"shake": 0.0})
        lx, ly = losses(horizontal, spec)
        assert lx > 0.45 and lx > 1.6 * ly, (seed, lx, ly)
        lx, ly = losses(vertical, spec)
        assert ly > 0.45 and ly > 1.6 * lx, (seed, lx, ly)
    ratios = []
    for seed in range(4):
        spec = perturb.PerturbSpec("motion_blur", eta=1.0, seed=seed)
        (hx, hy), (vx, vy) = losses(horizontal, spec), losses(vertical, spec)
        assert hx > hy and vy > vx, (seed, hx, hy, vx, vy)  # the shake never overrides a steady pan
        ratios.append((hx / hy, vy / vx))
    assert np.mean(ratios, 0).min() > 1.3, ratios


def test_motion_blur_on_a_turning_camera():
    """synthetic.render_synthetic's camera turning left (positive yaw rate) pans the view horizontally."""
    objects = [dict(shape=list(synthetic.SYNTH_SHAPES)[0], colour=list(synthetic.SYNTH_COLOURS)[0], pos=(0.5, 6.0))]
    frames, _, _ = synthetic.render_synthetic(objects, 0.06, 0.0, num_frames=6, size=64)
    ex, ey = gradient_energy(frames)
    bx, by = gradient_energy(perturb.apply(frames, perturb.PerturbSpec("motion_blur", eta=1.0, seed=0,
                                                                       params={"shake": 0.0})))
    assert 1 - bx / ex > 2 * (1 - by / ey), (bx / ex, by / ey)
    for seed in (0, 1, 2):  # with the shake too
        bx, by = gradient_energy(perturb.apply(frames, perturb.PerturbSpec("motion_blur", eta=1.0, seed=seed)))
        assert 1 - bx / ex > 1 - by / ey, (seed, bx / ex, by / ey)


def test_motion_blur_travels_with_its_frame_under_shuffle(clip):
    """Blur happens at capture: shuffling then blurring is blurring then shuffling (Eq. 1-2)."""
    frames, _ = clip
    perm = perturb.temporal_permutation(len(frames), 7)
    shuffled = perturb.apply(frames, perturb.PerturbSpec("motion_blur", seed=7, shuffle=True))
    assert np.array_equal(shuffled, perturb.apply(frames, perturb.PerturbSpec("motion_blur", seed=7))[perm])


# ----------------------------------------------------------------------------- noise: a sensor model

def test_noise_is_signal_dependent():
    """var = shot * I + read^2: flat dark and bright patches get the model's noise, more in the bright."""
    frames = np.zeros((4, 64, 64, 3), np.uint8)
    frames[:, :, :32] = 30
    frames[:, :, 32:] = 200
    for seed in (0, 1):
        spec = perturb.PerturbSpec("noise", eta=0.8, seed=seed)
        res = perturb.apply(frames, spec).astype(np.float64) - frames
        dark, bright = res[:, :, :32].std(), res[:, :, 32:].std()
        assert bright > 1.8 * dark, (dark, bright)
        for level, got in ((30, dark), (200, bright)):
            want = np.sqrt(spec.params["shot"] * level + spec.params["read"] ** 2)
            assert abs(got / want - 1) < 0.1, (level, got, want)
        assert abs(res.mean()) < 0.3  # zero-mean


# ----------------------------------------------------------------------------- B and C, backends, protocols

@pytest.mark.parametrize("sub", EXTRAS)
def test_masks_semantics(sub, clip):
    frames, depth = clip
    spec = perturb.PerturbSpec(sub, seed=4)
    out = perturb.apply(frames, spec, depth)
    B, C = perturb.masks(frames, spec, depth)
    assert B.shape == C.shape == frames.shape[:3] and B.dtype == bool and C.dtype == np.float32
    assert np.array_equal(B, C > 0) and B.all() and np.all(C == 1)  # E replaces every pixel, C = 1
    changed = (out != frames).any(-1)
    assert not (changed & ~B).any(), "where B is 0 the pixel is unchanged"
    assert changed.mean() > 0.5


@pytest.mark.parametrize("sub", EXTRAS)
def test_torch_tensors_match_numpy(sub, clip):
    torch = pytest.importorskip("torch")
    frames, depth = clip
    for spec in (perturb.PerturbSpec(sub, seed=8), perturb.PerturbSpec(sub, eta=1.0, seed=9, shuffle=True)):
        x = torch.from_numpy(frames)
        out = perturb.apply(x, spec, torch.from_numpy(depth))
        assert isinstance(out, torch.Tensor) and out.dtype == torch.uint8 and out.shape == x.shape
        assert torch.equal(out, perturb.apply(x, spec, torch.from_numpy(depth)))
        diff = np.abs(out.numpy().astype(np.int16) - perturb.apply(frames, spec, depth))
        assert diff.mean() < 0.2 and diff.max() <= 2, (diff.mean(), diff.max())
        B, C = perturb.masks(x, spec)
        assert isinstance(B, torch.Tensor) and B.dtype == torch.bool and C.dtype == torch.float32
        assert np.array_equal(B.numpy(), perturb.masks(frames, spec)[0])


def test_long_blur_kernel_pieces_match_one_kernel():
    """A long blur is filtered by OpenCV in pieces (see corruptions._filter); torch uses the summed kernel."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    f = cv2.GaussianBlur(rng.integers(0, 256, (96, 120, 3), dtype=np.uint8), (0, 0), 1.0)
    assert len(C._line_pieces(40.0, 0.0)) == 1  # a horizontal line is thin: one piece
    for b in ((30.0, 8.0), (17.0, 11.0), (-6.0, 19.5)):
        pieces = C._line_pieces(*b)
        assert len(pieces) > 1 and abs(sum(k.sum() for _, _, k in pieces) - 1) < 1e-5
        assert all(k.size <= 121 for _, _, k in pieces)
        a = C._filter(f, pieces)
        t = C._filter(torch.from_numpy(f), pieces).numpy()
        assert np.abs(a.astype(int) - t).max() <= 1


def test_robust_to_protocol_applies_cleanly(clip):
    frames, depth = clip
    for sub in perturb.PROTOCOLS["robust-to"]:
        spec = perturb.static_spec("clip-0", sub)
        out = perturb.apply(frames, spec, depth)
        assert out.shape == frames.shape and out.dtype == np.uint8
        assert mad(out, frames) > 0.5, sub
        assert np.array_equal(out, perturb.apply(frames, perturb.PerturbSpec.from_dict(spec.to_dict()), depth))


def test_tiny_and_odd_sizes_work():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    for shape in ((1, 9, 13, 3), (3, 31, 17, 3), (2, 64, 200, 3), (3, 3, 40, 3), (2, 5, 90, 3)):
        frames = rng.integers(0, 256, shape, dtype=np.uint8)
        for sub in EXTRAS:
            spec = perturb.PerturbSpec(sub, eta=1.0, seed=1, shuffle=True)
            out = perturb.apply(frames, spec)
            assert out.shape == frames.shape and out.dtype == np.uint8
            t = perturb.apply(torch.from_numpy(frames), spec).numpy()
            assert np.abs(out.astype(int) - t).max() <= 2, (shape, sub)


# ----------------------------------------------------------------------------- command line

def _cli(*args):
    """perturb.py's command line with Robust-TO's corruptions registered."""
    return subprocess.run([sys.executable, "-m", "extensions.robust_to.corruptions", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True)


def test_cli_extra_subtype_and_robust_to_grid(tmp_path):
    out, grid = tmp_path / "blur.mp4", tmp_path / "grid.png"
    run = _cli("--subtype", "motion_blur", "--out", out, "--grid", grid, "--protocol", "robust-to", "--frames", "4",
               "--size", "64")
    assert run.returncode == 0, run.stderr
    assert '"subtype":"motion_blur"' in run.stdout and '"category":"sensor"' in run.stdout
    frames, _, _ = video.read_frames(out, num_frames=4)
    assert frames.shape[0] == 4
    from PIL import Image
    assert Image.open(grid).size[1] == 6 * 64  # clean + Robust-TO's five


def test_cli_grid_of_a_full_length_clip_shows_a_few_sampled_frames(tmp_path):
    """(Moved from tests/test_perturb.py, where the same runs with --protocol pvrbench.)"""
    from PIL import Image

    src = video.write_video(tmp_path / "even.mp4", synthetic.sample_clip(30, 128, 160, seed=4, supersample=1)[0],
                            fps=15.0)
    grid = tmp_path / "grid.png"
    run = _cli(src, "--grid", grid, "--protocol", "robust-to", "--depth-model", "proxy")   # (no depth model here)
    assert run.returncode == 0, run.stderr
    h, w = video.smart_resize(128, 160, max_pixels=perturb_cli.GRID_MAX_PIXELS)
    with Image.open(grid) as im:
        assert im.size == (140 + 4 * w, 6 * h)  # 4 columns; clean + 5 rows
    assert f"x 4 frames of 16 sampled uniformly from {src} (of its 30), {w}x{h} each" in run.stdout
