"""The tests' shared set-up (extensions/conftest.py hands the same fixtures to extensions/*/tests):

- ``tiny_factory(arch="qwen2_5_vl", **kw)``: the folder of machinery/model/tiny.py's tiny model, built once per
  session for each set of arguments (an architecture, a tokenizer corpus); ``tiny_path`` is the default one.
- ``tiny_policy``: ``policy.load_policy(tiny_path)``, loaded afresh for each test (a test may train or change it).
- ``synthetic_factory(n, seed, num_frames, size, eval_fraction, ...)``: the folder of
  machinery/datasets/synthetic.py's benchmark, built once per session for each set of arguments.
- ``train_assets``: (a folder of the test module's own, the tiny model, 8 synthetic clips' train.json): what
  training's tests run on (test_train.py, test_parallel.py, test_multinode.py, test_lora_reference.py).

The folders these give are shared by every test of the session: read them, never write into them (copy first). The
session's end checks that none changed and names the files that did. A test that needs a model or benchmark
of its own (another size, a folder it edits) builds it in its own tmp_path.

Tiers: ``python -m pytest`` runs the default tier (everything not marked ``slow``); ``python -m pytest -m slow`` the
slow tier: torchrun matrices and multi-process runs, kill -9 chains, the reproduction pipelines, figure
regeneration (pyproject.toml registers the marker; .ci/run runs both).
"""
import hashlib
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _key(kind, **kw):
    """A folder name per set of arguments: the same arguments give the same folder, on every call and in both
    conftests (tests/ and the extensions' tests import this file as separate modules; the file system is their one
    cache)."""
    text = json.dumps(kw, sort_keys=True, default=list)
    return f"{kind}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def _shared(tmp_path_factory, key, leaf, build):
    """The folder ``key/leaf`` under the session's temporary root, made by ``build(folder)`` once (written beside
    it and renamed into place, so a build that failed half-way is never taken for a finished one). ``leaf`` is the
    name the tests see: a model's folder name is its name in evaluation outputs ("tiny")."""
    folder = tmp_path_factory.getbasetemp() / "shared" / key / leaf
    if not folder.is_dir():
        partial = folder.with_name(f".{leaf}.partial-{os.getpid()}")
        build(partial)
        partial.rename(folder)
    return folder


def _fingerprint(folder):
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(Path(folder).rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def _shared_folders():
    """The shared folders handed out, checked at the session's end: a test that wrote into one fails here."""
    seen = {}
    yield seen
    changed = {}
    for folder, before in seen.items():
        after = _fingerprint(folder)
        diff = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        if diff:
            changed[str(folder)] = diff[:10]
    assert not changed, f"a test wrote into a shared (read-only) fixture folder: {changed}"


@pytest.fixture(scope="session")
def tiny_factory(tmp_path_factory, _shared_folders):
    """``tiny_factory(arch="qwen2_5_vl", **kw)`` -> the folder (str) of ``tiny.build_tiny(folder, arch, **kw)``,
    built once per session per arguments. Read-only: load it, copy it, never write into it."""
    from machinery.model import tiny as tiny_model

    def make(arch="qwen2_5_vl", **kw):
        folder = _shared(tmp_path_factory, _key(f"tiny-{arch}", **kw), "tiny",
                         lambda out: tiny_model.build_tiny(out, arch=arch, **kw))
        _shared_folders.setdefault(folder, _fingerprint(folder))
        return str(folder)

    return make


@pytest.fixture(scope="session")
def tiny_path(tiny_factory):
    """The default tiny Qwen2.5-VL's folder (str), shared by the session."""
    return tiny_factory()


@pytest.fixture
def tiny_policy(tiny_path):
    """(model, processor) of the default tiny model, loaded afresh for this test."""
    from machinery.model import policy
    return policy.load_policy(tiny_path)


@pytest.fixture(scope="session")
def synthetic_factory(tmp_path_factory, _shared_folders):
    """``synthetic_factory(n=..., seed=..., num_frames=..., size=..., eval_fraction=..., **kw)`` -> the folder
    (Path) of ``synthetic.make_synthetic(folder, ...)`` (train.json, eval.jsonl, videos/, depth/), built once per
    session per arguments. Read-only: a test that edits rows or videos copies them out first."""
    from machinery.datasets import synthetic

    def make(**kw):
        folder = _shared(tmp_path_factory, _key("synthetic", **kw), "synth",
                         lambda out: synthetic.make_synthetic(out, **kw))
        _shared_folders.setdefault(folder, _fingerprint(folder))
        return folder

    return make


@pytest.fixture(scope="module")
def train_assets(tmp_path_factory, tiny_path, synthetic_factory):
    """(a folder of the test module's own, the tiny model, train.json of 8 synthetic clips of 4 frames of 56x56):
    training's tests' inputs."""
    synth = synthetic_factory(n=8, seed=1, num_frames=4, size=56, eval_fraction=0.25)
    return tmp_path_factory.mktemp("train"), tiny_path, synth / "train.json"
