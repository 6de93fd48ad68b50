"""A training step's record: `Timer` (seconds per named part of a step, Table 14's components) and `StepLog`
(rank 0's log.jsonl, TensorBoard scalars when installed, and the progress bar).

Standard library only at import (torch's TensorBoard writer and tqdm are imported where they are used).
"""
from __future__ import annotations

import json
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path


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

