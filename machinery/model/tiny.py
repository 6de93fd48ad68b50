"""The tiny offline model: a random-weight Qwen2.5-VL / Qwen2-VL / Qwen3-VL (or text-only Qwen2) of ~2 MB, with a
byte-level BPE tokenizer trained on the project's own prompts, Qwen's special tokens and chat template, that reloads
offline through the Hugging Face Auto classes exactly as a real checkpoint does
(:func:`machinery.model.policy.load_policy`). The tests, the CPU demo and the benchmarks build it in code; nothing is
downloaded::

    path = tiny.build_tiny("/tmp/tiny")         # or: python -m machinery.model.tiny build-tiny --out /tmp/tiny
    model, processor = policy.load_policy(path)
"""
from __future__ import annotations

from pathlib import Path

import torch

from machinery import cli
from machinery.datasets import data
from machinery.datasets import synthetic

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>"]

# The Qwen2-VL / Qwen2.5-VL chat template (as shipped with the Instruct checkpoints).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: "
    "{% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Appended to the project's prompt strings (data.tokenizer_corpus()): the templates and answers in prose.
_FALLBACK_CORPUS = [
    "You are a helpful assistant.",
    ("Think about the question step by step in <think> </think> tags, then give the final answer in "
     "<answer> </answer> tags."),
    ("<think>The camera moves forward and the road bends to the left, so the drone must turn left.</think>"
     "<answer>A</answer>"),
    "Please provide only the single option letter (e.g., A, B, C, D, etc.) within the <answer> </answer> tags.",
    "Please provide the numerical value (e.g., 42 or 3.14) within the <answer> </answer> tags.",
    "Options:\nA. turn left\nB. turn right\nC. go ahead\nD. stop\nE. go back",
    "Which way should the agent go next: turn left, turn right or go ahead (straight)?",
    "How many objects are there in the video? How many boxes, cars, people, trees?",
    "These are frames of a video. Answer with the option's letter from the given choices directly.",
    "Please answer the question using a single word or phrase. Option: []; Reason: []",
    "zero one two three four five six seven eight nine ten eleven twelve twenty hundred",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 20 42 100 3.14 0.5 1.5 2.0 meters seconds",
    "A B C D E (A) (B) (C) (D) (E) A. B. C. D. E. yes no YES NO Yes No",
    "Is the question answerable from the video? The video is clear, dark, foggy, rainy, snowy, occluded, shaky.",
    "left right ahead straight forward backward up down near far closer farther first then finally because",
]


