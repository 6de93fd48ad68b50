"""The checks that need a GPU, in one short script (the tests run on CPU only): the policy's CUDA / bf16
paths for the tiny VLM and the tiny text LM (Embodied-R's reasoner), Robust-TO's agent on CUDA, the
torch backend of the corruption engine on CUDA against its OpenCV one, one FSDP2 RL step of a
7B-wide Qwen2.5-VL (random weights; peak memory against memory.plan, seconds per step), and, where vLLM is
installed, ROVA steps of a 7B-wide model with each rollout engine (hf, vllm: seconds per step and their ratio).

    python checks/gpu_check.py [--device cuda] [--json OUT.json]

Each check prints one line, "ok" or "FAIL" with what it measured; the exit status is the number of
failures. Nothing is downloaded (tiny models are built in a temporary folder, clips rendered in memory).
"""
import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from machinery.datasets import data  # noqa: E402
from machinery.datasets import synthetic  # noqa: E402
from machinery.model import policy  # noqa: E402
from machinery.model import tiny as tiny_model  # noqa: E402


def _generate_vs_logprobs(model, processor, inputs, n=2, max_new_tokens=12):
    """Max |token_logprobs - log_softmax(generate's logits)| over the sampled completion tokens."""
    from transformers import GenerationConfig

    vision, eos, pad = policy._token_ids(processor, model)
    rep = policy._to(policy.repeat_for(model, inputs, n), policy.model_device(model))
    torch.manual_seed(0)
    with torch.no_grad():
        gen = model.generate(**rep, generation_config=GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=True, top_k=0, eos_token_id=eos, pad_token_id=pad,
            suppress_tokens=vision or None, output_logits=True, return_dict_in_generate=True))
        ids = gen.sequences[:, rep["input_ids"].shape[1]:]
        mask = policy.make_completion_mask(ids, eos)
        want = torch.stack(gen.logits, 1).float().log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        got = policy.token_logprobs(model, rep, ids, mask)
    return (got - want).abs()[mask.bool()].max().item()


def _lora_step(model, processor, inputs):
    out = policy.rollout(model, processor, inputs, n=2, max_new_tokens=8)
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    logp = policy.token_logprobs(model, out.prompt_inputs, out.completion_ids, out.completion_mask)
    (-(logp.sum())).backward()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    opt.step()
    changed = sum(not torch.equal(a, b.detach()) for a, b in zip(before, [p for p in model.parameters()
                                                                          if p.requires_grad]))
    ref = policy.reference_logprobs(model, out.prompt_inputs, out.completion_ids, out.completion_mask)
    return changed, bool(torch.isfinite(ref).all())


def wide_config(vlm_dir, tok, layers, shape="qwen2.5-vl-7b"):
    """`shape`'s Qwen2.5-VL config (a memory.py preset, or "tiny": the tiny model's) with `layers` decoder layers and
    the special token ids of the tiny model's tokenizer `tok`."""
    from machinery.model import memory

    config = memory.preset_config(shape) if shape != "tiny" else policy.load_policy(vlm_dir)[0].config
    config.text_config.num_hidden_layers = layers
    if getattr(config.text_config, "layer_types", None):   # transformers >= 5.2x validates one type per layer
        config.text_config.layer_types = config.text_config.layer_types[:layers]
    for name in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
        setattr(config, name, tok.convert_tokens_to_ids(f"<|{name.removesuffix('_token_id')}_pad|>")
                if name in ("image_token_id", "video_token_id") else
                tok.convert_tokens_to_ids(f"<|{name.removesuffix('_token_id')}|>"))
    config.text_config.eos_token_id = config.text_config.pad_token_id = tok.pad_token_id
    return config


