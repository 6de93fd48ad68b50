"""Training across nodes (docs/USAGE.md, "Across nodes"), as two torchrun agents on this machine: the command a user
runs on every node (--nnodes 2 --nproc-per-node 1, c10d rendezvous on 127.0.0.1). Two nodes end with the weights of
one node's two processes, bit for bit (FSDP2 and DDP-LoRA); a node lost in the middle of RL (its torchrun killed with
kill -9) stops the other within the collective timeout, in one line naming the lost rank, and the same two commands
started again continue from the last checkpoint to the uninterrupted run's weights."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from machinery.model import policy
from machinery.training import checkpoints
from test_parallel import ENV, ROOT, args, final_weights, torchrun

pytestmark = [pytest.mark.slow,   # torchrun agents, kill -9: the slow tier
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds torchrun's workers in /proc")]

KINDS = {"fsdp2": [], "ddp-lora": ["--lora-r", "4"]}
COLLECTIVE_TIMEOUT_S = 15   # ROVA_DIST_TIMEOUT of the run that loses a node
RUN_S = 300                 # the most one two-node run may take here


@pytest.fixture(scope="module")
def assets(train_assets):   # (conftest.py: the tiny model and 8 synthetic clips)
    return train_assets


def run_args(assets, out, kind):
    """test_parallel's small run (SFT, then 3 RL steps), GRPO, a checkpoint after every step."""
    return args(assets, out, "--mode", "grpo", "--save-every", "1", *KINDS[kind])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(ready, seconds, what):
    deadline = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline, f"{what}: not after {seconds} s"
        time.sleep(0.05)


