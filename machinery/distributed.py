"""torchrun's processes: the process group (`setup_distributed`, gloo on CPU, NCCL on GPUs, with the collective
timeout ROVA_DIST_TIMEOUT), the collectives train.py's plumbing uses (a barrier, sums, means and maxima of floats
over ranks, a step's record reduced over ranks), and a lost peer named in one line (`peer_lost`: which rank, node
and host stopped answering), which cli.run prints.

Standard library only at import (torch is imported where it is used).
"""
from __future__ import annotations

import os
import re
import sys

from machinery import cli

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
        raise cli.UserError(f"ROVA_DIST_TIMEOUT must be a number of seconds, got {value!r}") from None


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
        first = " ".join(str(lost[0]).split(". ")[0].split())[:200]
        return (f"{me}: the process group failed ({first}): a process or node of the run was lost, or the network "
                "between them")
    return None


def lost_peer(exc):
    """(peer_lost's line, the number of nodes) for this process's exception `exc` (cli.run prints it); None for any
    other exception, or outside a process group set up by setup_distributed."""
    line = peer_lost(exc, rank_of(), _PEERS) if _PEERS else None
    return None if line is None else (line, _nodes(_PEERS))


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


