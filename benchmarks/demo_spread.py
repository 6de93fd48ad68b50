"""The CPU demo's figures over seeds: how far each printed figure moves when only the run's randomness changes (a
stand-in for another CPU's float rounding, which sends the same seed down another path).

    python benchmarks/demo_spread.py --out /tmp/spread [--seeds 0,1,2,3,4] [--write]   # ~7 minutes a seed, 2 cores

For each seed: ``python train.py --out OUT/seed<K> --seed K`` (the tiny model and the synthetic benchmark built once,
by seed 0's run, and copied: every seed starts from the same weights on the same questions), then
``python eval_pvrbench.py`` on its final weights and its benchmark. A seed whose run and evaluation are done is
skipped, so the command resumes. Prints each figure per seed and its range (max - min, in points); ``--write`` puts
the ranges and each seed's figures into docs/results/demo_range.json (the README's ranges).
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from machinery import runtime  # noqa: E402

DEMO_RANGE = ROOT / "docs" / "results" / "demo_range.json"
DEMO_STAGES = (("after SFT", "after_sft"), ("after RL", "after"))


def demo_figures(summary):
    """The demo's printed figures by name ("after RL, clean", ...) from its summary.json."""
    return {f"{name}, {k}": summary[key][k] for name, key in DEMO_STAGES if summary.get(key)
            for k in ("clean", "perturbed")}


def same_config(summary, run, seed, train_args):
    """Whether a finished seed was trained as the demo trains now: its summary's config against train.py's."""
    import train

    now = vars(train.parse_args(["--out", str(run), "--seed", str(seed), *train_args]))
    return all(summary["config"].get(k) == now[k] for k in (*train.DEMO, "seed", "demo_clips", "mode"))


def run_seed(out, seed, train_args=()):
    """{figure: value} of one seed: the demo's table (demo_figures) and the evaluation's Orig. and Avg."""
    run, evaluated = out / f"seed{seed}", out / f"eval{seed}"
    if (run / "summary.json").is_file():
        if not same_config(json.loads((run / "summary.json").read_text()), run, seed, train_args):
            raise SystemExit(f"{run} was trained with another configuration than the demo's now (train.DEMO, "
                             f"--train-args): give another --out")
    else:
        if seed and not (run / "tiny").exists():   # the first seed's model and benchmark
            for part in ("tiny", "synthetic"):
                shutil.copytree(out / "seed0" / part, run / part)
        subprocess.run([sys.executable, "train.py", "--out", str(run), "--seed", str(seed), *train_args], cwd=ROOT,
                       check=True, stdout=subprocess.DEVNULL)
    if not any(evaluated.glob("*/*_results.json")):
        subprocess.run([sys.executable, "eval_pvrbench.py", "--model", str(run / "final"), "--benchmark",
                        f"synthetic={run / 'synthetic'}", "--out", str(evaluated)], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
    summary = json.loads((run / "summary.json").read_text())
    results = sorted(evaluated.glob("*/*_results.json"))[-1]
    accuracy = json.loads(results.read_text())["results"]["pvrbench"]["accuracy"]
    return demo_figures(summary) | {"eval Orig.": accuracy["orig"], "eval Avg.": accuracy["avg"]}


def report(per_seed):
    """{figure: [min, max]} over the seeds, each printed with its range in points."""
    ranges = {}
    for name in next(iter(per_seed.values())):
        values = [figures[name] for figures in per_seed.values()]
        ranges[name] = [min(values), max(values)]
        print(f"{name}: {min(values):.3f}-{max(values):.3f} over {len(values)} seeds, range "
              f"{100 * (max(values) - min(values)):.1f} points")
    return ranges


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="a folder for the runs (kept: the command resumes from it)")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--train-args", default="", help="more train.py flags, e.g. '--sft-epochs 5' (a candidate "
                    "configuration; --write is refused with them: the range is the demo's own)")
    ap.add_argument("--write", action="store_true", help="write the ranges to docs/results/demo_range.json")
    args = ap.parse_args(argv)
    out, seeds, train_args = Path(args.out), [int(s) for s in args.seeds.split(",")], shlex.split(args.train_args)
    if args.write and train_args:
        ap.error("--write measures the demo as it is: drop --train-args")
    out.mkdir(parents=True, exist_ok=True)
    t0, per_seed = time.perf_counter(), {}
    for seed in sorted(seeds):   # (seed 0 first: it builds the model and the benchmark the others copy)
        per_seed[seed] = run_seed(out, seed, train_args)
        print(f"seed {seed}: " + ", ".join(f"{k} {v:.3f}" for k, v in per_seed[seed].items()), flush=True)
    ranges = report(per_seed)
    print(f"widest range: {100 * max(hi - lo for lo, hi in ranges.values()):.1f} points "
          f"({time.perf_counter() - t0:.0f} s)")
    if args.write:
        record = {"about": "the CPU demo's figures over seeds (benchmarks/demo_spread.py)", "seeds": seeds,
                  "ranges": ranges, "per_seed": {str(s): v for s, v in per_seed.items()},
                  "date": time.strftime("%Y-%m-%d"), "git_commit": runtime.versions().get("git_commit")}
        DEMO_RANGE.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {DEMO_RANGE.relative_to(ROOT)}")   # no machine path in the recorded figure


if __name__ == "__main__":
    main()
