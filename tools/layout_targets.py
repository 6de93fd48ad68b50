"""The layout's figures (docs/DESIGN.md, "Layout"), reported, not limits: printed one per line:

- lines of the six stage scripts (together, and the largest), and the largest Python file anywhere in the
  project (its own files, `git ls-files`);
- one RL step's audit: the lines a reader follows from `RL.step` through Alg. 2 (the RL class, grpo.py,
  buffer.py), the files they are in, and the distribution code in them (collectives, gathers, sharding and
  replication wrappers, in code: comments and docstrings aside);
- the README's words; the options train.py's --help lists; the core's import edges into extensions/;
- the largest cyclomatic complexity in the stage scripts (radon, when installed: a measuring tool, not a
  dependency, e.g. `python -m venv /tmp/radon && /tmp/radon/bin/pip install radon`, then `--radon
  /tmp/radon/bin/radon`).

    python tools/layout_targets.py [--radon PATH]      # the figures (and, with radon, the complexity)
    python tools/layout_targets.py --lines             # the core's files and their lines
    python tools/layout_targets.py --complexity        # the complexity line alone
"""
from __future__ import annotations

import argparse
import ast
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
STAGES = ("perturb.py", "buffer.py", "grpo.py", "judge.py", "train.py", "eval_pvrbench.py")
# what a reader of one RL step follows (the RL class's phases, the equations, the curriculum)
AUDIT = ("train.py:RL", "grpo.py", "buffer.py")
# distribution code: collectives, process-group calls, sharding and replication wrappers (in code, not in comments
# or docstrings; a rank's own data shard and seed are data, not distribution)
DISTRIBUTION = re.compile(r"torch\.distributed|\bdist\.|\bparallel\.|all_reduce|all_gather|all_sum|gathered|"
                          r"barrier|FSDP|fully_shard|DistributedDataParallel|replicate\(|unwrap\(")


def lines(path):
    return len(Path(path).read_text().splitlines())


def project_files():
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    return [ROOT / p for p in out if (ROOT / p).is_file()] or sorted(ROOT.rglob("*.py"))


def core_files():
    """The stage scripts and the package beneath them, its sub-packages included (extensions, tests and the
    scripts of benchmarks/, experiments/, checks/ and tools/ excluded)."""
    return [p for p in project_files() if p.parent == ROOT or p.relative_to(ROOT).parts[0] == "machinery"]


def import_edges(files):
    out = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            out += [(p.name, n) for n in names if n.split(".")[0] == "extensions"]
    return out


def code_only(src):
    """`src` without its comments and strings (docstrings included)."""
    import io
    import tokenize
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.STRING):
            out.append(tok.string)
    return " ".join(out)


def audit_sources():
    """{file: source} of the RL step's audit set."""
    out = {}
    for item in AUDIT:
        file, _, obj = item.partition(":")
        if obj:
            tree = ast.parse((ROOT / file).read_text())
            node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == obj)
            out[item] = ast.get_source_segment((ROOT / file).read_text(), node)
        else:
            out[item] = (ROOT / file).read_text()
    return out


def complexity(radon, files):
    """(the largest CC in the files, the blocks above 15) by `radon cc -s`."""
    out = subprocess.run([radon, "cc", "-s", "-n", "A", *map(str, files)], capture_output=True, text=True,
                         check=True).stdout
    blocks = [(int(m.group(2)), m.group(1)) for m in re.finditer(r"^\s+[FMC] \d+:\d+ (\S+) - \w \((\d+)\)", out, re.M)]
    return max(blocks)[0] if blocks else 0, sorted(b for b in blocks if b[0] > 15)


def lines_table():
    """The core's files as a markdown table: folder, file, lines (docs/DESIGN.md shows it)."""
    rows = ["| folder | file | lines |", "| --- | --- | ---: |"]
    # the stage scripts, machinery/'s own files, then its sub-packages'
    for p in sorted(core_files(), key=lambda p: (len(p.relative_to(ROOT).parts), p.relative_to(ROOT).as_posix())):
        folder = "." if p.parent == ROOT else p.parent.relative_to(ROOT).as_posix() + "/"
        rows.append(f"| `{folder}` | `{p.name}` | {lines(p):,} |")
    stages = sum(lines(ROOT / s) for s in STAGES)
    rows.append(f"| | the six stage scripts | {stages:,} |")
    rows.append(f"| | the core | {sum(lines(p) for p in core_files()):,} |")
    return "\n".join(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--radon", default="", help="the radon executable: also print the largest cyclomatic "
                    "complexity in the stage scripts")
    ap.add_argument("--lines", action="store_true", help="print the core's files and their lines as a table, only")
    ap.add_argument("--complexity", action="store_true", help="print the complexity line only (radon from --radon, "
                    "$RADON or PATH)")
    args = ap.parse_args(argv)
    if args.lines:
        print(lines_table())
        return
    radon = args.radon or os.environ.get("RADON") or shutil.which("radon") or ""
    if args.complexity:
        if not radon:
            ap.error("--complexity needs radon: --radon PATH, $RADON or radon on PATH")
        return print_complexity(radon)
    import train  # noqa: E402 - after sys.path
    stages = {s: lines(ROOT / s) for s in STAGES}
    for s, n in stages.items():
        print(f"lines {s:<20} {n:5d}")
    files = project_files()
    big = max(files, key=lines)
    print(f"stage_scripts_lines={sum(stages.values())} largest_stage={max(stages.values())} "
          f"largest_file={big.relative_to(ROOT)}:{lines(big)} python_files={len(files)}")
    audit = audit_sources()
    dist = sum(len(DISTRIBUTION.findall(code_only(src))) for src in audit.values())
    print(f"rl_step_audit_lines={sum(len(s.splitlines()) for s in audit.values())} "
          f"rl_step_audit_files={len({a.split(':')[0] for a in audit})} rl_step_distribution_refs={dist} "
          f"rl_step_lines={len(inspect.getsource(train.RL.step).splitlines())}")
    ap_train = train.runs.config_parser(train.Config, train.GROUPS)
    flags = len([a for a in ap_train._actions if a.option_strings])
    words = len((ROOT / "README.md").read_text().split())
    print(f"readme_words={words} train_help_options={flags} core_to_extension_edges={len(import_edges(core_files()))}")
    if args.radon:
        print_complexity(args.radon)


def print_complexity(radon):
    worst, above = complexity(radon, [ROOT / s for s in STAGES])
    print(f"stage_max_cc={worst} stage_blocks_above_15={len(above)}" + "".join(f"\n  {n} {c}" for c, n in above))


if __name__ == "__main__":
    main()
