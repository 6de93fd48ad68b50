"""The evaluation machinery's hand-off (docs/DESIGN.md, Layout): eval_pvrbench gives it an evaluation.EvalSettings,
built once from the parsed flags, and never its argparse namespace."""
import ast
import dataclasses
from pathlib import Path

import pytest

import eval_pvrbench as ev
from machinery.eval import evaluation

ROOT = Path(__file__).resolve().parents[1]
EVAL_MACHINERY = ("evaluation.py", "lmms_task.py", "diagnostics.py")   # what eval_pvrbench.evaluate calls


def test_each_setting_is_a_flag_resolved_and_the_settings_are_frozen(tmp_path):
    flags = {a.dest for a in ev.parser()._actions}
    assert {f.name for f in dataclasses.fields(evaluation.EvalSettings)} <= flags
    settings = ev.eval_settings(ev.parse_args(["--benchmark", f"synthetic={tmp_path}", "--depth-model", "proxy",
                                               "--fps", "3", "--export-lmms-eval", str(tmp_path / "task")]))
    assert settings.fps == 3.0 and settings.frames == ev.SYNTH_DEFAULTS["frames"]   # parse_args's, resolved
    assert settings.export == str(tmp_path / "task")   # (--export-lmms-eval DIR is an --export DIR)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.frames = 1


@pytest.mark.parametrize("name", EVAL_MACHINERY)
def test_the_evaluation_machinery_takes_no_argparse_namespace(name):
    tree = ast.parse((ROOT / "machinery" / "eval" / name).read_text())
    params = [a.arg for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.Lambda))
              for a in node.args.args + node.args.kwonlyargs]
    reads = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute)
             and (node.attr == "args" or isinstance(node.value, ast.Name) and node.value.id == "args")]
    assert "args" not in params and reads == []
