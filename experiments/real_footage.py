"""The corruption engine on footage it was not tuned on: close-ups, surfaces seen from above, scenes under a sky.

    python experiments/real_footage.py [--engine OLD/perturb.py] [--frames 16] [--size 224] [--seeds 3]

Clips: a smooth pan and zoom over each of scikit-image's bundled photographs (synthetic.photo_clip; no download),
by kind (synthetic.PHOTO_KINDS): under a sky (rocket, camera), close-ups without sky (coffee, chelsea,
astronaut), surfaces that read as top-down views (grass, gravel, brick). The depth is the engine's proxy (what a
clip gets without a depth model). Three figures, each a property a reviewer checks by eye:

- **fog band**: the fog's increment per unit of contrast to its airlight, i.e. its layer C = 1 - t (output =
  input + C (airlight - input)), in grey levels (x 255), mean over frames and columns, as a profile over rows; a
  row's prominence is |p(y) - (p(y - k) + p(y + k)) / 2| with k = H / 16 (the row-mean test of
  tests/test_perturb_real.py); the clip's figure is the largest over its interior rows. A homogeneous haze gives
  ~0 whatever the picture; a haze that stops at a straight line gives about half its step. (The increment in
  grey levels itself also follows the picture's own rows: a dark row gains more from the same haze.)
- **floating occluders**: the share of frames in which a dynamic occluder (a walker or a car) is in view, clear
  of the side edges, and its lowest pixel stands neither on the frame's lower edge nor on ground: ground is
  where the depth used recedes upward (its vertical gradient below -0.002 per row over the occluder's columns,
  at the working scale, in this checkout's depth proxy, for every engine measured).
- **shadow blobs**: the connected dark regions of the shadow layer (C above half its clip maximum) that touch no
  frame edge and no depth edge (|grad depth| above 0.02 per pixel at the working scale, within 2 px of the
  region): shadows of nothing.

`--engine PATH` measures another copy of perturb.py (e.g. `git show REV:perturb.py > /tmp/old/perturb.py`)
beside this one, for before/after. Prints one table row per clip and engine, then the summary lines
`fog_band_median= fog_band_max= floating_share= shadow_blobs=` per engine.
"""
import argparse
import sys
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
import perturb  # noqa: E402
from bench_perturb import load_engine  # noqa: E402  (another checkout's engine, by path)
from machinery.corruption import scene  # noqa: E402
from machinery.datasets import synthetic  # noqa: E402


def band(profile, k):
    """|p(y) - (p(y-k) + p(y+k)) / 2| for the interior rows (0 within k of either end)."""
    z = np.zeros_like(profile)
    z[k:-k] = np.abs(profile[k:-k] - 0.5 * (profile[:-2 * k] + profile[2 * k:]))
    return z


