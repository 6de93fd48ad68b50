"""curriculum.py's memory buffer against Alg. 2 l.12-21 and Eq. 4-6, with scripted re-assessments."""
import json

import pytest

import perturb
from curriculum import LABELS, MemoryBuffer


def spec(i):
    return perturb.sample_spec(i).to_dict()


def each(assess):
    """MemoryBuffer.reevaluate's batched `assess(entries)` from a per-entry one."""
    return lambda entries: [assess(e) for e in entries]


def scripted(plan):
    """An assessor answering from a per-sample list of labels, one per re-evaluation round."""
    return each(lambda entry: plan[entry.sample_id][entry.k])


def test_add_is_eq4():
    buf = MemoryBuffer()
    e = buf.add("q1", spec(1), step=7)
    assert len(buf) == 1 and (e.sample_id, e.spec, e.k, e.added_step) == ("q1", spec(1), 0, 7)
    assert buf.add("q1", spec(1)) is None and len(buf) == 1  # the same (q, V~) once
    buf.add("q1", spec(2))  # the same question under another corruption is another entry
    assert len(buf) == 2 and buf.stats()["deferred"] == 2 and buf.stats()["duplicates"] == 1
    assert perturb.PerturbSpec.from_dict(e.spec) == perturb.PerturbSpec.from_dict(spec(1))  # V~ regenerates


def test_reevaluation_line_by_line():
    buf = MemoryBuffer(n_max=3)
    plan = {"inf": ["informative"], "easy": ["easy"], "late": ["difficult", "difficult", "informative"],
            "stuck": ["difficult"] * 5, "mastered_late": ["difficult", "easy"]}
    for sid in plan:
        buf.add(sid, spec(len(sid)))
    assess = scripted(plan)
    rounds = []
    for _ in range(5):
        promoted, evicted = buf.reevaluate(assess)
        rounds.append(([e.sample_id for e in promoted], [e.sample_id for e in evicted], [e.sample_id for e in buf]))
    # round 1 (every entry gets n <- n + 1, l.15): informative promoted (l.16-17), easy evicted (l.18-19)
    assert rounds[0] == (["inf"], ["easy"], ["late", "stuck", "mastered_late"])
    assert rounds[1] == ([], ["mastered_late"], ["late", "stuck"])        # easy on its 2nd re-evaluation
    assert rounds[2] == (["late"], [], ["stuck"])                          # informative on the 3rd
    assert rounds[3] == ([], ["stuck"], [])                                # n = 4 > N_max = 3: evicted (Eq. 6)
    assert rounds[4] == ([], [], [])
    st = buf.stats()
    assert (st["promoted"], st["evicted_easy"], st["evicted_n_max"], st["size"]) == (2, 2, 1, 0)
    assert st["reevaluations"] == 5 + 3 + 2 + 1 and st["evicted"] == 3


def test_n_max_is_a_parameter():
    for n_max, survives in ((0, 0), (1, 1), (3, 3)):
        buf = MemoryBuffer(n_max=n_max)
        buf.add("s", spec(0))
        rounds = 0
        while len(buf):
            buf.reevaluate(each(lambda e: "difficult"))
            rounds += 1
        assert rounds == survives + 1  # kept while k <= N_max, evicted on the re-evaluation that makes k > N_max


def test_due_every_period_or_when_full():
    buf = MemoryBuffer(capacity=3, period=50)
    assert not buf.due(50)  # nothing to re-evaluate
    buf.add("a", spec(0))
    assert [s for s in range(1, 151) if buf.due(s)] == [50, 100, 150]
    buf.add("b", spec(1))
    buf.add("c", spec(2))
    assert buf.due(7)  # full


def test_full_buffer_evicts_the_most_reevaluated_oldest():
    buf = MemoryBuffer(capacity=3, n_max=10)
    for sid in "abc":
        buf.add(sid, spec(ord(sid)))
    buf.reevaluate(each(lambda e: "difficult"))                # all k = 1
    buf.reevaluate(each(lambda e: "difficult" if e.sample_id in "bc" else "easy"))  # a evicted; b, c: k = 2
    buf.add("d", spec(9))                                      # k: b=2, c=2, d=0
    buf.add("e", spec(10))                                     # full: b (k=2, oldest) makes room
    assert [e.sample_id for e in buf] == ["c", "d", "e"] and buf.stats()["evicted_capacity"] == 1
    buf.add("f", spec(11))                                     # then c (k=2)
    assert [e.sample_id for e in buf] == ["d", "e", "f"] and len(buf) == 3


