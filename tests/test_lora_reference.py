"""LoRA's KL reference (Eq. 7) is the policy as RL starts: after SFT trained the adapters, a frozen copy of them
(policy.add_reference_adapter), not the adapters off (the model before SFT). Before the first update the policy is
its reference, so the first RL step's KL is 0, as under full fine-tuning; on 1 process, on 2 (DDP-LoRA), over a
4-bit base, and through a kill and resume."""
from pathlib import Path

import pytest
import torch

import train
from machinery.model import policy
from test_parallel import torchrun
from test_train import args, records, weights

# SFT at a large lr, so that the adapters move far from the base; no dropout, so that the KL is exact
SFT = ["--sft-epochs", "1", "--sft-batch-size", "2", "--sft-lr", "3e-2", "--mode", "grpo", "--set", "lora_dropout=0"]


@pytest.fixture(scope="module")
def assets(train_assets):   # (conftest.py: the tiny model and 8 synthetic clips)
    return train_assets


def first_kl(out):
    return records(out)[0]["kl"]


def sft_moved_the_adapters(out):
    """The saved reference (the adapters after SFT) differs from adapters-off: some B is far from 0."""
    ref = weights(out / "reference")
    return max(float(v.abs().max()) for k, v in ref.items() if "lora_B" in k) > 1e-3


@pytest.mark.parametrize("four_bit", [False, True], ids=["lora", "qlora"])
def test_the_first_rl_step_of_lora_after_sft_has_the_kl_of_full_fine_tuning(assets, tmp_path, four_bit):
    full, lora = tmp_path / "full", tmp_path / "lora"
    train.main(args(assets, full, *SFT, "--rl-steps", "1"))
    train.main(args(assets, lora, *SFT, "--rl-steps", "1", "--lora-r", "4", *(["--load-in-4bit"] * four_bit)))
    assert first_kl(full) == 0.0
    assert sft_moved_the_adapters(lora)   # (else adapters-off would pass too)
    assert abs(first_kl(lora)) <= 1e-6
    final = weights(lora / "final")       # the released adapter is the trained one alone
    assert final and not any(policy.REFERENCE_ADAPTER in k for k in final)
    assert not (lora / "final" / policy.REFERENCE_ADAPTER).exists()


def test_adapters_off_without_sft(assets, tmp_path):
    """No SFT: the adapters are untrained, the adapters off are the policy itself (no copy, no folder)."""
    train.main(args(assets, tmp_path / "none", "--mode", "grpo", "--rl-steps", "1", "--lora-r", "4",
                    "--set", "lora_dropout=0"))
    assert not (tmp_path / "none" / "reference").exists() and first_kl(tmp_path / "none") == 0.0


def test_the_reference_adapter_is_a_frozen_copy_of_the_trained_one(assets, tmp_path):
    """policy.save_reference_adapter / add_reference_adapter on a LoRA model whose adapters moved: pi_ref equals the
    policy until the trained adapter changes, then stays where it was; the trained adapter stays active and
    trainable, the reference frozen, and the reference has no dropout though the policy has."""
    model, processor = policy.load_checkpoint(str(assets[1]), lora_r=4, lora_dropout=0.0)
    assert policy.adapters_untrained(model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    assert not policy.adapters_untrained(model)
    policy.save_reference_adapter(model, tmp_path / "ref")
    policy.add_reference_adapter(model, tmp_path / "ref")
    ref_params = {n: p for n, p in model.named_parameters() if f".{policy.REFERENCE_ADAPTER}." in n}
    assert ref_params and not any(p.requires_grad for p in ref_params.values())
    assert model.active_adapter == "default"
    tok = policy.tokenizer_of(processor)
    inputs = tok(["a clip of a road"], return_tensors="pt")
    ids, mask = policy.target_ids(processor, ["<answer>B</answer>"])

    def logps():
        return (policy.token_logprobs(model, dict(inputs), ids, mask).detach(),
                policy.reference_logprobs(model, dict(inputs), ids, mask))
    pol, ref = logps()
    assert torch.equal(pol, ref)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and all(f".{policy.REFERENCE_ADAPTER}." not in n for n, p in model.named_parameters()
                             if p.requires_grad)
    with torch.no_grad():   # an "update" of the trained adapter
        for n, p in model.named_parameters():
            if "lora_B.default." in n:
                p.add_(0.05)
    pol2, ref2 = logps()
    assert torch.equal(ref2, ref) and not torch.allclose(pol2, pol)
    assert [p for p in model.parameters() if p.requires_grad] == trainable   # set_adapter's grads put back
    with torch.no_grad(), model.disable_adapter():   # what the reference was before: the model before SFT
        off = policy.token_logprobs(model, dict(inputs), ids, mask)
    assert not torch.allclose(off, ref)


def test_a_resumed_lora_run_continues_bit_identically(assets, tmp_path):
    """Killed after its first RL step, resumed: the checkpoint carries the reference adapter (added back from
    OUT/reference before the checkpoint fills it), and the run ends with the uninterrupted run's adapter and
    records, the KL of every step included."""
    common = [*SFT, "--rl-steps", "3", "--lora-r", "4", "--lr", "1e-2"]
    train.main(args(assets, tmp_path / "a", *common))
    steps_of_sft = len(records(tmp_path / "a", "sft"))
    train.main(args(assets, tmp_path / "b", *common), stop_after=steps_of_sft + 1)
    assert not (tmp_path / "b" / "final").exists()
    train.main(args(assets, tmp_path / "b", *common, "--resume", "auto"))
    a, b = weights(tmp_path / "a" / "final"), weights(tmp_path / "b" / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = records(tmp_path / "a"), records(tmp_path / "b")
    assert [r["step"] for r in rb] == [1, 2, 3]
    assert [(r["kl"], r["r_total"]) for r in ra] == [(r["kl"], r["r_total"]) for r in rb]
    assert ra[0]["kl"] <= 1e-6


@pytest.mark.slow
def test_two_processes_ddp_lora_start_rl_at_kl_zero(assets, tmp_path):
    """torchrun, 2 processes (DDP-LoRA, gloo): each rank adds the same reference adapter; the first step's KL,
    averaged over the ranks, is 0 as under full fine-tuning."""
    out = tmp_path / "ddp"
    torchrun(2, "train.py", *args(assets, out, *SFT, "--rl-steps", "1", "--lora-r", "4"))
    assert sft_moved_the_adapters(out)
    assert abs(first_kl(out)) <= 1e-6
    assert (Path(out) / "reference" / "adapter_config.json").is_file()
