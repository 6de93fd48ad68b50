"""Occluders that belong to the scene (machinery/corruption/props.py: a clip's scene kind decides which occluders it
gets).
What is checked, each computed here from the clip as built, not from the engine's own numbers:

- The scene kind: close-ups read as indoor, surfaces seen from above as aerial, scenes under a sky as street; with a
  true depth map, a room (a ceiling and walls nearer than the middle) is indoor and a far, flat ground aerial.
- An indoor or aerial spec never paints a car (nor an aerial one a walker), while a street spec does.
- A flyer is never drawn taller than its size in metres allows at its distance (70-degree field of view), and a
  walker or car on the ground never taller than a pinhole 1.5 m above the ground allows at its contact row.
- On the street, walkers and cars stand on the ground the true depth shows.
- Static kinds come in several kinds per scene, are shaded from the clip (a warm clip gives a warmer occluder, a
  dark clip a darker one) and are softer on a blurrier clip.
- The scene is part of the spec: it round-trips through JSON and regenerates the same pixels.
"""
import json
import math

import cv2
import numpy as np
import pytest

import perturb
from machinery.corruption import kernels, occluders, props, scene
from machinery.datasets import synthetic


def context(clip, depth=None):
    if depth is not None and depth.ndim == 2:
        depth = np.broadcast_to(depth, clip.shape[:3])
    return scene.Context(clip, perturb.PerturbSpec("static"), depth, kernels.HOST)


# ----------------------------------------------------------------------------- the scene kind

@pytest.mark.parametrize("name", sorted(synthetic.PHOTO_KINDS))
def test_a_photo_gets_the_scene_it_shows(name):
    pytest.importorskip("skimage")
    want = {"sky": "street", "close-up": "indoor", "top-down": "aerial"}[synthetic.PHOTO_KINDS[name]]
    assert props.infer_scene(context(synthetic.photo_clip(name, 4, 128))) == want


def test_scene_from_a_true_depth_map():
    clip, depth = synthetic.sample_clip(4, 96, 96)
    assert props.infer_scene(context(clip, depth)) == "street"
    assert props.infer_scene(context(clip)) == "street"   # the proxy: a sky over ground
    H = W = 96
    y, x = np.mgrid[0:H, 0:W] / (H - 1)
    room = 1.0 + 4.0 * np.minimum(np.minimum(y, 1 - y), np.minimum(x, 1 - x))   # ceiling, floor, walls: near edges
    assert props.infer_scene(context(clip, room.astype(np.float32))) == "indoor"
    ground = 300.0 + 5.0 * y   # a far, flat ground filling the view from above
    assert props.infer_scene(context(clip, ground.astype(np.float32))) == "aerial"


# ----------------------------------------------------------------------------- the kinds each scene allows

def _painted(monkeypatch, clip, spec, depth=None):
    """Which of occluders' painters drawing a car or a walker ran while rendering `spec`."""
    calls = set()
    for name in ("paint_car", "paint_walker"):
        real = getattr(occluders, name)
        monkeypatch.setattr(occluders, name, lambda *a, _n=name, _r=real: (calls.add(_n), _r(*a))[1])
    perturb.masks(clip, spec, depth)
    return calls


def test_indoor_and_aerial_specs_never_draw_a_vehicle(monkeypatch):
    pytest.importorskip("skimage")
    small = {"indoor": synthetic.photo_clip("coffee", 4, 96), "aerial": synthetic.photo_clip("gravel", 4, 96)}
    street, street_depth = synthetic.sample_clip(4, 96, 96)
    seen_on_street = set()
    for seed in range(24):
        for kind, clip in small.items():
            for scene_arg in (kind, "auto"):   # given by the source, or inferred from the clip
                spec = perturb.sample_spec(seed, subtype="dynamic", scene=scene_arg)
                painted = _painted(monkeypatch, clip, spec)
                assert "paint_car" not in painted, (kind, scene_arg, seed, spec.params)
                if kind == "aerial":   # nothing that walks or drives on the ground fills a drone's view
                    assert not painted, (seed, spec.params)
        seen_on_street |= _painted(monkeypatch, street, perturb.sample_spec(seed, subtype="dynamic",
                                                                           scene="street"), street_depth)
    assert seen_on_street == {"paint_car", "paint_walker"}   # the street does get both


def test_static_and_dynamic_kinds_vary_by_video_and_are_stored():
    for kind in props.SCENES:
        for sub in ("static", "dynamic"):
            specs = [perturb.static_spec(f"v{i}", sub, scene=kind) for i in range(40)]
            styles = {s.params["style"] for s in specs}
            assert all(s.params["scene"] == kind for s in specs)
            assert styles == set(props.KINDS[sub][kind]), (kind, sub, styles)
    assert {s for k in props.SCENES for s in props.KINDS["static"][k]} >= {"smudge", "raindrop", "edge", "plant",
                                                                            "hand"}


