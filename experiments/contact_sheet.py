"""Contact sheets of the corruption engine on real photographs and on the procedural street clip.

    python experiments/contact_sheet.py --sheet photo  --out docs/img/contact_photo.png
    python experiments/contact_sheet.py --sheet street --out docs/img/contact_street.png
    python experiments/contact_sheet.py --sheet photo --engine /tmp/before-wt/perturb.py --out before.png

A sheet is one section per (clip, eta). A section shows the clip's middle frame clean, the depth the
engine used (dark = near, bright = far: the clip's true depth, normalised as the engine does, or its depth
proxy), the strength maps C of fog and shadow (the layers where fixed-row bands and streaks would show), and
the middle frame under each registered subtype (Table 8's twelve), each with PVRBench's static spec of
(--video-id, subtype) at that eta (the scene kind "auto": inferred from the depth), then every occluder kind of
the clip's scene (machinery/corruption/props.py: KINDS; an engine before them: static object, smear; dynamic pedestrian,
vehicle), with the spec's seed.

Clips (--sheet): `photo` = a smooth pan and zoom over scikit-image's bundled outdoor photographs
(synthetic.photo_clip: `rocket`, a launch pad under a dusk sky, and `camera`, a lawn under a grey sky;
no download; the engine's depth proxy, as a real video gets); `closeup` = the same over close-ups without sky
(`coffee`, `chelsea`, `astronaut`); `topdown` = over surfaces that read as views from above (`grass`,
`gravel`, `brick`); `street` = synthetic.sample_clip with its true depth, then the same clip with the proxy.
--clips picks sections explicitly (any of synthetic.PHOTO_KINDS, street, street-proxy).

--engine PATH renders with another perturb.py (e.g. a git worktree of an older commit, for before/after
pictures); the clips always come from this checkout's synthetic.py.
"""
import argparse
import os
import sys

import cv2
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]
from bench_perturb import load_engine  # noqa: E402  (another checkout's engine, by path)
from machinery.datasets import synthetic  # noqa: E402

SHEETS = {"photo": ("rocket", "camera"), "street": ("street", "street-proxy"),
          "closeup": ("coffee", "chelsea", "astronaut"), "topdown": ("grass", "gravel", "brick")}
SCENE_OF = {"sky": "street", "close-up": "indoor", "top-down": "aerial"}  # a photo's kind -> the scene it stands for
CLIPS = (*synthetic.PHOTO_KINDS, "street", "street-proxy")
OLD_STYLES = {"static": ("object", "smear"), "dynamic": ("pedestrian", "vehicle")}  # an engine before scene kinds
LABEL_H, TITLE_H, COLS = 16, 20, 9


def make_clip(name, frames, size):
    """(frames uint8 [T,S,S,3], true depth or None, a description) of one section's clip."""
    if name in synthetic.PHOTO_KINDS:
        return (synthetic.photo_clip(name, frames, size), None,
                f"photo '{name}' (skimage, {synthetic.PHOTO_KINDS[name]}), pan+zoom, depth proxy")
    clip, depth = synthetic.sample_clip(frames, size, size)
    if name == "street":
        return clip, depth, "synthetic street, true depth"
    return clip, None, "synthetic street, depth proxy"


def scene_of(name):
    """The scene kind a section's clip stands for (its occluder kinds are shown)."""
    return SCENE_OF[synthetic.PHOTO_KINDS[name]] if name in synthetic.PHOTO_KINDS else "street"


def depth_used(engine, clip, depth, spec, t):
    """The depth map the engine conditions its effects on at frame t, [H,W] in [0,1]: its own context's."""
    return engine.scene.Context(clip, spec, depth, engine.kernels.HOST).depth(t)


def styles(engine, sub, scene):
    """[(params, label)] of the occluder kinds shown for `sub` in `scene` (each kind of the engine's)."""
    props = getattr(engine, "props", None)
    if props is None:
        return [({"style": s}, s) for s in OLD_STYLES[sub]]
    return [({"scene": scene, "style": s}, f"{scene[:3]}/{s}") for s in props.KINDS[sub][scene]]


def grey(m):
    """A [0,1] map as an RGB tile (magma: dark = 0, bright = 1)."""
    u8 = np.clip(np.round(255 * m), 0, 255).astype(np.uint8)
    return cv2.cvtColor(cv2.applyColorMap(u8, cv2.COLORMAP_MAGMA), cv2.COLOR_BGR2RGB)


