"""Cost of one RL step of standard GRPO, naive dual-branch and ROVA, interleaved in one process
(Table 13's per-step times and ratios, Table 14's component shares; App. G).

    python benchmarks/bench_step.py --model runs/reproduce/sft/final --data runs/reproduce/sft/synthetic/train.json
    python benchmarks/bench_step.py            # smoke run: an untrained tiny model on a small synthetic set

Each mode gets its own copy of the policy (loaded from --model), its own optimiser, memory buffer and
reference model, and the same data order and corruption-spec stream (same --seed). Step t runs the
three modes in a rotated order (t, t+1, t+2 mod 3) so that drifts of the machine's speed fall on all
of them alike; only the ratios measured this way are meant to be compared across machines. All clips
are decoded before timing (the decoding cost is the data loader's, not a training paradigm's). Each
mode trains on its own copy, so ROVA's curriculum sees its own evolving policy, as in training.

Per mode: mean seconds per step (+- standard deviation over steps) and each component's share of the
mean step: perturbation, rollout (both branches: one generation call), self-assessment, alignment reward (judge),
backward (Eq. 7-8 on the selected samples), memory re-evaluation (amortised: it runs every
--reeval-period steps, so use a multiple of it for --steps), other (what no component covers). The last
line is `rova_over_grpo=<x> rova_over_dual=<y>` (the paper: 403/215 = 1.87 and 403/428 = 0.94).

--model should be a checkpoint that has learnt the answer format (reproduce.py passes its SFT
checkpoint): an untrained model rolls out --max-new-tokens of noise, ROVA defers every sample and
trains nothing, and the ratios say little. Settings default to train.py's CPU demo.
"""
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machinery import runtime  # noqa: E402,F401 - before torch: the OpenMP wait policy (runtime.GOMP_SPINCOUNT)
import numpy as np  # noqa: E402
import torch  # noqa: E402

from machinery.datasets import data  # noqa: E402

from machinery.datasets import synthetic  # noqa: E402
from machinery.model import policy  # noqa: E402
from machinery.model import tiny as tiny_model  # noqa: E402
import train  # noqa: E402
from machinery.training import clips as clips_mod  # noqa: E402

MODES = ("grpo", "dual", "rova")
COMPONENTS = ("perturbation", "rollout", "self_assessment", "alignment_reward",
              "backward", "memory_reevaluation")
# Table 14 times the clean and the perturbed rollouts apart (35.4% each); train.py generates both branches in one
# call (each video encoded and prefilled once), so its "rollout" is their sum.
PAPER_TABLE14 = {"perturbation": 2.0, "rollout": 70.8, "self_assessment": 4.6,
                 "alignment_reward": 9.5, "backward": 11.6, "memory_reevaluation": 1.5}  # % of 403 s (4xA100)
PAPER_TABLE13 = {"grpo": 215.0, "dual": 428.0, "rova": 403.0}  # s per step


def parse_args(argv=None):
    ap = runtime.ArgumentParser(description=__doc__.split("\n\n")[0])
    a = ap.add_argument
    a("--model", default="", help="policy checkpoint (default: an untrained tiny model, a smoke run)")
    a("--data", default="", help="Video-R1 JSON (default: a small synthetic set built in --work)")
    a("--work", default="", help="folder for the smoke run's assets and the modes' judge caches (default: a temp dir)")
    a("--steps", type=int, default=30, help="timed steps per mode (a multiple of --reeval-period)")
    a("--warmup", type=int, default=2, help="untimed steps per mode first")
    a("--seed", type=int, default=0)
    a("--json", default="", help="also write the figures to this JSON file")
    for name in ("batch_size", "group_size", "max_new_tokens", "frames", "max_pixels", "reeval_period"):
        a("--" + name.replace("_", "-"), type=int, default=train.DEMO[name])
    a("--lr", type=float, default=train.DEMO["lr"])
    a("--unanswerable-below", type=float, default=train.DEMO["unanswerable_below"])
    a("--judge", default="local", help="alignment judge of dual and rova (train.py --judge)")
    a("--reassess", default=train.Config().reassess, choices=("rule", "verdict"), help="rova's re-assessment of "
      "buffered samples (train.py's reassess: rule = the accuracy rule's G rollouts per entry; verdict = one "
      "forward, App. G)")
    a("--eta", default=train.Config().eta, help="perturbation intensity (train.py --eta: a number or per subtype)")
    return ap.parse_args(argv)


def smoke_assets(work):
    tiny, synth = work / "tiny", work / "synthetic"
    if not (tiny / "config.json").is_file():
        tiny_model.build_tiny(tiny)
    if not (synth / "train.json").is_file():
        synthetic.make_synthetic(synth, n=16, seed=0, num_frames=8, size=56, eval_fraction=0.25)
    return str(tiny), str(synth / "train.json")


