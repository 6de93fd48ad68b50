"""grpo.py: Eq. 7-10 and Alg. 1 against hand-worked values, an independent implementation, finite
differences, and a learning test on the tiny policy."""
import math

import numpy as np
import pytest
import torch

import grpo

GOOD = "<think>the road bends left</think>\n<answer>A</answer>"


# ----------------------------------------------------------------------------- Eq. 9, Eq. 10, T-GRPO

@pytest.mark.parametrize("text,want", [
    (GOOD, 1.0),
    ("  <think>x</think><answer>B</answer>\n", 1.0),            # surrounding whitespace is not content
    ("<think>a\nb</think> \n <answer>\n3\n</answer>", 1.0),
    ("<answer>A</answer>", 0.0),                                 # no reasoning
    ("<think>x</think>", 0.0),                                   # no answer
    ("<answer>A</answer><think>x</think>", 0.0),                 # wrong order
    ("Sure! <think>x</think><answer>A</answer>", 0.0),           # text outside the blocks
    ("<think>x</think><answer>A</answer> because", 0.0),
    ("<think>x</think><answer>A", 0.0),
    ("", 0.0), (None, 0.0),
])
def test_format_reward_eq9(text, want):
    assert grpo.format_reward(text) == want


def test_accuracy_reward_eq10():
    assert grpo.accuracy_reward(GOOD, "A", "multiple choice") == 1.0
    assert grpo.accuracy_reward(GOOD, "B", "multiple choice") == 0.0
    assert grpo.accuracy_reward("A", "A", "multiple choice") == 0.0  # Video-R1: the answer must be tagged
    assert grpo.accuracy_reward("<think>.</think><answer>three</answer>", "3", "numerical") == 1.0
    assert grpo.accuracy_reward("<think>.</think><answer>3.0</answer>", "3", "numerical") == 0.0  # decimal rule
    # regression in training: 1 - clipped relative error (Video-R1 grpo.py): |5 - 4| / 4 = 0.25
    assert grpo.accuracy_reward("<think>.</think><answer>5</answer>", "4", "regression") == pytest.approx(0.75)


def test_temporal_reward_t_grpo():
    # ordered mean 0.5 >= 0.8 * shuffled mean 0.5: correct ordered rollouts get +0.3
    assert grpo.temporal_reward([1, 0, 1, 0], [1, 0, 0, 1]) == [0.3, 0.0, 0.3, 0.0]
    # ordered mean 0.25 < 0.8 * 0.5: no bonus
    assert grpo.temporal_reward([1, 0, 0, 0], [1, 1, 0, 0]) == [0.0] * 4
    # the boundary is inclusive: 0.4 >= 0.8 * 0.5
    assert grpo.temporal_reward([1, 0, 1, 0, 0], [1, 0], alpha=0.5) == [0.5, 0.0, 0.5, 0.0, 0.0]
    assert grpo.temporal_reward([0.05, 0.2], []) == [0.0, 0.3]  # threshold 0.1 on the accuracy


# ----------------------------------------------------------------------------- alignment (Alg. 1 Steps 2, 4, 5)

class Judge:
    """Exact-match judge with scripted failures."""

    def __init__(self, fail=(), garbage=(), batch=True):
        self.fail, self.garbage, self.calls = set(fail), set(garbage), []
        if not batch:
            self.answer_consistency_batch = None
            self.reasoning_consistency_batch = None

    def answer_consistency(self, ref, cand):
        self.calls.append(("a", ref, cand))
        if cand in self.fail:
            raise TimeoutError("judge timed out")
        if cand in self.garbage:
            return "maybe"
        return 1 if ref.strip().lower() == cand.strip().lower() else 0

    def reasoning_consistency(self, ref, cand):
        self.calls.append(("r", ref, cand))
        if cand in self.fail:
            return None
        return 1.0 if ref == cand else (0.5 if ref.split()[0] == cand.split()[0] else 0.0)

    def answer_consistency_batch(self, pairs):
        return [self.answer_consistency(*p) for p in pairs]

    def reasoning_consistency_batch(self, pairs):
        return [self.reasoning_consistency(*p) for p in pairs]


def out(think, answer):
    return f"<think>{think}</think><answer>{answer}</answer>"


def test_alignment_reward_hand_worked():
    clean = [out("road bends left", "A"), out("road bends left", "A"), out("two cars", "3")]
    pert = [out("road bends left", "A"), out("road is foggy", "B"), out("nothing seen", "three")]
    al = grpo.alignment_reward(clean, pert, Judge(), alpha_r=0.3, alpha_a=0.7)
    assert al.sim_r == [1.0, 0.5, 0.0] and al.sim_a == [1.0, 0.0, 0.0]
    assert al.rewards == pytest.approx([1.0, 0.15, 0.0])  # 0.3 * Sim_r + 0.7 * Sim_a
    assert al.missing == 0 and al.skipped == 0


