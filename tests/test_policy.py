"""Tests for policy.py on the tiny offline Qwen2.5-VL (tiny.py): build/reload, batches, rollouts, log-probs, LoRA,
4-bit."""
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from machinery.model import policy, positions
from machinery.model import tiny as tiny_model

F32 = {"dtype": torch.float32}  # exact comparisons; the default device (CUDA when present) is kept
QUESTION = "Which way should the drone go next?\nOptions:\nA. turn left\nB. turn right\nC. go ahead"


def _prompt(text):
    return [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}]


def _clips():
    """Two synthetic clips of different sizes; the first has an odd number of frames."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (5, 56, 56, 3), dtype=np.uint8)
    b = np.zeros((8, 84, 84, 3), np.uint8)
    b[:, ::14] = 255                                       # stripes that drift over time
    b = np.stack([np.roll(f, t * 3, axis=1) for t, f in enumerate(b)])
    return [a, torch.from_numpy(b)]                         # numpy and torch inputs


@pytest.fixture(scope="module")
def tiny_dir(tiny_path):
    return tiny_path


@pytest.fixture(scope="module")
def loaded(tiny_dir):
    return policy.load_policy(tiny_dir, **F32)


@pytest.fixture(scope="module")
def batch(loaded):
    _, processor = loaded
    return policy.make_inputs(processor, [_prompt(QUESTION), _prompt("How many boxes are there?")], _clips())


class _Bias:
    """A forward hook on the LM head adding a constant to some logits (steer a random model in tests)."""

    def __init__(self, model, token_ids, value):
        bias = torch.zeros(getattr(model.config, "text_config", model.config).vocab_size)  # VLM or text LM
        bias[token_ids] = value
        self.handle = model.lm_head.register_forward_hook(lambda m, i, out: out + bias.to(out))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


# ----------------------------------------------------------------------------- build and reload
def test_build_tiny_is_small_and_reloads_offline(tiny_dir, monkeypatch):
    import huggingface_hub.constants
    from transformers import AutoModelForImageTextToText, AutoProcessor

    size = sum(f.stat().st_size for f in os.scandir(tiny_dir))
    assert size < 3e6, size
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import time

    def no_network(*args, **kwargs):
        raise AssertionError("tried to reach the network")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    processor = AutoProcessor.from_pretrained(tiny_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_dir)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert type(processor).__name__ == "Qwen2_5_VLProcessor"
    tok = processor.tokenizer
    assert 300 <= len(tok) <= 2048 and model.config.text_config.vocab_size == len(tok)
    for name in tiny_model.SPECIAL_TOKENS:
        assert len(tok.encode(name, add_special_tokens=False)) == 1, name
    assert model.config.video_token_id == tok.convert_tokens_to_ids("<|video_pad|>")
    assert model.config.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
    assert tok.pad_token == "<|endoftext|>" and tok.padding_side == "left"
    text = processor.apply_chat_template([_prompt("hi")], tokenize=False, add_generation_prompt=True)[0]
    assert "<|vision_start|><|video_pad|><|vision_end|>hi<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.decode(tok.encode(QUESTION)) == QUESTION  # byte-level BPE round trip


def test_load_policy_defaults(tiny_dir):
    model, processor = policy.load_policy(tiny_dir)
    cuda = torch.cuda.is_available()
    want = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
    assert next(model.parameters()).dtype == want and policy.model_device(model).type == ("cuda" if cuda else "cpu")
    assert not model.training and processor.tokenizer.padding_side == "left"
    assert all(p.requires_grad for p in model.parameters())  # lora_r=0: full fine-tune


def test_make_inputs_video_tokens_match_grid(loaded, batch):
    model, processor = loaded
    for key in ("input_ids", "attention_mask", "mm_token_type_ids", "pixel_values_videos", "video_grid_thw",
                "second_per_grid_ts"):
        assert key in batch, key
    grid = batch["video_grid_thw"]
    assert grid.tolist() == [[3, 4, 4], [4, 6, 6]]  # 5 frames -> padded to 6 -> 3 temporal patches
    n_tokens = (batch["input_ids"] == model.config.video_token_id).sum(1)
    assert n_tokens.tolist() == (grid.prod(-1) // 4).tolist()
    assert batch["pixel_values_videos"].shape[0] == grid.prod(-1).sum()
    assert torch.equal(batch["mm_token_type_ids"] == 2, batch["input_ids"] == model.config.video_token_id)
    assert batch["second_per_grid_ts"].tolist() == [1.0, 1.0]  # 2 frames per grid at the default 2 fps
    assert batch["attention_mask"][0, 0] == 0 and batch["attention_mask"][:, -1].all()  # left padding
    fast = policy.make_inputs(processor, [_prompt("a")], _clips()[:1], fps=[8.0])
    assert fast["second_per_grid_ts"].tolist() == [0.25]


def test_text_after_a_video_resumes_past_its_largest_position_on_any_axis(loaded):
    """reference_rope_index by hand (the Qwen reference and vLLM): 3 text tokens, a video of 3 x 2 x 2 merged
    patches at 2 tokens per second and 1 s per grid (temporal 0, 2, 4), 2 text tokens; a left-padded row of the
    same. Text resumes at 3 + 4 + 1 = 8; transformers >= 5.3 would resume at 3 + 2 = 5."""
    model, _ = loaded
    inner = model.model
    v = model.config.video_token_id
    ids = torch.tensor([[1, 1, 1] + [v] * 12 + [1, 1], [0, 0, 1] + [v] * 12 + [1, 1]])
    types = (ids == v).long() * 2
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    grid = torch.tensor([[3, 4, 4], [3, 4, 4]])
    pos, delta = positions.reference_rope_index(inner, ids, types, video_grid_thw=grid,
                                             second_per_grid_ts=torch.tensor([1.0, 1.0]), attention_mask=mask)
    t = [3 + 2 * k for k in range(3) for _ in range(4)]
    h = [3 + (k // 2) % 2 for k in range(12)]
    w = [3 + k % 2 for k in range(12)]
    assert pos[:, 0].tolist() == [[0, 1, 2] + t + [8, 9], [0, 1, 2] + h + [8, 9], [0, 1, 2] + w + [8, 9]]
    assert pos[:, 1, :2].eq(0).all() and pos[0, 1, 2:].tolist() == [0] + [p - 2 for p in t] + [6, 7]
    assert delta.flatten().tolist() == [10 - 17, 8 - 15]
    assert inner.get_rope_index.__func__ is positions.reference_rope_index   # what load_policy installed
    # where the temporal span stays within the spatial one, transformers' own rule gives the same positions
    short = type(inner).get_rope_index(inner, ids[:1], types[:1], video_grid_thw=grid[:1],
                                       second_per_grid_ts=torch.tensor([0.25]))
    ours = positions.reference_rope_index(inner, ids[:1], types[:1], video_grid_thw=grid[:1],
                                       second_per_grid_ts=torch.tensor([0.25]))
    assert torch.equal(short[0], ours[0]) and torch.equal(short[1], ours[1])


def test_repeat_inputs_is_sample_major(loaded, batch):
    model, _ = loaded
    rep = policy.repeat_inputs(batch, 3, model.config.image_token_id, model.config.video_token_id)
    assert torch.equal(rep["input_ids"], batch["input_ids"].repeat_interleave(3, 0))
    assert rep["video_grid_thw"].tolist() == [[3, 4, 4]] * 3 + [[4, 6, 6]] * 3
    first = batch["pixel_values_videos"][:48]
    assert torch.equal(rep["pixel_values_videos"][48:96], first)
    assert torch.equal(rep["pixel_values_videos"][144:], batch["pixel_values_videos"][48:].repeat(3, 1))


def test_take_rows_regroups_videos_per_row(loaded, batch):
    model, _ = loaded
    rows = policy.take_rows_for(model, batch, [1, 0, 1])  # any order, repeats allowed
    assert torch.equal(rows["input_ids"], batch["input_ids"][[1, 0, 1]])
    assert torch.equal(rows["mm_token_type_ids"], batch["mm_token_type_ids"][[1, 0, 1]])
    assert rows["video_grid_thw"].tolist() == [[4, 6, 6], [3, 4, 4], [4, 6, 6]]
    first, second = batch["pixel_values_videos"][:48], batch["pixel_values_videos"][48:]
    assert torch.equal(rows["pixel_values_videos"], torch.cat([second, first, second]))
    assert rows["second_per_grid_ts"].tolist() == [1.0, 1.0, 1.0]
    only = policy.take_rows_for(model, batch, torch.tensor([0]))
    assert only["video_grid_thw"].tolist() == [[3, 4, 4]] and torch.equal(only["pixel_values_videos"], first)
    # repeat_inputs is take_rows with each row repeated
    rep = policy.repeat_for(model, batch, 2)
    same = policy.take_rows_for(model, batch, [0, 0, 1, 1])
    assert all(torch.equal(rep[k], same[k]) for k in rep if isinstance(rep[k], torch.Tensor))


# ----------------------------------------------------------------------------- rollouts
def test_rollout_shapes_mask_and_suppression(loaded, batch):
    model, processor = loaded
    tok = processor.tokenizer
    end, vision = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids(policy.VISION_TOKENS)
    torch.manual_seed(0)
    with _Bias(model, vision, 20.0), _Bias(model, [end], 5.0):  # vision tokens would win without suppression
        out = policy.rollout(model, processor, batch, n=3, max_new_tokens=24)
    ids, mask = out.completion_ids, out.completion_mask
    assert len(out.texts) == 6 and ids.shape == mask.shape and ids.shape[0] == 6 and ids.shape[1] <= 24
    assert not torch.isin(ids.cpu(), torch.tensor(vision)).any()
    ended = 0
    for row, m in zip(ids.tolist(), mask.tolist()):
        first_end = row.index(end) if end in row else None
        expected = [1] * len(row) if first_end is None else [1] * (first_end + 1) + [0] * (len(row) - first_end - 1)
        assert m == expected
        if first_end is not None:
            ended += 1
            assert all(t == tok.pad_token_id for t in row[first_end + 1:])
    assert 0 < ended  # the +5 bias makes <|im_end|> likely: the mask logic is exercised
    for text in out.texts:
        assert "<|" not in text
    assert torch.equal(out.prompt_inputs["input_ids"].cpu(), batch["input_ids"].repeat_interleave(3, 0))


def test_greedy_rollout_is_sample_major(loaded, batch):
    model, processor = loaded
    out = policy.rollout(model, processor, batch, n=3, max_new_tokens=8, do_sample=False)
    ids = out.completion_ids
    assert torch.equal(ids[0], ids[1]) and torch.equal(ids[0], ids[2])
    assert torch.equal(ids[3], ids[4]) and torch.equal(ids[3], ids[5])
    # each group is the greedy completion of its own prompt alone (no padding): the order is sample-major
    clips = _clips()
    for b, prompt in enumerate([_prompt(QUESTION), _prompt("How many boxes are there?")]):
        alone = policy.make_inputs(processor, [prompt], [clips[b]])
        single = policy.rollout(model, processor, alone, n=1, max_new_tokens=8, temperature=0).completion_ids[0]
        assert torch.equal(single, ids[3 * b, :len(single)])
        assert (ids[3 * b, len(single):] == processor.tokenizer.pad_token_id).all()


def _sharpen(model, std=0.1, seed=0):
    """Redraw the matrices of a tiny model with a larger std: its greedy completions then depend on the prompt
    and on every position (at init they repeat one token), so that equality of two rollouts means something."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def _arch_batch(processor, arch):
    """Two prompts of different lengths; for a VLM, a short question after a 16-frame video (its text after
    the video ends below the video's last temporal position: Qwen2.5-VL's cached rope_deltas are off by one
    there) and a wide 5-frame clip."""
    if arch == "qwen2":
        msgs = [[{"role": "user", "content": "Say A."}], [{"role": "user", "content": QUESTION}]]
        return policy.make_inputs(processor, msgs, None)
    size = 64 if arch == "qwen3_vl" else 56
    rng = np.random.default_rng(0)
    clips = [rng.integers(0, 256, (16, size, size, 3), dtype=np.uint8),
             rng.integers(0, 256, (5, size, 2 * size, 3), dtype=np.uint8)]
    return policy.make_inputs(processor, [_prompt("How many?"), _prompt(QUESTION)], clips)


