"""The temporal memory buffer of ROVA's self-reflective curriculum (Sec. 3.2, Eq. 4-6, Alg. 2 l.12-21).

Samples the policy judges too difficult under their current corruption are deferred here instead of
being trained on (Alg. 2 l.7-8). An entry is (q, V~, k): the sample's id, the corruption spec V~
(a `perturb.PerturbSpec` as a dict, so the corrupted video is regenerated on demand and never
stored, Eq. 4) and the number of re-evaluations k. Every `period` steps, or when the buffer is full
(Alg. 2 l.13), each entry is re-assessed under the current policy (Eq. 5):

    informative -> promoted: trained on now and removed          (Alg. 2 l.16-17)
    easy        -> evicted                                        (l.18-19)
    difficult   -> kept with k + 1; evicted once k > N_max        (l.18-19, Eq. 6)

App. D gives N_max = 3 replay attempts over at most |M|_max = 1000 entries, re-evaluated every 50
steps; it also writes K_max = 537, which conflicts with N_max = 3 (README): `n_max` is a parameter.

Adding to a full buffer (the paper is silent): the entry with the most re-evaluations (the oldest
among equals) is evicted to make room (counted as evicted for "capacity"), so new difficult samples
are never refused and no entry is kept past its chances; `due()` is then true, so the next check
re-evaluates the whole buffer. Pure Python: no torch, JSON state for checkpoints.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field

log = logging.getLogger(__name__)

LABELS = ("easy", "informative", "difficult")


@dataclass
class BufferEntry:
    """(q, V~, k) of Eq. 4, with bookkeeping."""
    sample_id: str
    spec: dict                 # the PerturbSpec dict (V~): regenerates the corrupted video
    k: int = 0                 # re-evaluations so far (Eq. 5)
    added_step: int = 0
    labels: list = field(default_factory=list)  # the re-assessment history, for analysis


class MemoryBuffer:
    """M of Alg. 2: `add` (Eq. 4), `due` (l.13), `reevaluate` (l.14-21, Eq. 5-6)."""

    def __init__(self, capacity: int = 1000, n_max: int = 3, period: int = 50):
        if capacity < 1 or n_max < 0 or period < 1:
            raise ValueError(f"need capacity >= 1, n_max >= 0, period >= 1; got {capacity}, {n_max}, {period}")
        self.capacity, self.n_max, self.period = int(capacity), int(n_max), int(period)
        self.entries: list[BufferEntry] = []
        self.counters = {"deferred": 0, "duplicates": 0, "promoted": 0, "evicted_easy": 0, "evicted_n_max": 0,
                         "evicted_capacity": 0, "evicted_error": 0, "reevaluations": 0, "rounds": 0}

    def __len__(self):
        return len(self.entries)

    def __iter__(self):
        return iter(list(self.entries))

    def add(self, sample_id, spec: dict, step: int = 0) -> BufferEntry | None:
        """Eq. 4: M <- M u {(q, V~, k = 0)}. The same sample with the same spec is stored once;
        returns the new entry, or None for such a duplicate. A full buffer makes room first (see the
        module docstring)."""
        sample_id = str(sample_id)
        spec = dict(spec)
        if any(e.sample_id == sample_id and e.spec == spec for e in self.entries):
            self.counters["duplicates"] += 1
            return None
        if len(self.entries) >= self.capacity:
            victim = max(range(len(self.entries)), key=lambda i: (self.entries[i].k, -i))
            gone = self.entries.pop(victim)
            self.counters["evicted_capacity"] += 1
            log.info("buffer full (%d): evicted %s (k=%d) to make room", self.capacity, gone.sample_id, gone.k)
        entry = BufferEntry(sample_id, spec, 0, int(step))
        self.entries.append(entry)
        self.counters["deferred"] += 1
        return entry

    def due(self, step: int) -> bool:
        """Alg. 2 l.13: re-evaluate only when the memory is full or every `period` steps."""
        return bool(self.entries) and (len(self.entries) >= self.capacity or (step > 0 and step % self.period == 0))

    def reevaluate(self, assess_fn=None, *, assess_batch=None, batch_size: int = 16):
        """Alg. 2 l.14-21 over every entry, with `assess_fn(entry) -> "easy" | "informative" |
        "difficult"` (the policy's re-assessment d' of the regenerated video, Eq. 5), or batched
        (Table 14: "Yes (batched)") with `assess_batch(entries) -> [label or Exception, ...]` on
        chunks of `batch_size` entries in buffer order.
        Returns (promoted, evicted): the entries to train on now, and those removed. An entry whose
        assessment raises or returns an Exception (e.g. its video can no longer be read) is evicted
        and logged, never fatal; a chunk whose `assess_batch` raises is re-assessed entry by entry."""
        if (assess_fn is None) == (assess_batch is None):
            raise ValueError("give exactly one of assess_fn and assess_batch")
        entries = list(self.entries)
        if assess_batch is None:
            labels = [_call(lambda e=e: assess_fn(e)) for e in entries]
        else:
            labels = []
            for i in range(0, len(entries), max(1, int(batch_size))):
                chunk = entries[i:i + max(1, int(batch_size))]
                got = _call(lambda: list(assess_batch(chunk)))
                if isinstance(got, Exception) or len(got) != len(chunk):
                    got = [_call(lambda e=e: assess_batch([e])[0]) for e in chunk]
                labels += got
        promoted, evicted, kept = [], [], []
        self.counters["rounds"] += 1
        for entry, label in zip(entries, labels):
            if isinstance(label, Exception):  # one unreadable sample must not stop training
                log.warning("buffer: re-assessing %s failed (%s); evicted", entry.sample_id, label)
                self.counters["evicted_error"] += 1
                evicted.append(entry)
                continue
            if label not in LABELS:
                raise ValueError(f"assess_fn returned {label!r} for {entry.sample_id}; expected one of {LABELS}")
            entry.k += 1  # l.15: n <- n + 1
            entry.labels.append(label)
            self.counters["reevaluations"] += 1
            if label == "informative":  # l.16-17: promote
                promoted.append(entry)
                self.counters["promoted"] += 1
            elif label == "easy":  # l.18-19: evict the mastered
                evicted.append(entry)
                self.counters["evicted_easy"] += 1
            elif entry.k > self.n_max:  # l.18-19, Eq. 6: evict k > N_max
                evicted.append(entry)
                self.counters["evicted_n_max"] += 1
            else:
                kept.append(entry)
        self.entries = kept
        return promoted, evicted

    def stats(self) -> dict:
        """Table 12's quantities: buffer size and the cumulative deferred / promoted / evicted counts."""
        evicted = sum(v for k, v in self.counters.items() if k.startswith("evicted_"))
        return {"size": len(self.entries), **self.counters, "evicted": evicted}

    def state_dict(self) -> dict:
        """JSON-serialisable state for checkpoints."""
        return {"capacity": self.capacity, "n_max": self.n_max, "period": self.period,
                "entries": [asdict(e) for e in self.entries], "counters": dict(self.counters)}

    def load_state_dict(self, state: dict) -> None:
        state = json.loads(json.dumps(state))  # accept any JSON round-trip of state_dict()
        self.capacity, self.n_max, self.period = int(state["capacity"]), int(state["n_max"]), int(state["period"])
        self.entries = [BufferEntry(**e) for e in state["entries"]]
        self.counters.update(state["counters"])


def _call(fn):
    """fn(), or the exception it raised."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        return e
