"""Robustness curves of the demo's models: `eval_pvrbench.py --etas` on seed 0 of demo_spread.py's runs.

    python experiments/demo_curves.py [--runs runs/demo_spread] [--out runs/demo_curves] [--etas 0.3,0.5,0.7,0.9]

The three models of one seed, all from the same SFT start: the start itself (the run's OUT/reference, the policy as
RL began, Eq. 7's KL reference), ROVA's OUT/final and standard GRPO's OUT/final (300 RL steps each,
demo_spread.py). Each is evaluated on the seed's held-out synthetic questions, every question clean and under every
subtype (`--assign all`) at each intensity, greedy, no judge; then `--compare` overlays the curves
(OUT/compare/compare_curves.png, copied to docs/figures/demo_curves.png with --write).

Prints each model's Avg. and category curves, then every subtype's AUC (the area under its curve over the grid,
divided by the grid's width) per model, and the intensity at which each subtype first falls 10 points below clean.
The evaluations resume and are cached like any eval_pvrbench.py run: a rerun recomputes nothing.
"""
import argparse
import json
import shutil
import sys
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import eval_pvrbench as ev  # noqa: E402

MODELS = (("sft-start", "rova/seed0/reference"), ("rova", "rova/seed0/final"), ("grpo", "grpo/seed0/final"))


def evaluate(runs, out, etas):
    """{label: results.json} of each model's sweep (eval_pvrbench.py's own main, its report kept quiet)."""
    results = {}
    bench = runs / "rova" / "seed0" / "synthetic"
    for label, folder in MODELS:
        argv = ["--model", str(runs / folder), "--model-name", label, "--benchmark", f"synthetic={bench}",
                "--etas", etas, "--assign", "all", "--judge", "none", "--out", str(out)]
        with redirect_stdout(StringIO()):
            res = ev.main(argv)
        results[label] = res
    return results


def drop_point(curve, clean, etas, points=0.10):
    """The first intensity at which a curve is `points` below clean ("-" if never)."""
    for e in etas:
        acc = curve[f"{e:g}"]["accuracy"]
        if acc is not None and clean - acc >= points - 1e-9:
            return f"{e:g}"
    return "-"


def report(results, etas):
    lines = []
    for label, res in results.items():
        r = res["results"]
        clean = r["curves"]["clean"]
        lines.append(f"{label}: clean {clean['accuracy']:.3f} (n {clean['n']}); Avg. AUC {r['auc']['avg']:.3f}; "
                     "Avg./Orig. " + ", ".join(f"{e}: {v:.2f}" for e, v in r["relative_robustness"].items()))
        for name in ("avg", "lighting", "occlusion", "camera", "weather"):
            pts = r["curves"][name]
            lines.append(f"  {name:10s} " + "  ".join(f"η={e:g} {pts[f'{e:g}']['accuracy']:.3f}±{pts[f'{e:g}']['se']:.3f}"
                                                   for e in etas))
    labels = list(results)
    lines.append("")
    lines.append("subtype AUC (10-pt drop at η) " + " | ".join(f"{lb:>16s}" for lb in labels))
    subtypes = [s for s in results[labels[0]]["results"]["curves"] if s not in ("clean", "avg", "lighting", "occlusion",
                                                                               "camera", "weather")]
    for sub in subtypes:
        cells = []
        for lb in labels:
            r = results[lb]["results"]
            cells.append(f"{r['auc'][sub]:.3f} ({drop_point(r['curves'][sub], r['curves']['clean']['accuracy'], etas):>3s})")
        lines.append(f"{sub:29s} " + " | ".join(f"{c:>16s}" for c in cells))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default="runs/demo_spread", help="demo_spread.py's --out")
    ap.add_argument("--out", default="runs/demo_curves")
    ap.add_argument("--etas", default="0.3,0.5,0.7,0.9")
    ap.add_argument("--write", action="store_true", help="also docs/figures/demo_curves.png and "
                    "experiments/results/demo_curves.json")
    args = ap.parse_args()
    runs, out = Path(args.runs), Path(args.out)
    etas = ev.etas_arg(args.etas)
    results = evaluate(runs, out, args.etas)
    paths = [sorted((out / label).glob("*_results.json"))[-1] for label in results]
    with redirect_stdout(StringIO()):
        ev.main(["--compare", *map(str, paths), "--out", str(out / "compare")])
    print(f"held-out questions of {runs / 'rova' / 'seed0' / 'synthetic'}, every question clean and under every "
          f"subtype at η in {args.etas} (--assign all), greedy")
    print(report(results, etas))
    if args.write:
        shutil.copyfile(out / "compare" / "compare_curves.png", ROOT / "docs" / "figures" / "demo_curves.png")
        keep = {lb: {k: r["results"][k] for k in ("curves", "auc", "relative_robustness")} | {
            "model": r["config"]["model"], "n_samples": r["n_samples"]} for lb, r in results.items()}
        (ROOT / "experiments" / "results" / "demo_curves.json").write_text(json.dumps(
            {"command": "python experiments/demo_curves.py --write", "etas": list(etas), "models": keep}, indent=1))


if __name__ == "__main__":
    main()
