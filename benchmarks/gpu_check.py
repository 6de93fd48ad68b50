"""The checks that need a GPU, in one short script (the tests run on CPU only): the policy's CUDA / bf16
paths for the tiny VLM and the tiny text LM (Embodied-R's reasoner), Robust-TO's agent on CUDA, and the
torch backend of the corruption engine on CUDA against its OpenCV one.

    python benchmarks/gpu_check.py [--device cuda] [--json OUT.json]

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
import data  # noqa: E402
import synthetic  # noqa: E402
import policy  # noqa: E402


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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    report, failures = {}, 0
    tmp = Path(tempfile.mkdtemp())
    objects = [{"colour": "red", "shape": "pillar", "pos": (-2.0, 6.0)}, {"colour": "blue", "shape": "cube", "pos": (1.5, 8.0)}]
    clip, _, _ = synthetic.render_synthetic(objects, 0.045, 0.2, num_frames=8, size=56)

    def check(name, fn):
        nonlocal failures
        t0 = time.perf_counter()
        try:
            ok, what = fn()
        except Exception as e:  # noqa: BLE001 - report every check
            ok, what = False, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
        failures += not ok
        report[name] = {"ok": ok, "what": what, "seconds": round(time.perf_counter() - t0, 2)}
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {what}", flush=True)

    vlm_dir = policy.build_tiny(tmp / "vlm")
    text_dir = policy.build_tiny(tmp / "text", arch="qwen2")
    prompt = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Which way does the camera turn?"}]}]

    def vlm_bf16():
        model, proc = policy.load_policy(vlm_dir, device=device)  # default dtype: bf16 on a bf16 GPU
        inputs = policy.make_inputs(proc, [prompt, prompt], [clip, clip[:6]])
        diff = _generate_vs_logprobs(model, proc, inputs)
        return diff < 0.1 and model.dtype == torch.bfloat16, f"dtype {model.dtype}, max |logp diff| {diff:.4f} (< 0.1 in bf16)"

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
                        answer="A", problem_type="multiple choice", options=["A. Turn left", "B. Turn right", "C. Go ahead"],
                        task="route_planning")
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
    for name, fn in (("vlm_bf16_logprobs", vlm_bf16), ("vlm_lora_step", vlm_lora), ("text_policy_bf16", text_bf16),
                     ("robust_to_agent", agent), ("perturb_torch_backend", perturb_torch)):
        check(name, fn)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(device), "torch": torch.__version__,
                                               "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
                                               "checks": report}, indent=1))
    return failures


if __name__ == "__main__":
    sys.exit(main())