def test_alignment_pairs_jth_with_jth_and_skips_empty_parts():
    judge = Judge()
    clean = [out("a b", "A"), "no tags at all"]
    pert = [out("a c", "A"), out("a b", "A")]
    al = grpo.alignment_reward(clean, pert, judge)
    assert ("r", "a b", "a c") in judge.calls and ("a", "A", "A") in judge.calls
    assert al.rewards[1] == 0.0 and al.skipped == 1  # the judge is not asked about an empty side
    assert len(judge.calls) == 2
    with pytest.raises(ValueError, match="pairs must match"):
        grpo.alignment_reward(clean, pert[:1], judge)


@pytest.mark.parametrize("batch", [True, False])
def test_missing_verdicts_are_reported_and_imputed(batch, caplog):
    clean = [out("x y", "A")] * 4
    pert = [out("x y", "A"), out("x y", "FAIL"), out("x z", "GARB"), out("x y", "A")]
    al = grpo.alignment_reward(clean, pert, Judge(fail={"FAIL"}, garbage={"GARB"}, batch=batch))
    assert al.sim_a == [1.0, None, None, 1.0] and al.missing == 2 and "missing" in caplog.text
    # mean imputation: the two missing answer verdicts take the group's mean (1.0)
    assert al.rewards == pytest.approx([1.0, 1.0, 0.3 * 0.5 + 0.7, 1.0])
    zero = grpo.alignment_reward(clean, pert, Judge(fail={"FAIL"}, garbage={"GARB"}, batch=batch), missing="zero")
    assert zero.rewards == pytest.approx([1.0, 0.3, 0.15, 1.0])


def test_a_dead_judge_never_crashes():
    class Dead:
        def answer_consistency(self, *a):
            raise ConnectionError("down")

        def reasoning_consistency(self, *a):
            raise ConnectionError("down")

        def answer_consistency_batch(self, pairs):
            raise ConnectionError("down")

    al = grpo.alignment_reward([out("a", "A")] * 3, [out("a", "A")] * 3, Dead())
    assert al.missing == 6 and al.rewards == [0.0, 0.0, 0.0]  # constant: no effect on Eq. 8's advantages


def test_total_reward_components():
    clean = [out("left turn", "A")] * 3
    pert = [out("left turn", "A"), "<answer>A</answer>", out("fog", "C")]
    rewards, comp = grpo.total_reward(pert, "A", "multiple choice", reference_texts=clean, judge=Judge())
    assert comp["format"] == [1.0, 0.0, 1.0] and comp["accuracy"] == [1.0, 1.0, 0.0]
    # the second has no <think>: its reasoning part scores 0, its answer still agrees (0.7 * 1)
    assert comp["alignment"] == pytest.approx([1.0, 0.7, 0.0]) and comp["judge_skipped"] == 1
    assert rewards == pytest.approx([3.0, 1.7, 1.0])  # R = r_F + r_Acc + r_A (Alg. 1 l.13)
    plain, comp = grpo.total_reward(pert, "A", "multiple choice")  # single-branch GRPO: no r_A
    assert plain == [2.0, 1.0, 1.0] and comp["alignment"] == [0.0] * 3
    weighted, _ = grpo.total_reward(pert, "A", "multiple choice", clean, Judge(), w_format=0.5, alpha_a=1.0)
    assert weighted == pytest.approx([0.5 + 1 + 0.3 + 1.0, 1 + 1.0, 0.5])


# ----------------------------------------------------------------------------- Eq. 8

