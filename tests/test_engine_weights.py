"""machinery/model/engine.py without vLLM: the weights a sync hands the engine, and the rollout it hands back."""
from types import SimpleNamespace

import pytest
import torch

from machinery.model import engine, policy
from machinery.model import tiny as tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model.build_tiny(tmp_path_factory.mktemp("engine") / "tiny")


def test_a_plain_policys_weights_are_its_checkpoints_names_and_tensors(tiny):
    model, _ = policy.load_policy(tiny, dtype=torch.float32, device="cpu")
    got = dict(engine.policy_weights(model))
    want = model.state_dict()
    assert got.keys() == want.keys() and "lm_head.weight" in got   # the tied head, which named_parameters() lacks
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_lora_weights_are_merged_as_peft_merges_them_and_the_model_is_left_alone(tiny):
    model, _ = policy.load_policy(tiny, lora_r=4, dtype=torch.float32, device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)   # peft starts B at 0: a merge would change nothing
    before = {k: v.clone() for k, v in model.state_dict().items()}
    got = dict(engine.policy_weights(model))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    plain, _ = policy.load_policy(tiny, dtype=torch.float32, device="cpu")
    assert got.keys() == plain.state_dict().keys()
    want = model.merge_and_unload().state_dict()   # peft's own merge, an independent computation
    worst = max((got[k] - want[k]).abs().max().item() for k in want)
    moved = max((got[k] - plain.state_dict()[k]).abs().max().item() for k in want)
    assert worst <= 1e-6 and moved > 1e-3, (worst, moved)


def test_the_engines_completions_become_a_rollout_like_generates(tiny):
    """Token lists of different lengths, one ended by <|im_end|>: padded with the pad id after the end, masked up to
    and including the end, decoded without special tokens, the log-probs masked like the tokens."""
    model, processor = policy.load_policy(tiny, dtype=torch.float32, device="cpu")
    vision, eos, pad = policy._token_ids(processor, model)
    tok = policy.tokenizer_of(processor)
    words = tok.encode("left", add_special_tokens=False)
    step = lambda t: {t: SimpleNamespace(logprob=-0.5)}   # noqa: E731
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
