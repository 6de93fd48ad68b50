"""Cost of one RL step of standard GRPO, naive dual-branch and ROVA, interleaved in one process
(Table 13's per-step times and ratios, Table 14's component shares; App. G).

    python benchmarks/bench_step.py --model runs/reproduce/sft/final --data runs/reproduce/sft/synthetic/train.json
    python benchmarks/bench_step.py            # smoke run: an untrained tiny model on a small synthetic set
    python benchmarks/bench_step.py --v5 --steps 40 --repeats 5 --write experiments/results/v5.json   # Table 13 on v5's start

Each mode gets its own copy of the policy (loaded from --model), its own optimiser, memory buffer and
reference model, and the same data order and corruption-spec stream (same --seed). Step t runs the
three modes in a rotated order (t, t+1, t+2 mod 3) so that drifts of the machine's speed fall on all
of them alike; only the ratios measured this way are meant to be compared across machines. All clips
are decoded before timing (the decoding cost is the data loader's, not a training paradigm's). Each
mode trains on its own copy, so ROVA's curriculum sees its own evolving policy, as in training.
--repeats runs the whole interleaved run again with fresh copies (repeat r at seed --seed + r: its own data
order, specs and sampling), and the figures are the means over repeats with their spread (min-max).

ROVA's step is App. G's by default (train.py's fill_rounds 0): it rolls out and self-assesses its batch_size samples
and trains the rho N it selects (Eq. 13); --fill-rounds 4 is v5's fill-up, which draws until N are selected.

Per mode: mean seconds per step (+- standard deviation over steps) and each component's share of the
mean step: perturbation, rollout (both branches: one generation call), self-assessment, alignment reward (judge),
backward (Eq. 7-8 on the selected samples), memory re-evaluation (amortised: it runs every
--reeval-period steps, so use a multiple of it for --steps), other (what no component covers); rho (Table 12's:
the share of the fresh samples trained) and the trained share (of every sample rolled out, the buffer's promotions
included: what the alignment reward and the backward scale with). Beside them, Eq. 15's predicted ROVA / dual
ratio from these measured costs (`predicted_ratio`). The last line is `rova_over_grpo=<x> rova_over_dual=<y>
predicted_ratio=<z>` (the paper: 403/215 = 1.87 and 403/428 = 0.94; Eq. 19: 0.950).

--model should be a checkpoint that has learnt the answer format (reproduce.py passes its SFT
checkpoint; --v5 takes v5's, experiments/results/v5-start): an untrained model rolls out --max-new-tokens of noise, ROVA
defers every sample and trains nothing, and the ratios say little. Settings default to train.py's CPU demo; --v5
takes v5's (its summary's RL settings, learning rate and toy, the toy's data rendered again into --work and checked
against the summary's hash).
"""
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machinery import cli  # noqa: E402,F401 - before torch: the OpenMP wait policy (cli.GOMP_SPINCOUNT)
import numpy as np  # noqa: E402
import torch  # noqa: E402

from machinery import hub  # noqa: E402
from machinery.datasets import data  # noqa: E402

from machinery.datasets import synthetic  # noqa: E402
from machinery.model import policy  # noqa: E402
from machinery.model import tiny as tiny_model  # noqa: E402
import train  # noqa: E402
from machinery.training import clips as clips_mod  # noqa: E402
from machinery.training import runs as runs_mod  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
V5_SUMMARY = ROOT / "experiments" / "results" / "v5.json"

MODES = ("grpo", "dual", "rova")
COMPONENTS = ("perturbation", "rollout", "self_assessment", "alignment_reward",
              "backward", "memory_reevaluation")
# Table 14 times the clean and the perturbed rollouts apart (35.4% each); train.py generates both branches in one
# call (each video encoded and prefilled once), so its "rollout" is their sum.
PAPER_TABLE14 = {"perturbation": 2.0, "rollout": 70.8, "self_assessment": 4.6,
                 "alignment_reward": 9.5, "backward": 11.6, "memory_reevaluation": 1.5}  # % of 403 s (4xA100)