def test_group_advantages_eq8():
    adv = grpo.group_advantages([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    std = math.sqrt(4 * 0.25 / 3)  # unbiased
    a = 0.5 / (std + 1e-4)  # (r - 0.5) / (std + eps)
    assert adv[0].tolist() == pytest.approx([a, -a, -a, a])
    assert adv[1].tolist() == [0.0] * 4 and not torch.isnan(adv).any()
    assert grpo.group_advantages([[3.0]]).tolist() == [[0.0]]
    r = torch.randn(5, 8)
    a = grpo.group_advantages(r)
    assert torch.allclose(a.mean(1), torch.zeros(5), atol=1e-5)
    with pytest.raises(ValueError, match=r"\[B, G\]"):
        grpo.group_advantages([1.0, 2.0])


def test_component_advantages_normalise_each_component_then_add_them_app_h1():
    """App. H.1: per-component advantages (each normalised in its group, then weighted and added) against the
    'single combined reward' (the components added first, then Eq. 8), by hand."""
    fmt, acc = [[1.0, 1.0, 0.0, 0.0]], [[1.0, 0.0, 1.0, 0.0]]
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)   # each component: mean 0.5, unbiased std sqrt(1/3)
    per = grpo.component_advantages({"format": fmt, "accuracy": acc}, {"format": 1.0, "accuracy": 1.0})
    assert per[0].tolist() == pytest.approx([2 * a, 0.0, 0.0, -2 * a])
    b = 1.0 / (math.sqrt(2 / 3) + 1e-4)   # R = [2, 1, 1, 0]: mean 1, std sqrt(2/3)
    assert grpo.group_advantages([[2.0, 1.0, 1.0, 0.0]])[0].tolist() == pytest.approx([b, 0.0, 0.0, -b])
    # a component constant within its group (accuracy all wrong) adds nothing, whatever its weight
    one = grpo.component_advantages({"format": fmt, "accuracy": [[0.0] * 4]}, {"format": 2.0, "accuracy": 5.0})
    assert one[0].tolist() == pytest.approx([2 * a, 2 * a, -2 * a, -2 * a])


# ----------------------------------------------------------------------------- Eq. 7

def test_grpo_loss_hand_worked_clipping_both_sides():
    # two completions, two tokens; ratios 1.5 and 0.5; A = +1 then A = -1; ref == logp (KL = 0)
    logp = torch.log(torch.tensor([[1.5, 0.5], [1.5, 0.5]]))
    old = torch.zeros(2, 2)
    loss, st = grpo.grpo_loss(logp, old, logp.clone(), torch.tensor([1.0, -1.0]), torch.ones(2, 2))
    # A=+1: -min(1.5, 1.2) = -1.2, -min(0.5, 0.8) = -0.5 -> -0.85; A=-1: +1.5, +0.8 -> 1.15
    assert loss.item() == pytest.approx((-0.85 + 1.15) / 2)
    assert st["clip_fraction"] == pytest.approx(0.5) and st["kl"] == pytest.approx(0.0)
    assert st["ratio"] == pytest.approx(1.0)


def test_grpo_loss_k3_kl_and_mask():
    logp = torch.full((1, 3), math.log(0.25))
    ref = torch.full((1, 3), math.log(0.5))  # ref - logp = ln 2: k3 = 2 - ln 2 - 1
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, st = grpo.grpo_loss(logp, logp.detach(), ref, torch.tensor([0.0]), mask, beta=0.1)
    k3 = 2 - math.log(2) - 1
    assert st["kl"] == pytest.approx(k3) and loss.item() == pytest.approx(0.1 * k3)
    # masked tokens contribute nothing, not even gradient
    logp2 = logp.clone()
    logp2[0, 2] = -30.0
    logp2.requires_grad_(True)
    loss2, _ = grpo.grpo_loss(logp2, logp.detach(), ref, torch.tensor([0.0]), mask, beta=0.1)
    loss2.backward()
    assert loss2.item() == pytest.approx(loss.item()) and logp2.grad[0, 2] == 0


def reference_loss(logp, old, ref, adv, mask, eps=0.2, beta=0.01):
    """An independent, loop-by-loop reading of DeepSeekMath's GRPO objective (float64)."""
    total = 0.0
    for i in range(logp.shape[0]):
        toks = [t for t in range(logp.shape[1]) if mask[i, t] > 0]
        acc = 0.0
        for t in toks:
            r = math.exp(logp[i, t] - old[i, t])
            surrogate = min(r * adv[i], max(1 - eps, min(1 + eps, r)) * adv[i])
            kl = math.exp(ref[i, t] - logp[i, t]) - (ref[i, t] - logp[i, t]) - 1
            acc += -(surrogate - beta * kl)
        total += acc / max(1, len(toks))
    return total / logp.shape[0]


def test_grpo_loss_matches_an_independent_implementation():
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        N, T = 6, 9
        logp = -torch.rand(N, T, generator=g, dtype=torch.float64) * 3
        old = logp + 0.4 * torch.randn(N, T, generator=g, dtype=torch.float64)
        ref = logp + 0.3 * torch.randn(N, T, generator=g, dtype=torch.float64)
        adv = torch.randn(N, generator=g, dtype=torch.float64)
        mask = (torch.rand(N, T, generator=g) > 0.3).double()
        mask[0] = 0  # an empty completion is allowed
        loss, _ = grpo.grpo_loss(logp, old, ref, adv, mask)
        want = reference_loss(logp.numpy(), old.numpy(), ref.numpy(), adv.numpy(), mask.numpy())
        assert loss.item() == pytest.approx(want, abs=1e-12)


def test_grpo_loss_gradient_by_finite_differences():
    g = torch.Generator().manual_seed(1)
    logp = (-torch.rand(3, 4, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    old = (logp + 0.1 * torch.randn(3, 4, generator=g, dtype=torch.float64)).detach()  # ratios away from the clip kinks
    ref = (logp + 0.2 * torch.randn(3, 4, generator=g, dtype=torch.float64)).detach()
    adv = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    for norm in grpo.LOSS_NORMS:
        assert torch.autograd.gradcheck(lambda x: grpo.grpo_loss(x, old, ref, adv, mask, beta=0.05,
                                                                  loss_norm=norm)[0], (logp,))


# ----------------------------------------------------------------------------- Eq. 7's normalisation (aggregate)
# Two completions of T = 3 with the losses below; the first has 2 tokens (token means 1.5 and 5; sums 3 and 15).
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])


@pytest.mark.parametrize("norm,alone,part", [("sequence", (1.5 + 5) / 2, 1.5 + 5), ("fixed", (1.5 + 5) / 2, 1.5 + 5),
                                             ("token", (3 + 15) / 5, 3 + 15)])
def test_aggregate_on_a_batch_that_is_its_step(norm, alone, part):
    """A batch that is the whole step on one process: the mean of the token means (sequence; fixed: a full step),
    or of every token (token); the part of the sum (for the log) is their sum."""
    loss, got = grpo.aggregate(PER_TOKEN, MASK, norm)
    assert loss.item() == pytest.approx(alone) and got == pytest.approx(part)


@pytest.mark.parametrize("norm,denominator,world,share,want", [
    ("sequence", 4.0, 1, 1.0, (1.5 + 5) / 4),        # 2 more completions in another micro-batch: N = 4
    ("sequence", 4.0, 2, 1.0, 2 * (1.5 + 5) / 4),    # ... on the other rank: x W (FSDP2/DDP halve it back)
    ("sequence", 4.0, 2, 0.5, (1.5 + 5) / 4),        # half of a loss of two parts
    ("fixed", 16.0, 2, 1.0, 2 * (1.5 + 5) / 16),     # B x G = 8 per rank, 2 ranks: / 16 however few are kept
    ("token", 10.0, 2, 1.0, 2 * (3 + 15) / 10),      # 5 more tokens on the other rank
])
def test_aggregate_of_a_micro_batch_of_a_step(norm, denominator, world, share, want):
    loss, _ = grpo.aggregate(PER_TOKEN, MASK, norm, denominator, world, share)
    assert loss.item() == pytest.approx(want)


def test_count_is_a_ranks_part_of_the_denominator():
    assert [grpo.count(n, MASK, 8) for n in grpo.LOSS_NORMS] == [2.0, 8.0, 5.0]   # sequence, fixed, token
    assert grpo.count("token", MASK.sum(1), 8) == 5.0   # (each completion's token count)
    assert [grpo.count(n, None, 8) for n in grpo.LOSS_NORMS] == [0.0, 8.0, 0.0]   # a rank that trains none
    with pytest.raises(ValueError, match="loss_norm"):
        grpo.aggregate(PER_TOKEN, MASK, "constant")


def step_loss_by_hand(logp, old, ref, adv, mask, norm, fixed_total, beta=0.05, eps=0.2):
    """L of one step (float64, loop by loop, beside grpo.py's table): sum_i mean_t l_it / N (sequence) or / W B G
    (fixed: `fixed_total`), or sum_i sum_t l_it / sum_i T_i (token)."""
    means, sums, tokens = [], [], 0
    for i in range(logp.shape[0]):
        ls = []
        for t in range(logp.shape[1]):
            if mask[i, t]:
                r, d = math.exp(logp[i, t] - old[i, t]), ref[i, t] - logp[i, t]
                ls.append(-min(r * adv[i], min(max(r, 1 - eps), 1 + eps) * adv[i]) + beta * (math.exp(d) - d - 1))
        means.append(sum(ls) / max(len(ls), 1))
        sums.append(sum(ls))
        tokens += len(ls)
    return {"sequence": sum(means) / len(means), "fixed": sum(means) / fixed_total, "token": sum(sums) / tokens}[norm]


@pytest.mark.parametrize("norm", grpo.LOSS_NORMS)
def test_a_step_split_over_micro_batches_and_ranks_has_the_gradient_of_one_batch(norm):
    """Six completions of one step on W = 2 ranks (rows 0-3 and 4-5, micro-batches of 2; B x G = 8 per rank for
    fixed), each rank's counts summed into the denominator and its terms added, the ranks' gradients averaged as
    FSDP2/DDP do: L's value and gradient, as a loop-by-loop L on one batch and aggregate on one batch give them."""
    g = torch.Generator().manual_seed(2)
    logp = -torch.rand(6, 5, generator=g, dtype=torch.float64) * 2
    old = (logp + 0.3 * torch.randn(6, 5, generator=g, dtype=torch.float64)).detach()
    ref = (logp + 0.2 * torch.randn(6, 5, generator=g, dtype=torch.float64)).detach()
    adv = torch.randn(6, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0],
                         [1, 1, 1, 1, 0]])
    want = step_loss_by_hand(logp.numpy(), old.numpy(), ref.numpy(), adv.numpy(), mask.numpy(), norm, 16)

    one = logp.clone().requires_grad_(True)   # one batch on one process (fixed: B x G = 16)
    loss, _ = grpo.grpo_loss(one, old, ref, adv, mask, beta=0.05, loss_norm=norm,
                             denominator=grpo.count(norm, mask, 16))
    loss.backward()
    split, ranks = logp.clone().requires_grad_(True), ([0, 1, 2, 3], [4, 5])
    denominator = sum(grpo.count(norm, mask[rows], 8) for rows in ranks)
    value = 0.0
    for rows in ranks:
        for mb in (rows[:2], rows[2:]):
            if mb:
                term = grpo.grpo_loss(split[mb], old[mb], ref[mb], adv[mb], mask[mb], beta=0.05, loss_norm=norm,
                                      denominator=denominator, world=2)[0]
                term.backward()
                value += term.item() / 2   # (FSDP2/DDP: the mean over the ranks)
    assert loss.item() == pytest.approx(want, abs=1e-12) and value == pytest.approx(want, abs=1e-12)
    assert torch.allclose(split.grad / 2, one.grad, atol=1e-12, rtol=0)