def make_mode(args, mode, samples, clips, work):
    cfg = train.Config(model=args.model, data=args.data, out=str(work / mode), mode=mode, seed=args.seed,
                       rl_steps=args.warmup + args.steps, batch_size=args.batch_size, group_size=args.group_size,
                       max_new_tokens=args.max_new_tokens, frames=args.frames, max_pixels=args.max_pixels,
                       reeval_period=args.reeval_period, lr=args.lr, unanswerable_below=args.unanswerable_below,
                       judge=args.judge, video_cache=len(samples) + 1, reassess=args.reassess,
                       eta=args.eta)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    Path(cfg.out, "judge_cache.sqlite").unlink(missing_ok=True)  # every verdict is computed, none cached
    model, processor = policy.load_policy(args.model, device="cpu")
    ref = policy.frozen_copy(policy.load_policy(args.model, device="cpu")[0])
    rl = train.build_rl(cfg, 0, 1, torch.device("cpu"), samples, clips, model, processor, ref)
    spec_rng = np.random.default_rng([cfg.seed, 0, 0xC0DE])  # train.py's stream: the same specs in every mode
    return rl, spec_rng


def run(args):
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_step_"))
    work.mkdir(parents=True, exist_ok=True)
    if not args.model or not args.data:
        args.model, args.data = smoke_assets(work)
    torch.manual_seed(args.seed)
    samples, missing = data.load_video_r1(args.data)
    if missing:
        print(f"note: {len(missing)} videos of {args.data} are missing; their samples are left out")
    cfg0 = train.Config(frames=args.frames, max_pixels=args.max_pixels, video_cache=len(samples) + 1)
    clips = clips_mod.Clips(cfg0, [], len(samples))
    for s in samples:  # decode everything before timing
        clips.get(s)
    modes = {m: make_mode(args, m, samples, clips, work) for m in MODES}
    secs = {m: [] for m in MODES}
    comp = {m: {c: 0.0 for c in COMPONENTS} for m in MODES}
    rho = {m: [] for m in MODES}
    for t in range(args.warmup + args.steps):
        for k in range(len(MODES)):
            m = MODES[(t + k) % len(MODES)]
            rl, spec_rng = modes[m]
            t0 = time.perf_counter()
            rec = rl.step(t, spec_rng)
            dt = time.perf_counter() - t0
            if t < args.warmup:
                continue
            secs[m].append(dt)
            for c in COMPONENTS:
                comp[m][c] += rec.get(f"sec_{c}", 0.0)
            rho[m].append(rec["selected"] / rec["samples"] if rec["samples"] else 0.0)
        print(f"step {t + 1}/{args.warmup + args.steps}" + (" (warm-up)" if t < args.warmup else ""), flush=True)
    out = {"config": {k: v for k, v in vars(args).items()}, "modes": {}}
    for m in MODES:
        n = len(secs[m])
        mean = statistics.fmean(secs[m])
        parts = {c: comp[m][c] / n for c in COMPONENTS}
        parts["other"] = mean - sum(parts.values())
        out["modes"][m] = {"sec_per_step": mean, "sec_std": statistics.stdev(secs[m]) if n > 1 else 0.0,
                           "components": parts, "share": {c: v / mean for c, v in parts.items()},
                           "rho": statistics.fmean(rho[m])}
    out["rova_over_grpo"] = out["modes"]["rova"]["sec_per_step"] / out["modes"]["grpo"]["sec_per_step"]
    out["rova_over_dual"] = out["modes"]["rova"]["sec_per_step"] / out["modes"]["dual"]["sec_per_step"]
    return out


def report(out):
    m = out["modes"]
    lines = ["Per step (mean +- sd over timed steps), ratios to naive dual-branch (Table 13):",
             f"  {'mode':<6} {'s/step':>14} {'x dual':>7} {'rho':>5}   paper s/step"]
    for mode in MODES:
        r = m[mode]
        lines.append(f"  {mode:<6} {r['sec_per_step']:8.3f} +- {r['sec_std']:.3f} "
                     f"{r['sec_per_step'] / m['dual']['sec_per_step']:7.2f} {r['rho']:5.2f}   "
                     f"{PAPER_TABLE13[mode]:.0f}")
    lines.append("Component shares of a step, % (Table 14 is ROVA's):")
    lines.append(f"  {'component':<20}" + "".join(f"{x:>8}" for x in MODES) + f"{'paper':>8}")
    for c in COMPONENTS + ("other",):
        lines.append(f"  {c:<20}" + "".join(f"{100 * m[x]['share'][c]:8.1f}" for x in MODES)
                     + (f"{PAPER_TABLE14[c]:8.1f}" if c in PAPER_TABLE14 else f"{'':>8}"))
    lines.append(f"rova_over_grpo={out['rova_over_grpo']:.3f} rova_over_dual={out['rova_over_dual']:.3f}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    out = run(args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
    print(report(out))


if __name__ == "__main__":
    main()
