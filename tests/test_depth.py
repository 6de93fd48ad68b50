"""depth.py: a monocular depth model for the depth-conditioned corruptions (Sec. 3.1, Table 1), its rule
(larger = farther, the sky farthest), the disk cache (computed once per clip, keyed by model, video, frame
indices and content), float16 throughout, and its plumbing: perturb.apply, machinery.training.clips.Clips,
eval_pvrbench's manifest, run hash and --export (Eq. 4: the exported depth regenerates the evaluated clips bit for
bit), perturb.py's CLI.
The model is a random-weight Depth Anything of ~25k parameters built here (no download)."""
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from machinery.corruption import depth
from machinery.datasets import data
import eval_pvrbench as ev
import perturb
from machinery import cli, hub
from machinery.datasets import synthetic
import train
from machinery import video
from machinery.training import clips as clips_mod
from machinery.training import runs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Depth Anything (Dinov2 backbone) and its DPT image processor, saved as safetensors."""
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config, DPTImageProcessor

    folder = tmp_path_factory.mktemp("depth") / "tiny-depth-anything"
    backbone = Dinov2Config(image_size=56, patch_size=14, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=32, out_indices=[1, 2], reshape_hidden_states=False)
    config = DepthAnythingConfig(backbone_config=backbone, reassemble_hidden_size=16, reassemble_factors=[2, 1],
                                 neck_hidden_sizes=[8, 16], fusion_hidden_size=8, head_hidden_size=8)
    torch.manual_seed(0)
    model = DepthAnythingForDepthEstimation(config)
    with torch.no_grad():   # weights large enough that the prediction varies over the image (ReLU head)
        for p in model.parameters():
            if p.dim() > 1:
                torch.nn.init.normal_(p, 0, 0.3)
        model.head.conv3.bias.fill_(1.0)
    with hub.no_hf_progress_bars():
        model.save_pretrained(folder)
        DPTImageProcessor(size={"height": 56, "width": 56}, keep_aspect_ratio=True,
                          ensure_multiple_of=14).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def clip():
    return synthetic.sample_clip(4, 48, 64, seed=3)[0]


def forward_counter(source):
    """Load the source's model and count its forward calls."""
    source.load()
    calls = []
    source.model.register_forward_hook(lambda *a: calls.append(1))
    return calls


# ----------------------------------------------------------------------------- the rule

def test_disparity_becomes_depth_larger_is_farther_with_the_sky_farthest():
    rows = np.concatenate([np.zeros(4), np.linspace(0.5, 8.0, 12)]).astype(np.float32)   # sky, then the ground
    disparity = np.repeat(rows[None, :, None], 3, axis=2).repeat(2, axis=0)                # [T=2, 16, 3]
    d = depth.to_depth(disparity, metric=False)
    assert d.dtype == np.float16 and d.shape == disparity.shape
    col = d[0, :, 0].astype(np.float32)
    assert np.all(np.diff(col[3:]) < 0)                        # nearer toward the bottom of the ground plane
    assert np.all(col[:4] == col.max()) and col.max() == np.float16(1 / depth.EPS)   # the sky: the far limit
    assert col.min() == np.float16(1 / (1 + depth.EPS))
    metres = np.array([[[2.0, 40.0]]], np.float32)
    assert np.array_equal(depth.to_depth(metres, metric=True), metres.astype(np.float16))  # metric: as it is
    with pytest.raises(ValueError, match="non-finite"):
        depth.to_depth(np.array([[[np.nan]]]), metric=False)


def test_the_clip_shares_one_scale_and_the_model_orientation_is_converted(tiny, tmp_path, monkeypatch):
    """Through Source.estimate: a crafted disparity (bright = near) gives the dark top the larger depth, one
    disparity scale for all the frames (a dim frame is not re-stretched)."""
    source = depth.Source(tiny, tmp_path)
    source.load()
    monkeypatch.setattr(source, "_predict", lambda f: torch.from_numpy(f.mean(-1).astype(np.float32)))
    frames = np.zeros((2, 8, 6, 3), np.uint8)
    frames[:, 4:] = 200
    frames[1] //= 2   # the same scene, half as bright: half the disparity
    d = source.estimate(frames).astype(np.float32)
    assert d.shape == (2, 8, 6) and (d[:, :4] > d[:, 4:]).all()
    assert d[0, 7, 0] < d[1, 7, 0] < d[0, 0, 0]


# ----------------------------------------------------------------------------- the model and its cache