# ----------------------------------------------------------------------------- learning

def run_toy_grpo(tmp_path, steps, lr, use_advantages=True):
    """GRPO on the tiny policy with a toy reward: the fraction of one chosen token in the completion."""
    from machinery.model import policy
    from machinery.model import tiny as tiny_model
    torch.manual_seed(0)
    model, proc = policy.load_policy(tiny_model.build_tiny(tmp_path / "tiny"))
    ref = policy.frozen_copy(model)
    rng = np.random.default_rng(0)
    videos = [rng.integers(0, 256, (4, 56, 56, 3), dtype=np.uint8) for _ in range(2)]
    prompts = [[{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Which action?"}]}]] * 2
    inputs = policy.make_inputs(proc, prompts, videos)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    curve, target = [], None
    for _ in range(steps):
        model.eval()
        with torch.no_grad():
            roll = policy.rollout(model, proc, inputs, n=8, max_new_tokens=8)
        ids, mask = roll.completion_ids, roll.completion_mask
        if target is None:  # a token the untrained policy samples only now and then
            values, counts = torch.unique(ids[mask.bool()], return_counts=True)
            target = int(values[torch.argsort(counts, descending=True)[3]])
        reward = ((ids == target).float() * mask).sum(1) / mask.sum(1).clamp(min=1)
        curve.append(reward.mean().item())
        adv = grpo.group_advantages(reward.view(2, 8)).view(-1)  # Eq. 8, one group per prompt
        if not use_advantages:
            adv = torch.zeros_like(adv)
        model.train()
        with torch.no_grad():
            old = policy.token_logprobs(model, roll.prompt_inputs, ids, mask)
            ref_logp = policy.reference_logprobs(model, roll.prompt_inputs, ids, mask, ref_model=ref)
        logp = policy.token_logprobs(model, roll.prompt_inputs, ids, mask)
        loss, _ = grpo.grpo_loss(logp, old, ref_logp, adv, mask)  # Eq. 7
        opt.zero_grad()
        loss.backward()
        opt.step()
    return curve


def test_grpo_raises_the_reward_of_the_tiny_policy(tmp_path):
    curve = run_toy_grpo(tmp_path, steps=40, lr=1e-2)
    start, end = np.mean(curve[:5]), np.mean(curve[-5:])
    assert start < 0.1 and end > 0.6, np.round(curve, 3)
    control = run_toy_grpo(tmp_path / "control", steps=40, lr=1e-2, use_advantages=False)  # KL term only
    assert np.mean(control[-5:]) < 0.15, np.round(control, 3)
