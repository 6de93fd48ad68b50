"""The figures in docs/ that a script measures, kept equal to that script's output.

Each sits in a marked block of a docs/ page,

    <!-- figures:NAME -->
    ```text
    (the command's output, exactly)
    ```
    <!-- /figures:NAME -->

and BLOCKS says which command writes it. A "live" block is cheap and the same on every machine (line counts,
the memory plan's arithmetic): `--check` runs its command again and fails if the page shows anything else, so
those figures cannot go stale. A "recorded" block varies by machine or takes long (speed, training runs):
`--update NAME` runs its command once and writes the output into the page and into docs/figures/NAME.txt
(with the commit and the date), and `--check` fails if the page's block differs from that file, so it always
shows what the script printed, never a hand edit.

    python benchmarks/figures.py --check            # tests/test_figures.py runs this
    python benchmarks/figures.py --update layout-targets memory-plan
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "docs" / "figures"


@dataclass(frozen=True)
class Block:
    page: str          # the docs/ page that shows it
    command: tuple     # argv after `python`, from the repository root
    live: bool         # checked by running the command again (cheap, machine-independent)
    keep: str = ""     # a regex: only the output's lines that match it (default: all)
    drop: str = ""     # a regex: removed from the lines kept (what varies from run to run, e.g. a duration)


BLOCKS = {
    "layout-targets": Block("docs/MEASURED.md", ("benchmarks/layout_targets.py",), True),
    "layout-lines": Block("docs/DESIGN.md", ("benchmarks/layout_targets.py", "--lines"), True),
    "memory-plan": Block("docs/MEASURED.md", ("benchmarks/memory_plan.py", "--all"), True),
    "memory-plan-7b": Block("docs/MEASURED.md", ("benchmarks/memory_plan.py", "--model", "qwen2.5-vl-7b", "--mode",
                                                 "fsdp", "--gpus", "4"), True),
    "memory-validate": Block("docs/MEASURED.md", ("benchmarks/memory_plan.py", "--validate"), False),
    "synthetic-400": Block("docs/MEASURED.md", ("-m", "machinery.synthetic", "--out", "{tmp}/synthetic", "--n",
                                                "400", "--seed", "0"), False),
    "test-count": Block("docs/MEASURED.md", ("-m", "pytest", "--collect-only", "-q"), True,
                        keep=r"tests collected", drop=r" in [0-9.]+s"),
    "demo": Block("docs/MEASURED.md", ("benchmarks/demo_figures.py", "--out", "{tmp}"), False),
    "bench-perturb": Block("docs/MEASURED.md", ("benchmarks/bench_perturb.py",), False),
    "bench-rollout": Block("docs/MEASURED.md", ("benchmarks/bench_rollout.py",), False),
    "bench-depth": Block("docs/MEASURED.md", ("benchmarks/bench_depth.py",), False),
    "bench-load": Block("docs/MEASURED.md", ("benchmarks/bench_load.py",), False),
    "bench-eval": Block("docs/MEASURED.md", ("benchmarks/bench_eval.py", "--reason"), False),
    "calibrate-judge": Block("docs/MEASURED.md", ("benchmarks/calibrate_judge.py",), False),
    "layout-complexity": Block("docs/MEASURED.md", ("benchmarks/layout_targets.py", "--complexity"), False),
}


def marks(name):
    return f"<!-- figures:{name} -->\n", f"<!-- /figures:{name} -->"


def shown(name):
    """The text the page's block shows (inside its code fence), or None when the page has no such block."""
    block = BLOCKS[name]
    text = (ROOT / block.page).read_text()
    begin, end = marks(name)
    m = re.search(re.escape(begin) + r"```text\n(.*?)```\n" + re.escape(end), text, re.S)
    return m.group(1) if m else None


def run(name):
    """The block's command's output (stdout), run from the repository root ({tmp} in it: a fresh folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [a.replace("{tmp}", tmp) for a in BLOCKS[name].command]
        out = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    block = BLOCKS[name]
    if block.keep:
        out = "".join(re.sub(block.drop, "", line) if block.drop else line for line in out.splitlines(True)
                      if re.search(block.keep, line))
    return out if out.endswith("\n") else out + "\n"


def recorded(name):
    """A recorded block's output, headed by the commit and the date it was measured at."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    return f"# measured at {commit}, {time.strftime('%Y-%m-%d')}: python {' '.join(BLOCKS[name].command)}\n" + run(name)


def write(name, output):
    """The page's block (created at the page's end when missing) and, for a recorded block, its saved file."""
    block = BLOCKS[name]
    page = ROOT / block.page
    text, (begin, end) = page.read_text(), marks(name)
    new = f"{begin}```text\n{output}```\n{end}"
    pattern = re.escape(begin) + r".*?" + re.escape(end)
    page.write_text(re.sub(pattern, lambda _: new, text, flags=re.S) if re.search(pattern, text, re.S)
                    else text.rstrip("\n") + "\n\n" + new + "\n")
    if not block.live:
        SAVED.mkdir(parents=True, exist_ok=True)
        (SAVED / f"{name}.txt").write_text(output)


def problems():
    """What --check finds: a block missing from its page, a live block that differs from its command's output
    now, a recorded one that differs from its saved output."""
    out = []
    for name, block in BLOCKS.items():
        text = shown(name)
        if text is None:
            out.append(f"{block.page}: no block {name} (python benchmarks/figures.py --update {name})")
            continue
        want = run(name) if block.live else (SAVED / f"{name}.txt").read_text()
        if text != want:
            out.append(f"{block.page}: block {name} is stale (python benchmarks/figures.py --update {name})")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if a block differs from what its command prints")
    ap.add_argument("--update", nargs="*", metavar="NAME", help=f"rewrite these blocks (none: all live ones); "
                    f"{', '.join(BLOCKS)}")
    args = ap.parse_args(argv)
    if args.update is not None:
        names = args.update or [n for n, b in BLOCKS.items() if b.live]
        unknown = set(names) - set(BLOCKS)
        if unknown:
            ap.error(f"unknown blocks {sorted(unknown)}; known: {', '.join(BLOCKS)}")
        for name in names:
            write(name, run(name) if BLOCKS[name].live else recorded(name))
            print(f"{BLOCKS[name].page}: {name} written")
    if args.check:
        found = problems()
        print("\n".join(found) or f"figures_current=True blocks={len(BLOCKS)}")
        return 1 if found else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
