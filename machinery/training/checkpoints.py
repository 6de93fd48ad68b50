"""Checkpoints and run folders (train.py's resume): a kill -9 anywhere leaves a checkpoint either whole or
invisible, every rank of a run resumes from the one checkpoint rank 0 chose, and no two runs share a folder.

- A checkpoint is written into ``checkpoints/.tmp-<name>``, marked COMPLETE and renamed into place; an old one
  is renamed to ``.trash-...`` before it is deleted. Names that start with a dot are never resumed from, and
  setup removes them once this run holds the folder.
- A checkpoint counts when it has every file a resume reads (:func:`missing`); one that lacks any is skipped with
  a one-line note and the previous complete one is used.
- Rank 0 decides what the run folder means (continue, refuse, start) and broadcasts it; the other ranks never
  list or read the folder on their own, and rank 0 changes it only after every rank has the decision.
- Every process of a run holds a shared lock on ``OUT/.lock`` while it lives (the kernel drops it at the
  process's death, kill -9 included). A new run's rank 0 first asks for it exclusively, so a folder in which
  another run's processes still work (torchrun's workers outlive a torchrun killed with kill -9) is refused.
- Testing: ``ROVA_FAULT=POINT[@N][:RANK]`` kills the process with SIGKILL the N-th time (default the first) it
  passes the named point, on rank RANK (default every rank); :data:`FAULT_POINTS` lists the points.

Standard library only at import (torch where it is used).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from machinery import distributed
from machinery.cli import UserError

STAGE_ORDER = {"sft": 0, "rl": 1}
FAULT_ENV = "ROVA_FAULT"
FAULT_POINTS = (
    "setup.locked",     # rank 0 holds the folder, nothing decided yet
    "setup.decided",    # every rank has the decision; stale temporary folders not yet removed
    "save.begin",       # the temporary folder exists
    "save.rank_files",  # this rank's JSON state and RNG tensors are written, the weights not yet
    "save.weights",     # torch.distributed.checkpoint has written every shard; no state.json yet
    "save.marked",      # rank 0: COMPLETE written in the temporary folder, not yet renamed
    "save.renamed",     # rank 0: the checkpoint is in place, the old ones not yet pruned
    "prune.retired",    # rank 0: an old checkpoint renamed to .trash-..., not yet deleted
)
_passed = Counter()
_locks = {}   # run folder -> its open lock file (held for the process's life, or until the next claim here)


def fault_point(name):
    """Kill this process (SIGKILL: no cleanup, no flush) where ROVA_FAULT names `name` (see the module's
    docstring); nothing otherwise."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    point, _, on_rank = spec.partition(":")
    point, _, nth = point.partition("@")
    if point != name or (on_rank and int(on_rank) != distributed.rank_of()):
        return
    _passed[name] += 1
    if _passed[name] == int(nth or 1):
        print(f"{FAULT_ENV}: killed at {name} (pass {_passed[name]})", file=sys.stderr, flush=True)
        import signal
        os.kill(os.getpid(), signal.SIGKILL)


def checkpoint_name(state):
    return f"{state['stage']}-{state['step']:07d}"


def missing(ckpt) -> list[str]:
    """The files a resume reads that `ckpt` lacks: COMPLETE, state.json, every rank's state and RNG files and
    the weights (torch.distributed.checkpoint writes state/.metadata last)."""
    ckpt = Path(ckpt)
    lacks = [n for n in ("COMPLETE", "state.json", "state/.metadata") if not (ckpt / n).is_file()]
    if "state.json" in lacks:
        return lacks
    try:
        world = json.loads((ckpt / "state.json").read_text()).get("world", 1)
    except (OSError, ValueError):
        return lacks + ["state.json (unreadable)"]
    return lacks + [n for r in range(world) for n in (f"rank{r}.json", f"rank{r}_rng.pt")
                    if not (ckpt / n).is_file()]


def complete_checkpoints(root, notes=None):
    """Checkpoints with every file a resume reads, oldest first (SFT before RL, then by step). Folders that
    start with a dot are being written or deleted; a checkpoint lacking a file is left out, with a line in
    `notes` (a list) if given."""
    found = [p for p in Path(root).glob("*-*") if p.is_dir() and not p.name.startswith(".")
             and p.name.split("-")[0] in STAGE_ORDER]
    done = []
    for p in found:
        lacks = missing(p)
        if not lacks:
            done.append(p)
        elif notes is not None and (p / "COMPLETE").is_file():
            notes.append(f"skipping checkpoint {p.name}: it lacks {', '.join(lacks)} (killed while it was written "
                         "or deleted)")
    return sorted(done, key=lambda p: (STAGE_ORDER[p.name.split("-")[0]], p.name))


def _retire(path):
    """Delete a folder so that a kill at any moment leaves it either whole or under a dot name: rename, then
    delete."""
    trash = path.parent / f".trash-{path.name}-{uuid.uuid4().hex[:8]}"
    os.replace(path, trash)
    fault_point("prune.retired")
    shutil.rmtree(trash, ignore_errors=True)