def test_the_scene_is_part_of_the_spec_and_regenerates_exactly():
    clip, depth = synthetic.sample_clip(6, 64, 64)
    for sub in ("static", "dynamic"):
        spec = perturb.static_spec("clip-7", sub, scene="street")
        again = perturb.PerturbSpec.from_dict(json.loads(spec.to_json()))
        assert again.params == spec.params and again.params["scene"] == "street"
        assert np.array_equal(perturb.apply(clip, spec, depth), perturb.apply(clip, again, depth))
        auto = perturb.static_spec("clip-7", sub)   # "auto": resolved from the same frames every time
        assert auto.params["scene"] == "auto"
        assert np.array_equal(perturb.apply(clip, auto, depth), perturb.apply(clip, auto, depth))
    with pytest.raises(ValueError, match="unknown scene"):
        perturb.static_spec("v", "static", scene="underwater")


# ----------------------------------------------------------------------------- sizes the depth allows

def _rows(mask):
    ys = np.nonzero(mask.any(1))[0]
    return (int(ys[0]), int(ys[-1])) if len(ys) else None


@pytest.mark.parametrize("kind", ["bird", "drone"])
def test_a_flyer_is_never_taller_than_its_distance_allows(kind):
    pytest.importorskip("skimage")
    clip = synthetic.photo_clip("grass", 8, 192)
    metres = {"bird": 0.3, "drone": 0.18}[kind]
    for nearness in (0.45, 0.7, 1.0):
        z = 1.0 + 6.0 * (1.0 - nearness)   # its distance in metres (the knob's documented meaning)
        allowed = 192 * metres / (z * 2 * math.tan(math.radians(35)))
        spec = perturb.PerturbSpec("dynamic", seed=5, params={"scene": "aerial", "style": kind, "nearness": nearness})
        _, C = perturb.masks(clip, spec)
        def heights(level, C=C):   # the extent of C > level in frames where it is not cut by the top or bottom
            return [r[1] - r[0] + 1 for c in C if (r := _rows(c > level)) and 0 < r[0] and r[1] < 191]

        assert max(heights(0.5)) <= allowed + 2, (kind, nearness, heights(0.5), allowed)   # half-max: its edge
        assert max(heights(0.1)) >= 0.5 * allowed, (kind, nearness, heights(0.1), allowed)   # it is drawn at all


def _sky_over_ground(T=8, H=160, W=160):
    """A grey ground under a clear blue sky that ends at 0.3 H: the horizon is that row."""
    clip = np.full((T, H, W, 3), 150, np.uint8)
    clip[:, :int(0.3 * H)] = (90, 140, 215)
    return clip


@pytest.mark.parametrize("style,metres", [("pedestrian", 1.75), ("vehicle", 1.45)])
def test_a_ground_actor_is_never_taller_than_its_contact_row_allows(style, metres):
    """A pinhole 1.5 m above flat ground: an object of height h standing at the row y is h / 1.5 (y - horizon) px
    tall. Measured on the solid body (C > 0.95: not the soft edge or the contact shadow)."""
    H, horizon = 160, 0.3 * 160
    clip = _sky_over_ground(H=H, W=H)
    for seed, nearness in ((0, 0.45), (1, 0.7), (2, 0.85), (3, 1.0)):
        spec = perturb.PerturbSpec("dynamic", seed=seed, params={"style": style, "nearness": nearness,
                                                                 "scene": "street"})
        _, C = perturb.masks(clip, spec)
        for c in C:
            r = _rows(c > 0.95)
            if r is None or r[1] >= H - 1 or not (c > 0.95)[:, 2:-2].any():
                continue
            top, low = r
            assert low - top + 1 <= metres / 1.5 * (low + 3 - horizon) + 2, (style, seed, top, low)


def test_on_the_street_walkers_and_cars_stand_on_the_ground():
    """With the street's true depth, the lowest solid pixel of a walker or a car is on ground: where it is inside
    the frame, the true depth there recedes upward (a few rows above is farther than a few rows below); else the
    actor is nearer than the nearest ground in view, its feet below the lower edge."""
    clip, depth = synthetic.sample_clip(8, 160, 160)
    checked = 0
    for seed, eta in ((0, 0.0), (1, 0.2), (2, 0.4), (3, 0.6), (4, 0.8)):
        for style in ("pedestrian", "vehicle"):
            spec = perturb.PerturbSpec("dynamic", eta=eta, seed=seed, params={"style": style, "scene": "street"})
            _, C = perturb.masks(clip, spec, depth)
            for t, c in enumerate(C):
                ys, xs = np.nonzero(c > 0.95)
                if len(ys) < 20 or xs.min() <= 1 or xs.max() >= 158:
                    continue
                low = int(ys.max())
                if low >= 158:
                    continue
                cols = xs[ys >= low - 2]
                assert np.median(depth[t, low - 6, cols]) > np.median(depth[t, min(low + 6, 159), cols]), (style, seed)
                checked += 1
    assert checked >= 20


