"""Per-GPU memory plan of ROVA training (memory.py): the parts of one RL step, phase by phase, in GiB.

    python benchmarks/memory_plan.py --model qwen2.5-vl-7b --mode fsdp --gpus 4     # App. D: 4xA100-80GB
    python benchmarks/memory_plan.py --model qwen2.5-vl-7b --mode lora --micro-batch-size 4
    python benchmarks/memory_plan.py --model /path/to/checkpoint --mode qlora       # its config.json, read offline
    python benchmarks/memory_plan.py --all         # docs/PERFORMANCE.md's table: FSDP2 on 4 and 8 GPUs, LoRA, QLoRA
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

import math
import sys
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machinery import cli  # noqa: E402,I001 - first: it sets the OpenMP wait policy before torch loads
import grpo  # noqa: E402
from machinery.model import memory  # noqa: E402

SETTINGS = ("batch_size", "group_size", "temporal_grpo", "frames", "max_pixels", "text_tokens", "max_new_tokens",
            "micro_batch_size", "lora_r")
ALL_ROWS = [(m, mode, n) for m in ("qwen2.5-vl-3b", "qwen2.5-vl-7b")
            for mode, n in (("fsdp", 4), ("fsdp", 8), ("lora", 1), ("qlora", 1))] \
    + [(m, "fsdp", 8) for m in ("qwen2.5-vl-32b", "qwen2.5-vl-72b")]


# ----------------------------------------------------------------------------- checking the accounting on CPU
def validation_config(hidden=256, intermediate=768, layers=4, heads=4, kv_heads=2, vocab=4096, vision_hidden=128,
                      vision_depth=2):
    """A small random Qwen2.5-VL, built in code, big enough that activations and states dominate fixed overheads
    (the tiny test model of tiny.build_tiny is too small: its tensors are mostly overheads)."""
    from transformers import Qwen2_5_VLConfig

    text = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
                bos_token_id=0, eos_token_id=1, pad_token_id=0,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                 "mrope_section": [hidden // heads // 8, 3 * hidden // heads // 16,
                                                   3 * hidden // heads // 16]})
    vision = dict(memory.QWEN25_VISION, depth=vision_depth, hidden_size=vision_hidden,
                  intermediate_size=2 * vision_hidden,
                  num_heads=2, out_hidden_size=hidden, fullatt_block_indexes=[vision_depth - 1])
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=vocab - 1,
                            video_token_id=vocab - 2, vision_start_token_id=vocab - 3, vision_end_token_id=vocab - 4,
                            tie_word_embeddings=True)


class LiveBytes:
    """Counts the bytes of live tensor storages: those registered with `add` and every one an op creates inside
    the context (a TorchDispatchMode; a weakref finalizer subtracts a storage when it is freed). `peak` is the
    largest sum seen. CPU or GPU alike; views share their storage and count once."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.weak import WeakIdKeyDictionary

        tracker = self
        self.seen, self.now, self.peak, self._refs = WeakIdKeyDictionary(), 0, 0, []

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                import torch.utils._pytree as pytree
                out = func(*args, **(kwargs or {}))
                for t in pytree.tree_leaves(out):
                    tracker.add(t)
                return out

        self._mode = _Mode()

    def add(self, t):
        import torch
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        st = t.untyped_storage()
        if st in self.seen:
            return
        n = st.nbytes()
        self.seen[st] = n
        self.now += n
        self.peak = max(self.peak, self.now)
        self._refs.append(weakref.ref(st, lambda _ref, n=n: setattr(self, "now", self.now - n)))

    def __enter__(self):
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)


