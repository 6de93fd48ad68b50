"""The CPU demo over seeds, ROVA beside standard GRPO: what each does to perturbed and to clean accuracy from the same
SFT start, and how far each figure moves when only the run's randomness changes (a stand-in for another CPU's float
rounding, which sends the same seed down another path).

    python experiments/demo_spread.py --out runs/demo_spread [--seeds 0,1,2,3,4] [--modes rova,grpo] [--write]

For each seed and mode: ``python train.py --out OUT/<mode>/seed<K> --seed K --mode <mode>`` (the demo: SFT, then RL,
then the before/after check), then ``python eval_pvrbench.py`` on its final weights and its benchmark. Both modes of a
seed run the same SFT (the same seed, data and weights: the tiny model and the synthetic benchmark are built once and
copied), and the script stops if their after-SFT figures differ. A run whose training and evaluation are done is
skipped, so the command resumes. Prints each figure per seed and mode and their ranges; ``--write`` puts them into
experiments/results/demo_range.json (docs/RESULTS.md, "The demo", shows them), with the work each run did (steps, optimiser updates, samples
rolled out and trained, rollouts).
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

from machinery import hub  # noqa: E402
from machinery.training import report  # noqa: E402

DEMO_RANGE = ROOT / "experiments" / "results" / "demo_range.json"
STAGES = (("after SFT", "after_sft"), ("after RL", "after"))
MODES = ("rova", "grpo")


def demo_figures(summary):
    """The demo's printed figures by name ("after RL, clean", ..., "after SFT, c AUROC") from its summary.json."""
    out = {f"{name}, {k}": summary[key][k] for name, key in STAGES if summary.get(key) for k in ("clean", "perturbed")}
    return out | {f"{name}, c AUROC": summary[key].get("c_auroc") for name, key in STAGES if summary.get(key)}


def work(run, summary):
    """What a run's RL did (its log.jsonl): steps, optimiser updates, samples rolled out (fresh and promoted), groups
    trained, rollouts generated (G per sample and branch: clean and perturbed in the dual-branch modes)."""
    recs, cfg = report.rl_records(run / "log.jsonl"), summary["config"]
    promoted = sum(r.get("promoted_trained", 0) for r in recs)
    samples = int(sum(r.get("samples", 0) for r in recs) + promoted)
    branches = 2 if cfg["mode"] in ("rova", "dual") else 1
    return {"steps": len(recs), "updates": int(recs[-1].get("updates", 0)) if recs else 0, "samples": samples,
            "trained": int(sum(r.get("trained", r.get("selected", 0)) for r in recs)),
            "rollouts": samples * cfg["group_size"] * branches}


def same_config(summary, run, seed, mode):
    """Whether a finished run was trained as the demo trains now: its summary's config against train.py's."""
    import train

    now = vars(train.parse_args(["--out", str(run), "--seed", str(seed), "--mode", mode]))
    return all(summary["config"].get(k) == now[k] for k in (*train.DEMO, "seed", "mode"))


