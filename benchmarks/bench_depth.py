"""What `--depth-model` costs per frame on this machine, beside the corruption it feeds (depth.py).

    python benchmarks/bench_depth.py [--frames 16 --size 448 --repeats 3]

Nothing is downloaded: the model is a Depth Anything V2 Small *shape* (Dinov2 ViT-S/14 backbone, DPT neck
and head, 518-pixel input, the processor's resize and normalisation) with random weights, built and saved
here, then loaded through depth.Source as a real one would be. Its cost is the real model's (same layers,
same input size); its depth is noise, so this measures time only. Printed:

    depth_model_ms_per_frame=<x> params_m=<p>    the model's forward, per frame, batch of --batch-size
    cache_hit_ms_per_clip=<y>                   a clip's depth read back from the disk cache
    apply_ms_per_clip proxy=<a> depth=<b>       perturb.apply(fog) on the clip with the proxy / with that depth
"""
import argparse
import os
import statistics
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machinery.corruption import depth  # noqa: E402
import perturb  # noqa: E402
from machinery.datasets import synthetic  # noqa: E402
from bench_perturb import timed  # noqa: E402  (benchmarks/)


def build_small_shape(folder):
    """Depth Anything V2 Small's architecture and processor (its published config), random weights."""
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config, DPTImageProcessor

    backbone = Dinov2Config(image_size=518, patch_size=14, hidden_size=384, num_hidden_layers=12,
                            num_attention_heads=6, mlp_ratio=4, out_indices=[3, 6, 9, 12],
                            out_features=["stage3", "stage6", "stage9", "stage12"], reshape_hidden_states=False)
    config = DepthAnythingConfig(backbone_config=backbone, reassemble_hidden_size=384,
                                 reassemble_factors=[4, 2, 1, 0.5], neck_hidden_sizes=[48, 96, 192, 384],
                                 fusion_hidden_size=64, head_hidden_size=32, depth_estimation_type="relative")
    model = DepthAnythingForDepthEstimation(config)
    model.save_pretrained(folder)
    DPTImageProcessor(size={"height": 518, "width": 518}, keep_aspect_ratio=True, ensure_multiple_of=14,
                      resample=3, do_normalize=True, image_mean=[0.485, 0.456, 0.406],
                      image_std=[0.229, 0.224, 0.225]).save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


def median_s(fn, repeats):
    """Median seconds of `repeats` runs (bench_perturb.timed, without its warm-up runs)."""
    return statistics.median(timed(fn, repeats, warmup=0))


def main():
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--size", type=int, default=448)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    frames, _ = synthetic.sample_clip(args.frames, args.size, args.size)
    with tempfile.TemporaryDirectory() as tmp:
        params = build_small_shape(tmp)
        source = depth.Source(tmp, cache_dir=os.path.join(tmp, "cache"), batch_size=args.batch_size)
        source.estimate(frames[:args.batch_size])  # warm-up (and the model's load)
        model_s = median_s(lambda: source.estimate(frames), args.repeats)
        d = source(frames, "bench")  # into the cache
        hit_s = median_s(lambda: source(frames, "bench"), max(args.repeats, 5))
    spec = perturb.sample_spec(0, subtype="fog")
    proxy_s = median_s(lambda: perturb.apply(frames, spec), max(args.repeats, 5))
    depth_s = median_s(lambda: perturb.apply(frames, spec, d), max(args.repeats, 5))
    print(f"clip {args.frames}x{args.size}x{args.size}, batch {args.batch_size}, torch threads "
          f"{__import__('torch').get_num_threads()}")
    print(f"depth_model_ms_per_frame={1e3 * model_s / args.frames:.1f} params_m={params / 1e6:.1f}")
    print(f"cache_hit_ms_per_clip={1e3 * hit_s:.1f}")
    print(f"apply_ms_per_clip proxy={1e3 * proxy_s:.1f} depth={1e3 * depth_s:.1f}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