def section_tiles(engine, clip, depth, eta, video_id, scene):
    """[(label, RGB tile)] of one section: clean, depth, C of fog and shadow, every subtype, every occluder kind."""
    t = len(clip) // 2
    specs = {sub: engine.static_spec(video_id, sub, eta=eta) for sub in engine.EFFECTS}
    tiles = [("clean", clip[t]), ("depth used", grey(depth_used(engine, clip, depth, specs["fog"], t)))]
    for sub in ("fog", "shadow"):
        _, C = engine.masks(clip, specs[sub], depth)
        tiles.append((f"{sub} C", grey(C[t])))
    for sub, spec in specs.items():
        tiles.append((f"{engine.CATEGORY_OF[sub][:5]}/{sub}", engine.apply(clip, spec, depth)[t]))
    for sub in OLD_STYLES:
        for params, label in styles(engine, sub, scene):
            spec = engine.PerturbSpec(sub, eta=eta, seed=specs[sub].seed, params=params)
            tiles.append((f"{sub[:3]} {label}", engine.apply(clip, spec, depth)[t]))
    return tiles


def render(sections, tile, path, colors):
    """Save the sheet: per section a title line, then its tiles COLS to a row, each labelled above."""
    from PIL import Image, ImageDraw, ImageFont

    rows = sum(-(-len(tiles) // COLS) for _, tiles in sections)
    sheet = Image.new("RGB", (COLS * tile, len(sections) * TITLE_H + rows * (tile + LABEL_H)), "white")
    draw = ImageDraw.Draw(sheet)
    font, bold = ImageFont.load_default(size=12), ImageFont.load_default(size=14)
    y = 0
    for title, tiles in sections:
        draw.text((4, y + 2), title, fill=(0, 0, 0), font=bold)
        y += TITLE_H
        for i, (label, img) in enumerate(tiles):
            x, yy = (i % COLS) * tile, y + (i // COLS) * (tile + LABEL_H)
            draw.text((x + 3, yy + 1), label, fill=(30, 30, 30), font=font)
            small = cv2.resize(img, (tile, tile), interpolation=cv2.INTER_AREA)
            sheet.paste(Image.fromarray(small), (x, yy + LABEL_H))
        y += -(-len(tiles) // COLS) * (tile + LABEL_H)
    if colors:
        sheet = sheet.quantize(colors, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).convert("RGB")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    sheet.save(path, optimize=True)
    return sheet.size


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output .png")
    ap.add_argument("--sheet", choices=sorted(SHEETS), default="photo", help="preset sections (default photo)")
    ap.add_argument("--clips", nargs="+", choices=CLIPS, help="sections' clips instead of --sheet's")
    ap.add_argument("--eta", type=float, nargs="+", default=[0.7], help="intensities, a section each (default 0.7)")
    ap.add_argument("--video-id", default="contact-sheet", help="static_spec's video id (the seeds)")
    ap.add_argument("--frames", type=int, default=16, help="frames per clip (the middle one is shown)")
    ap.add_argument("--size", type=int, default=224, help="side of the clips the engine corrupts")
    ap.add_argument("--tile", type=int, default=150, help="side of a tile on the sheet")
    ap.add_argument("--colors", type=int, default=0, help="quantise the PNG to this many colours (0: no)")
    ap.add_argument("--engine", help="path of another perturb.py to render with (before/after pictures)")
    args = ap.parse_args(argv)
    engine = load_engine(args.engine)
    sections = []
    for name in args.clips or SHEETS[args.sheet]:
        clip, depth, what = make_clip(name, args.frames, args.size)
        for eta in args.eta:
            title = f"{what}; eta={eta}, static_spec({args.video_id!r}, subtype); frame {len(clip) // 2}"
            sections.append((title, section_tiles(engine, clip, depth, eta, args.video_id, scene_of(name))))
    w, h = render(sections, args.tile, args.out, args.colors)
    print(f"wrote {args.out}: {len(sections)} sections, {w}x{h}, {os.path.getsize(args.out) / 1e6:.2f} MB "
          f"(engine {engine.__file__})")


if __name__ == "__main__":
    main()
