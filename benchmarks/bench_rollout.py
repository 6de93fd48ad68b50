"""Shared-prefix rollouts against repeated prompts, interleaved in one process, on the tiny Qwen2.5-VL.

    python benchmarks/bench_rollout.py            # ~1.5 min on 2 cores

A: ``policy.rollout(..., share_prefix=False)``, the old path: the prompt batch (pixels included) is repeated
G times before one generate(), so the ViT sees every video G times and every prompt is prefilled G times.
B: ``share_prefix=True``: each video through the ViT and each prompt prefilled once, the G completions decoded
from copies of its KV cache. App. D's rollout shape: 4 prompts (4 videos per GPU), G = 8, 16 frames, 64 and
256 new tokens, sampled at temperature 1. The end tokens are masked out of the logits (a hook on the LM
head, for A and B alike) so that every completion decodes all its tokens; the completion lengths are printed.

Frame sizes: 56x56 (the CPU training demo's max_pixels: 4 patches of 28x28 per frame, 32 video tokens per
clip) and 224x224 (64 patches of 28x28 per frame, the tiny processor's maximum: half App. D's 128x28x28
budget, 512 video tokens per clip). The summary line is for the 224x224 setting (the nearest to App. D).

Each round times A B B A (or B A A B, alternating) for each setting; the ratio of a round is A's time over
B's, and the table reports the medians over rounds. Speed is a ratio of two runs on the same machine, never
an absolute. The greedy check: do_sample=False through A and B on the same inputs must give identical tokens
(the tiny model's matrices are redrawn with std 0.1 first, so that its greedy tokens depend on the prompt
and on every position; at init it repeats one token). The last line is
`speedup_64=<x> speedup_256=<x> greedy_identical=<True|False>`.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machinery import cli  # noqa: E402,F401 - before torch: the OpenMP wait policy (cli.GOMP_SPINCOUNT)
import numpy as np  # noqa: E402
import torch  # noqa: E402

from machinery.model import policy  # noqa: E402
from machinery.model import tiny as tiny_model  # noqa: E402

QUESTION = "Which way should the drone go next?\nOptions:\nA. turn left\nB. turn right\nC. go ahead"


def sharpen(model, std=0.1, seed=0):
    """Redraw every weight matrix with a larger std (greedy tokens of the untrained tiny model then vary)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def no_end_tokens(model, end_ids):
    """A hook on the LM head that masks the end tokens out: every completion runs max_new_tokens."""
    end = torch.tensor(end_ids)
    return model.lm_head.register_forward_hook(lambda m, i, out: out.index_fill(-1, end.to(out.device), float("-inf")))


def make_batch(processor, prompts, frames, size, seed=0):
    rng = np.random.default_rng(seed)
    clips = [rng.integers(0, 256, (frames, size, size, 3), dtype=np.uint8) for _ in range(prompts)]
    msgs = [[{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": QUESTION}]}]] * prompts
    return policy.make_inputs(processor, msgs, clips)


def timed(model, processor, inputs, group, tokens, share):
    t0 = time.perf_counter()
    out = policy.rollout(model, processor, inputs, n=group, max_new_tokens=tokens, share_prefix=share)
    return time.perf_counter() - t0, out.completion_mask.sum(1)


def main(argv=None):
    ap = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (each runs A twice and B twice)")
    ap.add_argument("--prompts", type=int, default=4, help="videos per rollout batch (App. D: 4 per GPU)")
    ap.add_argument("--group", type=int, default=8, help="G, completions per video (App. D: 8)")
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--sizes", default="56,224", help="frame sizes in pixels (square); the last one is summarised")
    ap.add_argument("--tokens", default="64,256", help="new tokens per completion")
    args = ap.parse_args(argv)
    sizes, token_counts = [int(s) for s in args.sizes.split(",")], [int(t) for t in args.tokens.split(",")]
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model, processor = policy.load_policy(tiny_model.build_tiny(os.path.join(tmp, "tiny")), dtype=torch.float32,
                                              device="cpu")
    sharpen(model)
    batches = {s: make_batch(processor, args.prompts, args.frames, s) for s in sizes}

    greedy = {}  # A and B on the same inputs, before the end tokens are masked (as a rollout really runs)
    for s, inputs in batches.items():
        a, b = (policy.rollout(model, processor, inputs, n=args.group, max_new_tokens=token_counts[0],
                               do_sample=False, share_prefix=share) for share in (False, True))
        greedy[s] = torch.equal(a.completion_ids, b.completion_ids)

    hook = no_end_tokens(model, policy._token_ids(processor, model)[1])
    settings = [(s, t) for s in sizes for t in token_counts]
    for s, t in settings:  # warm-up: allocator, kernels, lazily built processors
        for share in (False, True):
            timed(model, processor, batches[s], args.group, t, share)
    times = {key: {False: [], True: []} for key in settings}
    ratios = {key: [] for key in settings}
    lengths = {key: set() for key in settings}
    for r in range(args.rounds):
        order = (False, True, True, False) if r % 2 == 0 else (True, False, False, True)
        for key in settings:
            spent = {False: 0.0, True: 0.0}
            for share in order:
                dt, length = timed(model, processor, batches[key[0]], args.group, key[1], share)
                spent[share] += dt / 2
                times[key][share].append(dt)
                lengths[key].update(length.tolist())
            ratios[key].append(spent[False] / spent[True])
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{s}px/{t}tok {ratios[(s, t)][-1]:.2f}x"
                                                         for s, t in settings), flush=True)
    hook.remove()

    rows = args.prompts * args.group
    print(f"\n{args.prompts} prompts x G={args.group} = {rows} completions, {args.frames} frames, sampled, "
          f"median of {args.rounds} rounds (A B B A interleaved)")
    print(f"{'frames':>9} {'video tok':>9} {'prompt':>6} {'new tok':>7} {'lengths':>9} {'A repeated s':>12} "
          f"{'B shared s':>10} {'A/B':>6}")
    for s, t in settings:
        grid = batches[s]["video_grid_thw"][0]
        video_tokens = int(grid.prod()) // 4
        span = f"{min(lengths[(s, t)])}-{max(lengths[(s, t)])}"
        print(f"{s:>4}x{s:<4} {video_tokens:>9} {batches[s]['input_ids'].shape[1]:>6} {t:>7} {span:>9} "
              f"{statistics.median(times[(s, t)][False]):>12.3f} {statistics.median(times[(s, t)][True]):>10.3f} "
              f"{statistics.median(ratios[(s, t)]):>5.2f}x")
    print("greedy identical (A vs B, do_sample=False, " + f"{token_counts[0]} tokens): "
          + ", ".join(f"{s}x{s} {greedy[s]}" for s in sizes))
    last = sizes[-1]
    speedups = " ".join(f"speedup_{t}={statistics.median(ratios[(last, t)]):.2f}" for t in token_counts)
    print(f"{speedups} greedy_identical={all(greedy.values())}")


if __name__ == "__main__":
    main()