def fsdp_step(device, vlm_dir, layers=8, group_size=8, micro_batch_size=4, new_tokens=64, shape="qwen2.5-vl-7b"):
    """One RL step of FSDP2 full fine-tuning of a Qwen2.5-VL with `shape`'s widths (7B: hidden 3584, MLP 18944,
    the 32-block vision tower, vocab 152064) and `layers` decoder layers, random fp32 weights, on this one
    process: G rollouts on a clean and a corrupted 16-frame video (App. D's 128x28x28 pixels per frame) in one
    shared-prefix generate call inside parallel.gathered, the GRPO update of the G perturbed rows in
    micro-batches with activation checkpointing, fused AdamW. Returns (peak GiB, s/step, the plan's GiB)."""
    from transformers import AutoModelForImageTextToText

    import grpo
    from machinery.model import memory
    from machinery.model import parallel

    _, proc = policy.load_policy(vlm_dir, device=device)
    proc.video_processor.size = {"shortest_edge": 56 * 56, "longest_edge": 128 * 28 * 28}  # App. D's budget
    config = wide_config(vlm_dir, policy.tokenizer_of(proc), layers, shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    if device.type == "cuda":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    parallel.shard(model, device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=device.type == "cuda")
    rng = np.random.default_rng(0)
    clean = rng.integers(0, 255, (16, 224, 448, 3), dtype=np.uint8)
    pert = np.clip(clean.astype(np.int16) - 60, 0, 255).astype(np.uint8)
    prompt = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Which way should it turn?"}]}]
    inputs = policy.make_inputs(proc, [prompt, prompt], [clean, pert])
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    with parallel.gathered(model):
        out = policy.rollout(model, proc, inputs, n=group_size, max_new_tokens=new_tokens)
    rows = torch.arange(group_size, 2 * group_size)  # the perturbed branch's rows are trained
    adv = torch.randn(group_size)
    model.train()

    def backward(part, denominator):
        r = rows[part]
        logp = policy.token_logprobs(model, out.row_inputs(r), out.completion_ids[r], out.completion_mask[r])
        mask = out.completion_mask[r].to(logp.device)
        per_token, _ = grpo.token_losses(logp, logp.detach(), logp.detach(), adv[part].to(logp.device), mask, beta=0.0)
        (grpo.agg_loss(per_token, mask, "sequence", denominator) * parallel.world()).backward()

    parallel.backward_micro_batches(len(rows), micro_batch_size, backward, device)
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else float("nan")
    planned = memory.plan(config, "fsdp", 1, batch_size=1, group_size=group_size, micro_batch_size=micro_batch_size,
                          max_new_tokens=new_tokens, reference=False, overhead_gib=0.0)["peak"]
    return peak, seconds, planned


def wide_checkpoint(folder, vlm_dir, layers, shape="qwen2.5-vl-7b"):
    """A Qwen2.5-VL checkpoint with `shape`'s widths and `layers` decoder layers, random bf16 weights, and the tiny
    model's processor (no download): what train.py loads for the engine comparison."""
    from transformers import AutoModelForImageTextToText

    _, proc = policy.load_policy(vlm_dir)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(wide_config(vlm_dir, policy.tokenizer_of(proc), layers, shape),
                                                    dtype=torch.bfloat16)
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    return folder


def engine_steps(tmp, vlm_dir, layers, steps=3):
    """train.py --mode rova on one GPU with each rollout engine, a 7B-wide model (`layers` decoder layers), App. D's
    G = 8 and 4 videos: the mean seconds of the steps after the first (hf, vllm), and the largest log-prob gap
    between the engine and the policy (bf16)."""
    import train
    model_dir = wide_checkpoint(tmp / "wide", vlm_dir, layers)
    synthetic.make_synthetic(tmp / "synth16", n=16, seed=2, num_frames=16, size=112, eval_fraction=0.25)
    out = {}
    for engine in ("hf", "vllm"):
        run = tmp / f"engine-{engine}"
        train.main(["--model", str(model_dir), "--data", str(tmp / "synth16" / "train.json"), "--out", str(run),
                    "--frames", "16", "--sft-epochs", "0", "--rl-steps", str(steps), "--batch-size", "4",
                    "--max-new-tokens", "64", "--save-every", str(steps), "--judge", "none", "--beta", "0",
                    "--rollout-engine", engine], eval_limit=0)
        recs = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines() if '"rl"' in x]
        out[engine] = float(np.mean([r["sec_step"] for r in recs[1:]]))
        out[f"{engine}_gap"] = max((r.get("engine_logprob_gap") or 0.0) for r in recs)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default="")
    ap.add_argument("--fsdp-layers", type=int, default=8, help="decoder layers of the 7B-wide FSDP2 step (of 28)")
    ap.add_argument("--engine-layers", type=int, default=8, help="decoder layers of the engine comparison's model")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    report, failures = {}, 0
    tmp = Path(tempfile.mkdtemp())
    objects = [{"colour": "red", "shape": "pillar", "pos": (-2.0, 6.0)},
               {"colour": "blue", "shape": "cube", "pos": (1.5, 8.0)}]
    clip, _, _ = synthetic.render_synthetic(objects, 0.045, 0.2, num_frames=8, size=56)

    def check(name, fn):
        nonlocal failures
        t0 = time.perf_counter()
        try:
            ok, what = fn()
        except Exception as e:  # noqa: BLE001 - report every check
            ok, what = False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
        failures += ok is False   # None: skipped (what it needs is not on this machine)
        report[name] = {"ok": ok, "what": what, "seconds": round(time.perf_counter() - t0, 2)}
        print(f"{'skip' if ok is None else 'ok  ' if ok else 'FAIL'} {name}: {what}", flush=True)

    vlm_dir = tiny_model.build_tiny(tmp / "vlm")
    text_dir = tiny_model.build_tiny(tmp / "text", arch="qwen2")
    prompt = [{"role": "user", "content": [{"type": "video"},
                                           {"type": "text", "text": "Which way does the camera turn?"}]}]

    def vlm_bf16():
        model, proc = policy.load_policy(vlm_dir, device=device)  # default dtype: bf16 on a bf16 GPU
        inputs = policy.make_inputs(proc, [prompt, prompt], [clip, clip[:6]])
        diff = _generate_vs_logprobs(model, proc, inputs)
        return (diff < 0.1 and model.dtype == torch.bfloat16,
                f"dtype {model.dtype}, max |logp diff| {diff:.4f} (< 0.1 in bf16)")

    def vlm_lora():
        model, proc = policy.load_policy(vlm_dir, device=device, lora_r=4)
        changed, finite = _lora_step(model, proc, policy.make_inputs(proc, [prompt], [clip]))
        return changed > 0 and finite, f"{changed} LoRA tensors updated, reference finite: {finite}"

    def text_bf16():
        model, tok = policy.load_policy(text_dir, device=device)
        msgs = [[{"role": "user", "content": "Frame 0: Observe: a red tall object on the left\nHow many red objects?"}],
                [{"role": "user", "content": "Which way? A. left B. right"}]]
        diff = _generate_vs_logprobs(model, tok, policy.make_inputs(tok, msgs, None))
        changed, finite = _lora_step(*policy.load_policy(text_dir, device=device, lora_r=4),
                                     policy.make_inputs(tok, msgs, None))
        return diff < 0.1 and changed > 0 and finite, \
            f"dtype {model.dtype}, max |logp diff| {diff:.4f}; LoRA step updated {changed} tensors"

    def agent():
        from extensions.robust_to import orchestrate
        model, proc = policy.load_policy(vlm_dir, device=device)
        s = data.Sample(id="q", source="synthetic", video="", question="Which action is the agent taking?",
                        answer="A", problem_type="multiple choice",
                        options=["A. Turn left", "B. Turn right", "C. Go ahead"], task="route_planning")
        traces = orchestrate.Agent(model, proc, k=4, decompose_tokens=16, synthesis_tokens=16).run([s, s], [clip, clip])
        ev = [e.to_dict() for t in traces for e in t.evidence]
        return len(traces) == 2 and bool(ev), f"{len(ev)} evidence records, tools {sorted({e['tool'] for e in ev})}"

    def perturb_torch():
        import perturb
        from extensions.robust_to import corruptions  # noqa: F401 - registers motion_blur, noise
        worst = {}
        frames = np.ascontiguousarray(np.repeat(clip, 2, axis=0))
        for sub in tuple(perturb.EFFECTS):
            spec = perturb.static_spec("gpu-check", sub)
            a = perturb.apply(frames, spec).astype(np.int16)
            b = perturb.apply(torch.from_numpy(frames).to(device), spec).cpu().numpy().astype(np.int16)
            worst[sub] = (float(np.abs(a - b).mean()), int(np.abs(a - b).max()))
        bad = {k: v for k, v in worst.items() if v[0] > 0.5}
        return not bad, f"mean |numpy - torch| per subtype <= {max(v[0] for v in worst.values()):.3f}" + \
            (f"; over 0.5: {bad}" if bad else "")

    if device.type == "cuda" and not torch.cuda.is_available():
        print("FAIL no CUDA device")
        return 1
    def fsdp2_7b_step():
        peak, seconds, planned = fsdp_step(device, vlm_dir, layers=args.fsdp_layers)
        within = abs(planned / peak - 1) <= 0.15
        return within, (f"7B-wide Qwen2.5-VL, {args.fsdp_layers} of 28 decoder layers, FSDP2 on 1 GPU: peak "
                         f"{peak:.1f} GiB (plan {planned:.1f} GiB, {planned / peak - 1:+.0%}), {seconds:.1f} s/step")

    def rova_fills_every_step():
        """train.py on the GPU, --mode rova with Fig. 4c's random discarding at rho 0.5: every step draws until
        its batch is selected (several draws, one loss) and makes one update. No alignment judge (--judge none): it
        is not what this checks, and the offline MiniLM package it loads is not on every GPU machine."""
        import train
        synthetic.make_synthetic(tmp / "synth", n=12, seed=1, num_frames=4, size=56, eval_fraction=0.25)
        out = tmp / "rova"
        train.main(["--model", str(vlm_dir), "--data", str(tmp / "synth" / "train.json"), "--out", str(out),
                    "--frames", "4", "--max-pixels", str(56 * 56), "--sft-epochs", "0", "--rl-steps", "4",
                    "--batch-size", "2", "--group-size", "4", "--max-new-tokens", "16", "--save-every", "4",
                    "--lr", "1e-4", "--judge", "none"], assess="random", random_keep=0.5)
        recs = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines() if '"rl"' in x]
        updates, seen = [r["updates"] for r in recs], sum(r["samples"] for r in recs)
        return updates == [1, 2, 3, 4] and seen > 8, f"updates {updates}, samples assessed {seen:g} for 8 trained"

    def rollout_engines():
        try:
            import vllm  # noqa: F401
        except ImportError:
            return None, "skipped: vLLM is not installed on this machine (requirements-vllm.txt, with vllm for CUDA)"
        t = engine_steps(tmp, vlm_dir, args.engine_layers)
        return t["vllm_gap"] < 0.1, (f"one ROVA step of a 7B-wide Qwen2.5-VL ({args.engine_layers} of 28 layers, 4 "
                                     f"videos x 2 x G=8): hf {t['hf']:.1f} s, vllm {t['vllm']:.1f} s, hf/vllm "
                                     f"{t['hf'] / t['vllm']:.2f}x; engine log-prob gap {t['vllm_gap']:.3f} "
                                     "(< 0.1, bf16)")

    for name, fn in (("vlm_bf16_logprobs", vlm_bf16), ("vlm_lora_step", vlm_lora), ("text_policy_bf16", text_bf16),
                     ("robust_to_agent", agent), ("perturb_torch_backend", perturb_torch),
                     ("rova_fills_every_step", rova_fills_every_step), ("fsdp2_7b_step", fsdp2_7b_step),
                     ("rollout_engines", rollout_engines)):
        check(name, fn)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(device), "torch": torch.__version__,
                                               "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
                                               "checks": report}, indent=1))
    return failures


if __name__ == "__main__":
    sys.exit(main())
