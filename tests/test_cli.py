"""machinery/cli.py: one-line errors, output-path checks, grouped help with defaults, quiet third-party output, the
OpenMP wait policy, a lost peer in one line (with distributed.py's peer_lost); and hub.py's model-source checks."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from machinery import cli, distributed, hub

ROOT = Path(__file__).resolve().parents[1]


def run_py(code, env=None):
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_run_prints_a_user_error_as_one_line_with_exit_code_2():
    code = ("from machinery import cli\n"
            "def main():\n    raise cli.UserError('bad.json: row 3 (id q7): field\\n solution: missing')\n"
            "cli.run(main)")
    out = run_py(code)
    assert out.returncode == 2 and out.stderr == "error: bad.json: row 3 (id q7): field solution: missing\n"
    debug = run_py(code, env={"ROVA_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "UserError" in debug.stderr


def test_run_turns_ctrl_c_into_one_line_with_the_hint():
    out = run_py("from machinery import cli\ndef main():\n    raise KeyboardInterrupt\n"
                 "cli.run(main, interrupted=lambda: 'rerun the same command')")
    assert out.returncode == 130 and out.stderr.strip() == "interrupted: rerun the same command"


def test_an_interrupt_hint_block_names_how_to_continue_and_the_innermost_wins():
    out = run_py("from machinery import cli\ndef main():\n    with cli.interrupt_hint('outer'):\n"
                 "        with cli.interrupt_hint('continue in OUT'):\n            raise KeyboardInterrupt\n"
                 "cli.run(main, interrupted='the default')")
    assert out.returncode == 130 and out.stderr.strip() == "interrupted: continue in OUT"
    out = run_py("from machinery import cli\ndef main():\n    with cli.interrupt_hint('in OUT'):\n"
                 "        pass\n    raise KeyboardInterrupt\ncli.run(main, interrupted='the default')")
    assert out.stderr.strip() == "interrupted: the default"


def test_out_dir_and_out_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(cli.UserError, match="is a file"):
        cli.out_dir(tmp_path / "f" / "sub")
    assert cli.out_dir(tmp_path / "a" / "b").is_dir()
    assert not cli.out_dir(tmp_path / "c", create=False).exists()
    with pytest.raises(cli.UserError, match="unsupported extension '.txt'"):
        cli.out_file(tmp_path / "x.txt", (".mp4",))
    with pytest.raises(cli.UserError, match="is a folder"):
        cli.out_file(tmp_path / "a", (".mp4",))
    with pytest.raises(cli.UserError, match="is a file"):
        cli.out_file(tmp_path / "f" / "x.mp4", (".mp4",))
    p = cli.out_file(tmp_path / "new" / "x.mp4", (".mp4",))
    assert p.parent.is_dir() and not p.exists()  # the folder is made, nothing is written


def test_model_source_tells_paths_from_hub_ids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    assert hub.model_source("ckpt") == {}
    for name, phrase in (("runs/nope", "no such folder"), ("./x", "no such folder"), ("a/b/c", "no such folder"),
                         (str(tmp_path), "no config.json")):
        with pytest.raises(cli.UserError, match=phrase):
            hub.model_source(name)
    monkeypatch.setattr(hub, "_hub_reachable", lambda *a, **k: pytest.fail("no hub request for a path"))
    with pytest.raises(cli.UserError):
        hub.model_source("runs/also-missing")


def test_an_uncached_hub_id_offline_is_one_line():
    out = run_py("from machinery import cli, hub\ncli.run(lambda: hub.model_source('someorg/not-cached'))",
                 env={"HF_HUB_OFFLINE": "1"})
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "HF_HUB_OFFLINE=1" in lines[0] and "hf download" in lines[0]


def test_bitsandbytes_is_quiet_and_the_spin_count_is_set():
    out = run_py("from machinery import cli; import os, peft, bitsandbytes; print(os.environ['GOMP_SPINCOUNT'])")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "gemm_4bit" not in out.stderr and "kernels" not in out.stderr
    assert out.stdout.strip() == cli.GOMP_SPINCOUNT
    mine = run_py("from machinery import cli; import os; print(os.environ['GOMP_SPINCOUNT'])",
                  env={"GOMP_SPINCOUNT": "7"})
    assert mine.stdout.strip() == "7"  # a user's own setting wins


def test_saving_a_checkpoint_draws_no_shard_bar(tmp_path, capfd, tiny_policy):
    from machinery.model import policy
    model, processor = tiny_policy
    capfd.readouterr()
    policy.save(model, processor, tmp_path / "ckpt")
    assert "Writing model shards" not in capfd.readouterr().err
    assert (tmp_path / "ckpt" / "model.safetensors").is_file()


def test_help_is_grouped_and_shows_the_defaults():
    out = subprocess.run([sys.executable, "train.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    text = out.stdout
    heads = [f"\n{g}:\n" for g in ("model", "data", "output", "SFT", "RL", "curriculum", "distributed")]
    assert all(h in text for h in heads) and [text.index(h) for h in heads] == sorted(text.index(h) for h in heads)
    assert "--perceiver" not in text and "--agent-k" not in text  # an extension's flags: only in its own --help
    er = subprocess.run([sys.executable, "-m", "extensions.embodied_r.train", "--help"], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
    assert er.returncode == 0 and er.stdout.index("\ndistributed:\n") < er.stdout.index("\nEmbodied-R:\n")
    assert "--perceiver" in er.stdout and "--lora-r" in er.stdout
    flat = " ".join(text.split())
    assert "RL steps (App. D: 300) (default: 300)" in flat and "--overwrite" in flat and "--debug" in flat
    ev = subprocess.run([sys.executable, "eval_pvrbench.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
    assert ev.returncode == 0 and all(f"\n{g}:\n" in ev.stdout for g in ("benchmark", "model", "judge", "output"))


# gloo's error when the peer's process is gone (torch 2.14, seen on the surviving rank of a two-node run whose other
# node's torchrun was killed with kill -9), and when a collective waited out the process group's timeout
GLOO_RESET = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [10.0.0.2]:49821: "
              "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the "
              "application. Check the logs of the remote worker before reporting an error. GLHF!")
GLOO_TIMEOUT = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting "
                "10000ms for recv operation to complete")
TWO_NODES = [(0, "gpu-a", ["10.0.0.1"]), (0, "gpu-a", ["10.0.0.1"]), (1, "gpu-b", ["10.0.0.2"]),
             (1, "gpu-b", ["10.0.0.2"])]


def test_a_lost_peer_is_named_by_its_rank_node_and_host():
    """distributed.peer_lost: gloo's address -> the rank, or the node's ranks, that it is; the timeout in seconds; any
    other exception is not a lost peer."""
    one_each = [(0, "gpu-a", ["10.0.0.1"]), (1, "gpu-b", ["10.0.0.2", "192.168.0.2"])]
    assert distributed.peer_lost(RuntimeError(GLOO_RESET), 0, one_each) == (
        "rank 1 (node 1 of 2, host gpu-b, 10.0.0.2:49821) stopped answering rank 0 (node 0 of 2): Connection reset by "
        "peer; a process or node of the run was lost")
    assert distributed.peer_lost(RuntimeError(GLOO_RESET), 1, TWO_NODES).startswith(
        "a rank of node 1 of 2 (host gpu-b, ranks 2, 3, 10.0.0.2:49821) stopped answering rank 1 (node 0 of 2): ")
    same_host = [(0, "vm", ["127.0.0.1"]), (0, "vm", ["127.0.0.1"]), (1, "vm", ["127.0.0.1"])]
    closed = RuntimeError("Connection closed by peer [127.0.0.1]:5")
    assert distributed.peer_lost(closed, 0, same_host).startswith(
        "the process at 127.0.0.1:5 (one of ranks 1, 2) stopped answering rank 0 (node 0 of 2): Connection closed by "
        "peer; ")
    assert distributed.peer_lost(RuntimeError(GLOO_TIMEOUT), 3, TWO_NODES) == (
        "rank 3 (node 1 of 2) waited 10 s (the collective timeout: ROVA_DIST_TIMEOUT) for a peer that did not answer: "
        "a process or node of the run was lost or hangs")
    try:   # what DCP does: the rank's error inside another one
        try:
            raise RuntimeError(GLOO_RESET.replace("10.0.0.2", "10.0.0.9"))
        except RuntimeError as inner:
            raise BaseException("CheckpointException ranks:dict_keys([0])") from inner
    except BaseException as wrapped:
        assert distributed.peer_lost(wrapped, 0, TWO_NODES).startswith("the process at 10.0.0.9:49821 stopped answering")
    assert distributed.peer_lost(RuntimeError("CUDA out of memory"), 0, TWO_NODES) is None
    assert distributed.peer_lost(ValueError("Read error in row 3"), 0, TWO_NODES) is None


def test_nccl_and_store_failures_are_a_lost_peer_and_other_backend_errors_are_not():
    """A DistBackendError is a lost peer only when it says so (NCCL's remote error); the rendezvous store gone is one;
    an NCCL error of another kind keeps its traceback."""
    import torch.distributed as dist
    remote = dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a "
                                   "network error, NCCL version 2.21.5\nncclRemoteError: A call failed. Last error: x")
    assert distributed.peer_lost(remote, 2, TWO_NODES) == (
        "rank 2 (node 1 of 2): the process group failed (NCCL error in: ProcessGroupNCCL.cpp:1970, remote process "
        "exited or there was a network error, NCCL version 2.21.5 ncclRemoteError: A call failed): a process or node "
        "of the run was lost, or the network between them")
    store = dist.DistNetworkError("Failed to recv, got 0 bytes. Connection was likely closed.")
    assert distributed.peer_lost(store, 0, TWO_NODES).startswith("rank 0 (node 0 of 2): the process group failed (Failed "
                                                                 "to recv, got 0 bytes): ")
    assert distributed.peer_lost(dist.DistBackendError("NCCL error: unhandled cuda error"), 0, TWO_NODES) is None


LOST = """
from machinery import cli, distributed
distributed._PEERS[:] = {peers!r}
def main():
    with cli.interrupt_hint(lambda: 'rerun the same command to continue from rl-0000004'):
        raise RuntimeError({text!r})
cli.run(main, interrupted='the default')
"""


def test_run_reports_a_lost_peer_in_one_line_with_how_to_continue():
    """cli.run on a process of a distributed run: a lost peer is one line naming it, then what to rerun (on every
    node when the run spans several) from the interrupt_hint block, exit code 1, no traceback; with ROVA_DEBUG=1
    the traceback. A process of no distributed run (no peers) gets the traceback."""
    out = run_py(LOST.format(peers=TWO_NODES, text=GLOO_RESET))
    assert out.returncode == 1 and out.stderr == (
        "error: a rank of node 1 of 2 (host gpu-b, ranks 2, 3, 10.0.0.2:49821) stopped answering rank 0 (node 0 of 2): "
        "Connection reset by peer; a process or node of the run was lost. On every node: rerun the same command to "
        "continue from rl-0000004\n")
    one_node = run_py(LOST.format(peers=[(0, "vm", ["127.0.0.1"])] * 2, text=GLOO_TIMEOUT))
    assert one_node.returncode == 1 and one_node.stderr.endswith(
        "or hangs. rerun the same command to continue from rl-0000004\n") and "On every node" not in one_node.stderr
    debug = run_py(LOST.format(peers=TWO_NODES, text=GLOO_RESET), env={"ROVA_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "GLHF" in debug.stderr
    alone = run_py(LOST.format(peers=[], text=GLOO_RESET))
    assert alone.returncode == 1 and "Traceback" in alone.stderr and "stopped answering" not in alone.stderr
