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
shows what the script printed, never a hand edit. A section a script writes into the page itself
(docs/RESULTS.md's, from experiments/results/v5.json) is a live block between that script's marks, unfenced.

A figure written outside the blocks (a duration, a size, a rate, a ratio such as 1.3x, a percentage) is a
record of one day's measurement: `--check` also fails where one stands without its date (`undated`), in its
own paragraph, in the paragraph that leads its list or table, or in its section's heading.

    python tools/figures.py --check            # tests/test_figures.py runs this
    python tools/figures.py --update layout-lines memory-plan
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
    marks: tuple = ()  # the block's begin and end lines, when a script writes the page itself (default: NAME's)
    fence: bool = True  # the output shown in a ```text fence (False: as markdown)


BLOCKS = {
    "layout-lines": Block("docs/DESIGN.md", ("tools/layout_targets.py", "--lines"), True),
    "memory-plan": Block("docs/PERFORMANCE.md", ("benchmarks/memory_plan.py", "--all"), True),
    "memory-plan-7b": Block("docs/PERFORMANCE.md", ("benchmarks/memory_plan.py", "--model", "qwen2.5-vl-7b", "--mode",
                                                 "fsdp", "--gpus", "4"), True),
    "memory-validate": Block("docs/PERFORMANCE.md", ("benchmarks/memory_plan.py", "--validate"), False),
    "synthetic-400": Block("docs/DATA.md", ("-m", "machinery.datasets.synthetic", "--out", "{tmp}/synthetic", "--n",
                                                "400", "--seed", "0"), False),
    "test-count": Block("docs/PERFORMANCE.md", ("-m", "pytest", "--collect-only", "-q", "-m", "slow or not slow"), True,
                        keep=r"tests collected", drop=r" in [0-9.]+s"),
    "demo-spread": Block("docs/RESULTS.md", ("experiments/demo_spread.py", "--out", "runs/demo_spread", "--write"),
                         False),
    "demo-curves": Block("docs/RESULTS.md", ("experiments/demo_curves.py", "--write"), False),
    "bench-perturb": Block("docs/PERFORMANCE.md", ("benchmarks/bench_perturb.py",), False),
    "bench-rollout": Block("docs/PERFORMANCE.md", ("benchmarks/bench_rollout.py",), False),
    "bench-depth": Block("docs/PERFORMANCE.md", ("benchmarks/bench_depth.py",), False),
    "bench-load": Block("docs/PERFORMANCE.md", ("benchmarks/bench_load.py",), False),
    "bench-eval": Block("docs/PERFORMANCE.md", ("benchmarks/bench_eval.py", "--reason"), False),
    "calibrate-judge": Block("docs/PERFORMANCE.md", ("experiments/calibrate_judge.py",), False),
    "layout-complexity": Block("docs/DESIGN.md", ("tools/layout_targets.py", "--complexity"), False),
    "results-v5": Block("docs/RESULTS.md", ("experiments/reproduce_v5.py", "--render", "--print"), True,
                        marks=("<!-- reproduce-v5:begin -->", "<!-- reproduce-v5:end -->"), fence=False),
    "vllm-check": Block("docs/PERFORMANCE.md", ("checks/vllm_check.py", "--out", "{tmp}/vllm_check"), False),
    "bench-engine": Block("docs/PERFORMANCE.md", ("benchmarks/bench_engine.py",), False,
                          keep=r"^(engine\s|hf\s|vllm\s+\d|rollouts_per_s)"),
    "bench-engine-train": Block("docs/PERFORMANCE.md", ("benchmarks/bench_engine.py", "--train"), False,
                                keep=r"^((hf|vllm)\s+reward|train_reward)"),
}


def marks(name):
    begin, end = BLOCKS[name].marks or (f"<!-- figures:{name} -->", f"<!-- /figures:{name} -->")
    return begin + "\n", end


def fenced(name, output):
    return f"```text\n{output}```\n" if BLOCKS[name].fence else output


def shown(name):
    """The text the page's block shows (inside its code fence), or None when the page has no such block."""
    block = BLOCKS[name]
    text = (ROOT / block.page).read_text()
    begin, end = marks(name)
    inside = r"```text\n(.*?)```\n" if block.fence else r"(.*?)"
    m = re.search(re.escape(begin) + inside + re.escape(end), text, re.S)
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
    new = f"{begin}{fenced(name, output)}{end}"
    pattern = re.escape(begin) + r".*?" + re.escape(end)
    page.write_text(re.sub(pattern, lambda _: new, text, flags=re.S) if re.search(pattern, text, re.S)
                    else text.rstrip("\n") + "\n\n" + new + "\n")
    if not block.live:
        SAVED.mkdir(parents=True, exist_ok=True)
        (SAVED / f"{name}.txt").write_text(output)


PAGES = ("README.md", "docs/*.md")
# a measured figure: a number with a unit of time, size, rate or ratio, or a percentage ("A100-80GB" is a name)
FIGURE = re.compile(r"(?<![\w.-])\d[\d,]*(?:\.\d+)?\s?(?:ms|s|min|minutes?|h|hours?|GiB|GB|MB|req/s|GB/s|x|%)(?![\w/])")
DATE = re.compile(r"20\d\d-\d\d-\d\d")
LIST_ITEM = re.compile(r"\s*([-*]|\d+\.) ")
NOT_MEASURED = (r"```.*?```", r"`[^`\n]*`",                                                     # code
                r"\([^()]*\b(?:Table|App\.|Sec\.|Eq\.|Fig\.|the paper)[^()]*\)", r'"[^"]{0,300}"')  # the paper's own


def blanked(text):
    """The page with what is not a measurement of ours blanked out, line numbers kept."""
    checked = [re.escape(marks(n)[0]) + ".*?" + re.escape(marks(n)[1]) for n in BLOCKS]
    for pattern in checked + list(NOT_MEASURED):
        text = re.sub(pattern, lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return text


def begins_unit(line, item):
    """Whether a line ends the unit `item` (a blank line, a heading) or begins another (a list item, a table)."""
    table_begins = line.startswith("|") and not (item and item[-1].startswith("|"))
    return not line.strip() or line.startswith("#") or bool(LIST_ITEM.match(line)) or table_begins


def units(text):
    """The page's paragraphs, list items and tables: (line number of the first line, its lines, the text that
    covers it besides itself: the headings above it and, for a list item or a table, the paragraph before)."""
    headings, lead, item, start = {}, "", [], 0
    for n, line in enumerate(text.split("\n") + [""]):
        if not begins_unit(line, item):
            start, item = (start if item else n + 1), item + [line]
            continue
        if item:
            listed = item[0].startswith("|") or bool(LIST_ITEM.match(item[0]))
            yield start, item, " ".join(headings.values()) + (lead if listed else "")
            lead = lead if listed else "\n".join(item)
        item, start = ([line] if line.strip() and not line.startswith("#") else []), n + 1
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            headings, lead = {k: v for k, v in headings.items() if k < level} | {level: line}, ""


def undated(text):
    """(line, figure) for each measured figure of a page that no date covers: its paragraph's, list item's or
    table's own, that of the paragraph leading its list or table, or that of a heading above it."""
    return [(start + i, figure) for start, lines, cover in units(blanked(text))
            if not DATE.search("\n".join(lines) + cover)
            for i, line in enumerate(lines) for figure in FIGURE.findall(line)]


def problems():
    """What --check finds: a block missing from its page, a live block that differs from its command's output
    now, a recorded one that differs from its saved output."""
    out = []
    for name, block in BLOCKS.items():
        text = shown(name)
        if text is None:
            out.append(f"{block.page}: no block {name} (python tools/figures.py --update {name})")
            continue
        saved = SAVED / f"{name}.txt"
        if not block.live and not saved.is_file():
            out.append(f"{saved.relative_to(ROOT)}: missing (python tools/figures.py --update {name})")
            continue
        if text != (run(name) if block.live else saved.read_text()):
            out.append(f"{block.page}: block {name} is stale (python tools/figures.py --update {name})")
    for page in sorted({p for pattern in PAGES for p in ROOT.glob(pattern)}):
        out += [f"{page.relative_to(ROOT)}:{line}: {figure!r} without the date it was measured (put it in a block, or "
                f"say when)" for line, figure in undated(page.read_text())]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
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
