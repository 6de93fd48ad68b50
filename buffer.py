"""ROVA's self-reflective, difficulty-aware curriculum, whole: the self-assessment and the memory buffer
(Sec. 3.2, Eq. 3-6, Alg. 2 l.6-21, App. C.2).

1. Self-assessment (Eq. 3): (d, c) = F_theta(q, V', S_e). The policy answers the answerability prompt S_e
   (Fig. 10) on the perturbed video V'; c = its P(YES) from the next-token probabilities of YES and NO
   (`answerability`). d comes from the step's own rollouts and that verdict (`self_assess`):
     easy        perturbed accuracy >= a_max, the clean and perturbed branches agree on the answer,
                 and the masked video is judged answerable;
     difficult   perturbed accuracy < a_min, or the masked video is judged unanswerable (P(YES) below
                 `unanswerable_below`, 0.5);
     informative otherwise.
   Selection (Sec. 3.2 (i)-(iii), Alg. 2 l.6-10): easy with c > tau is discarded, difficult is deferred
   to the memory buffer, the rest (informative, and easy with c <= tau) is trained on. App. D: tau = 0.8,
   a_min = 0.3, a_max = 0.85. (docs/DESIGN.md, "Readings of the paper", says why d reads this way.)

2. The temporal memory buffer (Eq. 4-6, Alg. 2 l.12-21). A deferred sample is stored as (q, V~, k): its
   id, the corruption spec V~ (a `perturb.PerturbSpec` as a dict, so the corrupted video is regenerated on
   demand and never stored, Eq. 4) and its number of re-evaluations k. Every `period` steps, or when the
   buffer is full (l.13), each entry is re-assessed under the current policy on its regenerated video
   (Eq. 5, the same forward as above):

    informative -> promoted: trained on now and removed          (Alg. 2 l.16-17)
    easy        -> evicted                                        (l.18-19)
    difficult   -> kept with k + 1; evicted once k > N_max        (l.18-19, Eq. 6)

   App. D gives N_max = 3 replay attempts over at most |M|_max = 1000 entries, re-evaluated every 50
   steps; it also writes K_max = 537, which conflicts with it: `n_max` is a parameter.
   Adding to a full buffer (the paper is silent): the entry with the most re-evaluations (the oldest
   among equals) is evicted to make room (counted as evicted for "capacity"), so new difficult samples
   are never refused and no entry is kept past its chances; `due()` is then true, so the next check
   re-evaluates the whole buffer. The buffer's state is JSON, for checkpoints.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field

import numpy as np

log = logging.getLogger(__name__)

LABELS = ("easy", "informative", "difficult")


# ----------------------------------------------------------------------------- self-assessment (Eq. 3)

# Fig. 10 / App. C.2: answerability from the masked (perturbed) video only. The policy answers this
# prompt itself, with the video, in the self-reflective assessment (Sec. 3.2, Eq. 3); c = P(YES).
ANSWERABILITY_PROMPT = """You are given a video that has been degraded by visual perturbations (for example \
darkness, glare, shadows, fog, rain, snow, occlusion or camera shake).

Use only this perturbed video: no outside knowledge and no guessing. Decide whether it still contains \
enough visual information to answer the question below reliably.

Question: {question}

