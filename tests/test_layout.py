"""The layout docs/DESIGN.md promises: the core never imports nor names an extension and hosts none, the machinery never
imports a stage script and its sub-packages keep their layer order, no stage function is handed down to the machinery,
no import cycles, one RL step auditable without distribution code, train.py's --help lists the core's flags only, and
no comment points outside the repository. Sizes (lines per file, the stage scripts' total, the RL step's audit, the
flags, the README's words) are figures tools/layout_targets.py reports, not limits tested here."""
import ast
import re
import sys
from pathlib import Path

import train

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import layout_targets  # noqa: E402
CORE = sorted(ROOT.glob("*.py")) + sorted((ROOT / "machinery").rglob("*.py"))   # machinery/ and its sub-packages
EXTENSIONS = sorted(p for p in (ROOT / "extensions").rglob("*.py") if "tests" not in p.parts)
SCRIPT_FOLDERS = ("benchmarks", "experiments", "checks", "tools")   # the scripts beside the core (docs/DESIGN.md)
SCRIPTS = sorted(p for folder in SCRIPT_FOLDERS for p in (ROOT / folder).glob("*.py"))


STAGES = ("perturb", "buffer", "grpo", "judge", "train", "eval_pvrbench")


def imported_modules(path):
    """Every module `path` imports, at module level or inside a function (`from machinery import x` is
    machinery.x, and so is any name `from a.b import name` imports: a.b.name, a module or not)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


def module_name(path):
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def in_machinery(path):
    return path.relative_to(ROOT).parts[0] == "machinery"


def test_the_machinery_never_imports_a_stage_script():
    edges = [(module_name(p), m) for p in CORE if in_machinery(p) for m in imported_modules(p)
             if m.split(".")[0] in STAGES]
    assert edges == []


# Where functions go down by design (docs/DESIGN.md, Layout): the scene compositor draws the layers of perturb.py's
# effects (scene.Layer, particles), and cli.run(main) is a program's entry point (as `sys.exit(main())`).
HANDED_BY_DESIGN = ("machinery.corruption.scene", "machinery.cli.run")


def local_names(tree, path):
    """(a stage script's own top-level defs, {alias: stage module}, {alias: the machinery name it imports})."""
    own = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)} if path.stem in STAGES else set()
    stages = {a.asname or a.name: a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
              if a.name in STAGES}
    machinery = {a.asname or a.name: f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                 and (n.module or "").startswith("machinery") for a in n.names}
    return own, stages, machinery


def machinery_objects_and_methods(tree, machinery):
    """(the `self.X` attributes a class of `tree` sets to a machinery object, the methods its classes define):
    `self.learner = learner.Learner(...)` makes `self.learner.backward(...)` a call into the machinery."""
    def from_machinery(call):
        f = call.func
        root = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else getattr(f, "id", "")
        return root in machinery
    objects = {t.attr for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
               and from_machinery(n.value) for t in n.targets
               if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    methods = {f.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body
               if isinstance(f, ast.FunctionDef)}
    return objects, methods


def stage_functions_handed_to_the_machinery(path):
    """(line, call) of each call in `path` to the machinery (a function or class: `evaluation.Runner(...)`, a name
    imported from the machinery, or a method of a machinery object the stage holds: `self.learner.backward(...)`)
    that is given a stage's function: a def of the stage script itself (`corrupt`), a stage module's function
    (`perturb.apply`, `judges.make_judge` under its alias), a method of the stage's own classes (`self.loss`, bound)
    or a lambda. An extension's RL subclass holds train.RL's machinery objects and methods too."""
    import importlib
    tree = ast.parse(path.read_text(), str(path))
    own, stages, machinery = local_names(tree, path)
    objects, methods = machinery_objects_and_methods(tree, machinery)
    if path.name != "train.py" or path.parent != ROOT:   # an extension's subclass inherits train.RL's
        base = ast.parse((ROOT / "train.py").read_text())
        inherited = machinery_objects_and_methods(base, local_names(base, ROOT / "train.py")[2])
        objects, methods = objects | inherited[0], methods | inherited[1]

    def target(f):   # the machinery's dotted name of the function called, or None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in machinery:
            return f"{machinery[f.value.id]}.{f.attr}"
        if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and f.value.attr in objects
                and isinstance(f.value.value, ast.Name) and f.value.value.id == "self"):
            return f"self.{f.value.attr}.{f.attr}"
        return machinery.get(f.id) if isinstance(f, ast.Name) else None

    def stage_function(v):
        if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id in stages:
            return callable(getattr(importlib.import_module(stages[v.value.id]), v.attr))
        if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "self":
            return v.attr in methods
        return isinstance(v, ast.Lambda) or (isinstance(v, ast.Name) and v.id in own)
    for node in ast.walk(tree):
        called = target(node.func) if isinstance(node, ast.Call) else None
        if (called and not called.startswith(HANDED_BY_DESIGN)
                and any(stage_function(v) for v in [*node.args, *(k.value for k in node.keywords)])):
            yield node.lineno, ast.unparse(node.func)