def _spy_generate(model, monkeypatch):
    """Record generate()'s raw per-step logits (whatever the path that calls it)."""
    import copy
    seen, generate = {}, model.generate

    def spy(*args, generation_config, **kwargs):
        config = copy.deepcopy(generation_config)
        config.output_logits, config.return_dict_in_generate = True, True
        out = generate(*args, generation_config=config, **kwargs)
        seen["logits"] = torch.stack(out.logits, 1).float()
        return out.sequences
    monkeypatch.setattr(model, "generate", spy)
    return seen


@pytest.mark.parametrize("arch", tiny_model.ARCHS)
def test_shared_prefix_rollout_matches_repeated_prompts(arch, tiny_factory, monkeypatch):
    """share_prefix (each prompt encoded and prefilled once, completions decoded from copies of its KV
    cache) gives the greedy completions of today's repeated-prompt path, with uneven n; sampled completions
    have per-token log-probs equal to generate()'s own scores."""
    model, processor = policy.load_policy(tiny_factory(arch), **F32)
    _sharpen(model)
    inputs = _arch_batch(processor, arch)
    kw = dict(n=[2, 3], max_new_tokens=12, do_sample=False)
    shared = policy.rollout(model, processor, inputs, share_prefix=True, **kw)
    repeated = policy.rollout(model, processor, inputs, share_prefix=False, **kw)
    assert shared.completion_ids.shape[0] == 5 and shared.index.tolist() == [0, 0, 1, 1, 1]
    assert torch.equal(shared.completion_ids, repeated.completion_ids)
    assert torch.equal(shared.completion_mask, repeated.completion_mask) and shared.texts == repeated.texts
    assert not torch.equal(shared.completion_ids[0], shared.completion_ids[2])  # the prompts matter
    assert torch.equal(shared.inputs["input_ids"].cpu(), inputs["input_ids"])  # unrepeated
    assert torch.equal(shared.prompt_inputs["input_ids"].cpu(), inputs["input_ids"][[0, 0, 1, 1, 1]])
    sub = shared.row_inputs([1, 4])
    assert torch.equal(sub["input_ids"].cpu(), inputs["input_ids"][[0, 1]])
    if arch != "qwen2":
        assert sub["video_grid_thw"].tolist() == inputs["video_grid_thw"].tolist()
        text_only = policy.make_inputs(processor, [[{"role": "user", "content": "Say A."}],
                                                   [{"role": "user", "content": QUESTION}]], None)
        a, b = (policy.rollout(model, processor, text_only, share_prefix=s, **kw).completion_ids for s in (True, False))
        assert torch.equal(a, b)  # a VLM without videos: 1-D positions over the left-padded rows
    # sampled: rows differ, masks are prefix masks, and token_logprobs reproduces generate()'s scores
    end = policy.tokenizer_of(processor).convert_tokens_to_ids("<|im_end|>")
    seen = _spy_generate(model, monkeypatch)
    torch.manual_seed(0)
    with _Bias(model, [end], 3.0):
        out = policy.rollout(model, processor, inputs, n=[3, 2], max_new_tokens=10)
        ids, mask = out.completion_ids, out.completion_mask
        assert ids.shape == mask.shape == (5, seen["logits"].shape[1]) and len(out.texts) == 5
        assert len({tuple(r) for r in ids.tolist()}) == 5
        assert ((mask[:, 1:] <= mask[:, :-1]).all() and mask[:, 0].all())
        with torch.no_grad():
            got = policy.token_logprobs(model, out.prompt_inputs, ids, mask)
            part = policy.token_logprobs(model, out.row_inputs(slice(2, 5)), ids[2:], mask[2:])
    want = seen["logits"].log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert (got - want).abs()[mask.bool()].max() < 1e-4
    assert torch.allclose(part, got[2:], atol=1e-5)