If the perturbed video provides sufficient information to answer the question reliably, output YES; \
otherwise output NO. Output only YES or NO."""


@dataclass
class Assessment:
    difficulty: str          # "easy" | "informative" | "difficult"
    confidence: float        # c = P(YES | answerability prompt), normalised over YES/NO
    decision: str            # "discard" | "defer" | "train"
    accuracy: float | None   # mean accuracy of the perturbed rollouts (None: the verdict rule uses none)
    agreement: bool | None   # clean and perturbed majority answers agree (None: no clean rollouts)


def _majority(answers):
    norm = [" ".join(str(a).lower().split()) for a in answers if str(a).strip()]
    if not norm:
        return None
    counts = {}
    for a in norm:
        counts[a] = counts.get(a, 0) + 1
    return max(counts, key=lambda a: (counts[a], -norm.index(a)))  # ties: the first seen


def self_assess(perturbed_accuracy, p_yes, perturbed_answers=None, clean_answers=None, *,
                tau: float = 0.8, a_min: float = 0.3, a_max: float = 0.85,
                unanswerable_below: float = 0.5) -> Assessment:
    """Eq. 3 and the selection policy of Sec. 3.2 for one sample at one step.

    perturbed_accuracy: r^Acc of each perturbed rollout (or their mean); p_yes: c, the policy's
    P(YES) on the answerability prompt (see `answerability_confidence`); perturbed_answers /
    clean_answers: the extracted answers of the j-th rollouts, for the agreement test (clean ones are
    absent when the buffer re-assesses a regenerated video, Eq. 5: agreement is then not required).
    unanswerable_below: P(YES) under which the masked video counts as judged unanswerable (NO, Fig. 10);
    0 ignores the verdict (for a policy never taught the answerability question, whose P(YES) is noise)."""
    many = hasattr(perturbed_accuracy, "__iter__")
    acc = [float(a) for a in perturbed_accuracy] if many else [float(perturbed_accuracy)]
    if not acc:
        raise ValueError("self_assess needs at least one perturbed rollout's accuracy")
    accuracy = sum(acc) / len(acc)
    c = float(p_yes)
    if not 0.0 <= c <= 1.0:
        raise ValueError(f"p_yes must be a probability in [0, 1], got {p_yes!r}")
    agreement = None
    if clean_answers is not None and perturbed_answers is not None:
        m_clean, m_pert = _majority(clean_answers), _majority(perturbed_answers)
        agreement = m_clean is not None and m_clean == m_pert
    answerable = c >= unanswerable_below
    if accuracy < a_min or not answerable:
        d = "difficult"
    elif accuracy >= a_max and agreement is not False:
        d = "easy"
    else:
        d = "informative"
    decision = "discard" if (d == "easy" and c > tau) else ("defer" if d == "difficult" else "train")
    return Assessment(d, c, decision, accuracy, agreement)


def self_assess_verdict(p_yes, *, tau: float = 0.8, yes_at: float = 0.5) -> Assessment:
    """Eq. 3 read as App. C.2 uses the verdict of Fig. 10's prompt, with no ground truth: NO (c < `yes_at`,
    the argmax of YES vs NO) -> difficult, deferred to the buffer; YES with c > tau -> easy, discarded ("the
    confidence score controls the sample discard rate via tau"); YES with c <= tau -> informative, trained.
    Eq. 5's re-assessment of a buffered sample is the same rule on its regenerated video (YES with c <= tau
    promotes it, NO keeps it, YES with c > tau evicts it as mastered)."""
    c = float(p_yes)
    if not 0.0 <= c <= 1.0:
        raise ValueError(f"p_yes must be a probability in [0, 1], got {p_yes!r}")
    d = "difficult" if c < yes_at else ("easy" if c > tau else "informative")
    decision = {"difficult": "defer", "easy": "discard", "informative": "train"}[d]
    return Assessment(d, c, decision, None, None)


def self_assess_random(key, keep: float) -> Assessment:
    """Fig. 4c's control, not ROVA: train a sample with probability `keep` (ROVA's measured rho), else discard it,
    whatever its difficulty; `key` (an integer, e.g. its spec's seed) makes the draw reproducible."""
    trained = np.random.default_rng([int(key), 0xF14C]).random() < keep
    return Assessment("informative" if trained else "easy", None, "train" if trained else "discard", None, None)


ASSESS_RULES = ("accuracy", "verdict", "random")   # train.py's `assess`: self_assess (default), _verdict, _random


def answerability_confidence(next_token_logits, yes_ids, no_ids) -> float:
    """c of Eq. 3: P(YES) / (P(YES) + P(NO)) from the next-token logits after the answerability
    prompt (Fig. 10), summing the probabilities of every spelling's first token."""
    x = np.asarray(next_token_logits, dtype=np.float64).ravel()
    ids = list(yes_ids) + list(no_ids)
    if not yes_ids or not no_ids:
        raise ValueError("need at least one YES and one NO token id")
    sel = x[ids]
    sel = np.exp(sel - sel.max())
    p_yes = sel[:len(yes_ids)].sum()
    return float(p_yes / sel.sum())


def answerability_messages(questions) -> list:
    """S_e of Eq. 3 for each question: one user turn holding the (perturbed) video and Fig. 10's prompt."""
    return [[{"role": "user", "content": [{"type": "video"},
                                          {"type": "text", "text": ANSWERABILITY_PROMPT.format(question=q)}]}]
            for q in questions]


def answerability(model, inputs, tokenizer) -> list[float]:
    """c of Eq. 3 for a batch: the policy's P(YES) on the answerability prompt, from one forward pass without
    gradient (`inputs`: the model's batch for `answerability_messages` with the perturbed videos)."""
    from machinery.model import policy   # (the model's forward: torch and transformers load only when asked)

    yes, no = policy.yes_no_token_ids(tokenizer)
    return [answerability_confidence(row, yes, no) for row in policy.next_token_logits(model, inputs)]


# ----------------------------------------------------------------------------- the memory buffer (Eq. 4-6)

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

    def reevaluate(self, assess, batch_size: int = 16):
        """Alg. 2 l.14-21 over every entry, batched (Table 14: "Yes (batched)"): `assess(entries) -> [label or
        Exception, ...]` on chunks of `batch_size` entries in buffer order, a label being "easy", "informative" or
        "difficult" (the policy's re-assessment d' of the regenerated video, Eq. 5). Returns (promoted, evicted): the
        entries to train on now, and those removed. An entry whose assessment raises or is an Exception (its video
        unreadable) is evicted and logged, never fatal; a chunk whose `assess` raises is re-assessed entry by entry."""
        entries, labels, size = list(self.entries), [], max(1, int(batch_size))
        for i in range(0, len(entries), size):
            chunk = entries[i:i + size]
            got = _call(lambda: list(assess(chunk)))
            if isinstance(got, Exception) or len(got) != len(chunk):
                got = [_call(lambda e=e: assess([e])[0]) for e in chunk]
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
                raise ValueError(f"assess returned {label!r} for {entry.sample_id}; expected one of {LABELS}")
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
