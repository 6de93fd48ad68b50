"""What each training signal can teach a given policy: the rollout groups of RL's first steps, measured
once, without training (the "find out why" of the CPU-scale reproduction, docs/RESULTS.md).

    python experiments/diagnose.py --model runs/reproduce/sft/final --data runs/reproduce/sft/synthetic/train.json

For --samples training questions (seeded order; one corruption spec each from the dynamic protocol, as
train.py draws them), G rollouts on the clean and G on the corrupted video at the training temperature,
then per group:

- Perturbation strength: rollout accuracy clean vs corrupted, per category (Table 8). GRPO's advantage
  (Eq. 8) is zero for a group whose rewards are all equal, so the share of corrupted groups that are all
  wrong (no signal: too strong for this policy), all right (no signal: too weak) or mixed (signal).
- Alignment reward (Alg. 1): the share of groups where r^A varies at all, of accuracy-constant groups
  where it varies (signal that accuracy alone does not give), the within-group correlation of r^A with
  r^Acc (1 = r^A only repeats the accuracy reward), and the correlation of the advantages with and
  without r^A (1 = r^A does not change the update's direction).
- Curriculum (Eq. 3, Sec. 3.2, train.py's thresholds): the share trained / deferred / discarded, and of
  the deferred the share whose corrupted group was mixed (GRPO signal the curriculum sets aside); the
  answerability confidence c and its correlation with the corrupted accuracy (is c informative).
"""
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machinery import cli  # noqa: E402,F401 - before torch: the OpenMP wait policy (cli.GOMP_SPINCOUNT)
import numpy as np  # noqa: E402
import torch  # noqa: E402

import buffer  # noqa: E402
from machinery.datasets import answers, data  # noqa: E402
import grpo  # noqa: E402
import judge as judges  # noqa: E402
import perturb  # noqa: E402
from machinery.model import policy  # noqa: E402
import train  # noqa: E402
from machinery import video  # noqa: E402


def parse_args(argv=None):
    ap = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    a = ap.add_argument
    a("--model", required=True, help="policy checkpoint (the state RL starts from)")
    a("--data", required=True, help="Video-R1 JSON of the training questions, or a VSI-Bench-format .jsonl (the "
      "synthetic benchmark's held-out eval.jsonl, its videos in videos/ beside it)")
    a("--samples", type=int, default=96, help="training questions measured")
    a("--seed", type=int, default=0)
    a("--json", default="", help="also write the figures to this JSON file")
    a("--judge", default="local", help="alignment judge (train.py --judge)")
    for name in ("group_size", "max_new_tokens", "frames", "max_pixels", "batch_size"):
        a("--" + name.replace("_", "-"), type=int, default=train.DEMO[name])
    cfg = train.Config()
    a("--eta", type=perturb.eta_arg, default=cfg.eta)
    for name in ("tau", "a_min", "a_max", "alpha_r", "alpha_a", "temperature"):
        a("--" + name.replace("_", "-"), type=float, default=getattr(cfg, name))
    a("--unanswerable-below", type=float, default=train.DEMO["unanswerable_below"])
    return ap.parse_args(argv)


def within_corr(xs, ys):
    """Pearson correlation of x and y after removing each group's mean (None without variation)."""
    dx = np.concatenate([np.asarray(x, float) - np.mean(x) for x in xs])
    dy = np.concatenate([np.asarray(y, float) - np.mean(y) for y in ys])
    den = np.sqrt((dx ** 2).sum() * (dy ** 2).sum())
    return float((dx * dy).sum() / den) if den > 0 else None


def corr(x, y):
    x, y = np.asarray(x, float), np.asarray(y, float)
    return float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else None


def varies(v):
    return max(v) - min(v) > 1e-9


def share(flags):
    flags = list(flags)
    return sum(flags) / len(flags) if flags else None


