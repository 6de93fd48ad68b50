"""synthetic.py: the synthetic embodied benchmark (rendering, questions, balance, blind baseline, formats, CLI)
and the procedural street clip."""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from machinery import video
from machinery.datasets import data
from machinery.datasets import synthetic

ROOT = Path(__file__).resolve().parents[1]


def digest(folder):
    h = hashlib.sha256()
    for p in sorted(Path(folder).rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth")
    summary = synthetic.make_synthetic(out, n=48, seed=3, num_frames=8, size=56, eval_fraction=0.5)
    return out, summary


def test_files_are_in_the_native_formats(bench):
    out, summary = bench
    train, missing = data.load_video_r1(out / "train.json")
    assert not missing and len(train) == summary["n_train"] > 0
    evaluation, missing = data.load_vsibench(out / "eval.jsonl", out / "videos")
    assert not missing and len(evaluation) == summary["n_eval"] > 0
    assert {s.problem_type for s in train} == {"multiple choice", "regression"}
    assert all(s.process and s.source == "video-r1" for s in train)
    assert {s.task for s in evaluation} <= set(synthetic.SYNTH_FAMILIES.values())
    depth = np.load(out / "depth" / f"{evaluation[0].meta.get('scene_name', Path(evaluation[0].video).stem)}.npy")
    assert depth.shape == (8, 56, 56) and depth.dtype == np.float16 and depth.min() > 0


def test_answers_are_balanced(bench):
    _, summary = bench
    for split, families in summary["answer_balance"].items():
        actions = families["next_action"]
        assert sorted(actions) == ["A", "B", "C"] and max(actions.values()) - min(actions.values()) <= 1
        counts = families["counting"]
        assert set(counts) == {"1", "2", "3", "4"}, counts
        assert max(counts.values()) - min(counts.values()) <= 2, counts
        for fam in ("appearance_order", "relative_distance"):
            if fam in families:
                letters = families[fam]
                assert max(letters.values()) - min(letters.values()) <= 1, (split, fam, letters)


def test_same_seed_same_bytes(bench, tmp_path):
    out, _ = bench
    again = synthetic.make_synthetic(tmp_path / "again", n=48, seed=3, num_frames=8, size=56, eval_fraction=0.5)
    assert digest(out) == digest(tmp_path / "again") and again["n_train"] > 0
    other = tmp_path / "other"
    synthetic.make_synthetic(other, n=4, seed=4, num_frames=8, size=56)
    assert (other / "train.json").read_bytes() != (out / "train.json").read_bytes()


def test_the_demo_and_the_eval_build_one_benchmark(bench, tmp_path):
    """train.py's demo renders synthetic.DEMO_BENCHMARK (eval_pvrbench.py's default), and refuses an OUT/synthetic
    rendered with other settings instead of training on it."""
    import train
    from machinery import cli
    from machinery.training import runs

    cfg = train.parse_args(["--out", str(tmp_path / "demo")])
    assert runs.synthetic_settings(runs.demo_benchmark(cfg)) == runs.synthetic_settings(synthetic.DEMO_BENCHMARK)
    out, summary = bench
    assert runs.synthetic_settings(summary) == runs.synthetic_settings(dict(n=48, seed=3, num_frames=8, size=56))
    with pytest.raises(cli.UserError, match="rendered with other settings"):
        runs.make_demo_benchmark(cfg, out)   # (48 clips, seed 3, the default turn: not the demo's)


@pytest.mark.slow
def test_text_only_baseline_sits_at_chance(tmp_path):
    out = tmp_path / "blind"
    synthetic.make_synthetic(out, n=240, seed=5, num_frames=6, size=56, eval_fraction=0.5)
    train, _ = data.load_video_r1(out / "train.json")
    evaluation, _ = data.load_vsibench(out / "eval.jsonl", out / "videos")
    results = synthetic.text_only_baseline(train, evaluation)
    assert set(results) == set(synthetic.SYNTH_FAMILIES)
    for family, (acc, chance) in results.items():
        n = sum(synthetic._family(s) == family for s in evaluation)
        slack = 2.5 * np.sqrt(chance * (1 - chance) / n) + 0.02  # 2.5 standard errors
        assert acc <= chance + slack, (family, acc, chance, n)


def test_rendered_motion_matches_the_action():
    """Turning left sweeps the scene to the right in the image, and vice versa; going ahead does not."""
    rng = np.random.default_rng(0)
    objects = synthetic._synthetic_scene(rng, "Go ahead", "red", 3)
    shifts = {}
    for name, yaw in (("left", 0.04), ("right", -0.04), ("ahead", 0.0)):
        frames, depth, visible = synthetic.render_synthetic(objects, yaw, 0.0, num_frames=6, size=64)
        g = frames.mean(-1)
        err = lambda t, s: np.abs(np.roll(g[t], s, axis=1)[:, 12:-12] - g[t + 1][:, 12:-12]).mean()  # noqa: E731
        best = [min(range(-12, 13), key=lambda s: err(t, s)) for t in range(5)]
        shifts[name] = np.mean(best)
        assert depth.shape == (6, 64, 64) and (depth > 0).all()
    assert shifts["left"] > 1 and shifts["right"] < -1 and abs(shifts["ahead"]) < 0.5, shifts


def test_cli(tmp_path):
    run = subprocess.run([sys.executable, "-m", "machinery.datasets.synthetic", "--out", str(tmp_path / "s"),
                          "--n", "3", "--seed", "1", "--frames", "4", "--size", "56"], cwd=ROOT, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["n_clips"] == 3 and (tmp_path / "s" / "videos" / "synthetic").is_dir()


# ----------------------------------------------------------------------------- the street clip
@pytest.fixture(scope="module")
def street():
    """40 frames of the sample street at 144x192 (no supersampling, for speed)."""
    return synthetic.sample_clip(40, 144, 192, seed=1, supersample=1)


def test_sample_clip_shape_and_determinism():
    frames, depth = synthetic.sample_clip(4, 48, 64, seed=3)
    assert frames.shape == (4, 48, 64, 3) and frames.dtype == np.uint8
    assert depth.shape == (4, 48, 64) and depth.dtype == np.float32
    again, depth_again = synthetic.sample_clip(4, 48, 64, seed=3)
    assert np.array_equal(frames, again) and np.array_equal(depth, depth_again)
    assert not np.array_equal(frames, synthetic.sample_clip(4, 48, 64, seed=4)[0])


def test_sample_clip_depth_and_motion(street):
    frames, depth = street
    assert np.all(depth > 0) and np.all(np.isfinite(depth))
    assert depth.max() == synthetic.SKY_DEPTH
    top, bottom = depth[:, :10].mean(), depth[:, -10:].mean()
    assert top > 20 * bottom and bottom < 10  # sky above, nearby road below
    assert frames.std() > 30  # textured, not flat
    step = np.abs(np.diff(frames.astype(float), axis=0)).mean(axis=(1, 2, 3))
    noise = np.random.default_rng(0).integers(0, 256, frames[0].shape)
    assert np.all(step > 0.5)  # the camera moves ...
    assert step.max() < 0.3 * np.abs(frames[0] - noise.astype(float)).mean()  # ... smoothly


def test_write_sample_video(tmp_path):
    path = synthetic.write_sample_video(tmp_path / "sample.mp4", fps=4.0, num_frames=3, height=56, width=56)
    frames, indices, fps = video.read_frames(path, num_frames=3)
    assert frames.shape == (3, 56, 56, 3) and fps == pytest.approx(4.0) and indices.tolist() == [0, 1, 2]