def test_a_ground_actor_walks_behind_what_is_nearer():
    """A post 0.3 m from the lens (columns 70-89 of the true depth) hides a walker or a car crossing the street
    behind it, on every frame, while the same actor without the post is drawn over those columns, and with it
    is still drawn on either side (the whole crossing, not the whole actor, is hidden)."""
    clip, depth = synthetic.sample_clip(8, 160, 160)
    post = depth.copy()
    post[:, :, 70:90] = 0.3
    for style in ("pedestrian", "vehicle"):
        for eta in (0.3, 1.0):   # its contact on the ground in view, and (a walker at 1.0) below the lower edge
            spec = perturb.PerturbSpec("dynamic", eta=eta, seed=0, params={"style": style, "scene": "street"})
            _, open_ = perturb.masks(clip, spec, depth)
            _, hidden = perturb.masks(clip, spec, post)
            assert open_[:, :, 72:88].max() > 0.5, (style, eta)
            assert hidden[:, :, 72:88].max() < 0.02, (style, eta)
            assert max(hidden[:, :, :60].max(), hidden[:, :, 100:].max()) > 0.5, (style, eta)


# ----------------------------------------------------------------------------- static kinds in the clip's light

def _cast(clip, gains):
    return np.clip(clip.astype(np.float32) * np.float32(gains), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("style", ["edge", "plant", "hand"])
def test_a_static_occluder_is_shaded_from_the_clip(style):
    pytest.importorskip("skimage")
    base = synthetic.photo_clip("coffee", 4, 128)
    spec = perturb.PerturbSpec("static", seed=2, params={"scene": "indoor", "style": style})
    _, C = perturb.masks(base, spec)
    solid = C[0] > 0.9
    assert solid.mean() > 0.02

    def colour(clip):
        return perturb.apply(clip, spec)[0][solid].astype(np.float32).mean(0)

    warm, cool = colour(_cast(base, (1.15, 1.0, 0.7))), colour(_cast(base, (0.7, 1.0, 1.15)))
    def temperature(c):   # red over blue, in chromaticity
        return (c[0] - c[2]) / c.sum()

    assert temperature(warm) > temperature(cool) + 0.03, (style, warm, cool)   # the clip's colour temperature
    dark, bright = colour(_cast(base, (0.4, 0.4, 0.4))), colour(base)
    assert dark.mean() < 0.75 * bright.mean(), (style, dark, bright)   # and its brightness


def test_a_static_occluder_is_softer_on_a_blurrier_clip():
    pytest.importorskip("skimage")
    sharp = synthetic.photo_clip("astronaut", 4, 160)
    blurry = np.stack([cv2.GaussianBlur(f, (0, 0), 3.0) for f in sharp])
    assert props.softness(blurry[0]) > props.softness(sharp[0]) + 1.0
    spec = perturb.PerturbSpec("static", seed=1, eta=0.3, params={"scene": "indoor", "style": "hand"})

    def edge_px(clip):   # pixels where the layer is neither clear nor solid: the width of its soft edge
        _, C = perturb.masks(clip, spec)
        return int(((C[0] > 0.05) & (C[0] < 0.6)).sum())

    assert edge_px(blurry) > 1.3 * edge_px(sharp)


def test_a_user_clip_gets_its_scene_named_in_the_spec(tmp_path, capsys):
    """with_scene resolves "auto" as apply does (the same pixels), and the CLI prints the spec with its scene."""
    pytest.importorskip("skimage")
    clip = synthetic.photo_clip("gravel", 6, 96)
    for sub in ("static", "dynamic"):
        auto = perturb.PerturbSpec(sub, seed=9)
        named = perturb.with_scene(auto, clip)
        assert named.params["scene"] == "aerial" and named.params["style"] in props.KINDS[sub]["aerial"]
        assert np.array_equal(perturb.apply(clip, auto), perturb.apply(clip, named))
    assert perturb.with_scene(perturb.PerturbSpec("fog"), clip).params == perturb.PerturbSpec("fog").params
    out = tmp_path / "dyn.mp4"
    perturb.main(["--subtype", "dynamic", "--scene", "indoor", "--size", "64", "--frames", "4", "--out", str(out),
                  "--depth-model", "proxy"])
    printed = capsys.readouterr().out
    assert '"scene":"indoor"' in printed and '"style":"pedestrian"' in printed
