"""Models and versions: where a model comes from, checked before anything loads it (a local folder with
config.json, or a hub id in the Hugging Face cache or on a reachable hub: `model_source`, `check_hf_flags`), the
versions a result depends on (`versions`), and transformers' own progress bars kept off the training bar.

Standard library only at import (huggingface_hub and transformers are imported where they are used).
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from machinery import cli

def versions():
    """The versions a result depends on (Python, the libraries, the git commit), for results files."""
    import platform
    import subprocess

    out = {"python": platform.python_version(), "platform": platform.platform()}
    for mod in ("numpy", "torch", "transformers", "peft", "cv2", "decord", "PIL", "requests"):
        try:
            out[mod] = getattr(__import__(mod), "__version__", "?")
        except Exception:  # noqa: BLE001
            out[mod] = None
    try:
        out["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                           cwd=Path(__file__).parent).stdout.strip() or None
    except Exception:  # noqa: BLE001
        out["git_commit"] = None
    return out


@contextmanager
def no_hf_progress_bars():
    """transformers' own bars off (e.g. "Writing model shards" on every checkpoint, which garbles the
    training bar); back on after."""
    from transformers.utils import logging as hf_logging
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


# ----------------------------------------------------------------------------- model sources

def _looks_local(name: str) -> bool:
    """A path rather than a hub id (ORG/NAME): starts with . / ~, has a backslash or more than one
    slash, or its first part is a folder here (runs/nope when runs/ exists)."""
    if name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1:
        return True
    return "/" in name and Path(name.split("/", 1)[0]).is_dir()


def _hub_reachable(endpoint: str, timeout: float = 3.0) -> bool:
    import socket
    from urllib.parse import urlparse

    url = urlparse(endpoint)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
        return True
    except OSError:
        return False


def model_source(name: str, what: str = "--model") -> dict:
    """Check where a model comes from before anything loads it, and return the extra from_pretrained
    arguments. A local folder must exist and hold config.json; a path-like name that does not exist is one
    line at once, not a hub request (5 retries, ~30 s, then a traceback about the network). A hub id
    (ORG/NAME) must be in the Hugging Face cache or reachable on the hub; when the hub is unreachable a
    cached model loads from the cache (local_files_only)."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise cli.UserError(f"{what} {name}: the folder has no config.json (not a transformers checkpoint)")
        return {}
    if path.exists():
        raise cli.UserError(f"{what} {name} is a file; give a model folder (with config.json) or a hub id ORG/NAME")
    if _looks_local(name):
        raise cli.UserError(f"{what} {name}: no such folder (a hub id is ORG/NAME)")
    from huggingface_hub import constants, try_to_load_from_cache

    cached = isinstance(try_to_load_from_cache(name, "config.json"), str)
    if cached:
        return {} if constants.HF_HUB_OFFLINE or _hub_reachable(constants.ENDPOINT) else {"local_files_only": True}
    lead = f"{what} {name}: no such folder here, and as a hub id it is not in the Hugging Face cache " \
           f"({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE:
        raise cli.UserError(f"{lead} and HF_HUB_OFFLINE=1 forbids downloading it: run `hf download {name}` where the "
                        "hub is reachable, or give a local folder")
    if not _hub_reachable(constants.ENDPOINT):
        raise cli.UserError(f"{lead} and the hub ({constants.ENDPOINT}) cannot be reached: run `hf download {name}` "
                        "where it is (then HF_HUB_OFFLINE=1 here), or give a local folder")
    return {}


def check_hf_flags(flags: dict):
    """model_source for every flag value of the form hf:PATH (local judges and perceivers)."""
    for flag, spec in flags.items():
        if spec.startswith("hf:"):
            model_source(spec[3:], what=f"{flag} hf:")
