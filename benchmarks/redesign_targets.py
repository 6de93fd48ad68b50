"""The layout's measured targets (docs/DESIGN.md, "Layout"): lines per core file, of the six stage scripts and of
the whole core; the largest cyclomatic complexity in the core (radon, when installed: it is a measuring tool,
not a dependency, e.g. `python -m venv /tmp/radon && /tmp/radon/bin/pip install radon`, then `--radon
/tmp/radon/bin/radon`); the lines of RL.step; the options train.py's --help lists; the core's import edges
into extensions/.

    python benchmarks/redesign_targets.py [--radon PATH]
"""
from __future__ import annotations

import argparse
import ast
import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
STAGES = ("perturb.py", "judge.py", "buffer.py", "grpo.py", "train.py", "eval_pvrbench.py")


def lines(path):
    return len(path.read_text().splitlines())


def core_files():
    return sorted(ROOT.glob("*.py"))


def import_edges(files):
    out = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            out += [(p.name, n) for n in names if n.split(".")[0] == "extensions"]
    return out


def complexity(radon, files):
    """(the largest CC in the files, the blocks above 20) by `radon cc -s`."""
    out = subprocess.run([radon, "cc", "-s", "-n", "A", *map(str, files)], capture_output=True, text=True,
                         check=True).stdout
    blocks = [(int(m.group(2)), m.group(1)) for m in re.finditer(r"^\s+[FMC] \d+:\d+ (\S+) - \w \((\d+)\)", out, re.M)]
    return max(blocks)[0] if blocks else 0, sorted(b for b in blocks if b[0] > 20)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--radon", default=shutil.which("radon") or "", help="the radon executable (default: on PATH)")
    args = ap.parse_args(argv)
    import train  # noqa: E402 - after sys.path

    files = core_files()
    for p in files:
        print(f"lines {p.name:<20} {lines(p):5d}")
    stage = sum(lines(ROOT / s) for s in STAGES)
    print(f"stage_scripts_lines={stage} core_lines={sum(lines(p) for p in files)} "
          f"largest_file={max(files, key=lines).name}:{max(lines(p) for p in files)}")
    step = len(inspect.getsource(train.RL.step).splitlines())
    ap_train = train.runtime.config_parser(train.Config, train.GROUPS)
    flags = len([a for a in ap_train._actions if a.option_strings])
    print(f"rl_step_lines={step} train_help_options={flags} core_to_extension_edges={len(import_edges(files))}")
    if args.radon:
        worst, above = complexity(args.radon, files)
        print(f"core_max_cc={worst} core_blocks_above_20={len(above)}" + "".join(f"\n  {n} {c}" for c, n in above))
    else:
        print("core_max_cc=unmeasured (radon not found: give --radon PATH)")


if __name__ == "__main__":
    main()