PAPER_TABLE13 = {"grpo": 215.0, "dual": 428.0, "rova": 403.0}  # s per step


RL_FLAGS = ("batch_size", "group_size", "max_new_tokens", "frames", "max_pixels", "reeval_period")


def parse_args(argv=None):
    ap = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    a = ap.add_argument
    a("--model", default="", help="policy checkpoint (default: an untrained tiny model, a smoke run)")
    a("--data", default="", help="Video-R1 JSON (default: a small synthetic set built in --work)")
    a("--work", default="", help="folder for the smoke run's assets and the modes' judge caches (default: a temp dir; "
      "--v5: runs/bench_step_v5)")
    a("--steps", type=int, default=30, help="timed steps per mode (a multiple of --reeval-period)")
    a("--warmup", type=int, default=2, help="untimed steps per mode first")
    a("--repeats", type=int, default=1, help="the whole interleaved run this many times, each with fresh copies "
      "(repeat r at seed --seed + r)")
    a("--seed", type=int, default=0)
    a("--json", default="", help="also write the figures to this JSON file")
    for name in RL_FLAGS:
        a("--" + name.replace("_", "-"), type=int, default=train.DEMO[name])
    a("--lr", type=float, default=train.DEMO["lr"])
    a("--unanswerable-below", type=float, default=train.DEMO["unanswerable_below"])
    a("--fill-rounds", type=int, default=train.Config().fill_rounds, help="rova's draws after a step's first while "
      "its selection is short of batch_size (train.py's fill_rounds; 0: App. G's step)")
    a("--judge", default="local", help="alignment judge of dual and rova (train.py --judge)")
    a("--reassess", default=train.Config().reassess, choices=("rule", "verdict"), help="rova's re-assessment of "
      "buffered samples (train.py's reassess: rule = the accuracy rule's G rollouts per entry; verdict = one "
      "forward, App. G)")
    a("--eta", default=train.Config().eta, help="perturbation intensity (train.py --eta: a number or per subtype)")
    a("--v5", action="store_true", help="v5's start (experiments/results/v5-start), toy data, RL settings, learning rate and "
      "eta, from --summary (flags given explicitly still win)")
    a("--summary", default=str(V5_SUMMARY), help="v5's summary, for --v5 and as the default of --write")
    a("--write", default="", metavar="SUMMARY", help="write the figures as `cost_app_g` into this summary JSON "
      "(v5's: experiments/results/v5.json; then `python experiments/reproduce_v5.py --render`)")
    args = ap.parse_args(argv)
    if args.v5:   # v5's settings as defaults, then the command line again (its explicit flags win)
        ap.set_defaults(**v5_settings(json.loads(Path(args.summary).read_text())))
        args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def v5_settings(summary):
    """bench_step's defaults for v5: its start, its RL settings, the learning rate its budget stage chose, its toy's
    eta; the data: the toy rendered again in --work (v5_data)."""
    rl, toy = summary["settings"]["rl"], summary["settings"]["toy"]
    return {"model": str(ROOT / "experiments" / "results" / "v5-start"), "work": str(ROOT / "runs" / "bench_step_v5"),
            "lr": summary["budget"]["lr"], "eta": toy["eta"], "unanswerable_below": rl["unanswerable_below"],
            **{k: rl[k] for k in RL_FLAGS}}