@contextmanager
def interrupt_after():
    """Ctrl-C while a checkpoint is written stops the run once it is written (a second Ctrl-C at once):
    torch.distributed.checkpoint would report the interrupt as a failed write, not as an interrupt."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    asked = []

    def later(signum, frame):
        if asked:
            raise KeyboardInterrupt
        asked.append(signum)
        print("interrupt: finishing the checkpoint first (Ctrl-C again to stop now)", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGINT, later)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if asked:
        raise KeyboardInterrupt


def save_checkpoint(out, rank, state, config, per_rank, save_all, keep=2, world=1):
    """Atomic: every rank writes its own state (JSON, and torch RNG tensors: both safe to load) and what
    `save_all(folder)` writes (a collective: each rank's shard of the weights and optimiser, with
    torch.distributed.checkpoint) into a temporary folder; rank 0 adds state.json (with the number of
    processes), marks it COMPLETE and renames it; only the last `keep` complete checkpoints stay."""
    with interrupt_after():
        _save_checkpoint(out, rank, state, config, per_rank, save_all, keep, world)


def _save_checkpoint(out, rank, state, config, per_rank, save_all, keep, world):
    import torch

    root = Path(out) / "checkpoints"
    tmp = root / f".tmp-{checkpoint_name(state)}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    distributed.barrier()
    fault_point("save.begin")
    plain, tensors = per_rank
    (tmp / f"rank{rank}.json").write_text(json.dumps(plain))
    torch.save(tensors, tmp / f"rank{rank}_rng.pt")
    fault_point("save.rank_files")
    save_all(tmp)
    fault_point("save.weights")
    if rank == 0:
        (tmp / "state.json").write_text(json.dumps({"state": state, "config": config, "world": world}, indent=1))
    distributed.barrier()
    if rank == 0:
        (tmp / "COMPLETE").write_text("ok\n")
        fault_point("save.marked")
        final = root / checkpoint_name(state)
        if final.exists():   # a checkpoint of this step skipped at resume (it lacked a file)
            _retire(final)
        os.replace(tmp, final)
        fault_point("save.renamed")
        for old in complete_checkpoints(root)[:-max(1, keep)]:
            _retire(old)
    distributed.barrier()


def load_rank_state(ckpt, rank):
    """This rank's (JSON state, torch RNG tensors) from a checkpoint, or None without one."""
    import torch

    if ckpt is None:
        return None
    return json.loads((ckpt / f"rank{rank}.json").read_text()), torch.load(ckpt / f"rank{rank}_rng.pt",
                                                                            weights_only=True)


def config_changes(saved: dict, now: dict, ignore=()) -> list[str]:
    """'--flag old -> new' for every field (not in `ignore`) in which `now` differs from a saved config."""
    return [f"--{k.replace('_', '-')} {saved[k]!r} -> {now[k]!r}" for k in now
            if k in saved and k not in ignore and saved[k] != now[k]]


# ----------------------------------------------------------------------------- claiming a run folder

def claim_run_folder(out, config, rank, *, resume="", overwrite=False, ignore=(), files=(), folders=(), log=print,
                     world=1):
    """What the run folder `out` holds decides what this run does; nothing finished is deleted implicitly.
    A finished run (final/ or summary.json) is refused unless `overwrite`; an unfinished one (complete
    checkpoints) is continued from its last checkpoint when `config` matches its saved one (fields in
    `ignore` aside) or `resume` is given, refused otherwise; the `files` and `folders` of a run stopped
    before its first checkpoint are replaced. `resume` may also name a checkpoint folder. A checkpoint
    written by another number of processes (`world`) is refused, and so is a folder another run's processes
    still hold. Rank 0 decides; every rank returns its decision: the checkpoint to resume from, or None for a
    fresh run."""
    out = Path(out)
    decision = None
    if rank == 0:
        try:
            _lock(out, exclusive=True)
            fault_point("setup.locked")
            decision = _decide(out, config, resume, overwrite, ignore, world, log)
        except UserError as e:
            decision = {"error": str(e)}
    decision = _broadcast(decision)
    if "error" in decision:
        raise UserError(decision["error"])
    if rank != 0:
        _lock(out, exclusive=False)
    fault_point("setup.decided")
    if rank == 0:
        _tidy(out, files, folders, clear=decision["clear"])
    distributed.barrier()
    return Path(decision["ckpt"]) if decision["ckpt"] else None