def _tiny_tokenizer(texts, vocab_size):
    """A byte-level BPE trained on ``texts``, wrapped as a transformers fast tokenizer with Qwen's specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        extra_special_tokens=SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:], padding_side="left",
        chat_template=CHAT_TEMPLATE, model_max_length=32768)


ARCHS = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl", "qwen2")  # the last is a text-only LM (a text reasoner)


def build_tiny(out_dir, arch="qwen2_5_vl", texts=None, seed=0, vocab_size=1024, extra_texts=()):
    """Write a tiny random-weight video VLM (~2 MB) that reloads offline with the Auto classes.
    ``arch="qwen2"``: the same text model without a vision tower (a Qwen2ForCausalLM and its tokenizer):
    a text reasoner in miniature (its extension passes its prompts' vocabulary as ``extra_texts``).

    Text model: 2 layers, 128 wide (4 query heads of 32, 2 key/value heads; mrope_section [4, 6, 6] sums to
    head_dim / 2): head_dim 32 is the smallest that vLLM's CPU attention serves (it rejects 16), so the same
    checkpoint runs through transformers and a real server; with fewer than 4 heads of 32 at 64 wide the demo's
    SFT learned the task about half as well. Vision tower: 2 blocks, 32 wide; tied embeddings. Processor: a
    byte-level BPE tokenizer trained on ``texts`` (default: the project's prompts, ``data.tokenizer_corpus``
    with the synthetic benchmark's, plus a built-in template corpus), then ``extra_texts``, and image/video
    processors limited to 56x56 .. 64 patches of 28x28 per frame (32x32 for Qwen3-VL), temporal_patch_size 2,
    no frame re-sampling (the frames given are the frames seen). ``vocab_size`` is the BPE target; a small
    corpus gives fewer tokens. ``arch``: "qwen2_5_vl" (default), "qwen2_vl" or "qwen3_vl" (timestamps in the
    prompt from the video metadata that :func:`machinery.model.policy.make_inputs` passes). Returns the directory as a
    string.
    """
    import transformers as tf

    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(map(repr, ARCHS))}, got {arch!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if texts is None:
        texts = data.tokenizer_corpus(synthetic.tokenizer_corpus()) + _FALLBACK_CORPUS
    corpus = list(texts) + list(extra_texts)
    tokenizer = _tiny_tokenizer(corpus, vocab_size)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    unit = 32 if arch == "qwen3_vl" else 28  # a merged 2x2 group of 16- or 14-pixel patches
    size = {"shortest_edge": (2 * unit) ** 2, "longest_edge": 64 * unit * unit}  # 56x56 .. 64 units per frame
    pix = dict(size=size, patch_size=unit // 2, temporal_patch_size=2, merge_size=2)
    image_processor = tf.Qwen2VLImageProcessor(**pix)
    video_cls = tf.Qwen3VLVideoProcessor if arch == "qwen3_vl" else tf.Qwen2VLVideoProcessor
    video_processor = video_cls(**pix, cap_pixels_per_frame=False, do_sample_frames=False)
    text = dict(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6]},
                bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    generation = tf.GenerationConfig(
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], pad_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|endoftext|>"])
    if arch == "qwen2":  # text only: 1-D RoPE, no vision tokens in use
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
        torch.manual_seed(seed)
        model = tf.AutoModelForCausalLM.from_config(tf.Qwen2Config(**text, tie_word_embeddings=True),
                                                    dtype=torch.float32)
        model.generation_config = generation
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        return str(out_dir)
    specials = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                    vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                    tie_word_embeddings=True)
    if arch == "qwen2_5_vl":
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=128, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2, tokens_per_second=2, window_size=112,
                      fullatt_block_indexes=[1])
        config = tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **specials)
        processor_cls = tf.Qwen2_5_VLProcessor
    elif arch == "qwen2_vl":
        vision = dict(depth=2, embed_dim=32, hidden_size=128, mlp_ratio=2, num_heads=2, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2)
        config = tf.Qwen2VLConfig(text_config=text, vision_config=vision, **specials)
        processor_cls = tf.Qwen2VLProcessor
    else:  # Qwen3-VL: interleaved M-RoPE, learned 2-D position table, deepstack, timestamps in the text
        text.update(head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                                  "mrope_section": [4, 6, 6], "mrope_interleaved": True})
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=128, patch_size=16,
                      spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=256,
                      deepstack_visual_indexes=[0])
        config = tf.Qwen3VLConfig(text_config=text, vision_config=vision, **specials)
        processor_cls = tf.Qwen3VLProcessor
    torch.manual_seed(seed)
    model = tf.AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.generation_config = generation
    model.save_pretrained(out_dir)
    processor = processor_cls(image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor,
                              chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(out_dir)
    return str(out_dir)


def main(argv=None):
    ap = cli.ArgumentParser(description="Policy tools of the ROVA reference implementation.")
    sub = ap.add_subparsers(dest="command", required=True)
    tiny = sub.add_parser("build-tiny", help="write a tiny random VLM that loads offline (tests, CPU demos)")
    tiny.add_argument("--out", required=True, help="output directory")
    tiny.add_argument("--arch", default="qwen2_5_vl", choices=list(ARCHS), help="qwen2: a text-only LM")
    tiny.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(build_tiny(args.out, arch=args.arch, seed=args.seed))


if __name__ == "__main__":
    cli.run(main)