def v5_data(summary, work):
    """v5's toy benchmark (train.py's demo benchmark at v5's toy settings) rendered in WORK/v5-synthetic, checked
    against the hash its summary records; returns its train.json."""
    toy, synth = summary["settings"]["toy"], Path(work) / "v5-synthetic"
    if not (synth / "train.json").is_file():
        cfg = SimpleNamespace(demo_clips=toy["demo_clips"], demo_families=toy["demo_families"],
                              demo_turn=toy["demo_turn"], frames=summary["settings"]["rl"]["frames"])
        print(f"rendering v5's toy benchmark ({toy['demo_clips']} clips) in {synth}", flush=True)
        synthetic.make_synthetic(synth, **runs_mod.demo_benchmark(cfg))
    if synthetic.questions_hash(synth) != summary["start"]["data"]:   # (the data's hash, as v5 recorded it)
        raise SystemExit(f"{synth} is not the benchmark {V5_SUMMARY.name} records (remove it and run again)")
    return str(synth / "train.json")


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
                       eta=args.eta, fill_rounds=args.fill_rounds)
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    Path(cfg.out, "judge_cache.sqlite").unlink(missing_ok=True)  # every verdict is computed, none cached
    model, processor = policy.load_policy(args.model, device="cpu")
    ref = policy.frozen_copy(policy.load_policy(args.model, device="cpu")[0])
    rl = train.build_rl(cfg, 0, 1, torch.device("cpu"), samples, clips, model, processor, ref)
    spec_rng = np.random.default_rng([cfg.seed, 0, 0xC0DE])  # train.py's stream: the same specs in every mode
    return rl, spec_rng


def predicted_ratio(rho, rollout, judge, alignment, backward):
    """App. G Eq. 15 (Prop. 1), C_ROVA / C_naive = (2G C_fwd + C_judge + 2 rho C_API + 1.5 rho G C_fwd) /
    (2G C_fwd + 2 C_API + 1.5 G C_fwd), from measured costs of a step of N samples: `rollout` = N 2G C_fwd (dual's
    two branches), `alignment` = N 2 C_API (dual's alignment reward), `backward` = N 1.5 G C_fwd (dual's Eq. 7-8),
    `judge` = N C_judge (ROVA's self-assessment), `rho` the share of ROVA's samples that it trains. Perturbation and
    the amortised re-evaluation are left out, as Eq. 15 leaves them (Eq. 16-18)."""
    return (rollout + judge + rho * (alignment + backward)) / (rollout + alignment + backward)


def predicted(modes):
    """Eq. 15's ratio from one run's measured per-step components: dual's rollout, alignment reward and backward,
    ROVA's self-assessment, ROVA's trained share."""
    d, r = modes["dual"]["components"], modes["rova"]
    return predicted_ratio(r["trained_share"], d["rollout"], r["components"]["self_assessment"],
                           d["alignment_reward"], d["backward"])


def run_once(args, samples, clips, work, seed):
    """One interleaved run of the three modes, each from a fresh copy of --model, at `seed`: per mode, its mean
    step, components, rho and trained share over the timed steps."""
    torch.manual_seed(seed)
    args = SimpleNamespace(**{**vars(args), "seed": seed})
    modes = {m: make_mode(args, m, samples, clips, work / f"seed{seed}") for m in MODES}
    secs = {m: [] for m in MODES}
    comp = {m: {c: 0.0 for c in COMPONENTS} for m in MODES}
    counts = {m: {"samples": 0, "selected": 0, "trained": 0, "promoted_trained": 0} for m in MODES}
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
            for c in counts[m]:   # (records.decisions: samples and selected are the fresh ones)
                counts[m][c] += rec.get(c, 0)
        print(f"seed {seed}: step {t + 1}/{args.warmup + args.steps}" + (" (warm-up)" if t < args.warmup else ""),
              flush=True)
    out = {}
    for m in MODES:
        n, c = len(secs[m]), counts[m]
        mean = statistics.fmean(secs[m])
        parts = {x: comp[m][x] / n for x in COMPONENTS}
        parts["other"] = mean - sum(parts.values())
        seen = c["samples"] + c["promoted_trained"]
        out[m] = {"sec_per_step": mean, "sec_std": statistics.stdev(secs[m]) if n > 1 else 0.0,
                  "components": parts, "share": {x: v / mean for x, v in parts.items()},
                  "rho": c["selected"] / c["samples"] if c["samples"] else None,
                  "trained_share": c["trained"] / seen if seen else None,
                  "samples_per_step": seen / n, "trained_per_step": c["trained"] / n}
    return out