def run_one(out, seed, mode):
    """{figure: value} of one run, the demo's table (demo_figures) and the evaluation's Orig. and Avg., and its work."""
    run, evaluated = out / mode / f"seed{seed}", out / mode / f"eval{seed}"
    if (run / "summary.json").is_file():
        if not same_config(json.loads((run / "summary.json").read_text()), run, seed, mode):
            raise SystemExit(f"{run} was trained with another configuration than the demo's now (train.DEMO): "
                             f"give another --out")
    else:
        first = next((p for p in sorted(out.glob("*/seed*")) if (p / "synthetic" / "summary.json").is_file()), None)
        if first is not None and not (run / "tiny").exists():   # every run: the first one's model and benchmark
            for part in ("tiny", "synthetic"):
                shutil.copytree(first / part, run / part)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "train.py", "--out", str(run), "--seed", str(seed), "--mode", mode], cwd=ROOT,
                       check=True, stdout=subprocess.DEVNULL)
        (run / "wall_s.json").write_text(json.dumps(time.perf_counter() - t0))
    summary = json.loads((run / "summary.json").read_text())
    if not any(evaluated.glob("*/*_results.json")):   # (at the intensities the demo trained and checked at)
        subprocess.run([sys.executable, "eval_pvrbench.py", "--model", str(run / "final"), "--benchmark",
                        f"synthetic={run / 'synthetic'}", "--eta", summary["config"]["eta"], "--out", str(evaluated)],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    results = sorted(evaluated.glob("*/*_results.json"))[-1]
    accuracy = json.loads(results.read_text())["results"]["pvrbench"]["accuracy"]
    wall = json.loads((run / "wall_s.json").read_text()) if (run / "wall_s.json").is_file() else None
    return (demo_figures(summary) | {"eval Orig.": accuracy["orig"], "eval Avg.": accuracy["avg"]},
            work(run, summary) | {"wall_s": wall}, summary["config"]["demo_families"].split(","))


def changes(figures):
    """What RL did, per run: the perturbed gain and the clean change over the after-SFT start, and the start's gap."""
    return {"RL gain, perturbed": figures["after RL, perturbed"] - figures["after SFT, perturbed"],
            "RL change, clean": figures["after RL, clean"] - figures["after SFT, clean"],
            "after SFT, clean - perturbed": figures["after SFT, clean"] - figures["after SFT, perturbed"]}


def check_same_start(per_mode, seed):
    starts = {m: {k: v for k, v in per_mode[m][seed].items() if k.startswith("after SFT")} for m in per_mode}
    if len({json.dumps(s, sort_keys=True) for s in starts.values()}) > 1:
        raise SystemExit(f"seed {seed}: the modes' after-SFT figures differ ({starts}): not the same SFT start")


def report_ranges(per_seed, mode):
    """{figure: [min, max, mean]} over the seeds, each printed with its range in points."""
    ranges = {}
    for name in next(iter(per_seed.values())):
        values = [figures[name] for figures in per_seed.values() if figures[name] is not None]
        if values:
            ranges[name] = [min(values), max(values), sum(values) / len(values)]
            print(f"{mode:>5} {name}: mean {ranges[name][2]:.3f}, {min(values):.3f} to {max(values):.3f} over "
                  f"{len(values)} seeds (range {100 * (max(values) - min(values)):.1f} points)")
    return ranges


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="a folder for the runs (kept: the command resumes from it)")
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--modes", default=",".join(MODES), help="train.py modes, each from the same SFT start per seed")
    ap.add_argument("--write", action="store_true", help="write the figures to experiments/results/demo_range.json")
    args = ap.parse_args(argv)
    out, seeds, modes = Path(args.out), [int(s) for s in args.seeds.split(",")], args.modes.split(",")
    out.mkdir(parents=True, exist_ok=True)
    t0, per_mode, works, families = time.perf_counter(), {m: {} for m in modes}, {m: {} for m in modes}, None
    for seed in sorted(seeds):
        for mode in modes:
            figures, works[mode][seed], families = run_one(out, seed, mode)
            per_mode[mode][seed] = figures | changes(figures)
            print(f"seed {seed} {mode}: " + ", ".join(f"{k} {v:.3f}" for k, v in per_mode[mode][seed].items()
                                                      if v is not None), flush=True)
        check_same_start(per_mode, seed)
    ranges = {mode: report_ranges(per_mode[mode], mode) for mode in modes}
    wall = time.perf_counter() - t0
    print(f"{wall:.0f} s")
    if args.write:
        record = {"about": "the CPU demo over seeds, each mode from the same SFT start per seed "
                           "(experiments/demo_spread.py)", "command": "python experiments/demo_spread.py " +
                  shlex.join(argv if argv is not None else sys.argv[1:]), "seeds": seeds, "families": families,
                  "modes": {m: {"per_seed": {str(s): per_mode[m][s] | {"work": works[m][s]} for s in seeds},
                                "ranges": ranges[m]} for m in modes},
                  "wall_s": sum(w["wall_s"] or 0 for m in modes for w in works[m].values()),
                  "date": time.strftime("%Y-%m-%d"), "git_commit": hub.versions().get("git_commit")}
        DEMO_RANGE.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {DEMO_RANGE.relative_to(ROOT)}")   # no machine path in the recorded figure


if __name__ == "__main__":
    main()
