"""What a finished run shows of its RL stage: the curriculum per window of steps (Table 12 in miniature, with the
buffer's traffic and the optimiser updates) and a picture of it, OUT/curriculum.png (the rollouts' accuracy on
clean and on perturbed videos, and rho, over the steps). Both read OUT/log.jsonl, as anyone can afterwards."""
from __future__ import annotations

import json
import math
from pathlib import Path

from machinery import cli

WINDOWS = 6   # rows of the table: App. D's 300 steps in windows of 50 (Table 12's)


def rl_records(log):
    """The RL steps' records of a run's log.jsonl, one per step (a resumed run logs again the steps after its last
    checkpoint: the later record wins)."""
    recs = {}
    for line in Path(log).read_text().splitlines():
        rec = json.loads(line) if line.strip() else {}
        if rec.get("stage") == "rl":
            recs[rec["step"]] = rec
    return [recs[k] for k in sorted(recs)]


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def windows(recs, size=None):
    """Table 12's columns per window of `size` steps (default: the steps in WINDOWS windows): the fresh samples
    assessed, the shares of them discarded as easy and deferred as hard, rho (the share trained: Table 12's rho_t),
    the buffer's mean size over the window's steps (at a re-evaluation it can empty, so its size at the window's end
    says little), the entries it promoted and evicted, the optimiser updates made, and the
    rollouts' mean accuracy on the clean and on the perturbed videos."""
    size = size or max(1, math.ceil(len(recs) / WINDOWS))
    out, updates = [], 0
    for start in range(0, len(recs), size):
        part = recs[start:start + size]
        n = int(sum(r.get("samples", 0) for r in part))
        share = (lambda key: sum(r.get(key, 0) for r in part) / n if n else None)  # noqa: E731
        out.append({"steps": [part[0]["step"], part[-1]["step"]], "samples": n, "discarded": share("discarded"),
                    "deferred": share("deferred"), "rho": share("selected"),
                    "buffer": _mean(r.get("buffer_size", 0) for r in part),
                    "promoted": int(sum(r.get("promoted", 0) for r in part)),
                    "evicted": int(sum(r.get("evicted", 0) for r in part)),
                    "updates": int(part[-1].get("updates", 0) - updates),
                    "acc_clean": _mean(r.get("acc_clean") for r in part),
                    "acc_perturbed": _mean(r.get("acc_perturbed") for r in part)})
        updates = part[-1].get("updates", 0)
    return out


def _f(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def print_windows(rows, mode):
    """The windows (`windows`) as the demo prints them after its before/after table."""
    curriculum = mode == "rova"
    cli.log(f"the RL steps ({mode}) by window: rollout accuracy on clean / perturbed videos"
            + (", and the curriculum (shares of the fresh samples assessed; Table 12)" if curriculum else ""))
    head = "  steps      acc clean  acc pert  updates"
    if curriculum:
        head += "  fresh  discarded  deferred   rho  buffer  promoted  evicted"
    cli.log(head)
    for w in rows:
        line = (f"  {w['steps'][0]:>4}-{w['steps'][1]:<5} {_f(w['acc_clean']):>9} {_f(w['acc_perturbed']):>9} "
                f"{w['updates']:>8}")
        if curriculum:
            line += (f"  {w['samples']:>5} {_f(w['discarded']):>10} {_f(w['deferred']):>9} {_f(w['rho']):>5} "
                     f"{_f(w['buffer'], '.1f'):>7} {w['promoted']:>9} {w['evicted']:>8}")
        cli.log(line)


def plot(path, recs, rows, mode):
    """OUT/curriculum.png: the rollouts' accuracy on clean and on perturbed videos per step (dots) and per window
    (lines), and, for --mode rova, rho per window (its own axis)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    mid = [(w["steps"][0] + w["steps"][1]) / 2 for w in rows]
    steps = [r["step"] for r in recs]
    for key, label, colour in (("acc_clean", "clean", "tab:blue"), ("acc_perturbed", "perturbed", "tab:orange")):
        ax.scatter(steps, [r.get(key) if r.get(key) is not None else math.nan for r in recs], s=5, alpha=0.3,
                   color=colour)
        ax.plot(mid, [w[key] if w[key] is not None else math.nan for w in rows], "-o", color=colour,
                label=f"rollout accuracy, {label} videos")
    ax.set_xlabel("RL step")
    ax.set_ylabel("rollout accuracy")
    ax.set_ylim(0, 1.05)
    handles, labels = ax.get_legend_handles_labels()
    if mode == "rova":
        twin = ax.twinx()
        line, = twin.plot(mid, [w["rho"] if w["rho"] is not None else math.nan for w in rows], "--s", color="tab:green",
                          label="rho (share of fresh samples trained)")
        twin.set_ylabel("rho")
        twin.set_ylim(0, 1.05)
        handles, labels = handles + [line], labels + [line.get_label()]
    ax.legend(handles, labels, loc="lower right", fontsize=8)
    ax.set_title(f"RL ({mode}): rollouts and curriculum")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)


def show(out, mode):
    """The windows printed and the picture written, from OUT/log.jsonl (nothing if it holds no RL step)."""
    recs = rl_records(Path(out) / "log.jsonl") if (Path(out) / "log.jsonl").is_file() else []
    if not recs:
        return None
    rows = windows(recs)
    print_windows(rows, mode)
    cli.log(f"picture of the RL steps: {plot(Path(out) / 'curriculum.png', recs, rows, mode)}")
    return rows
