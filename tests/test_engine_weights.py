"""machinery/model/engine.py without vLLM: the weights a sync hands the engine, and the rollout it hands back."""
import tempfile
from types import SimpleNamespace

import pytest
import torch

from machinery import cli
from machinery.model import engine, policy


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return tiny_path


def test_a_plain_policys_weights_are_its_checkpoints_names_and_tensors(tiny):
    model, _ = policy.load_policy(tiny, dtype=torch.float32, device="cpu")
    got = dict(engine.policy_weights(model))
    want = model.state_dict()
    assert got.keys() == want.keys() and "lm_head.weight" in got   # the tied head, which named_parameters() lacks
    assert all(torch.equal(got[k], want[k]) for k in want)


def two_adapter_model(tiny, dropout=0.0):
    """A LoRA policy as RL holds it after SFT: the trained "default" adapter and the KL's frozen "reference" copy
    beside it (policy.add_reference_adapter), the trained one moved on since (peft starts B at 0: every B drawn)."""
    model, _ = policy.load_policy(tiny, lora_r=4, lora_dropout=dropout, dtype=torch.float32, device="cpu")
    torch.manual_seed(0)

    def draw_b():
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B.default." in name:
                    p.normal_(0, 0.05)
    draw_b()
    with tempfile.TemporaryDirectory() as folder:
        policy.save_reference_adapter(model, folder)
        policy.add_reference_adapter(model, folder)
    draw_b()
    assert model.active_adapter == "default" and policy.REFERENCE_ADAPTER == "reference"
    return model


def lora_modules(model, adapter):
    from peft.tuners.lora import LoraLayer
    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer) and adapter in m.lora_A}


def served_products(model, dtype):
    """B' A' of each served module (float64), keyed by the module's name."""
    _, tensors = engine.served_adapter(model, dtype)
    return {k.removesuffix(".lora_A.weight"): tensors[k.replace("lora_A", "lora_B")].double()
            @ tensors[k].double() for k in tensors if k.endswith("lora_A.weight")}


def test_the_served_adapter_is_the_trained_one_alone_and_the_model_is_left_alone(tiny):
    """Two adapters: the served one is "default" (B A scaled as peft scales it), never the KL's "reference", whose
    delta differs; float32 serves rank r, a 16-bit engine rank 3r whose product is B A to about 16 bits."""
    model = two_adapter_model(tiny)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert engine.trained_adapter(model) == "default"
    modules = lora_modules(model, "default")
    config, tensors = engine.served_adapter(model, torch.float32)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert config["r"] == config["lora_alpha"] == 4 and config["lora_dropout"] == 0.0
    assert len(tensors) == 2 * len(modules) and len(modules) > 0
    assert not any(".reference" in k or ".default" in k for k in tensors)   # peft's file names: no adapter name
    for dtype, rank, tol in ((torch.float32, 4, 1e-6), (torch.bfloat16, 12, 1e-4)):
        got = served_products(model, dtype)
        assert engine.served_rank(model, dtype) == rank and set(got) == set(modules)
        for name, m in modules.items():
            want, other = m.get_delta_weight("default").detach().double(), m.get_delta_weight("reference").double()
            err = ((got[name] - want).norm() / want.norm()).item()
            assert err <= tol, (name, dtype, err)
            assert (got[name] - other).norm() > 0.5 * want.norm()   # the reference's delta is another one
    model.set_adapter("reference")   # whatever is active, the trained adapter is the one served
    assert engine.trained_adapter(model) == "default"


def test_a_lora_model_training_anything_beside_its_adapter_is_refused(tiny):
    model, _ = policy.load_policy(tiny, lora_r=4, dtype=torch.float32, device="cpu")
    next(p for n, p in model.named_parameters() if "lora_" not in n).requires_grad_(True)
    with pytest.raises(cli.UserError, match="serves a LoRA model's adapter alone"):
        engine.served_adapter(model)


def lost(true, served):
    """(the share of weights whose served value does not move while the policy's does, the relative error of the
    served change: ||served - true|| / ||true||) of one weight matrix's change."""
    return float(((served == 0) & (true != 0)).double().mean()), float((served - true).norm() / true.norm())


