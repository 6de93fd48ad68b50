"""PVRBench's static protocol: which subtypes a question is asked under (eval_pvrbench.make_plan, --assign;
eval_pvrbench.round_robin)."""
import hashlib

import numpy as np
import pytest

import eval_pvrbench as ev
import perturb
from machinery.datasets import data


def test_subtype_parsing_and_cycle_assignment():
    assert ev.parse_subtypes("all") == list(perturb.SUBTYPES)
    assert ev.parse_subtypes("rain,lighting,fog") == ["dusk", "night", "overexposure", "shadow", "fog", "rain"]
    assert ev.parse_subtypes("none") == []
    with pytest.raises(ev.cli.UserError):
        ev.parse_subtypes("hail")
    samples = [data.Sample(id=f"{t}{i}", video=f"v{i % 5}.mp4", question="Q", options=["A. x", "B. y"], answer="A",
                           problem_type="multiple choice", task=t, source="urbanvideo", meta={"video_id": f"v{i % 5}"})
               for t in ("Causal", "Duration") for i in range(25)]
    groups, manifest = ev.make_plan({"urbanvideo": samples}, list(perturb.SUBTYPES), "cycle", 0.7)
    assert len(groups) == 5 and sum(len(g.items) for g in groups) == 50
    for task in ("Causal", "Duration"):   # every subtype gets an equal share of every task (+-1)
        got = [c[1] for g in groups for s, c in g.items if s.task == task]
        counts = [got.count(sub) for sub in perturb.SUBTYPES]
        assert max(counts) - min(counts) <= 1 and sum(counts) == 25
    for row in manifest:   # one spec per (video, subtype), seeded by the video identity (Sec. 4), in its scene
        assert row["spec"] == perturb.static_spec(row["video_id"], row["subtype"], 0.7, scene="aerial").to_dict()
        if row["subtype"] in ("static", "dynamic"):   # UrbanVideo's drone views: the occluders of an aerial scene
            assert row["spec"]["params"]["scene"] == "aerial"
            assert row["spec"]["params"]["style"] in {"smudge", "raindrop", "plant", "bird", "drone", "foliage"}
    groups, _ = ev.make_plan({"urbanvideo": samples[:3]}, ["fog", "rain"], "all", 0.7)
    assert [c for g in groups for _, c in g.items] == [["clean", "fog", "rain"]] * 3


def test_balanced_assignment_gives_every_subtype_an_equal_share_of_each_answer():
    """--assign balanced: per task, each subtype gets every answer equally often (+-1), where the
    questions' order (answers drawn at random) leaves cycle's shares far apart; cycle is the round-robin in order."""
    rng = np.random.default_rng(0)
    answers = [str(a) for a in rng.choice(list("ABC"), 240)]
    samples = [data.Sample(id=f"q{i}", video=f"v{i}.mp4", question="Q", options=["A. x", "B. y", "C. z"], answer=a,
                           problem_type="multiple choice", task="route", source="synthetic")
               for i, a in enumerate(answers)]
    spread = {}
    for assign in ("balanced", "cycle"):
        one = ev.round_robin(samples, list(perturb.SUBTYPES), assign == "balanced")
        conds = dict(zip((s.id for s in samples), one))
        counts = {(sub, a): sum(conds[s.id] == sub and s.answer == a for s in samples)
                  for sub in perturb.SUBTYPES for a in "ABC"}
        shares = {a: [counts[sub, a] for sub in perturb.SUBTYPES] for a in "ABC"}
        spread[assign] = {a: max(v) - min(v) for a, v in shares.items()}
        per_subtype = [sum(counts[sub, a] for a in "ABC") for sub in perturb.SUBTYPES]
        assert max(per_subtype) - min(per_subtype) <= 1 and sum(per_subtype) == 240
    assert max(spread["balanced"].values()) <= 1 and max(spread["cycle"].values()) >= 4, spread
    off = int(hashlib.sha256(b"route").hexdigest(), 16)   # cycle: the k-th question's subtype is (k + off) mod 12
    assert ev.round_robin(samples, list(perturb.SUBTYPES)) == [
        perturb.SUBTYPES[(k + off) % 12] for k in range(240)]


def test_round_robin_by_answer_by_hand():
    """Hand-worked: the A questions (0, 3, 6, 7) take x y z x from the task's offset, the B ones (1, 4, 8) y z x,
    the C ones (2, 5) y z, each rank counted over the task's questions sorted by answer."""
    samples = [data.Sample(id=str(i), video="v.mp4", question="Q", options=[], answer=a, problem_type="multiple choice",
                           task="t", source="synthetic") for i, a in enumerate("ABCABCAAB")]
    off = int(hashlib.sha256(b"t").hexdigest(), 16) % 3
    subs = [["x", "y", "z"][(i + 3 - off) % 3] for i in range(3)]   # so that rank 0 lands on "x"
    assert ev.round_robin(samples, subs, by_answer=True) == ["x", "y", "y", "y", "z", "z", "z", "x", "x"]
    assert ev.round_robin(samples, subs) == ["x", "y", "z"] * 3
