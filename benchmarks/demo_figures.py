"""The CPU demo's figures: `python train.py --out OUT` from a fresh folder, then `python eval_pvrbench.py` on its
final weights and its synthetic benchmark; prints the demo's before/after table, then the evaluation's Table 2
row with its legend and collapse warning (docs/MEASURED.md shows both: benchmarks/figures.py's `demo` block).

    python benchmarks/demo_figures.py --out /tmp/demo     # ~10 minutes on 2 cores
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="a fresh folder for the demo's run (OUT/rova) and its evaluation")
    args = ap.parse_args(argv)
    run = Path(args.out) / "rova"
    train = subprocess.run([sys.executable, "train.py", "--out", str(run)], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout
    print("python train.py:")
    print("".join(line for line in train.splitlines(True) if line.startswith(("accuracy on", "  "))))
    ev = subprocess.run([sys.executable, "eval_pvrbench.py", "--model", str(run / "final"), "--benchmark",
                         f"synthetic={run / 'synthetic'}", "--out", str(Path(args.out) / "eval")], cwd=ROOT,
                        capture_output=True, text=True, check=True).stdout
    table = (Path(args.out) / "eval" / "rova-final" / "table.md").read_text()
    print("python eval_pvrbench.py (table.md):")
    print(table.rstrip("\n"))
    print("".join(line for line in ev.splitlines(True) if line.startswith("synthetic:")), end="")


if __name__ == "__main__":
    main()
