"""Process plumbing shared by the command-line scripts (train.py, eval_pvrbench.py, perturb.py, data.py,
reliability.py, perceive.py, policy.py): a mistake the user can fix is one line on stderr with exit code 2
(the traceback only with --debug or ROVA_DEBUG=1), Ctrl-C ends with one line saying how to continue, output
paths and model sources are checked before any work, --help is grouped with defaults shown, third-party
output that is not an error stays quiet, and torch's OpenMP threads spin briefly, so that a second busy
process on the machine costs a share of the cores, not a collapse.

Standard library only at import (huggingface_hub and transformers are imported where they are used), so
every module can import it.
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path

DEBUG_ENV = "ROVA_DEBUG"

# CPU threads. torch's OpenMP threads (GNU libgomp) spin-wait for up to 300,000 iterations after each
# parallel region before they sleep. On a machine whose cores another busy process also uses, the spinning
# threads take the cores the working ones need, and each of the thousands of small parallel regions of a
# step waits for a descheduled thread: measured on 2 cores, the CPU demo beside a second demo took 10.4x its
# time alone (an SFT step 3-4x, a rollout 4-5x: benchmarks/bench_load.py). A short spin (1000) costs ~3%
# alone and makes a shared machine cost about its share (the demo 1.64x). libgomp reads this when torch
# loads it, so the scripts import this module before torch; a user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT
# wins.
GOMP_SPINCOUNT = "1000"
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = GOMP_SPINCOUNT


class UserError(Exception):
    """A mistake the user can fix (a bad flag value, a missing file, a malformed dataset row): printed as
    one line, exit code 2. data.DataError and video.VideoError are UserErrors."""


def debug_requested(argv=None) -> bool:
    argv = sys.argv[1:] if argv is None else argv
    return "--debug" in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def add_debug_flag(parser):
    parser.add_argument("--debug", action="store_true",
                        help=f"show the full traceback of an error (also: {DEBUG_ENV}=1)")
    return parser


# OSErrors that are about the user's files (a path that is a file, a folder that does not exist, no
# permission, a full disk), not about the program.
_USER_ERRNOS = {errno.ENOENT, errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.ENOSPC,
                errno.EROFS, errno.EDQUOT}


def _one_line(exc) -> str:
    text = " ".join(str(exc).split())
    if isinstance(exc, OSError) and exc.filename and str(exc.filename) not in text:
        text += f": {exc.filename}"
    return text or type(exc).__name__


def _close_progress_bars():
    """Close open tqdm bars now, so that none redraws itself after the last line (at interpreter exit)."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", [])):
        bar.close()


def run(main, *, interrupted="", argv=None):
    """Run a script's main(): user errors as one line and exit 2; Ctrl-C as one line and exit 130, with
    `interrupted` (a string, or a function giving one) saying how to continue; --debug / ROVA_DEBUG=1 lets
    every exception through with its traceback. Under torchrun only rank 0 prints the Ctrl-C line."""
    debug = debug_requested(argv)
    try:
        rc = main() if argv is None else main(argv)
    except KeyboardInterrupt:
        if debug:
            raise
        hint = interrupted() if callable(interrupted) else interrupted
        _close_progress_bars()
        if os.environ.get("RANK", "0") == "0":
            print(f"\ninterrupted{': ' + hint if hint else ''}", file=sys.stderr, flush=True)
        sys.exit(130)
    except UserError as e:
        if debug:
            raise
        _close_progress_bars()
        print(f"error: {_one_line(e)}", file=sys.stderr, flush=True)
        sys.exit(2)
    except BrokenPipeError:  # the output went into a pipe that closed (`... | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
    except OSError as e:
        if debug or e.errno not in _USER_ERRNOS:
            raise
        _close_progress_bars()
        print(f"error: {_one_line(e)} (--debug shows the traceback)", file=sys.stderr, flush=True)
        sys.exit(2)
    sys.exit(rc if isinstance(rc, int) else 0)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help: the description as written; each flag's default shown unless its help already says it."""

    def _get_help_string(self, action):
        text, default = action.help or "", action.default
        if default in (None, "", argparse.SUPPRESS) or "default" in text or not action.option_strings[0].startswith("--"):
            return text
        return f"{text} (default: {('on' if default else 'off') if isinstance(default, bool) else default})"


# ----------------------------------------------------------------------------- output paths

def _no_file_on_the_way(folder: Path, path, what: str):
    """A UserError when `folder` or one of its parents is a file (so that `path` cannot be made)."""
    for parent in [folder, *folder.parents]:
        if parent.exists() and not parent.is_dir():
            raise UserError(f"{what} {path}: {parent} is a file, not a folder")


def out_dir(path, what: str = "--out", create: bool = True) -> Path:
    """Check that folder `path` can be made (a clear UserError when it, or a parent, is a file), and make
    it unless create=False."""
    p = Path(path)
    _no_file_on_the_way(p, path, what)
    if create:
        p.mkdir(parents=True, exist_ok=True)
    return p


def out_file(path, suffixes, what: str = "--out") -> Path:
    """Check an output file before any work: a supported extension, not a folder, a writable parent
    (created). Nothing is written here."""
    p = Path(path)
    if p.is_dir() or str(path).endswith(("/", os.sep)):
        raise UserError(f"{what} {path} is a folder; give a file name ending in {' or '.join(suffixes)}")
    if p.suffix.lower() not in suffixes:
        raise UserError(f"{what} {path}: unsupported extension {p.suffix or '(none)'!r} "
                        f"(use {' or '.join(suffixes)})")
    _no_file_on_the_way(p.parent, path, what)
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


# ----------------------------------------------------------------------------- quiet libraries

# bitsandbytes logs, on import (peft and transformers import it whenever it is installed, 4-bit or not),
# that an optional CPU kernel package is absent: it reads like an error and is not one.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


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
            raise UserError(f"{what} {name}: the folder has no config.json (not a transformers checkpoint)")
        return {}
    if path.exists():
        raise UserError(f"{what} {name} is a file; give a model folder (with config.json) or a hub id ORG/NAME")
    if _looks_local(name):
        raise UserError(f"{what} {name}: no such folder (a hub id is ORG/NAME)")
    from huggingface_hub import constants, try_to_load_from_cache

    cached = isinstance(try_to_load_from_cache(name, "config.json"), str)
    if cached:
        return {} if constants.HF_HUB_OFFLINE or _hub_reachable(constants.ENDPOINT) else {"local_files_only": True}
    lead = f"{what} {name}: no such folder here, and as a hub id it is not in the Hugging Face cache " \
           f"({constants.HF_HUB_CACHE})"
    if constants.HF_HUB_OFFLINE:
        raise UserError(f"{lead} and HF_HUB_OFFLINE=1 forbids downloading it: run `hf download {name}` where the "
                        "hub is reachable, or give a local folder")
    if not _hub_reachable(constants.ENDPOINT):
        raise UserError(f"{lead} and the hub ({constants.ENDPOINT}) cannot be reached: run `hf download {name}` "
                        "where it is (then HF_HUB_OFFLINE=1 here), or give a local folder")
    return {}


def check_hf_flags(flags: dict):
    """model_source for every flag value of the form hf:PATH (local judges and perceivers)."""
    for flag, spec in flags.items():
        if spec.startswith("hf:"):
            model_source(spec[3:], what=f"{flag} hf:")
