"""The layout docs/DESIGN.md promises: the core never imports an extension, train.py's --help lists the core's
flags only, and no comment points outside the repository."""
import ast
import re
from pathlib import Path

import train

ROOT = Path(__file__).resolve().parents[1]
CORE = sorted(ROOT.glob("*.py")) + sorted((ROOT / "machinery").glob("*.py"))


def imported_modules(path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_the_core_never_imports_an_extension():
    assert {p.name for p in CORE} >= {"perturb.py", "judge.py", "buffer.py", "grpo.py", "train.py", "eval_pvrbench.py"}
    edges = [(p.name, m) for p in CORE for m in imported_modules(p) if m.split(".")[0] == "extensions"]
    assert edges == []


def test_train_help_lists_the_core_flags_only():
    ap = train.runtime.config_parser(train.Config, train.GROUPS)
    options = [a for a in ap._actions if a.option_strings]  # -h included
    assert len(options) <= 41   # (40, + --depth-model: depth.py)
    flags = {s for a in ap._actions for s in a.option_strings}
    assert not flags & {"--perceiver", "--reward-weights", "--frame-sampler", "--agent-k", "--policy", "--agent"}


def test_no_comment_cites_a_file_outside_the_repository():
    files = CORE + sorted((ROOT / "extensions").rglob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))
    bad = [(p.name, n) for p in files for n, line in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"(?<!docs/)DESIGN\.md|\.\./shared", line)]
    assert bad == []