def fog_band(engine, clip, seed):
    _, C = engine.masks(clip, engine.PerturbSpec("fog", seed=seed))
    profile = 255 * C.mean((0, 2))   # the share of airlight the fog adds, in grey levels
    return float(band(profile, clip.shape[1] // 16).max())


def _working_depth(clip):
    """This checkout's depth proxy at the engine's working scale (the middle frame at 1/8 size, at least 24 px):
    the reference for "ground" and "depth edges" whichever engine is measured (an older proxy that puts a ground
    plane under a close-up would otherwise vouch for its own occluders)."""
    T, H, W = clip.shape[:3]
    sh, sw = max(24, round(H / 8)), max(24, round(W / 8))
    return scene.depth_proxy(cv2.resize(clip[T // 2], (sw, sh), interpolation=cv2.INTER_AREA))


def floating(engine, clip, seed, style, eta):
    """(frames with the occluder in view, frames where its lowest pixel is on neither the lower edge nor ground)."""
    _, C = engine.masks(clip, engine.PerturbSpec("dynamic", eta=eta, seed=seed, params={"style": style}))
    H, W = clip.shape[1:3]
    d = _working_depth(clip)
    recede = np.diff(d, axis=0)   # d(y + 1) - d(y): negative where depth grows upward (ground)
    shown = bad = 0
    for c in C:
        ys, xs = np.nonzero(c > 0.5)
        if len(ys) < 20 or xs.min() == 0 or xs.max() == W - 1:   # (entering or leaving by a side edge)
            continue
        shown += 1
        low = int(ys.max())
        if low >= H - 2:
            continue
        row = min(int(low * d.shape[0] / H), d.shape[0] - 2)
        cols = slice(int(xs.min() * d.shape[1] / W), int(xs.max() * d.shape[1] / W) + 1)
        if not recede[row, cols].mean() < -0.002:
            bad += 1
    return shown, bad


def shadow_blobs(engine, clip, seed):
    """Dark regions of the shadow layer that touch no frame edge and no depth edge (summed over frames)."""
    _, C = engine.masks(clip, engine.PerturbSpec("shadow", seed=seed))
    H, W = clip.shape[1:3]
    d = cv2.resize(_working_depth(clip), (W, H), interpolation=cv2.INTER_LINEAR)
    gy, gx = np.gradient(d)
    scale = H / max(24, round(H / 8))   # per working-scale pixel
    edge = cv2.dilate((np.hypot(gx, gy) * scale > 0.02).astype(np.uint8), np.ones((5, 5), np.uint8)) > 0
    peak = float(C.max())
    blobs = 0
    for c in C:
        n, labels = cv2.connectedComponents((c > 0.5 * peak).astype(np.uint8)) if peak > 0 else (1, None)
        for k in range(1, n):
            region = labels == k
            ys, xs = np.nonzero(region)
            if ys.min() == 0 or xs.min() == 0 or ys.max() == H - 1 or xs.max() == W - 1:
                continue
            if not edge[cv2.dilate(region.astype(np.uint8), np.ones((5, 5), np.uint8)) > 0].any():
                blobs += 1
    return blobs


def measure(engine, name, frames, size, seeds):
    clip = synthetic.photo_clip(name, frames, size)
    fog = [fog_band(engine, clip, s) for s in range(seeds)]
    occ = [floating(engine, clip, s, style, eta) for s in range(seeds) for style in ("pedestrian", "vehicle")
           for eta in (0.3, 0.5, 0.7)]   # (nearness grows with eta: at 0.7 a walker is often cut by the edge)
    blobs = sum(shadow_blobs(engine, clip, s) for s in range(seeds))
    shown, bad = (sum(x) for x in zip(*occ))
    return {"clip": name, "kind": synthetic.PHOTO_KINDS[name], "fog_band": fog, "occluder_frames": shown,
            "floating_frames": bad, "shadow_blobs": blobs}


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--engine", default="", help="another perturb.py to measure beside this one")
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args(argv)
    engines = {"this": perturb} | ({"other": load_engine(args.engine)} if args.engine else {})
    print("| engine | clip | kind | fog band (grey levels, per seed) | occluder frames floating | shadow blobs |")
    print("|---|---|---|---|---|---|")
    summary = {label: report(label, engine, args) for label, engine in engines.items()}
    for label, line in summary.items():
        print(f"{label}: {line}")


def report(label, engine, args):
    """Print one engine's table rows; return its summary line."""
    rows = [measure(engine, name, args.frames, args.size, args.seeds) for name in synthetic.PHOTO_KINDS]
    for r in rows:
        print(f"| {label} | {r['clip']} | {r['kind']} | {' / '.join(f'{v:.1f}' for v in r['fog_band'])} | "
              f"{r['floating_frames']} of {r['occluder_frames']} | {r['shadow_blobs']} |")
    bands = [v for r in rows for v in r["fog_band"]]
    shown = sum(r["occluder_frames"] for r in rows)
    return (f"fog_band_median={np.median(bands):.1f} fog_band_max={max(bands):.1f} "
            f"floating_share={sum(r['floating_frames'] for r in rows) / max(shown, 1):.3f} "
            f"shadow_blobs={sum(r['shadow_blobs'] for r in rows)}")


if __name__ == "__main__":
    main()