def spread(values):
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "sd": statistics.stdev(values) if len(values) > 1 else 0.0}


def run(args):
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_step_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.v5 and not args.data:
        args.data = v5_data(json.loads(Path(args.summary).read_text()), work)
    if not args.model or not args.data:
        args.model, args.data = smoke_assets(work)
    samples, missing = data.load_video_r1(args.data)
    if missing:
        print(f"note: {len(missing)} videos of {args.data} are missing; their samples are left out")
    cfg0 = train.Config(frames=args.frames, max_pixels=args.max_pixels, video_cache=len(samples) + 1)
    clips = clips_mod.Clips(cfg0, [], len(samples))
    for s in samples:  # decode everything before timing
        clips.get(s)
    repeats = [run_once(args, samples, clips, work, args.seed + r) for r in range(args.repeats)]
    out = {"config": {k: v for k, v in vars(args).items() if k != "argv"}, "modes": {}, "repeats": []}
    for m in MODES:   # means over repeats (the components and "other" still add up to the mean step)
        rs = [rep[m] for rep in repeats]
        out["modes"][m] = {"sec_per_step": statistics.fmean(r["sec_per_step"] for r in rs),
                           "sec_std": statistics.fmean(r["sec_std"] for r in rs),
                           "components": {c: statistics.fmean(r["components"][c] for r in rs)
                                          for c in rs[0]["components"]}}
        mean = out["modes"][m]["sec_per_step"]
        out["modes"][m]["share"] = {c: v / mean for c, v in out["modes"][m]["components"].items()}
        for key in ("rho", "trained_share", "samples_per_step", "trained_per_step"):
            vals = [r[key] for r in rs if r[key] is not None]
            out["modes"][m][key] = statistics.fmean(vals) if vals else None
    for seed, rep in zip(range(args.seed, args.seed + args.repeats), repeats):
        out["repeats"].append({"seed": seed, "modes": rep,
                               "rova_over_grpo": rep["rova"]["sec_per_step"] / rep["grpo"]["sec_per_step"],
                               "rova_over_dual": rep["rova"]["sec_per_step"] / rep["dual"]["sec_per_step"],
                               "predicted_ratio": predicted(rep)
                               if rep["rova"]["trained_share"] is not None else None})
    out["rova_over_grpo"] = out["modes"]["rova"]["sec_per_step"] / out["modes"]["grpo"]["sec_per_step"]
    out["rova_over_dual"] = out["modes"]["rova"]["sec_per_step"] / out["modes"]["dual"]["sec_per_step"]
    out["predicted_ratio"] = predicted(out["modes"]) if out["modes"]["rova"]["trained_share"] is not None else None
    out["spread"] = {k: spread([r[k] for r in out["repeats"] if r[k] is not None])
                     for k in ("rova_over_dual", "rova_over_grpo", "predicted_ratio")
                     if any(r[k] is not None for r in out["repeats"])}
    rhos = [r["modes"]["rova"]["rho"] for r in out["repeats"] if r["modes"]["rova"]["rho"] is not None]
    if rhos:
        out["spread"]["rho"] = spread(rhos)
    return out


