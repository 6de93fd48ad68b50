"""Process plumbing shared by the command-line scripts (train.py, eval_pvrbench.py, perturb.py, data.py,
synthetic.py, policy.py and the extensions' scripts): a mistake the user can fix is one line on stderr with exit code 2
(the traceback only with --debug or ROVA_DEBUG=1), Ctrl-C ends with one line saying how to continue, and so does a
distributed run that lost a process or node (naming it; exit code 1), output paths and model sources are checked
before any work, --help is grouped with defaults shown, third-party output that is not an error stays quiet, and
torch's OpenMP threads spin briefly, so that a second busy process on the machine costs a share of the cores, not a
collapse.

The second half is train.py's plumbing, kept out of the training loop so that the loop reads as the
paper's algorithm: torchrun's process group, gradients averaged over ranks, every RNG's state and the step log
(checkpoints and run folders: machinery/training/checkpoints.py).

Standard library only at import (torch, huggingface_hub and transformers are imported where they are used),
so every module can import it.
"""
from __future__ import annotations

import argparse
import errno
import hashlib
import json
import logging
import os
import random
import re
import shutil
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
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


@contextmanager
def interrupt_hint(text):
    """Ctrl-C, or a lost peer (peer_lost), inside the block: `run` says `text` (how to continue; a function giving
    it is asked then, so that it names only what exists) instead of its `interrupted` line."""
    try:
        yield
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt) or (_PEERS and peer_lost(e, rank_of(), _PEERS)):
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
        line = peer_lost(e, rank_of(), _PEERS) if _PEERS and not debug else None
        if line is None:
            raise
        hint = getattr(e, "hint", None) or (interrupted() if callable(interrupted) else interrupted)
        _close_progress_bars()
        print(f"error: {line}" + (f". {'On every node: ' if _nodes(_PEERS) > 1 else ''}{hint}" if hint else ""),
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
        if not existed and rank_of() == 0:
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


# ----------------------------------------------------------------------------- processes (torchrun)

def collective_timeout():
    """How long a collective may wait for the other ranks before it fails: $ROVA_DIST_TIMEOUT seconds when set
    (the tests set a short one, so that a collective only some ranks entered fails instead of hanging), else
    torch's default."""
    import datetime

    value = os.environ.get("ROVA_DIST_TIMEOUT")
    if not value:
        return None
    try:
        return datetime.timedelta(seconds=float(value))
    except ValueError:
        raise UserError(f"ROVA_DIST_TIMEOUT must be a number of seconds, got {value!r}") from None


def setup_distributed():
    """torchrun's environment -> (rank, world, device): NCCL on GPUs, gloo on CPU; a plain `python train.py`
    is rank 0 of 1."""
    import torch
    import torch.distributed as dist

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1:
        _die_with_the_launcher()
        cuda = torch.cuda.is_available()
        dist.init_process_group("nccl" if cuda else "gloo", timeout=collective_timeout())
        rank, world = dist.get_rank(), dist.get_world_size()
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        _PEERS[:] = [None] * world
        dist.all_gather_object(_PEERS, _where())
        return rank, world, device
    return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _die_with_the_launcher():
    """torchrun starts each worker in a session of its own, so a torchrun killed with kill -9 leaves its workers
    running, still writing checkpoints into the run folder. On Linux, have the kernel kill a worker when its
    launcher dies (prctl PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux") or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    import ctypes
    import signal

    launcher = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # 1 = PR_SET_PDEATHSIG
    if os.getppid() != launcher:   # the launcher died before the request: follow it now
        os.kill(os.getpid(), signal.SIGKILL)


# every rank's (node, host, addresses), gathered as the process group starts (setup_distributed): names a lost peer
_PEERS: list = []

# gloo's words (transport/tcp/pair.cc) for a peer that is gone: "Read error [10.0.0.2]:43675: Connection reset by
# peer", "Connection closed by peer [10.0.0.2]:43675", "writev [...]:43675: Broken pipe", "Read timeout [...]:43675";
# and for a collective that no peer completed in time: "Timed out waiting 10000ms for recv operation to complete"
_GLOO_LOST = re.compile(r"(Read error|Read timeout|Write timeout|writev|Connection closed by peer|Connect timeout|"
                        r"Socket (?:unexpectedly )?closed) \[([^\]\s]+)\]:(\d+)(?::\s*([^.\n]+))?")
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms")
# NCCL's (a DistBackendError): "remote process exited or there was a network error" (unverified here: no GPUs)
_NCCL_LOST = re.compile(r"remote process|network error|[Cc]onnection (?:closed|reset)")


def _where():
    """This process's (node, host, addresses): torchrun's node rank, the host name, and the addresses its peers
    may know it by (the host name's, gloo's default, and the one it reaches the rendezvous host from)."""
    import socket

    host, addresses = socket.gethostname(), set()
    try:
        addresses.update(socket.gethostbyname_ex(host)[2])
    except OSError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:   # (UDP: connect sends nothing)
            s.connect((os.environ.get("MASTER_ADDR", "127.0.0.1"), 1))
            addresses.add(s.getsockname()[0])
    except OSError:
        pass
    return int(os.environ.get("GROUP_RANK", 0)), host, sorted(addresses)


def _span(ranks):
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)) \
        else ", ".join(map(str, ranks))


def _nodes(peers):
    return len({node for node, _, _ in peers})


def _peer_name(ip, port, rank, peers):
    """The process at ip:port as its rank (or its node's ranks) and host, where `peers` tells which it is."""
    nodes = _nodes(peers)
    ranks = [r for r, (_, _, addresses) in enumerate(peers) if ip in addresses and r != rank]
    places, at = {tuple(peers[r][:2]) for r in ranks}, f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
    if len(places) != 1:
        return f"the process at {at}" + (f" (one of ranks {_span(ranks)})" if ranks else "")
    (node, host), = places
    if len(ranks) == 1:
        return f"rank {ranks[0]} (node {node} of {nodes}, host {host}, {at})"
    return f"a rank of node {node} of {nodes} (host {host}, ranks {_span(ranks)}, {at})"


def peer_lost(exc, rank, peers):
    """The one line (after `error: `) for an exception `exc` of rank `rank` that says another process of the run
    was lost: a gloo connection closed by a peer (named by its rank, node and host where `peers`, every rank's
    (node, host, addresses), tells which it is; else by its address), a collective that waited out
    ROVA_DIST_TIMEOUT, the rendezvous store gone, NCCL's remote error; None for any other exception (its traceback
    tells more)."""
    chain = [exc]   # the exception and what it was raised from (DCP's CheckpointException holds the rank's error)
    while len(chain) < 8 and (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    text = "\n".join(str(e) for e in chain)
    me = f"rank {rank} (node {peers[rank][0]} of {_nodes(peers)})"
    if m := _GLOO_LOST.search(text):
        what, ip, port, why = m.groups()
        return (f"{_peer_name(ip, port, rank, peers)} stopped answering {me}: {' '.join((why or what).split())}; "
                "a process or node of the run was lost")
    if m := _GLOO_TIMEOUT.search(text):
        return (f"{me} waited {int(m.group(1)) / 1000:g} s (the collective timeout: ROVA_DIST_TIMEOUT) for a peer "
                "that did not answer: a process or node of the run was lost or hangs")
    dist = sys.modules.get("torch.distributed")
    lost = [] if dist is None else [e for e in chain if isinstance(e, (dist.DistNetworkError, dist.DistStoreError))
                                    or isinstance(e, dist.DistBackendError) and _NCCL_LOST.search(str(e))]
    if lost:
        return (f"{me}: the process group failed ({_one_line(str(lost[0]).split('. ')[0])[:200]}): a process or node "
                "of the run was lost, or the network between them")
    return None


def log(*args, **kwargs):
    """print, flushed, on rank 0 only once the process group is up (the other ranks would repeat its lines)."""
    if not distributed() or rank_of() == 0:
        print(*args, **kwargs, flush=True)


def rank_of() -> int:
    import torch.distributed as dist
    return dist.get_rank() if dist.is_initialized() else 0


def distributed() -> bool:
    import torch.distributed as dist
    return dist.is_initialized()


def barrier():
    if distributed():
        import torch.distributed as dist
        dist.barrier()


def all_sum(values, device):
    """Sum a list of floats over ranks."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def mean_over_ranks(value, n, device):
    """The mean of per-rank means `value`, each weighing its count n (None where no rank has data)."""
    tot = all_sum([0.0 if value is None else value * n, float(n)], device)
    return tot[0] / tot[1] if tot[1] else None


class Timer:
    """Seconds spent in each named part of a step (Table 14's components)."""

    def __init__(self):
        self.seconds = defaultdict(float)

    @contextmanager
    def __call__(self, name):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t0


def reduce_record(s, device, world):
    """A step's record from each rank's sums and counts (`key_sum`, `key_n`: the mean over ranks' data,
    None where no rank has any; `key_max`: the largest over ranks, None where every rank has -1; `sec_*` and `w_*`:
    averaged over ranks; anything else: summed), with the curriculum's rates (App. G, Table 12): rho = selected /
    samples, and the discard and defer rates."""
    keys = sorted(s)
    tot = dict(zip(keys, all_sum([s[k] for k in keys], device)))
    maxed = [k for k in keys if k.endswith("_max")]
    top = dict(zip(maxed, all_max_floats([s[k] for k in maxed], device)))
    rec = {}
    for k in keys:
        if k in top:
            rec[k[:-4]] = top[k] if top[k] >= 0 else None
        elif k.endswith("_sum"):
            base = k[:-4]
            rec[base] = tot[k] / tot[base + "_n"] if tot.get(base + "_n") else None
        elif not k.endswith("_n"):
            rec[k] = tot[k] / world if k.startswith(("sec_", "w_")) else tot[k]
    n = tot.get("samples", 0)
    for name, key in (("rho", "selected"), ("discard_rate", "discarded"), ("defer_rate", "deferred")):
        rec[name] = tot.get(key, 0) / n if n else None
    return rec


def all_max_floats(values, device):
    """The largest of each float over ranks."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and len(values):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


# ----------------------------------------------------------------------------- RNG state and data order

def hash48(*parts) -> int:
    """Stable 48-bit hash of strings (Python's hash() is salted per process; this is not)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:6], "big")


@dataclass(frozen=True)
class Seeds:
    """Every random stream of a run, named, from --seed and the process's rank: the one place that says which
    numbers seed what (the values are the ones earlier versions used, so a run regenerates exactly). Streams that
    must not depend on the rank (a benchmark's corruptions) are seeded by what they corrupt."""
    seed: int
    rank: int = 0

    @property
    def process(self) -> int:
        """Python's, NumPy's and torch's global generators (sampling in generate), and a vLLM engine's."""
        return self.seed * 1000 + self.rank

    @property
    def sft_order(self) -> int:
        """SFT's walk over this rank's samples (a Cursor)."""
        return self.seed * 1000 + 2 * self.rank

    @property
    def rl_order(self) -> int:
        """RL's walk over this rank's samples."""
        return self.seed * 1000 + 2 * self.rank + 1

    @property
    def answerability_order(self) -> int:
        """The answerability warm-up's walk over its labelled examples (on 4+ ranks rank 0's is rank 3's RL order
        number, a walk over another list: kept, as every value here, so that runs regenerate)."""
        return self.seed * 1000 + 2 * self.rank + 7

    @property
    def rl_specs(self) -> list:
        """The dynamic protocol's corruption draws of RL (Sec. 4: a fresh spec per video and step)."""
        return [self.seed, self.rank, 0xC0DE]

    def sft_jitter(self, sample_id: str, step: int | None = None) -> list:
        """A clip's photometric jitter in SFT: without `step` the same draw on every epoch and rank; with the SFT
        step's number a fresh draw each time the clip is shown (the same again on a resumed run)."""
        return [self.seed, hash48("sft-jitter", sample_id)] + ([] if step is None else [step])

    def sft_corruption(self, sample_id: str, step: int) -> list:
        """Whether, and how, a clip is corrupted at one showing in SFT (sft_corruption; the same on a resumed run)."""
        return [self.seed, hash48("sftc", sample_id), step]

    def answerability_spec(self, i: int) -> list:
        """The corruption of the answerability warm-up's i-th example (the same on a rerun)."""
        return [self.seed, self.rank, 0xA5, i]


class Cursor:
    """A seeded, resumable walk over n items: epoch e visits a fresh permutation."""

    def __init__(self, n, seed, epoch=0, pos=0):
        self.n, self.seed, self.epoch, self.pos = n, seed, epoch, pos

    def take(self, k):
        import numpy as np

        out = []
        while len(out) < k and self.n:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
            out.append(int(order[self.pos]))
            self.pos += 1
            if self.pos == self.n:
                self.epoch, self.pos = self.epoch + 1, 0
        return out

    def state(self):
        return {"epoch": self.epoch, "pos": self.pos}

    def load(self, st):
        self.epoch, self.pos = st["epoch"], st["pos"]


def rng_state(spec_rng):
    """Every RNG of this rank: JSON-able parts (python, numpy, the corruption-spec stream), and torch's
    generator states as tensors."""
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_py = random.getstate()
    plain = {"python": [version, list(internal), gauss_py], "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
             "spec": spec_rng.bit_generator.state}
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return plain, tensors


def set_rng_state(plain, tensors, spec_rng):
    import numpy as np
    import torch

    version, internal, gauss_py = plain["python"]
    random.setstate((version, tuple(internal), gauss_py))
    kind, keys, pos, has_gauss, gauss = plain["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    spec_rng.bit_generator.state = plain["spec"]
    torch.set_rng_state(tensors["torch"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(tensors["cuda"]))


# ----------------------------------------------------------------------------- the step log

class StepLog:
    """Rank 0's record of every step: log.jsonl, TensorBoard scalars (when installed) and a tqdm bar with
    a few of the figures (`postfix`: per stage, the keys shown)."""

    def __init__(self, out, rank, postfix):
        self.path, self.rank, self.postfix, self.bar = Path(out) / "log.jsonl", rank, postfix, None
        self.writer = None
        if rank == 0:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.writer = SummaryWriter(str(Path(out) / "tensorboard"))
            except Exception:  # noqa: BLE001 - TensorBoard is optional
                self.writer = None

    def open_bar(self, total, initial, desc):
        self.close_bar()
        if self.rank == 0:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)

    def close_bar(self):
        if self.bar is not None:
            self.bar.close()
        self.bar = None

    def __call__(self, rec):
        if self.rank != 0:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.writer is not None:
            for k, v in rec.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.writer.add_scalar(f"{rec['stage']}/{k}", v, rec["step"])
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix({k: round(rec[k], 3) for k in self.postfix[rec["stage"]] if rec.get(k) is not None})


def leave(code: int = 0):
    """End the process now, without the interpreter's teardown (runs.finish, after a distributed run's last
    collective): the logs and standard streams flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