def lost_shares(model, b_std, effective_rms=None, seed=1):
    """What a bf16 engine loses of an optimiser step's change of the effective weights (s B A) (`lost`), per way of
    serving it: "merged" into bf16 base weights ~ N(0, 0.02) (what the engine did), a "bf16 adapter" of rank r,
    the "split" adapter (engine.served_adapter for bf16, rank 3r) and "float32" (served_adapter for float32). The
    adapter's B ~ N(0, b_std) (how far training took it); the step moves every entry of A and B by 1e-5 with a
    random sign (Adam's steps are about lr each), or by what makes the effective change `effective_rms` per weight.
    Products are taken in float64 from the served factors (vLLM's LoRA kernels multiply bf16 operands into float32
    sums)."""
    modules = lora_modules(model, "default")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in modules.values():
            m.lora_B["default"].weight.normal_(0, b_std, generator=gen)

    def plain():
        return {n: (m.lora_B["default"].weight.detach().bfloat16().double() * m.scaling["default"])
                @ m.lora_A["default"].weight.detach().bfloat16().double() for n, m in modules.items()}

    start = {n: m.get_delta_weight("default").detach().double() for n, m in modules.items()}
    before = {"bf16 adapter": plain(), "split": served_products(model, torch.bfloat16),
              "float32": served_products(model, torch.float32)}
    with torch.no_grad():
        steps = {p: (torch.randint(0, 2, p.shape, generator=gen).float() * 2 - 1) * 1e-5
                 for m in modules.values() for p in (m.lora_A["default"].weight, m.lora_B["default"].weight)}
        if effective_rms:
            for p, d in steps.items():
                p.add_(d)
            probe = torch.cat([(m.get_delta_weight("default").detach().double() - start[n]).flatten()
                               for n, m in modules.items()])
            for p, d in steps.items():
                p.sub_(d)
                d.mul_(effective_rms / probe.pow(2).mean().sqrt().item())
        for p, d in steps.items():
            p.add_(d)
    true = {n: m.get_delta_weight("default").detach().double() - start[n] for n, m in modules.items()}
    w = {n: torch.empty_like(start[n]).normal_(0, 0.02, generator=gen).bfloat16().double() for n in modules}
    after = {"bf16 adapter": plain(), "split": served_products(model, torch.bfloat16),
             "float32": served_products(model, torch.float32)}
    out = {"merged": [lost(true[n], (w[n] + start[n] + true[n]).bfloat16().double()
                           - (w[n] + start[n]).bfloat16().double()) for n in modules]}
    for way in after:
        out[way] = [lost(true[n], after[way][n] - before[way][n]) for n in modules]
    rms = torch.cat([v.flatten() for v in true.values()]).pow(2).mean().sqrt().item()
    return {k: tuple(round(sum(x) / len(v), 6) for x in zip(*v)) for k, v in out.items()}, rms


def test_an_update_of_1e_5_reaches_a_bf16_engine_served_as_a_split_adapter(tiny):
    """An update of 1e-5 (RMS, per weight) of the effective weights: merged into bf16 weights most of it is lost
    (bf16 keeps 8 significant bits); served as the split adapter, none."""
    got, rms = lost_shares(two_adapter_model(tiny), b_std=1e-3, effective_rms=1e-5)
    print(f"\nan update of {rms:.2g} per weight, (share of weights unmoved, relative error):", got)
    assert abs(rms - 1e-5) < 1e-6
    assert got["merged"][0] > 0.7 and got["merged"][1] > 0.8, got
    assert got["split"][0] < 1e-3 and got["split"][1] < 1e-2 and got["float32"][1] < 1e-5, got


def test_a_bf16_adapter_would_lose_the_steps_of_a_trained_adapter(tiny):
    """Why split: once B has grown (here ~ 3e-2), a step of 1e-5 per entry is below bf16's rounding of A and of B,
    and a plain bf16 adapter of rank r misses the update (by 4x its size, measured); the split adapter keeps it to
    about 1% (its dropped B_lo A_lo term, 2^-16 of B A, against a change 1e-3 of B A)."""
    got, rms = lost_shares(two_adapter_model(tiny), b_std=3e-2)
    print(f"\nsteps of 1e-5 per adapter entry ({rms:.2g} per weight), (share of weights unmoved, relative error):",
          got)
    assert got["bf16 adapter"][1] > 0.5 and got["split"][1] < 0.05 and got["float32"][1] < 1e-3, got


