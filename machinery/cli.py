"""The command-line scripts' plumbing (train.py, eval_pvrbench.py, perturb.py, data.py, synthetic.py, policy.py,
the benchmarks' and the extensions' scripts): a mistake the user can fix is one line on stderr with exit code 2 (the
traceback only with --debug or ROVA_DEBUG=1), Ctrl-C ends with one line saying how to continue, and so does a
distributed run that lost a process or node (named by machinery/distributed.py; exit code 1), output paths are
checked before any work, --help is grouped with defaults shown, third-party output that is not an error stays
quiet, and torch's OpenMP threads spin briefly, so that a second busy process on the machine costs a share of the
cores, not a collapse. `log` prints on rank 0 only.

Standard library only at import, and it sets the OpenMP wait policy when imported: every entry point imports it
first, before torch. (Model sources and versions: hub.py; torchrun's processes: distributed.py; the random streams:
seeds.py; the step log: steplog.py.)
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import shutil
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


def _lost_peer(exc):
    """(distributed.py's one line saying that another process of the run was lost, the number of nodes) for `exc`;
    None for any other exception, or when no process group was set up (distributed.py not even imported: it is
    looked up, not imported, since it imports this module)."""
    distributed = sys.modules.get("machinery.distributed")
    return None if distributed is None else distributed.lost_peer(exc)


@contextmanager
def interrupt_hint(text):
    """Ctrl-C, or a lost peer (peer_lost), inside the block: `run` says `text` (how to continue; a function giving
    it is asked then, so that it names only what exists) instead of its `interrupted` line."""
    try:
        yield
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt) or _lost_peer(e):
            e.hint = getattr(e, "hint", None) or (text() if callable(text) else text)
        raise


def run(main, *, interrupted="", argv=None):
    """Run a script's main(): user errors as one line and exit 2; Ctrl-C as one line and exit 130, with
    `interrupted` (a string, or a function giving one; an `interrupt_hint` block's text first) saying how to
    continue; a collective that failed because another process of the run was lost (peer_lost) as one line on
    every process that saw it, with the same hint, and exit 1; --debug / ROVA_DEBUG=1 lets every exception through
    with its traceback. Under torchrun only rank 0 prints the Ctrl-C line."""
    debug = debug_requested(argv)
    try:
        rc = main() if argv is None else main(argv)
    except KeyboardInterrupt as e:
        if debug:
            raise
        hint = getattr(e, "hint", None) or (interrupted() if callable(interrupted) else interrupted)
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
    except BaseException as e:   # (DCP's CheckpointException is a BaseException)
        lost = None if debug else _lost_peer(e)
        if lost is None:
            raise
        line, nodes = lost
        hint = getattr(e, "hint", None) or (interrupted() if callable(interrupted) else interrupted)
        _close_progress_bars()
        print(f"error: {line}" + (f". {'On every node: ' if nodes > 1 else ''}{hint}" if hint else ""),
              file=sys.stderr, flush=True)
        leave(1)   # (the broken process group's teardown could block)
    sys.exit(rc if isinstance(rc, int) else 0)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help: the description as written; each flag's default shown unless its help already says it."""

    def _get_help_string(self, action):
        text, default = action.help or "", action.default
        if (default in (None, "", argparse.SUPPRESS) or "default" in text
                or not action.option_strings[0].startswith("--")):
            return text
        return f"{text} (default: {('on' if default else 'off') if isinstance(default, bool) else default})"


class ArgumentParser(argparse.ArgumentParser):
    """Every script's parser: no abbreviations (`--rl-step 5` is an error, not --rl-steps), and a mistake in the
    command line is one line, `error: ...` with exit code 2, like every other mistake (not argparse's usage
    block; --help shows it)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        _close_progress_bars()
        self.exit(2, f"error: {' '.join(str(message).split())}\n")


def strict_bool(text) -> bool:
    """A boolean setting's value: true/false, 1/0, yes/no, on/off (any case); anything else is a ValueError
    (`--set gradient_checkpointing=ture` must not quietly mean False)."""
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean (true/false, 1/0, yes/no, on/off)")


def _rank0() -> bool:
    """Whether this process is rank 0, or in no process group (torch.distributed not even imported: none)."""
    dist = sys.modules.get("torch.distributed")
    return dist is None or not dist.is_initialized() or dist.get_rank() == 0


def log(*args, **kwargs):
    """print, flushed, on rank 0 only once the process group is up (the other ranks would repeat its lines)."""
    if _rank0():
        print(*args, **kwargs, flush=True)


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


@contextmanager
def no_folder_if_refused(folder):
    """A start refused inside the block (a UserError: a data mistake, a finished run, a model that cannot fit)
    leaves no `folder` behind when it did not exist before the block (rank 0 removes it)."""
    folder = Path(folder)
    existed = folder.exists()
    try:
        yield
    except UserError:
        if not existed and _rank0():
            shutil.rmtree(folder, ignore_errors=True)
        raise


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

def leave(code: int = 0):
    """End the process now, without the interpreter's teardown (runs.finish, after a distributed run's last
    collective): the logs and standard streams flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
