"""The layout docs/DESIGN.md promises: the core never imports nor names an extension and hosts none, the machinery
never imports a stage script, no import cycles, train.py's --help lists the core's flags only, and no comment
points outside the repository."""
import ast
import re
from pathlib import Path

import train

ROOT = Path(__file__).resolve().parents[1]
CORE = sorted(ROOT.glob("*.py")) + sorted((ROOT / "machinery").glob("*.py"))


STAGES = ("perturb", "buffer", "grpo", "judge", "train", "eval_pvrbench")


def imported_modules(path):
    """Every module `path` imports, at module level or inside a function (`from machinery import x` is
    machinery.x)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            if node.module == "machinery":
                yield from (f"machinery.{a.name}" for a in node.names)


def module_name(path):
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_the_machinery_never_imports_a_stage_script():
    edges = [(p.name, m) for p in CORE if p.parent.name == "machinery" for m in imported_modules(p)
             if m.split(".")[0] in STAGES]
    assert edges == []


def test_the_core_has_no_import_cycle():
    names = {module_name(p) for p in CORE}
    graph = {module_name(p): {m for m in imported_modules(p) if m in names and m != module_name(p)} for p in CORE}
    done, stack = set(), []

    def visit(node):  # depth-first: a node met again on the current path closes a cycle
        if node in stack:
            raise AssertionError(f"import cycle: {' -> '.join(stack[stack.index(node):] + [node])}")
        if node in done:
            return
        stack.append(node)
        for nxt in sorted(graph[node]):
            visit(nxt)
        stack.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)


def test_the_core_never_imports_an_extension():
    assert {p.name for p in CORE} >= {"perturb.py", "judge.py", "buffer.py", "grpo.py", "train.py", "eval_pvrbench.py"}
    edges = [(p.name, m) for p in CORE for m in imported_modules(p) if m.split(".")[0] == "extensions"]
    assert edges == []


EXTENSION_NAMES = re.compile(r"embodied[-_ ]?r\b|robust[-_ ]?to\b|perception_cache|(?-i:\bextensions\.[a-z])", re.I)


def test_the_core_names_no_extension_and_hosts_none():
    """Neither code nor prose of the core names an extension (a module, its flags' settings or its entry point),
    and the core keeps no hook class for them: an extension writes its own main from the core's functions."""
    named = [(p.name, n) for p in CORE for n, line in enumerate(p.read_text().splitlines(), 1)
             if EXTENSION_NAMES.search(line) and "extensions.<name>" not in line]
    assert named == []
    hooks = [(p.name, node.name) for p in CORE for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.ClassDef) and "Extension" in node.name]
    assert hooks == []


def test_train_help_lists_the_core_flags_only():
    ap = train.runtime.config_parser(train.Config, train.GROUPS)
    options = [a for a in ap._actions if a.option_strings]  # -h included
    assert len(options) <= 40   # -h, --debug and --set included
    flags = {s for a in ap._actions for s in a.option_strings}
    assert not flags & {"--perceiver", "--reward-weights", "--frame-sampler", "--agent-k", "--policy", "--agent"}


def test_no_comment_cites_a_file_outside_the_repository():
    files = CORE + sorted((ROOT / "extensions").rglob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))
    bad = [(p.name, n) for p in files for n, line in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"(?<!docs/)DESIGN\.md|\.\./shared", line)]
    assert bad == []
