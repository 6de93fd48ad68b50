"""Eq. 8 per component (App. H.1): the 'other' component is the sum of R_j's terms beyond Alg. 1's three, as they
were added (T-GRPO's bonus; Embodied-R's w_C r^C), never R_j less the three."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import grpo
import train


def item(rng, g=4, temporal=True):
    f, a, al = (rng.integers(0, 2, g).astype(float) for _ in range(3))
    t = rng.uniform(0, 0.3, g)
    comp = {"format": list(f), "accuracy": list(a), "alignment": list(0.3 * al), "extra": [list(t)] if temporal else []}
    comp |= {"temporal": list(t)} if temporal else {}
    rewards = f + a + 0.3 * al + (t if temporal else 0.0)
    return SimpleNamespace(rewards=list(rewards), comp=comp)


def rl_with(*flags, cls=train.RL):
    rl = cls.__new__(cls)
    rl.cfg = train.parse_args(["--set", "advantage=per_component", *flags])
    return rl


@pytest.mark.parametrize("temporal", [True, False])
def test_other_is_t_grpos_bonus_as_added(temporal):
    rng = np.random.default_rng(0)
    items = [item(rng, temporal=temporal) for _ in range(3)]
    rl = rl_with(*(["--temporal-grpo", "2"] if temporal else []))
    got = rl.advantages(items)
    other = [it.comp["temporal"] if temporal else [0.0] * 4 for it in items]
    want = sum(w * grpo.group_advantages([it.comp[k] for it in items]) for k, w in
               (("format", 1.0), ("accuracy", 1.0), ("alignment", 1.0))) + grpo.group_advantages(other)
    assert torch.allclose(got, want.view(-1), atol=1e-6)
    for it in items:   # coherence: R_j is Alg. 1's three plus the extra terms
        extra = np.sum(it.comp["extra"], axis=0) if it.comp["extra"] else 0.0
        three = np.add(np.add(it.comp["format"], it.comp["accuracy"]), it.comp["alignment"])
        assert np.allclose(it.rewards, three + extra)


def test_add_term_adds_to_r_j_and_lists_the_term():
    it = SimpleNamespace(rewards=[1.0, 2.0], comp={"extra": [[0.5, 0.5]]})
    train.add_term(it, [0.25, 0.0])
    assert it.rewards == [1.25, 2.0] and it.comp["extra"] == [[0.5, 0.5], [0.25, 0.0]]


def test_embodied_rs_consistency_term_is_weighted_as_added(monkeypatch):
    """Embodied-R's rewards phase adds w_C r^C_j to R_j (its with_consistency) and lists w_C r^C among the extra
    terms, after Alg. 1's R_j (train.RL.rewards, stubbed here)."""
    er = pytest.importorskip("extensions.embodied_r.train")
    rl = rl_with(cls=er.EmbodiedRL)
    rl.judge = None
    it = item(np.random.default_rng(1), temporal=False)
    it.sample = SimpleNamespace(question="q", answer="A", problem_type="multiple choice", options=None, source=None)
    it.texts = [""] * 4
    it.comp["judge_missing"] = 0
    consistency = [1.0, 0.0, 1.0, 1.0]
    monkeypatch.setattr(train.RL, "rewards", lambda self, selected: 0)
    monkeypatch.setattr(rl, "staged", lambda: (1.0, 1.0, 0.2, 1.0))
    monkeypatch.setattr(er.er_rewards, "with_consistency", lambda rewards, *a: (
        [r + a[5] * c for r, c in zip(rewards, consistency)], consistency, 1))
    three = np.add(np.add(it.comp["format"], it.comp["accuracy"]), it.comp["alignment"])
    assert rl.rewards([it]) == 1 and it.comp["judge_missing"] == 1
    assert it.comp["extra"] == [[0.2, 0.0, 0.2, 0.2]] and np.allclose(it.rewards, three + [0.2, 0.0, 0.2, 0.2])
