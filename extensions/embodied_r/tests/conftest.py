"""Shared by Embodied-R's tests: a scripted perception backend, chosen by --perceiver scripted; and the core tests'
shared fixtures (tests/conftest.py: the tiny model, the synthetic benchmark)."""
import numpy as np
import pytest

from extensions.embodied_r import perceive
from tests.conftest import _shared_folders, synthetic_factory, tiny_factory, tiny_path, tiny_policy  # noqa: F401


class Scripted:
    """A perception backend that reports each image's mean brightness: what it is shown is visible in
    the text (a corrupted video reads differently from its clean one), and every call is recorded."""
    name = "scripted-brightness"

    def __init__(self):
        self.calls = []

    def __call__(self, prompt, images):
        self.calls.append((prompt, [float(np.mean(im)) for im in images]))
        level = int(np.mean(images[-1]))
        if len(images) == 1:
            return f"a scene of brightness {level}"
        return f"Action: move forward\nNew: brightness {level}\nRelevant: none"


@pytest.fixture
def scripted(monkeypatch):
    backend = Scripted()
    real = perceive.make_perceiver
    monkeypatch.setattr(perceive, "make_perceiver",
                        lambda spec, **kw: backend if spec == "scripted" else real(spec, **kw))
    return backend