@pytest.mark.parametrize("arch", [a for a in tiny_model.ARCHS if a != "qwen2"])
def test_many_questions_on_one_video_match_a_plain_batch(arch, tiny_factory):
    """answer_same_video (the video encoded and the shared prefix prefilled once, each question's own tokens
    appended to copies of that cache, 2 decoded at a time) gives the greedy texts of the questions asked as one
    plain batch; questions of different lengths, one a single word; prompts whose text comes before the
    video share no video prefix and are asked as a plain batch."""
    model, processor = policy.load_policy(tiny_factory(arch), **F32)
    _sharpen(model)
    size = 64 if arch == "qwen3_vl" else 56
    clip = np.random.default_rng(1).integers(0, 256, (8, size, size, 3), dtype=np.uint8)
    questions = ["How many?", QUESTION, "Is there a chair in the room, and where is it standing?", "A?", "Boxes?"]
    prompts = [_prompt(q) for q in questions]
    plain = policy.make_inputs(processor, prompts, [clip] * len(prompts), fps=2.0)
    want = policy.rollout(model, processor, plain, n=1, max_new_tokens=10, do_sample=False).texts
    assert len(set(want)) > 1   # (the questions matter)
    prefix, suffixes = policy.split_shared_prefix(processor, prompts, clip, fps=2.0)
    assert prefix["input_ids"].shape[0] == 1 and prefix["mm_token_type_ids"][0, -1] == 0   # the video, then text
    for row, s in zip(plain["input_ids"], suffixes):   # prefix + suffix = the prompt's own tokens
        assert row[row != processor.tokenizer.pad_token_id].tolist()[-len(s):] == s
    got = policy.answer_same_video(model, processor, prompts, clip, fps=2.0, max_new_tokens=10, batch_size=2)
    assert got == want
    text_first = [[{"role": "user", "content": [{"type": "text", "text": q}, {"type": "video"}]}] for q in questions]
    assert policy.split_shared_prefix(processor, text_first, clip, fps=2.0) is None
    plain = policy.make_inputs(processor, text_first, [clip] * len(prompts), fps=2.0)
    want = policy.rollout(model, processor, plain, n=1, max_new_tokens=10, do_sample=False).texts
    assert policy.answer_same_video(model, processor, text_first, clip, fps=2.0, max_new_tokens=10) == want