def _pm(x, lo, hi, digits=3):
    return f"{x:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def report(out):
    m, reps = out["modes"], out["repeats"]

    def rng(mode, get):
        vals = [get(r["modes"][mode]) for r in reps]
        vals = [v for v in vals if v is not None]
        return (min(vals), max(vals)) if vals else (float("nan"), float("nan"))
    lines = [f"Per step (mean over {len(reps)} repeat(s) of the interleaved run; min-max over repeats), "
             "ratios to naive dual-branch (Table 13):",
             f"  {'mode':<6} {'s/step':>24} {'x dual':>7} {'rho':>5} {'trained':>8} {'rolled out':>11}   paper s/step"]
    for mode in MODES:
        r = m[mode]
        lo, hi = rng(mode, lambda x: x["sec_per_step"])
        rho = "    -" if r["rho"] is None else f"{r['rho']:5.2f}"
        lines.append(f"  {mode:<6} {_pm(r['sec_per_step'], lo, hi):>24} "
                     f"{r['sec_per_step'] / m['dual']['sec_per_step']:7.2f} {rho} {r['trained_per_step']:8.2f} "
                     f"{r['samples_per_step']:11.2f}   {PAPER_TABLE13[mode]:.0f}")
    lines.append("Seconds per step by component (Table 14's components; min-max over repeats):")
    lines.append(f"  {'component':<20}" + "".join(f"{x:>22}" for x in MODES))
    for c in COMPONENTS + ("other",):
        lines.append(f"  {c:<20}" + "".join(f"{_pm(m[x]['components'][c], *rng(x, lambda r: r['components'][c])):>22}"
                                            for x in MODES))
    lines.append("Component shares of a step, % (Table 14 is ROVA's):")
    lines.append(f"  {'component':<20}" + "".join(f"{x:>8}" for x in MODES) + f"{'paper':>8}")
    for c in COMPONENTS + ("other",):
        lines.append(f"  {c:<20}" + "".join(f"{100 * m[x]['share'][c]:8.1f}" for x in MODES)
                     + (f"{PAPER_TABLE14[c]:8.1f}" if c in PAPER_TABLE14 else f"{'':>8}"))
    sp = out["spread"]
    for key in ("rova_over_dual", "rova_over_grpo", "predicted_ratio"):
        if key in sp:
            lines.append(f"{key}: {_pm(sp[key]['mean'], sp[key]['min'], sp[key]['max'])} over repeats"
                         + (" (Eq. 15 from the measured rho and components)" if key == "predicted_ratio" else ""))
    pred = out["predicted_ratio"]
    lines.append(f"rova_over_grpo={out['rova_over_grpo']:.3f} rova_over_dual={out['rova_over_dual']:.3f} "
                 f"predicted_ratio={'-' if pred is None else f'{pred:.3f}'}")
    return "\n".join(lines)


def cost_app_g(out, args):
    """v5.json's `cost_app_g`: Table 13 as App. G defines it (fill_rounds 0), with the command that measured it."""
    m = out["modes"]
    return {"rova_over_dual": out["rova_over_dual"], "rova_over_grpo": out["rova_over_grpo"],
            "rho": m["rova"]["rho"], "trained_share": m["rova"]["trained_share"],
            "predicted_ratio": out["predicted_ratio"],
            "components": {mode: m[mode]["components"] for mode in MODES},
            "sec_per_step": {mode: m[mode]["sec_per_step"] for mode in MODES},
            "samples_per_step": {mode: m[mode]["samples_per_step"] for mode in MODES},
            "trained_per_step": {mode: m[mode]["trained_per_step"] for mode in MODES},
            "repeats": len(out["repeats"]), "steps": args.steps, "warmup": args.warmup,
            "fill_rounds": args.fill_rounds, "spread": out["spread"],
            "per_repeat": [{k: r[k] for k in ("seed", "rova_over_dual", "rova_over_grpo", "predicted_ratio")}
                           | {"rho": r["modes"]["rova"]["rho"]} for r in out["repeats"]],
            "command": " ".join(["python benchmarks/bench_step.py", *args.argv]),
            "date": time.strftime("%Y-%m-%d"), "commit": hub.versions()["git_commit"], "cpus": os.cpu_count()}


def write_cost(path, entry):
    """`cost_app_g` into the summary at `path`, the rest of it as it was (written as experiments/reproduce_v5.py
    writes it: indented by 1, whole or not at all)."""
    summary = json.loads(Path(path).read_text())
    summary["cost_app_g"] = entry
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(path)


def main(argv=None):
    args = parse_args(argv)
    out = run(args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.write:
        write_cost(args.write, cost_app_g(out, args))
        print(f"cost_app_g written into {args.write}; render it: python experiments/reproduce_v5.py --render")
    print(report(out))


if __name__ == "__main__":
    main()