# ----------------------------------------------------------------------------- the sync guard
def test_the_guard_stops_on_the_third_step_in_a_row_above_the_limit():
    guard = engine.SyncGuard(0.05)
    mask = torch.ones(1, 4)

    def step(gap, tokens=True):
        if tokens:
            guard.add(torch.zeros(1, 4), torch.full((1, 4), -gap), mask)
        return guard.close_step(torch.device("cpu"))
    assert step(0.2) == pytest.approx(0.2) and step(0.3) == pytest.approx(0.3)
    assert step(0.01) == pytest.approx(0.01)   # the run of steps above resets
    assert step(0.2) and step(0.2) and step(0, tokens=False) == -1.0   # a step that measured nothing: neither
    with pytest.raises(cli.UserError) as e:
        step(0.4)
    msg = str(e.value)
    assert "\n" not in msg and "0.2, 0.2, 0.4" in msg and "engine_max_gap 0.05" in msg and "not sampling" in msg
    off = engine.SyncGuard(0)
    for _ in range(5):
        off.add(torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
        assert off.close_step(torch.device("cpu")) == 1.0


def test_the_guards_gap_is_the_mean_over_unmasked_tokens():
    guard = engine.SyncGuard(0.05)
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, 0.0, 0.0]])
    guard.add(logp, logp + torch.tensor([[0.1, -0.3, 9.0], [0.2, 9.0, 9.0]]), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert guard.close_step(torch.device("cpu")) == pytest.approx(0.2)


@pytest.mark.parametrize("dropout,temperature", [(0.05, 1.0), (0.0, 0.7), (0.05, 0.7)])
def test_the_gap_is_taken_without_dropout_at_temperature_1(tiny, dropout, temperature):
    """The update's forward (training mode: LoRA's dropout on; at the sampling temperature) is not what the engine
    sampled from: measure replaces it by an eval-mode forward at temperature 1, so a synced engine (here: its
    log-probs those of that forward) gives 0, where the update's own log-probs are off."""
    model = two_adapter_model(tiny, dropout)
    _, processor = policy.load_policy(tiny, dtype=torch.float32, device="cpu")
    frames = torch.randint(0, 255, (4, 56, 56, 3), dtype=torch.uint8).numpy()
    inputs = policy.make_inputs(processor, [[{"role": "user", "content": [{"type": "video"}, {"type": "text",
                                                                                                "text": "Q?"}]}]],
                                [frames])
    ids = torch.randint(0, 50, (1, 6))
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    model.eval()
    with torch.no_grad():
        synced = policy.token_logprobs(model, inputs, ids, mask)
    model.train()
    torch.manual_seed(3)
    logp = policy.token_logprobs(model, inputs, ids, mask, temperature=temperature)
    eng = engine.Engine.__new__(engine.Engine)
    eng.guard, eng.dropout = engine.SyncGuard(0.05), None
    eng.measure(model, inputs, ids, mask, logp, synced, temperature)
    assert model.training   # put back
    assert eng.guard.close_step(torch.device("cpu")) < 1e-6
    naive = (logp.detach() - synced).abs()[mask.bool()].mean().item()
    assert naive > 1e-3, naive   # what the update's own forward would have measured
    eng.measure(model, inputs, ids, mask, logp, None, temperature)   # nothing to compare: nothing counted
    assert eng.guard.close_step(torch.device("cpu")) == -1.0


def test_the_engines_completions_become_a_rollout_like_generates(tiny):
    """Token lists of different lengths, one ended by <|im_end|>: padded with the pad id after the end, masked up to
    and including the end, decoded without special tokens, the log-probs masked like the tokens."""
    model, processor = policy.load_policy(tiny, dtype=torch.float32, device="cpu")
    _, eos, pad = policy._token_ids(processor, model)
    tok = policy.tokenizer_of(processor)
    words = tok.encode("left", add_special_tokens=False)
    step = lambda t: {t: SimpleNamespace(logprob=-0.5)}
    rows = [SimpleNamespace(token_ids=words + [eos[0]], logprobs=[step(t) for t in words + [eos[0]]]),
            SimpleNamespace(token_ids=words + words + words, logprobs=[step(t) for t in words * 3])]
    eng = engine.Engine.__new__(engine.Engine)
    eng.processor, eng.eos, eng.pad = processor, eos, pad
    inputs = policy.make_inputs(processor, [[{"role": "user", "content": [{"type": "video"}, {"type": "text",
                                                                                                "text": "Q?"}]}]],
                                [torch.zeros(4, 56, 56, 3, dtype=torch.uint8).numpy()])
    out = eng._as_rollout(model, rows, inputs, [2])
    n = len(words)
    assert out.completion_ids.shape == (2, 3 * n) and out.texts == ["left", "leftleftleft"]
    assert out.completion_mask[0].tolist() == [1] * (n + 1) + [0] * (2 * n - 1)
    assert (out.completion_ids[0, n + 1:] == pad).all() and out.completion_mask[1].all()
    assert (out.engine_logprobs == -0.5 * out.completion_mask).all()
    assert out.index.tolist() == [0, 0]
