"""perturb.py's effects registry (register_effect, register_protocol, EFFECTS): what the core knows on its own,
and how an extension adds a subtype and a protocol. Robust-TO's motion_blur / noise, registered this way, are
tested in extensions/robust_to/tests/test_rt_corruptions.py."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import perturb

ROOT = Path(__file__).resolve().parents[1]


def test_the_core_alone_knows_table_8_and_shuffle_only():
    """In a fresh process (tests elsewhere in this session may have imported an extension)."""
    code = ("import json, perturb\n"
            "try:\n    perturb.PerturbSpec('motion_blur')\nexcept ValueError as e:\n    err = str(e)\n"
            "cats = sorted(set(perturb.CATEGORY_OF.values()))\n"
            "print(json.dumps([list(perturb.EFFECTS), sorted(perturb.PROTOCOLS), cats, err]))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    effects, protocols, categories, err = json.loads(run.stdout)
    assert effects == list(perturb.SUBTYPES) and protocols == ["pvrbench"]
    assert categories == sorted(perturb.CATEGORIES)
    assert err == ("unknown perturbation subtype 'motion_blur'; valid subtypes: dusk, night, overexposure, shadow, "
                   "translation, zoom, rotation, static, dynamic, fog, rain, snow (PVRBench)")
    spec = perturb.PerturbSpec(None, seed=3, shuffle=True)  # temporal shuffle needs no effect
    assert spec.category is None and spec.params == {}


@pytest.mark.parametrize("flags, phrase", [
    (["--subtype", "motion_blur", "--out", "o.mp4"], "argument --subtype: invalid choice: 'motion_blur'"),
    (["--grid", "g.png", "--protocol", "robust-to"], "argument --protocol: invalid choice: 'robust-to'"),
])
def test_the_core_cli_alone_refuses_an_unregistered_subtype_or_protocol(flags, phrase, tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "perturb.py"), *flags], cwd=tmp_path, capture_output=True,
                         text=True)
    assert run.returncode == 2 and phrase in run.stderr, run.stderr
    assert list(tmp_path.iterdir()) == []


def test_table_8_goes_through_the_registry():
    assert tuple(perturb.EFFECTS)[:12] == perturb.SUBTYPES
    for sub in perturb.SUBTYPES:
        effect = perturb.EFFECTS[sub]
        assert effect.subtype == sub and effect.category == perturb.CATEGORY_OF[sub]
    assert perturb.PROTOCOLS["pvrbench"] == perturb.SUBTYPES


def _tint(ctx):
    """A toy effect: every frame blended toward one colour."""
    colour = {"red": (255, 0, 0), "blue": (0, 0, 255)}[ctx.p["colour"]]
    for _ in range(ctx.T):
        yield perturb.Layer(float(ctx.p["level"]), colour)


@pytest.fixture
def tint():
    """Registers the toy subtype "tint" (category "toy") and a protocol using it, and removes them afterwards."""
    perturb.register_effect("tint", "toy", lambda d: dict(level=d.eta * d.u(0.5, 1.0), colour=d.pick(("red", "blue"))),
                            _tint)
    perturb.register_protocol("toy-bench", ("tint", "fog"))
    yield
    del perturb.EFFECTS["tint"], perturb.CATEGORY_OF["tint"], perturb.PROTOCOLS["toy-bench"]


def test_a_registered_effect_is_a_subtype_everywhere(tint):
    frames = np.random.default_rng(0).integers(0, 256, (4, 24, 32, 3), dtype=np.uint8)
    spec = perturb.PerturbSpec("tint", eta=0.5, seed=3)
    r = np.random.default_rng([3, perturb.hash48("tint", "params")])  # the stream (seed, subtype, "params")
    level = round(0.5 * float(r.uniform(0.5, 1.0)), 4)
    assert spec.category == "toy" and spec.params == {"level": level, "colour": ("red", "blue")[int(r.integers(2))]}
    assert perturb.PerturbSpec.from_dict(json.loads(spec.to_json())) == spec
    assert perturb.static_spec("v1", "tint").seed == perturb.hash48("pvrbench", "v1", "tint")
    assert perturb.sample_spec(0, subtype="tint").category == "toy"
    rng = np.random.default_rng(0)
    assert all(perturb.sample_spec(rng).subtype != "tint" for _ in range(400))  # never drawn: not in Table 8
    assert "toy" not in perturb.CATEGORIES and "tint" not in perturb.SUBTYPES
    out = perturb.apply(frames, spec)
    colour = np.array((255, 0, 0) if spec.params["colour"] == "red" else (0, 0, 255), np.float64)
    want = frames * (1 - level) + colour * level
    assert np.abs(out - want).max() <= 1
    B, C = perturb.masks(frames, spec)
    assert B.all() and np.allclose(C, level)
    shuffled = perturb.PerturbSpec("tint", eta=0.5, seed=3, shuffle=True)
    perm = perturb.temporal_permutation(len(frames), 3)
    assert np.array_equal(perturb.apply(frames, shuffled), out[perm])  # Eq. 2 for a registered effect too
    assert perturb.PROTOCOLS["toy-bench"] == ("tint", "fog")
    with pytest.raises(ValueError, match=r"snow \(PVRBench\)(, .*)?, tint \(toy\)$"):  # after any extension's
        perturb.PerturbSpec("hail")


def test_bad_registrations_are_refused(tint):
    draw, render = (lambda d: {}), _tint
    with pytest.raises(ValueError, match="'fog' is in category 'weather', not 'lighting'"):
        perturb.register_effect("fog", "lighting", draw, render)
    with pytest.raises(ValueError, match="'weather' is one of Table 8's"):
        perturb.register_effect("hail", "weather", draw, render)
    with pytest.raises(ValueError, match="'tint' is in category 'toy'"):
        perturb.register_effect("tint", "sensor", draw, render)
    with pytest.raises(ValueError, match="unknown perturbation subtype 'hail'"):
        perturb.register_protocol("hail-bench", ("fog", "hail"))
    assert "hail" not in perturb.EFFECTS and "hail-bench" not in perturb.PROTOCOLS
