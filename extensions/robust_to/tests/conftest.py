"""The core tests' shared fixtures (tests/conftest.py: the tiny model, the synthetic benchmark) for Robust-TO's tests."""
from tests.conftest import _shared_folders, synthetic_factory, tiny_factory, tiny_path, tiny_policy  # noqa: F401
