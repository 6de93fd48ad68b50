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
    comp = {"format": list(f), "accuracy": list(a), "alignment": list(0.3 * al)} | (
        {"temporal": list(t)} if temporal else {})
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
        extra = np.sum(rl.extra_terms(it), axis=0) if rl.extra_terms(it) else 0.0
        three = np.add(np.add(it.comp["format"], it.comp["accuracy"]), it.comp["alignment"])
        assert np.allclose(it.rewards, three + extra)


def test_embodied_rs_consistency_term_is_weighted_as_added():
    er = pytest.importorskip("extensions.embodied_r.train")
    rl = rl_with(cls=er.EmbodiedRL)
    it = item(np.random.default_rng(1), temporal=False)
    it.comp |= {"consistency": [1.0, 0.0, 1.0, 1.0], "w_consistency": 0.2}
    assert rl.extra_terms(it) == [[0.2, 0.0, 0.2, 0.2]]
