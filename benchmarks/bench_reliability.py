"""How well reliability.py's scores rank corrupted frames (Robust-TO): the Spearman rank correlation
between a corruption's true intensity eta and the disturbance on its axis (and 1 - reliability), per
subtype, over clips of the synthetic benchmark's renderer.

    python benchmarks/bench_reliability.py [--clips 12] [--json OUT.json]

For each clip and subtype the clip is corrupted at eta in {0, 0.25, 0.5, 0.75, 1} (perturb.static_spec,
the same spec seed at every eta) and every frame scored; rho pools the (eta, score) pairs of all frames
of all clips ("pooled") and is also taken per clip ("per-clip median"; its maximum with 5 tied levels
is below 1). The last line is `robust_to_mean_rho=<x>`: the mean pooled rho of 1 - reliability over
Robust-TO's five corruptions (perturb.PROTOCOLS["robust-to"]).
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from machinery.datasets import synthetic  # noqa: E402
import perturb  # noqa: E402
from extensions.robust_to import corruptions  # noqa: E402,F401 - registers motion_blur, noise
from extensions.robust_to import reliability  # noqa: E402

# the axis each corruption should move (None: only the combined reliability is checked)
AXIS = {"motion_blur": "blur", "noise": "noise", "overexposure": "brightness", "static": "occlusion",
        "night": "brightness", "dusk": "brightness", "fog": "brightness", "shadow": None, "dynamic": "occlusion",
        "rain": None, "snow": None, "translation": None, "zoom": None, "rotation": None}
ETAS = (0.0, 0.25, 0.5, 0.75, 1.0)


def ranks(x):
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x))
    r[order] = np.arange(len(x), dtype=np.float64)
    for v in np.unique(x):  # ties get their mean rank
        tie = x == v
        r[tie] = r[tie].mean()
    return r


def spearman(x, y):
    a, b = ranks(x), ranks(y)
    if a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def clips(n, frames=16, size=96):
    """n clips of the synthetic renderer: coloured boxes, a camera turning or going ahead."""
    rng = np.random.default_rng(0)
    out = []
    for k in range(n):
        objs = [{"colour": str(rng.choice(list(synthetic.SYNTH_COLOURS))),
                 "shape": str(rng.choice(list(synthetic.SYNTH_SHAPES))),
                 "pos": (float(rng.uniform(-3, 3)), float(rng.uniform(4, 12)))} for _ in range(4)]
        yaw = (-1, 0, 1)[k % 3] * float(rng.uniform(0.035, 0.05))
        out.append(synthetic.render_synthetic(objs, yaw, float(rng.uniform(0.15, 0.25)), frames, size)[0])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--clips", type=int, default=12)
    ap.add_argument("--subtypes", default="all", help="comma list (default: all 14)")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    subs = list(perturb.EFFECTS) if args.subtypes == "all" else args.subtypes.split(",")
    videos = clips(args.clips)
    rows = {}
    for sub in subs:
        axis = AXIS.get(sub)
        pooled = {"axis": ([], []), "unrel": ([], [])}
        per_clip = {"axis": [], "unrel": []}
        for c, frames in enumerate(videos):
            got = {"axis": ([], []), "unrel": ([], [])}
            for eta in ETAS:
                x = perturb.apply(frames, perturb.static_spec(f"bench-{c}", sub, eta=eta)) if eta > 0 else frames
                d = reliability.disturbance(x)
                vals = {"unrel": 1.0 - reliability.combine(d)}
                if axis:
                    vals["axis"] = d[axis]
                for key, v in vals.items():
                    got[key][0].extend([eta] * len(v))
                    got[key][1].extend(v.tolist())
            for key in got:
                if got[key][0]:
                    pooled[key][0].extend(got[key][0])
                    pooled[key][1].extend(got[key][1])
                    per_clip[key].append(spearman(*got[key]))
        rows[sub] = {"axis": axis}
        for key in ("axis", "unrel"):
            if pooled[key][0]:
                rows[sub][key] = {"pooled": spearman(*pooled[key]),
                                  "per_clip_median": float(np.nanmedian(per_clip[key])),
                                  "mean_by_eta": [float(np.mean([v for e, v in zip(*pooled[key]) if e == eta]))
                                                  for eta in ETAS]}
    print(f"{'subtype':<13} {'axis':<11} {'rho axis':>9} {'(per clip)':>10} {'rho 1-rel':>9} {'(per clip)':>10}   "
          "mean 1-reliability at eta 0 .. 1")
    for sub, r in rows.items():
        a, u = r.get("axis"), r["unrel"]
        ax = (f"{r['axis']['pooled']:9.2f} {r['axis']['per_clip_median']:10.2f}" if isinstance(a, dict)
              else f"{'–':>9} {'':>10}")
        print(f"{sub:<13} {str(r['axis'] if not isinstance(a, dict) else AXIS[sub]):<11} {ax} {u['pooled']:9.2f} "
              f"{u['per_clip_median']:10.2f}   " + " ".join(f"{v:.2f}" for v in u["mean_by_eta"]))
    robust = [rows[s]["unrel"]["pooled"] for s in perturb.PROTOCOLS["robust-to"] if s in rows]
    out = {"clips": args.clips, "etas": ETAS, "subtypes": rows,
           "robust_to_mean_rho": float(np.mean(robust)) if robust else None}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    if robust:
        print(f"robust_to_mean_rho={out['robust_to_mean_rho']:.3f}")
    return out


if __name__ == "__main__":
    main()
