"""The CPU demo's figures: `python train.py --out OUT/rova` from a fresh folder (or `--run`, a finished demo run, e.g.
demo_spread.py's seed 0: `python train.py --seed 0` is the demo), then `python eval_pvrbench.py` on its final weights
and its synthetic benchmark; prints the demo's before/after table and its curriculum windows, then the evaluation's
Table 2 row with its legend and collapse warning (docs/RESULTS.md's demo-spread block shows seed 0's among the others).

    python experiments/demo_figures.py --out /tmp/demo     # ~10 minutes on 2 cores
    python experiments/demo_figures.py --out /tmp/demo --run runs/demo_spread/rova/seed0   # ~30 s
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from machinery.training import report, runs  # noqa: E402


def printed(run):
    """What `python train.py` printed at the end of `run`: the table and the windows, from its summary and log."""
    summary = json.loads((run / "summary.json").read_text())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runs.print_table(summary, summary["config"]["mode"])
        report.print_windows(report.windows(report.rl_records(run / "log.jsonl")), summary["config"]["mode"])
    return out.getvalue()


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="a fresh folder for the demo's run (OUT/rova) and its evaluation")
    ap.add_argument("--run", default="", help="a finished demo run to show instead of training one")
    args = ap.parse_args(argv)
    run = Path(args.run) if args.run else Path(args.out) / "rova"
    if not args.run:
        subprocess.run([sys.executable, "train.py", "--out", str(run)], cwd=ROOT, capture_output=True, text=True,
                       check=True)
    seed = json.loads((run / "summary.json").read_text())["config"]["seed"]
    print(f"python train.py --seed {seed}:" if args.run else "python train.py:")
    print(printed(run), end="")
    ev = subprocess.run([sys.executable, "eval_pvrbench.py", "--model", str(run / "final"), "--benchmark",
                         f"synthetic={run / 'synthetic'}", "--out", str(Path(args.out) / "eval")], cwd=ROOT,
                        capture_output=True, text=True, check=True).stdout
    table = next((Path(args.out) / "eval").glob("*/table.md")).read_text()
    print("python eval_pvrbench.py (table.md):")
    print(table.rstrip("\n"))
    print("".join(line for line in ev.splitlines(True) if line.startswith("synthetic:")), end="")


if __name__ == "__main__":
    main()