def test_completion_index_checks_counts():
    assert policy.completion_index(2, 3).tolist() == [0, 0, 1, 1, 2, 2]
    assert policy.completion_index([0, 2, 1], 3).tolist() == [1, 1, 2]
    for bad in ([1, 2], [1, -1, 1], [0, 0, 0]):
        with pytest.raises(ValueError):
            policy.completion_index(bad, 3)


# ----------------------------------------------------------------------------- log-probs
def _sample_with_logits(model, processor, inputs, n=2, max_new_tokens=20):
    """generate() directly, keeping its raw per-step logits; some rows end early (masked tails)."""
    from transformers import GenerationConfig

    vision, eos, pad = policy._token_ids(processor, model)
    rep = policy.repeat_inputs(inputs, n, model.config.image_token_id, model.config.video_token_id)
    rep = policy._to(rep, policy.model_device(model))
    end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    torch.manual_seed(1)
    with _Bias(model, [end], 5.0), torch.no_grad():
        gen = model.generate(**rep, generation_config=GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=True, top_k=0, eos_token_id=eos, pad_token_id=pad,
            suppress_tokens=vision, output_logits=True, return_dict_in_generate=True))
    ids = gen.sequences[:, rep["input_ids"].shape[1]:]
    return rep, ids, policy.make_completion_mask(ids, eos), torch.stack(gen.logits, 1).float()