def test_model_depth_is_float16_frame_sized_and_computed_once(tiny, tmp_path, clip):
    source = depth.Source(tiny, tmp_path / "cache", batch_size=3)   # 4 frames: batches of 3 and 1
    calls = forward_counter(source)
    d = source(clip, "synthetic/a", range(4))
    assert d.dtype == np.float16 and d.shape == clip.shape[:3] and calls == [1, 1]
    assert np.ptp(d.astype(np.float32)) > 0 and (d > 0).all()
    cached = source.path(source.key(clip, "synthetic/a", range(4)))
    assert np.array_equal(np.load(cached), d)   # what is used is what is cached
    assert np.array_equal(source(clip, "synthetic/a", range(4)), d) and calls == [1, 1]
    fresh = depth.Source(tiny, tmp_path / "cache")   # another process: read from disk, no model loaded
    assert np.array_equal(fresh(clip, "synthetic/a", range(4)), d) and fresh.model is None
    assert np.array_equal(source.estimate(clip), d)   # deterministic


def test_cache_key_covers_model_video_indices_and_frames(tiny, tmp_path, clip):
    a = depth.Source(tiny, tmp_path)
    key = a.key(clip, "synthetic/a", [0, 1, 2, 3])
    assert key == a.key(clip.copy(), "synthetic/a", np.arange(4))
    others = [a.key(clip, "synthetic/a", [0, 2, 4, 6]), a.key(clip, "synthetic/b", [0, 1, 2, 3]),
              a.key(clip[::-1], "synthetic/a", [0, 1, 2, 3]), a.key(clip, "synthetic/a", None),
              depth.Source(depth.RECOMMENDED, tmp_path).key(clip, "synthetic/a", [0, 1, 2, 3])]
    assert len({key, *others}) == 6
    assert depth.model_id(depth.RECOMMENDED) == depth.RECOMMENDED and tiny in depth.model_id(tiny)


def test_a_corrupt_cache_file_is_recomputed_with_a_warning_naming_it(tiny, tmp_path, clip):
    source = depth.Source(tiny, tmp_path)
    d = source(clip, "v", range(4))
    path = source.path(source.key(clip, "v", range(4)))
    path.write_bytes(path.read_bytes()[:100])   # torn
    with pytest.warns(UserWarning, match=re.escape(str(path))):
        again = source(clip, "v", range(4))
    assert np.array_equal(again, d) and np.array_equal(np.load(path), d)
    np.save(path, d.astype(np.float32))   # the wrong dtype is not used either
    with pytest.warns(UserWarning, match="expected float16"):
        assert np.array_equal(source(clip, "v", range(4)), d)
    with pytest.raises(cli.UserError, match=re.escape(f"depth file {path}: shape")):
        depth.read(path, (5, 48, 64))
    assert not list(tmp_path.rglob("*.tmp"))   # atomic writes leave no temporary file


def test_clip_memo_reads_a_clips_depth_once_per_frames_object(tiny, tmp_path, clip, monkeypatch):
    source = depth.Source(tiny, tmp_path)
    d = source(clip, "v", range(4))
    asked = []
    monkeypatch.setattr(source, "key", lambda *a, _key=source.key: asked.append(1) or _key(*a))
    memo = depth.ClipMemo(source, size=2)
    for _ in range(3):   # one clip under three specs: one hash and read
        assert np.array_equal(memo(clip, "v", range(4)), d)
    assert len(asked) == 1
    same = clip.copy()   # equal frames, another object (a new read): asked again, the same numbers
    assert np.array_equal(memo(same, "v", range(4)), d) and len(asked) == 2
    memo(clip[::-1].copy(), "w"), memo(clip[:2].copy(), "x")   # size 2: "v" is evicted
    assert list(memo.items) == ["w", "x"]
    memo(same, "v", range(4))
    assert len(asked) == 5