def test_no_stage_function_is_handed_to_the_machinery():
    """The flow runs one way: a stage (or a benchmark, experiment, check or tool) calls the machinery with data
    (frames, settings, the registry's names), never with a stage's function for the machinery to call back."""
    files = [ROOT / f"{s}.py" for s in STAGES] + SCRIPTS + EXTENSIONS
    found = [(p.name, *c) for p in files for c in stage_functions_handed_to_the_machinery(p)]
    assert found == []


def test_the_check_of_handed_functions_sees_one(tmp_path):
    probe = tmp_path / "train.py"
    probe.write_text("import perturb\nimport judge as judges\nfrom machinery.eval import evaluation\n"
                     "from machinery.eval.evaluation import Runner\nfrom machinery.corruption.scene import Layer\n"
                     "def corrupt(x):\n    return x\n"
                     "evaluation.Runner(1, corrupt)\nevaluation.export(perturb.apply)\nevaluation.write(x=lambda: 0)\n"
                     "Runner(judges.make_judge)\nevaluation.Runner(1, [2], perturb.RENDER_VERSION)\n"
                     "Layer(1, lambda f: f)\n"
                     "from machinery.model import learner\n"
                     "class RL:\n    def __init__(self):\n        self.learner = learner.Learner(1)\n"
                     "        self.learner.backward(self.loss, 2)\n        self.learner.backward(self.cfg)\n"
                     "    def loss(self):\n        return 0\n")
    assert [c for _, c in stage_functions_handed_to_the_machinery(probe)] == [
        "evaluation.Runner", "evaluation.export", "evaluation.write", "Runner", "self.learner.backward"]


# machinery/'s layers, lowest first (docs/DESIGN.md, Layout): a module imports only modules of its own layer or a
# lower one. "machinery" is the foundation: its own files (cli, imported first, hub, distributed, seeds, steplog:
# the standard library only at import; video).
LAYERS = ("machinery", "machinery.datasets", "machinery.corruption", "machinery.model", "machinery.eval",
          "machinery.training")


def layer(module):
    """The layer of a machinery module (`machinery.model.policy`, or a name imported from it: `...policy.rollout`),
    or None outside the machinery."""
    parts = module.split(".")
    if parts[0] != "machinery" or len(parts) < 2:
        return None
    package = "machinery." + parts[1]
    return LAYERS.index(package) if package in LAYERS else 0


def test_the_machinery_keeps_its_layer_order():
    """At module level or inside a function: no module imports one of a higher layer."""
    packages = {".".join(module_name(p).split(".")[:2]) for p in CORE
                if in_machinery(p) and p.parent.name != "machinery"}
    assert packages == set(LAYERS[1:]), "a sub-package of machinery/ missing from LAYERS, or LAYERS naming one gone"
    up = [(module_name(p), m) for p in CORE if in_machinery(p) for m in imported_modules(p)
          if layer(m) is not None and layer(m) > layer(module_name(p))]
    assert up == []


def test_no_module_imports_in_a_cycle():
    """Neither the core nor an extension: no import, at the top or inside a function, closes a loop."""
    names = {module_name(p) for p in CORE + EXTENSIONS}
    graph = {module_name(p): {m for m in imported_modules(p) if m in names and m != module_name(p)}
             for p in CORE + EXTENSIONS}
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


def test_a_benchmark_never_imports_an_experiment():
    """benchmarks/ holds speed and memory benchmarks that stand alone: none imports a script of experiments/ (a
    helper both use lives in benchmarks/ or the machinery)."""
    assert {p.parent.name for p in SCRIPTS} == set(SCRIPT_FOLDERS)
    experiments = {p.stem for p in (ROOT / "experiments").glob("*.py")}
    edges = [(p.name, m) for p in sorted((ROOT / "benchmarks").glob("*.py")) for m in imported_modules(p)
             if m.split(".")[0] in experiments]
    assert edges == []


def test_the_core_never_imports_an_extension():
    assert {p.name for p in CORE} >= {"perturb.py", "judge.py", "buffer.py", "grpo.py", "train.py",
                                      "eval_pvrbench.py"}
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
    ap = train.runs.config_parser(train.Config, train.GROUPS)
    flags = {s for a in ap._actions for s in a.option_strings}
    assert not flags & {"--perceiver", "--reward-weights", "--frame-sampler", "--agent-k", "--policy", "--agent"}


def test_no_comment_cites_a_file_outside_the_repository():
    files = CORE + sorted((ROOT / "extensions").rglob("*.py")) + SCRIPTS
    bad = [(p.name, n) for p in files for n, line in enumerate(p.read_text().splitlines(), 1)
           if re.search(r"(?<!docs/)DESIGN\.md|\.\./shared", line)]
    assert bad == []


def test_one_rl_step_is_auditable_without_distribution_code():
    """What a reader follows from RL.step (the RL class, grpo.py, buffer.py) holds no collective, gather or
    sharding wrapper: distribution lives in machinery/model/parallel.py."""
    audit = layout_targets.audit_sources()
    assert audit and not [m for src in audit.values()
                          for m in layout_targets.DISTRIBUTION.findall(layout_targets.code_only(src))]