def _max_diff(model, processor, rep, ids, mask, logits, temperature=1.0):
    """Largest |token_logprobs - log_softmax(generate's logits / T)| over the unmasked completion tokens."""
    end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    want = (logits / temperature).log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    with _Bias(model, [end], 5.0), torch.no_grad():
        got = policy.token_logprobs(model, rep, ids, mask, temperature=temperature)
    assert got.shape == ids.shape and (got[mask == 0] == 0).all()
    return (got - want).abs()[mask.bool()].max().item()


def test_token_logprobs_match_generate_scores(loaded, batch):
    """The M-RoPE check: one forward over [prompt | completion] reproduces generate()'s per-step logits."""
    model, processor = loaded
    rep, ids, mask, logits = _sample_with_logits(model, processor, batch)
    assert (mask == 0).any()
    assert _max_diff(model, processor, rep, ids, mask, logits) < 1e-4
    assert _max_diff(model, processor, rep, ids, mask, logits, temperature=2.0) < 1e-4
    # without mm_token_type_ids the model falls back to 1-D positions: the log-probs drift
    no_types = {k: v for k, v in rep.items() if k != "mm_token_type_ids"}
    assert _max_diff(model, processor, no_types, ids, mask, logits) > 1e-4


def test_token_logprobs_checkpointed_equals_full_log_softmax(tiny_dir, batch):
    """Values and parameter gradients equal those of one plain log_softmax over all rows (fp32)."""
    model, processor = policy.load_policy(tiny_dir, **F32)
    torch.manual_seed(0)
    out = policy.rollout(model, processor, batch, n=2, max_new_tokens=10)
    ids, mask = out.completion_ids, out.completion_mask
    weights = torch.randn(ids.shape)  # an arbitrary loss over the tokens
    model.train()

    def grads(logp):
        model.zero_grad()
        (logp * weights * mask).sum().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]
    got = policy.token_logprobs(model, out.prompt_inputs, ids, mask, temperature=0.7)
    got_grads = grads(got)
    logits = policy.completion_logits(model, out.prompt_inputs, ids, mask)
    want = (logits / 0.7).log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1) * mask
    want_grads = grads(want)
    assert torch.allclose(got, want, atol=1e-6)
    assert len(got_grads) == len(want_grads) > 0
    # float32 rounding, relative to each gradient's scale (the largest entries are ~10)
    assert all((a - b).abs().max() <= 1e-6 * max(1.0, b.abs().max().item()) for a, b in zip(got_grads, want_grads))


