"""checkpoints.py: a checkpoint lacking a file is skipped for the previous complete one, dot folders are never
resumed from, a folder another run's processes hold is refused, and torchrun's workers die with a killed
torchrun (the cause of a rerun resuming from a checkpoint the old workers were pruning)."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from machinery.cli import UserError
from machinery.training import checkpoints

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {"lr": 1.0}


def fake_checkpoint(root, name, world=1, lacks=()):
    """A checkpoint folder with every file a resume reads (empty stand-ins), but those in `lacks`."""
    ckpt = root / "checkpoints" / name
    (ckpt / "state").mkdir(parents=True)
    stage, step = name.removeprefix(".tmp-").split("-")
    files = {"COMPLETE": "ok\n", "state/.metadata": "",
             "state.json": json.dumps({"state": {"stage": stage, "step": int(step)}, "config": CONFIG, "world": world})}
    files |= {f"rank{r}{suffix}": "{}" for r in range(world) for suffix in (".json", "_rng.pt")}
    for path, text in files.items():
        if path not in lacks:
            (ckpt / path).write_text(text)
    return ckpt


def claim(out, **kw):
    lines = []
    ckpt = checkpoints.claim_run_folder(out, CONFIG, 0, log=lines.append, **kw)
    return ckpt, lines


@pytest.mark.parametrize("lacks", ["state.json", "rank1_rng.pt", "state/.metadata"])
def test_a_checkpoint_lacking_a_file_is_skipped_with_a_note_for_the_previous_one(tmp_path, lacks):
    fake_checkpoint(tmp_path, "sft-0000002", world=2)
    fake_checkpoint(tmp_path, "sft-0000004", world=2, lacks=(lacks,))
    ckpt, lines = claim(tmp_path, world=2)
    assert ckpt.name == "sft-0000002"
    assert any(ln.startswith("skipping checkpoint sft-0000004") and lacks in ln for ln in lines), lines
    assert checkpoints.missing(tmp_path / "checkpoints" / "sft-0000004") == [lacks]


def test_dot_folders_are_never_resumed_from_and_are_removed_once_the_folder_is_claimed(tmp_path):
    fake_checkpoint(tmp_path, "sft-0000002")
    fake_checkpoint(tmp_path, ".tmp-sft-0000004")             # killed between COMPLETE and the rename
    (tmp_path / "checkpoints" / ".trash-sft-0000000-ab12cd34").mkdir()   # killed while pruning
    ckpt, _ = claim(tmp_path)
    assert ckpt.name == "sft-0000002"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["sft-0000002"]


def test_only_incomplete_checkpoints_start_the_run_over(tmp_path):
    fake_checkpoint(tmp_path, "sft-0000002", lacks=("COMPLETE",))
    (tmp_path / "log.jsonl").write_text("{}\n")
    ckpt, _ = claim(tmp_path, files=("log.jsonl",), folders=("checkpoints",))
    assert ckpt is None and not (tmp_path / "log.jsonl").exists() and not (tmp_path / "checkpoints").exists()
    assert not list(tmp_path.glob(".trash-*"))


HOLDER = """import fcntl, sys, time
f = open(sys.argv[1], "a"); fcntl.flock(f, fcntl.LOCK_SH); print("held", flush=True); time.sleep(60)"""


def test_a_folder_another_runs_process_holds_is_refused(tmp_path):
    fake_checkpoint(tmp_path, "sft-0000002")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / ".lock")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match="another run's processes are still at work"):
            claim(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert claim(tmp_path)[0].name == "sft-0000002"   # the holder is gone: the kernel dropped its lock
    assert claim(tmp_path)[0].name == "sft-0000002"   # this process's own earlier claim does not block it


def test_a_filesystem_without_flock_is_one_line(tmp_path, monkeypatch):
    """Lustre mounted without -o flock answers flock with ENOSYS: a UserError naming the folder, not a traceback."""
    import errno
    import fcntl

    def no_flock(handle, how):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    monkeypatch.setattr(fcntl, "flock", no_flock)
    with pytest.raises(UserError, match="its filesystem does not lock files .*Lustre: mount with -o flock"):
        claim(tmp_path)


WORKER = """import os, sys, time
from machinery import distributed
distributed.setup_distributed()
path = f"{sys.argv[1]}/{distributed.rank_of()}"
open(path, "w").write(str(os.getpid()))
os.replace(path, path + ".pid")
time.sleep(120)"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
@pytest.mark.slow
def test_torchruns_workers_die_with_a_torchrun_killed_by_sigkill(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                 "2", str(script), str(tmp_path)], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while len(list(tmp_path.glob("*.pid"))) < 2 and time.time() < deadline:
        time.sleep(0.2)
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    time.sleep(2)
    alive = [pid for pid in pids if _alive(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "torchrun's workers outlived it"


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