def test_failing_assessment_evicts_that_entry_only(caplog):
    buf = MemoryBuffer()
    buf.add("ok", spec(0))
    buf.add("broken", spec(1))

    def assess(e):
        if e.sample_id == "broken":
            raise FileNotFoundError("video gone")
        return "informative"
    promoted, evicted = buf.reevaluate(each(assess))   # (the chunk raises: retried entry by entry)
    assert [e.sample_id for e in promoted] == ["ok"] and [e.sample_id for e in evicted] == ["broken"]
    assert "broken" in caplog.text and buf.stats()["evicted_error"] == 1
    buf.add("x", spec(2))
    with pytest.raises(ValueError, match="expected one of"):
        buf.reevaluate(each(lambda e: "hard"))
    assert set(LABELS) == {"easy", "informative", "difficult"}


def test_state_round_trip_through_json():
    buf = MemoryBuffer(capacity=5, n_max=2, period=7)
    for i in range(4):
        buf.add(f"s{i}", spec(i), step=i)
    buf.reevaluate(scripted({"s0": ["easy"], "s1": ["difficult"], "s2": ["informative"], "s3": ["difficult"]}))
    text = json.dumps(buf.state_dict())
    other = MemoryBuffer()
    other.load_state_dict(json.loads(text))
    assert other.state_dict() == buf.state_dict() and len(other) == 2
    assert (other.capacity, other.n_max, other.period) == (5, 2, 7)
    # the restored buffer continues exactly as the original
    plan = {"s1": [None, "difficult", "difficult"], "s3": [None, "informative"]}
    a, b = buf.reevaluate(scripted(plan)), other.reevaluate(scripted(plan))
    assert [[e.sample_id for e in x] for x in a] == [[e.sample_id for e in x] for x in b] == [["s3"], []]
    assert buf.state_dict() == other.state_dict()
    with pytest.raises(ValueError):
        MemoryBuffer(capacity=0)


def test_reevaluation_in_chunks_matches_one_chunk():
    plan = {f"s{i}": lab for i, lab in enumerate(["easy", "informative", "difficult", "difficult", "informative"])}
    a, b = MemoryBuffer(), MemoryBuffer()
    for buf in (a, b):
        for i in range(5):
            buf.add(f"s{i}", spec(i))
    calls = []

    def assess_batch(entries):
        calls.append([e.sample_id for e in entries])
        return [plan[e.sample_id] for e in entries]
    one = a.reevaluate(each(lambda e: plan[e.sample_id]), batch_size=16)
    many = b.reevaluate(assess_batch, batch_size=2)
    assert calls == [["s0", "s1"], ["s2", "s3"], ["s4"]]
    assert [[e.sample_id for e in x] for x in one] == [[e.sample_id for e in x] for x in many] == [["s1", "s4"], ["s0"]]
    assert a.state_dict() == b.state_dict()


def test_batched_reevaluation_evicts_only_the_failing_entries(caplog):
    buf = MemoryBuffer()
    for name in ("ok", "gone", "boom", "ok2"):
        buf.add(name, spec(len(name)))

    def assess_batch(entries):
        if any(e.sample_id == "boom" for e in entries):  # a whole chunk fails: retried entry by entry
            raise RuntimeError("generation failed")
        return [FileNotFoundError("video gone") if e.sample_id == "gone" else "informative" for e in entries]
    promoted, evicted = buf.reevaluate(assess_batch, batch_size=4)
    assert [e.sample_id for e in promoted] == ["ok", "ok2"] and [e.sample_id for e in evicted] == ["gone", "boom"]
    assert buf.stats()["evicted_error"] == 2 and "video gone" in caplog.text and "generation failed" in caplog.text


def test_random_discarding_trains_its_share_reproducibly():
    """Fig. 4c's control: a sample is trained with probability `keep` whatever its difficulty, the same draw for
    the same key (its spec's seed)."""
    from curriculum import self_assess_random
    first = [self_assess_random(k, 0.87) for k in range(2000)]
    assert [a.decision for a in first] == [self_assess_random(k, 0.87).decision for k in range(2000)]
    assert {a.decision for a in first} == {"train", "discard"}
    assert abs(sum(a.decision == "train" for a in first) / 2000 - 0.87) < 0.03
    assert all(self_assess_random(k, 1.0).decision == "train" for k in range(50))