def test_token_logprobs_keeps_no_float32_logits_for_backward(tiny_dir, batch):
    """bf16 model: autograd saves only the bf16 logits; the float32 log-softmax is recomputed in backward."""
    model, processor = policy.load_policy(tiny_dir, dtype=torch.bfloat16, device="cpu")
    out = policy.rollout(model, processor, batch, n=2, max_new_tokens=6)
    vocab = model.config.text_config.vocab_size
    saved = []

    def pack(t):
        saved.append((t.shape[-1] if t.ndim else 0, t.dtype))
        return t
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp = policy.token_logprobs(model, out.prompt_inputs, out.completion_ids, out.completion_mask)
    logp.sum().backward()
    assert (vocab, torch.bfloat16) in saved  # the logits themselves
    assert (vocab, torch.float32) not in saved


def test_text_only_prompts(loaded):
    model, processor = loaded
    inputs = policy.make_inputs(processor, [[{"role": "user", "content": "Say A."}], [{"role": "user", "content": [
        {"type": "text", "text": "Which option is right? A or B?"}]}]], None)
    assert "pixel_values_videos" not in inputs
    out = policy.rollout(model, processor, inputs, n=2, max_new_tokens=6)
    assert out.completion_ids.shape[0] == 4
    rep, ids, mask, logits = _sample_with_logits(model, processor, inputs)
    assert _max_diff(model, processor, rep, ids, mask, logits) < 1e-4


@pytest.mark.parametrize("arch, size", [("qwen2_vl", 56), ("qwen3_vl", 64)])
def test_other_architectures(arch, size, tiny_factory):
    model, processor = policy.load_policy(tiny_factory(arch), **F32)
    assert type(model).__name__.lower().startswith(arch.replace("_", ""))
    clips = [np.zeros((5, size, size, 3), np.uint8), np.full((4, size, 2 * size, 3), 200, np.uint8)]
    inputs = policy.make_inputs(processor, [_prompt(QUESTION), _prompt("How many?")], clips)
    out = policy.rollout(model, processor, inputs, n=2, max_new_tokens=6)
    assert len(out.texts) == 4
    rep, ids, mask, logits = _sample_with_logits(model, processor, inputs, max_new_tokens=12)
    assert _max_diff(model, processor, rep, ids, mask, logits) < 1e-4