def measure(args):
    torch.manual_seed(args.seed)
    model, processor = policy.load_policy(args.model, device="cpu")
    model.eval()
    if args.data.endswith(".jsonl"):
        samples, _ = data.load_vsibench(args.data, Path(args.data).parent / "videos")
    else:
        samples, _ = data.load_video_r1(args.data)
    order = np.random.default_rng(args.seed).permutation(len(samples))[:args.samples]
    spec_rng = np.random.default_rng([args.seed, 0, 0xC0DE])
    judge = judges.make_judge(args.judge)
    G = args.group_size
    gen = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    groups = []
    for start in range(0, len(order), args.batch_size):
        batch = []
        for i in order[start:start + args.batch_size]:
            s = samples[int(i)]
            frames, _, _ = video.read_frames(s.video, num_frames=args.frames, max_pixels=args.max_pixels)
            spec = perturb.sample_spec(spec_rng, eta=args.eta)
            batch.append((s, spec, frames, perturb.apply(frames, spec)))
        prompts = [data.build_messages(s) for s, *_ in batch]
        clean = policy.rollout(model, processor, policy.make_inputs(processor, prompts, [b[2] for b in batch]), n=G,
                               **gen)
        pert = policy.rollout(model, processor, policy.make_inputs(processor, prompts, [b[3] for b in batch]), n=G,
                              **gen)
        questions = buffer.answerability_messages([data.question_text(b[0]) for b in batch])
        asked = policy.make_inputs(processor, questions, [b[3] for b in batch])
        conf = buffer.answerability(model, asked, policy.tokenizer_of(processor))
        for k, (s, spec, _, _) in enumerate(batch):
            ct, pt = clean.texts[k * G:(k + 1) * G], pert.texts[k * G:(k + 1) * G]
            acc_c = [grpo.accuracy_reward(t, s.answer, s.problem_type, s.source) for t in ct]
            rew, comp = grpo.total_reward(pt, s.answer, s.problem_type, reference_texts=ct, judge=judge,
                                          alpha_r=args.alpha_r, alpha_a=args.alpha_a, source=s.source)
            base = [f + a for f, a in zip(comp["format"], comp["accuracy"])]
            a = buffer.self_assess(comp["accuracy"], conf[k], answers.each(pt, s), answers.each(ct, s),
                                   tau=args.tau, a_min=args.a_min, a_max=args.a_max,
                                   unanswerable_below=args.unanswerable_below)
            groups.append(dict(category=perturb.CATEGORY_OF[spec.subtype], subtype=spec.subtype, acc_clean=acc_c,
                               acc_pert=comp["accuracy"], r_align=comp["alignment"], base=base, total=rew,
                               c=conf[k], decision=a.decision,
                               verdict=buffer.self_assess_verdict(conf[k], tau=args.tau).decision))
        print(f"{len(groups)}/{len(order)} samples", flush=True)
    return groups


def summarise(groups, args):
    out = {"config": vars(args), "n": len(groups)}
    cats = {}
    for cat in sorted({g["category"] for g in groups}):
        gs = [g for g in groups if g["category"] == cat]
        cats[cat] = {"n": len(gs), "acc_clean": statistics.fmean(np.mean(g["acc_clean"]) for g in gs),
                     "acc_pert": statistics.fmean(np.mean(g["acc_pert"]) for g in gs),
                     "all_wrong": share(max(g["acc_pert"]) == 0 for g in gs),
                     "mixed": share(varies(g["acc_pert"]) for g in gs),
                     "all_right": share(min(g["acc_pert"]) == 1 for g in gs)}
    out["categories"] = cats
    out["acc_clean"] = statistics.fmean(np.mean(g["acc_clean"]) for g in groups)
    out["acc_pert"] = statistics.fmean(np.mean(g["acc_pert"]) for g in groups)
    out["pert_all_wrong"] = share(max(g["acc_pert"]) == 0 for g in groups)
    out["pert_mixed"] = share(varies(g["acc_pert"]) for g in groups)
    out["pert_all_right"] = share(min(g["acc_pert"]) == 1 for g in groups)
    out["clean_mixed"] = share(varies(g["acc_clean"]) for g in groups)
    const = [g for g in groups if not varies(g["acc_pert"])]
    out["align_varies"] = share(varies(g["r_align"]) for g in groups)
    out["align_varies_when_acc_constant"] = share(varies(g["r_align"]) for g in const)
    out["align_mean"] = statistics.fmean(np.mean(g["r_align"]) for g in groups)
    out["corr_align_acc_within"] = within_corr([g["r_align"] for g in groups], [g["acc_pert"] for g in groups])
    adv_base = [grpo.group_advantages([g["base"]]).view(-1).tolist() for g in groups]
    adv_full = [grpo.group_advantages([g["total"]]).view(-1).tolist() for g in groups]
    out["corr_adv_with_without_align"] = corr(sum(adv_full, []), sum(adv_base, []))
    decisions = [g["decision"] for g in groups]
    out["curriculum"] = {d: decisions.count(d) / len(decisions) for d in ("train", "defer", "discard")}
    deferred = [g for g in groups if g["decision"] == "defer"]
    out["deferred_mixed"] = share(varies(g["acc_pert"]) for g in deferred)
    out["deferred_any_right"] = share(max(g["acc_pert"]) > 0 for g in deferred)
    verdicts = [g["verdict"] for g in groups]   # App. C.2's rule (train.py --set assess=verdict), same groups
    out["curriculum_verdict"] = {d: verdicts.count(d) / len(verdicts) for d in ("train", "defer", "discard")}
    for d in ("train", "defer", "discard"):
        mine = [np.mean(g["acc_pert"]) for g in groups if g["verdict"] == d]
        out["curriculum_verdict"][f"acc_pert_{d}"] = statistics.fmean(mine) if mine else None
    cs = [g["c"] for g in groups]
    out["c_mean"], out["c_min"], out["c_max"] = statistics.fmean(cs), min(cs), max(cs)
    out["corr_c_acc_pert"] = corr(cs, [np.mean(g["acc_pert"]) for g in groups])
    return out