def serving(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def start_nodes(argv, logs, port, job, env=None):
    """The same command on two 'nodes': a torchrun agent each, with its output in its log file. The first starts
    alone until it serves the rendezvous on `port`, so that it is the node that hosts it (on a cluster, the one
    --rdzv-endpoint names)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend",
           "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", job, "train.py", *map(str, argv)]
    agents = []
    for log in logs:
        with open(log, "w") as f:
            agents.append(subprocess.Popen(cmd, cwd=ROOT, env={**ENV, **(env or {})}, stdout=f,
                                           stderr=subprocess.STDOUT))
        wait_until(lambda: serving(port) or agents[0].poll() is not None, 120, "the rendezvous")
    return agents


def finish(agents, logs):
    """Wait for both agents; each must end with exit code 0."""
    for agent, log in zip(agents, logs):
        try:
            rc = agent.wait(timeout=RUN_S)
        except subprocess.TimeoutExpired:
            rc = "still running"
        assert rc == 0, (rc, log.read_text()[-3000:])


def stop(agents):
    """kill -9 what still runs (its workers die with it)."""
    for agent in agents:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


def workers(agent):
    """{pid: environment} of the processes torchrun agent `agent` started (/proc)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == agent.pid:
                env = (stat.parent / "environ").read_bytes().split(b"\0")
                out[int(stat.parent.name)] = dict(kv.decode().split("=", 1) for kv in env if b"=" in kv)
        except (OSError, IndexError, ValueError):
            continue
    return {pid: env for pid, env in out.items() if "RANK" in env}


def alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def trained(weights, tiny):
    base = policy.load_policy(tiny)[0].state_dict()   # (LoRA: B starts at zero, the adapter is all it saves)
    return [k for k in weights if (k in base and not torch.equal(weights[k], base[k])) or
            ("lora_B" in k and weights[k].any())]


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def two_nodes(assets, tmp_path_factory):
    """kind -> the run folder of an uninterrupted two-node run (made once per kind)."""
    done = {}

    def get(kind):
        if kind not in done:
            root = tmp_path_factory.mktemp(f"two-nodes-{kind}")
            logs = [root / "node-a.log", root / "node-b.log"]
            agents = start_nodes(run_args(assets, root / "run", kind), logs, free_port(), uuid.uuid4().hex)
            try:
                finish(agents, logs)
            finally:
                stop(agents)
            done[kind] = root / "run"
        return done[kind]
    return get


@pytest.mark.parametrize("kind", KINDS)
def test_two_nodes_end_with_the_weights_of_one_node(assets, tmp_path, two_nodes, kind):
    """Two torchrun agents (--nnodes 2, one process each, c10d rendezvous) train to the final weights of
    `torchrun --nproc-per-node 2` on one node, bit for bit: FSDP2 full fine-tuning and DDP-LoRA."""
    one = tmp_path / "one"
    torchrun(2, "train.py", *run_args(assets, one, kind))
    two = two_nodes(kind)
    assert len(json.loads((two / "summary.json").read_text())["rank_checksums"]) == 2
    wa, wb = final_weights(one), final_weights(two)
    assert same(wa, wb), [k for k in wa if not torch.equal(wa[k], wb.get(k, torch.empty(0)))][:5]
    assert trained(wa, assets[1]), "training changed nothing"


def lose_node(agents, out):
    """Once RL's first checkpoint is in place, kill -9 the torchrun of the node that does not host the rendezvous:
    (its rank, its node rank, its worker's pid, seconds until the other agent exited, the other's exit code)."""
    wait_until(lambda: (out / "checkpoints" / "rl-0000001").is_dir() or any(a.poll() is not None for a in agents),
               RUN_S, "RL's first checkpoint")
    host, lost = agents
    assert host.poll() is None and lost.poll() is None, "an agent ended before RL's first checkpoint"
    found = workers(lost)
    assert len(found) == 1, found
    ((pid, env),) = found.items()
    t0 = time.monotonic()
    os.kill(lost.pid, signal.SIGKILL)
    try:
        rc = host.wait(timeout=COLLECTIVE_TIMEOUT_S + 60)
    except subprocess.TimeoutExpired:
        rc = None
    return int(env["RANK"]), int(env["GROUP_RANK"]), pid, time.monotonic() - t0, rc


def rl_lines(out):
    return [line for line in (out / "log.jsonl").read_text().splitlines() if json.loads(line)["stage"] == "rl"]


def check_the_line(text, rank, node, saved):
    """The surviving node's output: one `error:` line naming the lost rank and its node, and what to rerun (on every
    node, from `saved`); no worker traceback (torch's hook prints it as "[rank0]: Traceback ...")."""
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "]: Traceback" not in text, text[-3000:]
    assert re.fullmatch(
        rf"error: rank {rank} \(node {node} of 2, host {re.escape(socket.gethostname())}, 127\.0\.0\.1:\d+\) stopped "
        rf"answering rank {1 - rank} \(node {1 - node} of 2\): [^;]+; a process or node of the run was lost\. On every "
        rf"node: rerun the same command to continue from the last checkpoint in {re.escape(str(saved.parent))} "
        rf"\({saved.name}\)", errors[0]), errors[0]


def test_a_lost_node_stops_the_other_in_one_line_and_the_same_commands_continue(assets, tmp_path, two_nodes):
    """FSDP2 on two nodes, one lost in the middle of RL (its torchrun killed with kill -9, its worker with it): the
    other node's torchrun exits non-zero within ROVA_DIST_TIMEOUT (plus a margin), its output has one line naming
    the lost rank and what to rerun, and no worker traceback; the same two commands started again continue from
    the last checkpoint (the RL steps saved are not redone) and end with the uninterrupted run's weights, bit for
    bit."""
    out, port, job = tmp_path / "run", free_port(), uuid.uuid4().hex
    argv, env = run_args(assets, out, "fsdp2"), {"ROVA_DIST_TIMEOUT": str(COLLECTIVE_TIMEOUT_S)}
    logs = [tmp_path / "node-a.log", tmp_path / "node-b.log"]
    agents = start_nodes(argv, logs, port, job, env)
    try:
        rank, node, pid, seconds, rc = lose_node(agents, out)
    finally:
        stop(agents)
    assert rc not in (0, None) and seconds < COLLECTIVE_TIMEOUT_S + 30, (rc, seconds, logs[0].read_text()[-3000:])
    wait_until(lambda: not alive(pid), 30, "the lost node's worker")
    assert not (out / "final").exists(), "the run ended before the node was lost: the test checked nothing"
    saved = checkpoints.complete_checkpoints(out / "checkpoints")[-1]
    step = json.loads((saved / "state.json").read_text())["state"]["step"]
    assert saved.name.startswith("rl-") and 1 <= step < 3, saved
    check_the_line(logs[0].read_text(), rank, node, saved)

    before, logs = rl_lines(out), [tmp_path / "node-a.again.log", tmp_path / "node-b.again.log"]
    agents = start_nodes(argv, logs, port, job, env)
    try:
        finish(agents, logs)
    finally:
        stop(agents)
    assert f"continuing the unfinished run in {out} from {saved.name}" in " ".join(log.read_text() for log in logs)
    after = rl_lines(out)
    assert [json.loads(line)["step"] for line in after] == [1, 2, 3]
    assert after[:step] == before[:step], "the saved RL steps were redone"
    assert same(final_weights(out), final_weights(two_nodes("fsdp2")))