def _decide(out, config, resume, overwrite, ignore, world, log):
    """Rank 0's reading of the run folder: {"ckpt": path or None, "clear": whether to replace the run's
    files}; a UserError where the run must not start."""
    if resume and resume != "auto":
        ckpt = Path(resume)
        if not (ckpt / "COMPLETE").is_file():
            raise UserError(f"--resume {ckpt}: not a complete checkpoint (no COMPLETE marker)")
        lacks = missing(ckpt)
        if lacks:
            raise UserError(f"--resume {ckpt}: the checkpoint lacks {', '.join(lacks)}")
        log(f"resuming from {ckpt}")
        return {"ckpt": str(_same_world(ckpt, world)), "clear": False}
    notes = []
    done = complete_checkpoints(out / "checkpoints", notes)
    for note in notes:
        log(note)
    finished = (out / "final").is_dir() or (out / "summary.json").is_file()
    if overwrite:
        if done or finished:
            log(f"--overwrite: replacing the run in {out}")
        return {"ckpt": None, "clear": True}
    if finished:
        raise UserError(f"{out} holds a finished run (final weights in {out / 'final'}): give --out NEW for "
                        "another run, or --overwrite to replace it")
    if not done:
        return {"ckpt": None, "clear": True}  # nothing finished: a run stopped before its first checkpoint
    saved = json.loads((done[-1] / "state.json").read_text())
    changes = config_changes(saved["config"], config, ignore)
    if changes and not resume:
        raise UserError(f"{out} holds an unfinished run (last checkpoint {done[-1].name}) with another "
                        f"config ({'; '.join(changes[:4])}): rerun with its flags to continue it, "
                        "--resume auto to continue it with these, --out NEW, or --overwrite")
    log(f"continuing the unfinished run in {out} from {done[-1].name} ({saved['state']['stage']} step "
        f"{saved['state']['step']}" + (f"; changed flags: {'; '.join(changes)})" if changes
                                      else "; same config, --overwrite starts over)"))
    return {"ckpt": str(_same_world(done[-1], world)), "clear": False}


def _same_world(ckpt, world):
    """The weights and optimiser would reshard (torch.distributed.checkpoint does), but each process's data
    shard, memory buffer and RNG streams cannot be split or merged: a checkpoint resumes on as many processes
    as wrote it."""
    saved = json.loads((ckpt / "state.json").read_text())
    if saved.get("world", 1) != world:
        raise UserError(f"{ckpt} was written by {saved.get('world', 1)} processes and this run has {world}: each "
                        f"process's data shard, memory buffer and RNG streams are in it; rerun with torchrun "
                        f"--nproc_per_node={saved.get('world', 1)} (or --out NEW)")
    return ckpt


def _broadcast(decision):
    if not distributed.distributed():
        return decision
    import torch.distributed as dist
    box = [decision]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _tidy(out, files, folders, clear):
    """Rank 0, once every rank has the decision: remove what killed saves and prunes left (dot folders), and
    with `clear` the `files` and `folders` of the run being replaced."""
    for stale in [*out.glob(".trash-*"), *(out / "checkpoints").glob(".*-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    if clear:
        for name in files:
            (out / name).unlink(missing_ok=True)
        for name in folders:
            if (out / name).is_dir():
                _retire(out / name)


def _lock(out, exclusive):
    """Hold OUT/.lock for this process's life: shared, after rank 0 made sure nobody else holds it (exclusive
    and non-blocking, then shared). Where flock is missing (not Linux or macOS), nothing is locked."""
    try:
        import fcntl
    except ImportError:
        return
    out.mkdir(parents=True, exist_ok=True)
    key = str(out.resolve())
    if key in _locks:   # this process's earlier run in the same folder (tests, notebooks): it has ended
        _locks.pop(key).close()
    handle = open(out / ".lock", "a")
    try:
        if exclusive:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(handle, fcntl.LOCK_SH | (fcntl.LOCK_NB if exclusive else 0))
    except BlockingIOError:
        handle.close()
        raise UserError(f"another run's processes are still at work in {out} (they hold {out / '.lock'}; the "
                        "workers of a torchrun killed with kill -9 outlive it): stop them (for example pkill -f "
                        f"'{out}'), or give --out NEW") from None
    except OSError as e:   # a filesystem without flock (Lustre mounted without -o flock: ENOSYS; some NFS: ENOLCK)
        handle.close()
        raise UserError(f"--out {out}: its filesystem does not lock files ({e.strerror}); the run folder needs flock "
                        "(Lustre: mount with -o flock; NFS: with its lock service), or give --out on another "
                        "filesystem") from None
    _locks[key] = handle


def release(out):
    """Let go of OUT/.lock (a run that ended; the process's death does it otherwise)."""
    handle = _locks.pop(str(Path(out).resolve()), None)
    if handle is not None:
        handle.close()


# ----------------------------------------------------------------------------- the step log on resume

def truncate_log(path, state):
    """On resume, drop the log lines of steps after the checkpoint (they are redone)."""
    path = Path(path)
    if not path.is_file():
        return
    at = (STAGE_ORDER[state["stage"]], state["step"])
    keep = [ln for ln in path.read_text().splitlines()
            if ln.strip() and (STAGE_ORDER[json.loads(ln)["stage"]], json.loads(ln)["step"]) <= at]
    path.write_text("".join(ln + "\n" for ln in keep))