def _validation_batch(config, rows, text_tokens, frames, side, new_tokens, seed):
    """A left-padded prompt batch with one video per row (tokens as Qwen2.5-VL's processor lays them out), and
    completions of uneven lengths (masked after their end), as a GRPO update sees them."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    vc, vocab = config.vision_config, config.text_config.vocab_size
    grid = (math.ceil(frames / vc.temporal_patch_size), side // vc.patch_size, side // vc.patch_size)
    n_video = grid[0] * grid[1] * grid[2] // vc.spatial_merge_size ** 2
    length = text_tokens + n_video
    ids, mask = torch.zeros(rows, length, dtype=torch.long), torch.zeros(rows, length, dtype=torch.long)
    for r in range(rows):
        pad = 8 * (r % 2)  # every other prompt 8 tokens shorter: left padding
        row = torch.randint(5, vocab - 8, (length - pad,), generator=gen)
        row[4] = config.vision_start_token_id
        row[5:5 + n_video] = config.video_token_id
        row[5 + n_video] = config.vision_end_token_id
        ids[r, pad:], mask[r, pad:] = row, 1
    patches = rows * grid[0] * grid[1] * grid[2]
    inputs = dict(input_ids=ids, attention_mask=mask, mm_token_type_ids=(ids == config.video_token_id).long() * 2,
                  pixel_values_videos=torch.randn(patches, 3 * vc.temporal_patch_size * vc.patch_size ** 2,
                                                  generator=gen),
                  video_grid_thw=torch.tensor([grid] * rows), second_per_grid_ts=torch.ones(rows))
    completion = torch.randint(5, vocab - 8, (rows, new_tokens), generator=gen)
    lengths = torch.tensor([max(1, new_tokens - 5 * r) for r in range(rows)])
    completion_mask = (torch.arange(new_tokens)[None] < lengths[:, None]).long()
    return inputs, completion.masked_fill(completion_mask == 0, 0), completion_mask


def measure_update(config=None, rows=4, text_tokens=120, frames=4, side=112, new_tokens=64, reference=True,
                   seed=0, dtype="float32", gradient_checkpointing=False, lora_r=0) -> dict:
    """Peak live tensor bytes of one GRPO update of a random model built from `config` (default
    validation_config()) in one CPU process: policy.token_logprobs, the reference's log-probs (a frozen copy; with
    `lora_r`, peft adapters and a frozen reference adapter), Eq. 7's loss (grpo.grpo_loss), backward, gradient
    clipping and an AdamW step, as learner.py's.
    `dtype` of the weights (float32 or bfloat16: AdamW's states follow), `gradient_checkpointing` as load_policy sets
    it. Measured at the second update (AdamW's states exist: the steady state the plan describes). Returns bytes:
    "peak", "base" (weights, states, reference and inputs at the start)."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    from machinery.model import policy

    config = config or validation_config()
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).to(getattr(torch, dtype))
    if gradient_checkpointing:  # as policy.load_policy (transformers >= 5.2x calls it activation checkpointing)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    ref = policy.frozen_copy(model) if (reference and not lora_r) else None
    if lora_r:  # as policy.load_policy: adapters on the LM's projections; the reference a frozen second adapter
        from peft import LoraConfig, get_peft_model
        lora = dict(r=lora_r, lora_alpha=2 * lora_r, target_modules=policy.LM_LORA_TARGETS, task_type="CAUSAL_LM")
        model = get_peft_model(model, LoraConfig(lora_dropout=0.05, **lora))
        if reference:   # (as policy.add_reference_adapter after SFT)
            model.add_adapter(policy.REFERENCE_ADAPTER, LoraConfig(lora_dropout=0.0, inference_mode=True, **lora))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    inputs, ids, mask = _validation_batch(config, rows, text_tokens, frames, side, new_tokens, seed)
    adv = torch.randn(rows, generator=torch.Generator().manual_seed(seed))

    def update():
        model.train()
        logp = policy.token_logprobs(model, inputs, ids, mask)
        ref_logp = policy.reference_logprobs(model, inputs, ids, mask, ref_model=ref) if reference else logp.detach()
        loss, _ = grpo.grpo_loss(logp, logp.detach(), ref_logp, adv, mask)
        (loss * rows).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    update()  # creates AdamW's states
    with LiveBytes() as live:
        for t in [*model.parameters(), *(ref.parameters() if ref else []), *inputs.values(), ids, mask,
                  *(v for state in opt.state.values() for v in state.values())]:
            live.add(t)
        base = live.now
        update()
    return {"peak": live.peak, "base": base}


def check_plan(rows=4, text_tokens=120, frames=4, side=112, new_tokens=64, reference=True, dtype="float32",
               gradient_checkpointing=False) -> dict:
    """memory.plan of validation_config() against measure_update: GiB measured, planned, and planned / measured.
    fp32 is planned as `single`; bf16 as `ddp` (bf16 weights, grads and AdamW states: what a CPU can run of the GPU
    modes' accounting), without the CUDA overhead."""
    config = validation_config()
    measured = measure_update(config, rows, text_tokens, frames, side, new_tokens, reference, dtype=dtype,
                              gradient_checkpointing=gradient_checkpointing)
    p = memory.plan(config, "single" if dtype == "float32" else "ddp", batch_size=1, group_size=rows,
                    micro_batch_size=rows, frames=frames, max_pixels=side * side, text_tokens=text_tokens,
                    max_new_tokens=new_tokens, reference=reference, gradient_checkpointing=gradient_checkpointing,
                    overhead_gib=0.0)
    planned = max(p["update"], p["step"])  # the measured update ends with the optimizer step
    peak = measured["peak"] / memory.GIB
    return {"measured": peak, "planned": planned, "ratio": planned / peak, "plan": p}


def parse_args(argv=None):
    ap = cli.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=cli.HelpFormatter,
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
    ap.add_argument("--all", action="store_true", help="docs/PERFORMANCE.md's table (other flags but --gpu-gib ignored)")
    ap.add_argument("--validate", action="store_true", help="measure a CPU update and compare (about 10 s)")
    cli.add_debug_flag(ap)
    return ap.parse_args(argv)


def model_config(name):
    """A preset's name as is; a checkpoint folder's config, offline."""
    if name in memory.PRESETS:
        return name
    if not (Path(name) / "config.json").is_file():
        raise cli.UserError(f"--model {name}: neither a preset ({', '.join(memory.PRESETS)}) nor a folder "
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
        v = check_plan(dtype=dtype, gradient_checkpointing=checkpointing)
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
    cli.run(main)
