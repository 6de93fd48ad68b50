"""Per-GPU memory plan of ROVA training (memory.py): the parts of one RL step, phase by phase, in GiB.

    python benchmarks/memory_plan.py --model qwen2.5-vl-7b --mode fsdp --gpus 4     # App. D: 4xA100-80GB
    python benchmarks/memory_plan.py --model qwen2.5-vl-7b --mode lora --micro-batch-size 4
    python benchmarks/memory_plan.py --model /path/to/checkpoint --mode qlora       # its config.json, read offline
    python benchmarks/memory_plan.py --all         # docs/MEASURED.md's table: FSDP2 on 4 and 8 GPUs, LoRA, QLoRA
    python benchmarks/memory_plan.py --validate    # the accounting against a measured CPU update (~10 s)

A plan prints a table of the parts (weights, gradients, AdamW states, the reference model, the generate call's
gathered weights and KV cache, the activations one micro-batch keeps, the transients, each phase's total) and ends
with the line `peak_gib=<number>`; when the peak exceeds --gpu-gib it says which micro-batch size would fit.
--all prints one row per model and setup at App. D's settings and ends with App. D's row (7B, FSDP2, 4 GPUs) as
`peak_gib=<number>`. --validate trains one GRPO update of a small random Qwen2.5-VL on the CPU (fp32, no
checkpointing), measures the peak of live tensor bytes, compares it with the plan's `single` mode and ends with
`measured_gib=<m> planned_gib=<p> ratio=<p/m>`.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machinery import runtime  # noqa: E402,I001 - first: it sets the OpenMP wait policy before torch loads
import grpo  # noqa: E402
from machinery.model import memory  # noqa: E402

SETTINGS = ("batch_size", "group_size", "temporal_grpo", "frames", "max_pixels", "text_tokens", "max_new_tokens",
            "micro_batch_size", "lora_r")
ALL_ROWS = [(m, mode, n) for m in ("qwen2.5-vl-3b", "qwen2.5-vl-7b")
            for mode, n in (("fsdp", 4), ("fsdp", 8), ("lora", 1), ("qlora", 1))] \
    + [(m, "fsdp", 8) for m in ("qwen2.5-vl-32b", "qwen2.5-vl-72b")]


def parse_args(argv=None):
    ap = runtime.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=runtime.HelpFormatter,
                                 epilog="Defaults are App. D's (train.py's): 4 videos per GPU, G = 8 per branch, "
                                        "16 frames x 128x28x28 pixels, 256 new tokens.")
    ap.add_argument("--model", default="qwen2.5-vl-7b",
                    help=f"a preset ({', '.join(memory.PRESETS)}) or a local checkpoint folder (its config.json)")
    ap.add_argument("--mode", default="fsdp", choices=memory.MODES)
    ap.add_argument("--gpus", type=int, default=None, help="FSDP world size (default 4 for fsdp, else 1)")
    defaults = memory.Settings()
    for name in SETTINGS:
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    ap.add_argument("--no-reference", action="store_true", help="beta = 0: the reference model is not loaded")
    ap.add_argument("--no-gradient-checkpointing", action="store_true")
    ap.add_argument("--gpu-gib", type=float, default=80.0, help="memory of one GPU (A100-80GB: 80)")
    ap.add_argument("--all", action="store_true", help="docs/MEASURED.md's table (other flags but --gpu-gib ignored)")
    ap.add_argument("--validate", action="store_true", help="measure a CPU update and compare (about 10 s)")
    runtime.add_debug_flag(ap)
    return ap.parse_args(argv)


def model_config(name):
    """A preset's name as is; a checkpoint folder's config, offline."""
    if name in memory.PRESETS:
        return name
    if not (Path(name) / "config.json").is_file():
        raise runtime.UserError(f"--model {name}: neither a preset ({', '.join(memory.PRESETS)}) nor a folder "
                                f"with a config.json")
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(name, local_files_only=True)


def one_plan(args):
    settings = {name: getattr(args, name) for name in SETTINGS}
    settings.update(reference=not args.no_reference, gradient_checkpointing=False if args.no_gradient_checkpointing
                    else None)
    gpus = args.gpus or (4 if args.mode == "fsdp" else 1)
    config = model_config(args.model)
    p = memory.plan(config, args.mode, gpus, **settings)
    print(memory.format_plan(p, args.gpu_gib))
    if p["peak"] > args.gpu_gib:
        fit = memory.largest_micro_batch(config, args.mode, gpus, args.gpu_gib, **settings)
        print(f"does not fit: --micro-batch-size {fit} would ({args.gpu_gib:g} GiB)" if fit else
              f"does not fit with any micro-batch: the {p['peak_phase']} phase needs more than {args.gpu_gib:g} GiB "
              f"(fewer videos per GPU, more GPUs, or LoRA / QLoRA)")
    print(f"peak_gib={p['peak']:.2f}")


def all_plans(args):
    print(f"Per-GPU peak, GiB, at App. D's settings (4 videos x 2 x 8 rollouts per GPU, 16 frames x 128x28x28, "
          f"256 new tokens, micro-batch 8, reference model loaded; {args.gpu_gib:g} GiB GPUs):\n")
    print("| model | training | GPUs | weights + grads + AdamW + reference | (a) generation | (b) update | "
          "peak | fits | largest micro-batch that fits |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    target = None
    for name, mode, n in ALL_ROWS:
        p = memory.plan(name, mode, n)
        state = p["weights"] + p["grads"] + p["optimizer"] + p["reference"]
        label = {"fsdp": "full, FSDP2", "lora": f"LoRA r={p['settings']['lora_r']} (bf16)",
                 "qlora": f"QLoRA r={p['settings']['lora_r']} (NF4)"}[mode]
        fit = memory.largest_micro_batch(name, mode, n, args.gpu_gib)
        print(f"| {name} | {label} | {n} | {state:.1f} | {p['generation']:.1f} | {p['update']:.1f} | "
              f"{p['peak']:.1f} ({p['peak_phase']}) | {'yes' if p['peak'] <= args.gpu_gib else 'no'} | "
              f"{fit if fit else 'none'} |")
        if (name, mode, n) == ("qwen2.5-vl-7b", "fsdp", 4):
            target = p["peak"]
    print(f"\npeak_gib={target:.2f}")


def validate(args):
    print("one GRPO update of a small random Qwen2.5-VL on the CPU (4 rows of 120 text + 32 video + 64 completion "
          "tokens, frozen reference copy, AdamW): peak of live tensors, measured vs planned")
    cases = [("float32", True, "fp32, checkpointing (single)"), ("bfloat16", True, "bf16, checkpointing (ddp)"),
             ("float32", False, "fp32, no checkpointing (single)")]  # the check last
    for dtype, checkpointing, label in cases:
        v = memory.validate(grpo.grpo_loss, dtype=dtype, gradient_checkpointing=checkpointing)
        print(f"  {label:<34} measured {v['measured'] * 1024:7.1f} MiB  planned {v['planned'] * 1024:7.1f} MiB  "
              f"ratio {v['ratio']:.3f}")
    print(f"measured_gib={v['measured']:.4f} planned_gib={v['planned']:.4f} ratio={v['ratio']:.3f}")


def main(argv=None):
    args = parse_args(argv)
    if args.validate:
        validate(args)
    elif args.all:
        all_plans(args)
    else:
        one_plan(args)


if __name__ == "__main__":
    runtime.run(main)
