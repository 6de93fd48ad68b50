"""machinery/training/records.py: Table 12's counts of a step against hand-built items, promotions apart."""
from types import SimpleNamespace

import pytest
import torch

from machinery import distributed
from machinery.training import records

CATS = {"lighting": ("dusk",), "weather": ("fog",)}
CAT_OF = {"dusk": "lighting", "fog": "weather"}


def item(subtype, decision, promoted=False, rewards=(1.0, 0.0)):
    return SimpleNamespace(spec=SimpleNamespace(subtype=subtype), decision=decision, promoted=promoted,
                           rewards=list(rewards))


def step():
    """Four fresh samples (dusk: trained, deferred; fog: discarded, trained with equal rewards) and one promotion
    from the buffer (dusk, trained without a new assessment: Alg. 2 l.17). train.RL.select returns every item whose
    decision is "train", promotions included."""
    a, b, c = item("dusk", "train"), item("fog", "discard"), item("dusk", "defer")
    d, e = item("fog", "train", rewards=(1.0, 1.0)), item("dusk", "train", promoted=True, rewards=(0.0, 1.0))
    items = [e, a, b, c, d]   # (next_samples: the promotions first)
    return items, [it for it in items if it.decision == "train"]


def test_rho_counts_the_fresh_samples_and_promotions_apart():
    items, selected = step()
    out = records.decisions(items, selected, CATS, CAT_OF)
    # fresh: a, b, c, d -> selected a, d (2 of 4), discarded b, deferred c; the promotion e trained apart
    assert (out["samples"], out["selected"], out["discarded"], out["deferred"]) == (4, 2, 1, 1)
    assert (out["promoted_trained"], out["trained"], out["flat_groups"]) == (1, 3, 1)   # flat: d's rewards equal
    # per category, fresh only: lighting a (trained), c (deferred); weather b (discarded), d (trained)
    assert [out[f"cat_lighting_{k}"] for k in ("samples", "trained", "deferred", "discarded")] == [2, 1, 1, 0]
    assert [out[f"cat_weather_{k}"] for k in ("samples", "trained", "deferred", "discarded")] == [2, 1, 0, 1]


def test_the_logged_rates_are_table12s():
    items, selected = step()
    rec = records.step_record(items, selected, {}, 0, {}, buffer_size=3, seconds={"rollout": 1.0},
                              weights=(1.0, 1.0, 1.0), categories=CATS, category_of=CAT_OF, promoted=2)
    assert rec["samples"] == 4 and rec["promoted"] == 2   # (promoted: this step's re-evaluation, not its batch)
    reduced = distributed.reduce_record(rec, torch.device("cpu"), 1)
    # rho = 2 / 4 (counting the promotion among the samples and the selected would give 3 / 5 = 0.6)
    assert reduced["rho"] == pytest.approx(0.5)
    assert (reduced["discard_rate"], reduced["defer_rate"]) == (pytest.approx(0.25), pytest.approx(0.25))
    assert reduced["rho"] + reduced["discard_rate"] + reduced["defer_rate"] == pytest.approx(1.0)


def test_a_step_of_promotions_alone_has_no_fresh_samples():
    e = item("dusk", "train", promoted=True)
    rec = records.step_record([e], [e], {}, 0, {}, buffer_size=0, seconds={}, weights=(1.0, 1.0, 1.0),
                              categories=CATS, category_of=CAT_OF)
    assert (rec["samples"], rec["selected"], rec["trained"], rec["promoted_trained"]) == (0, 0, 1, 1)
    assert distributed.reduce_record(rec, torch.device("cpu"), 1)["rho"] is None