def report(d):
    f = lambda v, p=2: "–" if v is None else f"{v:.{p}f}"  # noqa: E731
    lines = [f"{d['n']} training questions, G = {d['config']['group_size']} rollouts per branch "
             f"(temperature {d['config']['temperature']}), one dynamic corruption spec each:",
             f"  rollout accuracy clean {f(d['acc_clean'])}, corrupted {f(d['acc_pert'])}",
             "  category     n  clean  corrupted  all-wrong  mixed  all-right (corrupted groups)"]
    for cat, c in d["categories"].items():
        lines.append(f"  {cat:<10} {c['n']:3d}  {f(c['acc_clean'])}   {f(c['acc_pert'])}       {f(c['all_wrong'])}"
                     f"    {f(c['mixed'])}   {f(c['all_right'])}")
    lines += [f"  corrupted groups with a GRPO signal (mixed accuracy): {f(d['pert_mixed'])} "
              f"(all wrong {f(d['pert_all_wrong'])}, all right {f(d['pert_all_right'])}); clean groups mixed: "
              f"{f(d['clean_mixed'])}",
              f"  alignment reward: mean {f(d['align_mean'])}, varies within {f(d['align_varies'])} of groups and "
              f"within {f(d['align_varies_when_acc_constant'])} of the accuracy-constant ones; within-group "
              f"corr(r^A, r^Acc) = {f(d['corr_align_acc_within'])}; corr(advantages with r^A, without) = "
              f"{f(d['corr_adv_with_without_align'])}",
              f"  curriculum (accuracy rule): train {f(d['curriculum']['train'])}, defer "
              f"{f(d['curriculum']['defer'])}, discard {f(d['curriculum']['discard'])}; of the deferred, mixed "
              f"{f(d['deferred_mixed'])}, any rollout right {f(d['deferred_any_right'])}"]
    v = d.get("curriculum_verdict")
    if v:
        lines.append(f"  curriculum (verdict rule, App. C.2): train {f(v['train'])} (corrupted accuracy "
                     f"{f(v['acc_pert_train'])}), defer {f(v['defer'])} ({f(v['acc_pert_defer'])}), discard "
                     f"{f(v['discard'])} ({f(v['acc_pert_discard'])})")
    lines.append(f"  answerability c: mean {f(d['c_mean'])} (min {f(d['c_min'])}, max {f(d['c_max'])}), "
                 f"corr(c, corrupted accuracy) = {f(d['corr_c_acc_pert'])}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    d = summarise(measure(args), args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(d, indent=1))
    print(report(d))


if __name__ == "__main__":
    main()