def test_frozen_copy(loaded, batch):
    model, processor = loaded
    out = policy.rollout(model, processor, batch, n=2, max_new_tokens=8)
    ref = policy.frozen_copy(model)
    assert not any(p.requires_grad for p in ref.parameters()) and not ref.training
    args = (out.prompt_inputs, out.completion_ids, out.completion_mask)
    with torch.no_grad():
        a = policy.token_logprobs(model, *args)
    b = policy.reference_logprobs(model, *args, ref_model=ref)
    assert torch.equal(a, b) and not b.requires_grad
    with pytest.raises(ValueError):
        policy.reference_logprobs(model, *args)  # no adapters to disable, no ref_model


# ----------------------------------------------------------------------------- LoRA and 4-bit
def _one_step(model, out, lr=1e-2):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    model.train()
    logp = policy.token_logprobs(model, out.prompt_inputs, out.completion_ids, out.completion_mask)
    loss = -(logp.sum() / out.completion_mask.sum())
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)
    opt.step()
    opt.zero_grad()
    model.eval()


def test_lora_trains_only_adapters_and_reference_is_base(tiny_dir, batch):
    model, processor = policy.load_policy(tiny_dir, lora_r=4, **F32)
    base, _ = policy.load_policy(tiny_dir, **F32)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and "language_model" in n for n in trainable)
    assert not any("lora" in n for n, _ in model.named_parameters() if "visual" in n)
    targets = {n.split(".")[-4] for n in trainable}  # ...q_proj.lora_A.default.weight
    assert targets == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    torch.manual_seed(0)
    out = policy.rollout(model, processor, batch, n=2, max_new_tokens=12)
    args = (out.prompt_inputs, out.completion_ids, out.completion_mask)
    with torch.no_grad():
        before = policy.token_logprobs(model, *args)
        base_logp = policy.token_logprobs(base, *args)
    assert torch.allclose(policy.reference_logprobs(model, *args), before, atol=1e-6)  # B = 0 at init
    assert torch.allclose(before, base_logp, atol=1e-6)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    _one_step(model, out)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, state[k])]
    assert changed and all("lora_" in k for k in changed)
    with torch.no_grad():
        after = policy.token_logprobs(model, *args)
    ref = policy.reference_logprobs(model, *args)
    assert (after - before).abs().max() > 1e-3
    assert torch.allclose(ref, base_logp, atol=1e-6)


def test_4bit_lora_loads_and_trains(tiny_dir, batch):
    pytest.importorskip("bitsandbytes")
    import bitsandbytes as bnb

    model, processor = policy.load_policy(tiny_dir, load_in_4bit=True, lora_r=4, **F32)
    lm = {n: m for n, m in model.named_modules() if n.endswith(("q_proj", "down_proj")) and "language_model" in n}
    assert lm and all(isinstance(m.base_layer, bnb.nn.Linear4bit) for m in lm.values())
    assert all(m.base_layer.weight.quant_state.quant_type == "nf4" for m in lm.values())
    assert not any(isinstance(m, bnb.nn.Linear4bit) for n, m in model.named_modules() if "visual" in n)
    torch.manual_seed(0)
    # an eval-mode no-grad pass first: on an AVX512-BF16 CPU, bitsandbytes 0.50 would repack the weights there
    # and break backward afterwards (load_policy turns that off); the reference log-probs stay bit-identical
    out = policy.rollout(model, processor, batch, n=2, max_new_tokens=12)
    args = (out.prompt_inputs, out.completion_ids, out.completion_mask)
    ref_before = policy.reference_logprobs(model, *args)
    state = {k: v.clone() for k, v in model.state_dict().items() if "lora_" in k}
    _one_step(model, out)
    assert all(not torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert torch.equal(policy.reference_logprobs(model, *args), ref_before)


def test_cli_builds_a_tiny_model(tmp_path):
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-m", "machinery.model.tiny", "build-tiny", "--out", str(tmp_path / "m"),
                          "--arch", "qwen2_vl"], cwd=root, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "m" / "config.json").is_file() and "qwen2_vl" in (tmp_path / "m" / "config.json").read_text()
