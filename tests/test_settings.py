"""The machinery's typed hand-off from the stage scripts: each module that reads a run's settings declares them in a
Protocol (clips.ClipSettings, learner.LearnerSettings, engine.EngineSettings, runs.RunSettings), reads nothing
else, and every script's Config satisfies them with the same types."""
import ast
import dataclasses
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import train  # noqa: E402
from extensions.embodied_r import train as er  # noqa: E402
from extensions.robust_to import train as rt  # noqa: E402
from machinery.model import engine, learner  # noqa: E402
from machinery.training import clips, runs  # noqa: E402

PROTOCOLS = (clips.ClipSettings, learner.LearnerSettings, engine.EngineSettings, runs.RunSettings)


def declared(protocol):
    return {name: str(kind) for c in protocol.__mro__ for name, kind in vars(c).get("__annotations__", {}).items()}


RUN = set(declared(runs.RunSettings)) | {f.name for f in dataclasses.fields(runs.RunConfig)}
READS = {"clips.py": set(declared(clips.ClipSettings)), "learner.py": set(declared(learner.LearnerSettings)),
         "engine.py": set(declared(engine.EngineSettings)), "runs.py": RUN, "warmup.py": RUN}


def settings_read(path):
    """Attributes read off a run's settings in a module's code (docstrings aside): cfg.X, self.cfg.X, run.cfg.X."""
    def is_cfg(node):
        return isinstance(node, ast.Name) and node.id == "cfg" or isinstance(node, ast.Attribute) and node.attr == "cfg"
    return {node.attr for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute) and is_cfg(node.value)}


@pytest.mark.parametrize("path", sorted((ROOT / "machinery").rglob("*.py")),
                         ids=lambda p: p.relative_to(ROOT / "machinery").as_posix())
def test_the_machinery_reads_only_the_settings_it_declares(path):
    read = settings_read(path)
    assert read <= READS.get(path.name, set()), f"{path.name} reads {sorted(read - READS.get(path.name, set()))}"


def test_the_check_sees_a_read_it_was_not_told_of(tmp_path):
    module = tmp_path / "clips.py"
    module.write_text('"""cfg.lr in a docstring is not a read."""\n'
                      'def f(self, run):\n    return self.cfg.frames, run.cfg.lr\n')
    assert settings_read(module) == {"frames", "lr"} and not settings_read(module) <= READS["clips.py"]


@pytest.mark.parametrize("config", [train.Config, er.Config, rt.Config], ids=["train", "embodied_r", "robust_to"])
def test_every_scripts_config_satisfies_the_protocols_with_their_types(config):
    cfg, fields = config(), {f.name: str(f.type) for f in dataclasses.fields(config)}
    for protocol in PROTOCOLS:
        assert isinstance(cfg, protocol)
        wrong = {name: (kind, fields.get(name)) for name, kind in declared(protocol).items()
                 if fields.get(name) != kind}
        assert not wrong, f"{config.__module__}.Config against {protocol.__name__}: {wrong}"