def test_bad_depth_models_are_one_line(tmp_path):
    with pytest.raises(cli.UserError, match="--depth-model .*no such folder"):
        depth.check_source(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(cli.UserError, match="no config.json"):
        depth.Source(str(tmp_path / "empty"), tmp_path).load()
    depth.check_source("")   # none: the proxy


# ----------------------------------------------------------------------------- perturb and train

def test_model_depth_changes_the_depth_graded_corruptions(tiny, tmp_path, clip):
    d = depth.Source(tiny, tmp_path)(clip, "v", range(4))
    fog = perturb.static_spec("synthetic/a", "fog")
    with_model, with_proxy = perturb.apply(clip, fog, d), perturb.apply(clip, fog)
    assert not np.array_equal(with_model, with_proxy)
    assert np.array_equal(with_model, perturb.apply(clip, fog, d.copy()))   # deterministic in (frames, spec, depth)


@pytest.fixture(scope="module")
def bench(synthetic_factory):
    return synthetic_factory(n=4, seed=0, num_frames=4, size=56, eval_fraction=1.0)


def test_train_clips_give_each_clip_its_depth(tiny, tmp_path, bench):
    cfg = train.parse_args(["--depth-model", tiny, "--frames", "4", "--max-pixels", str(56 * 56)],
                           settings={"depth_cache": str(tmp_path)})
    assert cfg.depth_model == tiny and "depth_cache" in runs.NOT_RESULT_KEYS
    samples, _ = data.load_vsibench(bench / "eval.jsonl", bench / "videos")
    clips, s = clips_mod.Clips(cfg, [], len(samples)), samples[0]
    frames, spec = clips.get(s), perturb.static_spec(data.video_identity(s), "fog")
    source = depth.Source(tiny, tmp_path)
    d = source(frames, data.video_identity(s), video.read_frames(s.video, 4, 56 * 56)[1])
    assert np.array_equal(train.perturbed(clips, s, frames, spec), perturb.apply(frames, spec, d))
    assert clips.depth_of.items[data.video_identity(s)][0] is frames   # the next spec reuses it (ClipMemo)
    assert len(list(tmp_path.rglob("*.npy"))) == 1   # the same cache entry
    auto = clips_mod.Clips(train.parse_args(["--frames", "4", "--max-pixels", str(56 * 56)]), [], len(samples))
    own = depth.own_depth(depth.own_depth_file(s.video), frames, video.read_frames(s.video, 4, 56 * 56)[1])
    assert auto.depth.kind(s.video) == "own"   # the default: the synthetic benchmark's own (true) depth
    assert np.array_equal(auto.depth_map(s, frames), own)
    plain = clips_mod.Clips(train.parse_args(["--depth-model", "proxy"]), [], len(samples))
    assert plain.depth.kind(s.video) == "proxy"
    assert plain.depth_map(s, frames) is None   # perturb.apply's own proxy
    assert not np.array_equal(train.perturbed(plain, s, frames, spec), train.perturbed(auto, s, frames, spec))


# ----------------------------------------------------------------------------- eval_pvrbench

class StubModel:
    """Stands in for the evaluated model: records the clip of each (question, condition)."""
    seen = {}

    def generate(self, samples, prompts, clips, fps, style, max_new_tokens):
        for s, c in zip(samples, clips):
            StubModel.seen.setdefault(s.id, []).append(np.array(c))
        return [("<answer>A</answer>", None) for _ in samples]


def eval_cli(bench, tiny, out, *extra):
    return ["--benchmark", f"synthetic={bench}", "--model", tiny, "--frames", "4", "--max-new-tokens", "4",
            "--subtypes", "fog,rain,dusk,static", "--limit", "8", "--out", str(out), "--judge", "none", *extra]


def test_eval_records_the_depth_hashes_it_and_export_regenerates_bit_identically(tiny, tmp_path, bench,
                                                                                 monkeypatch):
    monkeypatch.setitem(ev.MODELS, "", lambda args, path: StubModel())
    StubModel.seen = {}
    cache = tmp_path / "cache"
    keys = []   # a clip's depth is hashed and read once, not once per subtype (depth.ClipMemo)
    monkeypatch.setattr(depth.Source, "key",
                        lambda self, *a, _key=depth.Source.key: keys.append(a[1]) or _key(self, *a))
    ev.main(eval_cli(bench, tiny, tmp_path / "out", "--depth-model", tiny, "--depth-cache", str(cache)))
    assert keys and len(keys) == len(set(keys))
    ev.main(eval_cli(bench, tiny, tmp_path / "out", "--depth-model", "proxy"))   # the proxy: another run store
    ev.main(eval_cli(bench, tiny, tmp_path / "out"))   # the default (auto): the synthetic set's own depth, a third
    runs = sorted((tmp_path / "out" / Path(tiny).name).glob("run_*"))
    assert len(runs) == 3
    rows = {json.dumps(json.loads(line)["depth"]) for r in runs
            for line in (r / "manifest.jsonl").read_text().splitlines()}
    own = {json.dumps({"own": f"depth/{Path(p).stem}.npy"}) for p in (bench / "videos" / "synthetic").glob("*.mp4")}
    assert rows == {json.dumps({"model": tiny}), json.dumps("proxy")} | own
    assert sorted(json.loads((r / "config.json").read_text())["depth"].split(":")[0] for r in runs) == \
        sorted(["auto", "proxy", tiny])
    export = tmp_path / "pvr"
    ev.main(eval_cli(bench, tiny, tmp_path / "x", "--export", str(export), "--depth-model", tiny,
                     "--depth-cache", str(cache)))
    manifest = [json.loads(x) for x in (export / "manifest.jsonl").read_text().splitlines()]
    assert manifest and not (tmp_path / "x").exists()
    for row in manifest:   # another machine: the clean frames + spec + exported depth, no model
        file = export / row["depth"]["file"]
        assert row["depth"]["model"] == tiny and hashlib.sha256(file.read_bytes()).hexdigest() == row["depth"]["sha256"]
        frames = video.read_frames(row["source_video"], num_frames=row["frames"], max_pixels=row["max_pixels"])[0]
        clip = perturb.apply(frames, perturb.PerturbSpec.from_dict(row["spec"]), depth.read(file, frames.shape[:3]))
        for qid in row["questions"]:   # what the eval showed the model under this subtype (first run: the model's)
            assert np.array_equal(StubModel.seen[qid][1], clip)
        if row["subtype"] in ("fog", "rain"):
            assert not np.array_equal(clip, perturb.apply(frames, perturb.PerturbSpec.from_dict(row["spec"])))


def test_eval_depth_flags_are_checked_before_any_work(tiny, tmp_path, bench):
    with pytest.raises(cli.UserError, match="--depth-cache .* give --depth-model auto or NAME"):
        ev.main(eval_cli(bench, tiny, tmp_path / "out", "--depth-model", "proxy", "--depth-cache", str(tmp_path / "c")))
    with pytest.raises(cli.UserError, match="--depth-model"):
        ev.main(eval_cli(bench, tiny, tmp_path / "out", "--export", str(tmp_path / "e"), "--depth-model",
                         str(tmp_path / "nope")))
    assert not (tmp_path / "e").exists()


# ----------------------------------------------------------------------------- perturb.py's command line

def test_perturb_cli_with_a_depth_model(tiny, tmp_path):
    out, cache = tmp_path / "fog.mp4", tmp_path / "cache"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "perturb.py", "--subtype", "fog", "--out", str(out), "--frames", "4",
                          "--size", "56", "--depth-model", tiny, "--depth-cache", str(cache)],
                         cwd=ROOT, capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert f"depth by {tiny}" in run.stdout and video.probe(out)["frames"] == 4
    (cached,) = cache.rglob("*.npy")
    frames = synthetic.sample_clip(4, 56, 56)[0]
    assert np.array_equal(np.load(cached), depth.Source(tiny, cache)(frames, "perturb-sample-clip/56", range(4)))
    bad = subprocess.run([sys.executable, "perturb.py", "--subtype", "fog", "--out", str(out), "--depth-model", "proxy",
                          "--depth-cache", str(cache)], cwd=ROOT, capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--depth-model" in bad.stderr


def test_auto_grades_a_real_video_by_the_recommended_model_when_it_is_cached(tiny, tmp_path):
    """The default (--depth-model auto) with depth.RECOMMENDED in the Hugging Face cache (here the random tiny model
    stored under its name), offline: a video without its own depth is corrupted with that model's depth, the same
    maps as naming the model's folder; with an empty cache the same command stops with one line."""
    import shutil

    repo = tmp_path / "hub" / ("models--" + depth.RECOMMENDED.replace("/", "--"))
    shutil.copytree(tiny, repo / "snapshots" / ("0" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    src = synthetic.write_sample_video(tmp_path / "in.mp4", num_frames=4, height=56, width=56)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "OMP_NUM_THREADS": "1"}

    def cli(out, *extra):
        return subprocess.run([sys.executable, "perturb.py", str(src), "--subtype", "fog", "--out", str(out),
                               "--frames", "4", *extra], cwd=ROOT, capture_output=True, text=True, env=env)

    run = cli(tmp_path / "auto.mp4", "--depth-cache", str(tmp_path / "c1"))
    assert run.returncode == 0 and f"depth by {depth.RECOMMENDED}" in run.stdout, run.stderr
    named = cli(tmp_path / "named.mp4", "--depth-model", tiny, "--depth-cache", str(tmp_path / "c2"))
    assert named.returncode == 0, named.stderr
    (a,), (b,) = (tmp_path / "c1").rglob("*.npy"), (tmp_path / "c2").rglob("*.npy")
    assert np.array_equal(np.load(a), np.load(b)) and np.ptp(np.load(a).astype(np.float32)) > 0
    got = [video.read_frames(tmp_path / f, 4, 56 * 56)[0] for f in ("auto.mp4", "named.mp4")]
    assert np.array_equal(*got)
    proxy = cli(tmp_path / "proxy.mp4", "--depth-model", "proxy")
    assert (proxy.returncode == 0
            and not np.array_equal(video.read_frames(tmp_path / "proxy.mp4", 4, 56 * 56)[0], got[0]))
    shutil.rmtree(repo)
    gone = cli(tmp_path / "gone.mp4")
    assert gone.returncode == 2 and len(gone.stderr.strip().splitlines()) == 1 and "hf download" in gone.stderr
    assert not (tmp_path / "gone.mp4").exists()
