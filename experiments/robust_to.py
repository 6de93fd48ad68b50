"""Robust-TO against robust training at CPU scale (Robust-TO's comparison under its five corruptions, on
the checkpoints of experiments/reproduce.py): the direct models (the SFT checkpoint, standard GRPO and
ROVA from it) and Robust-TO's orchestrated agent around the same SFT checkpoint, evaluated on the same
corrupted videos (`python -m extensions.robust_to.eval --protocol robust-to --assign all`), plus how well
reliability.py's scores rank the corruption of each frame.

    python experiments/reproduce.py              # first: the SFT checkpoint and the direct runs (runs/reproduce)
    python experiments/robust_to.py              # then this: ~45 min on 2 cores at --rl-steps 100 (longer at 300)
    python experiments/robust_to.py --smoke --from /tmp/r --out /tmp/rt --results /tmp/rt/RESULTS.md

Stages, each one of the project's own commands run as a subprocess, skipped when its output exists
(a killed training run resumes from its last checkpoint, an evaluation from its sample store):

1. Reliability ranking: `benchmarks/bench_reliability.py` (Spearman rho of each frame's 1 - reliability
   against the true corruption intensity eta, per subtype).
2. Direct models: the evaluation of FROM/sft/final and of FROM/runs/{grpo,rova}-sS/final (reproduce.py's
   100-step runs) under the robust-to protocol.
3. The agent around the SFT checkpoint, untrained for its prompts, and the agent with the three tier
   rules applied by code (`--agent-synthesis rules`, orchestrate.tiered_answer): what the tools and the
   tiers give without a learned synthesiser.
4. The agent's warm-up (`python -m extensions.robust_to.train --rl-steps 0`, agent_sft_step: the one-sub-query
   plan and the synthesis that cites the evidence and names the option it supports), then
   confidence-cost GRPO on Robust-TO's corruptions (`--mode grpo-aug`, as many steps as the direct
   runs) per seed; each evaluated with the agent's own synthesis budget (`--synthesis-tokens`).

The tables go to OUT/results.md and between `<!-- robust-to:begin -->` and `<!-- robust-to:end -->`
in --results (docs/RESULTS.md); text outside the markers is kept.
"""
import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments"), str(ROOT / "benchmarks")]
import reproduce  # noqa: E402  (Stages, the table helpers, the marked-section writer)
from reproduce import fmt, latest_results, mean_sd, pct  # noqa: E402

import perturb  # noqa: E402
from extensions.robust_to import eval as rt_eval  # noqa: E402  (ROBUST_TO_COLUMNS; registers the corruptions)

COLUMNS = rt_eval.ROBUST_TO_COLUMNS
BEGIN, END = "<!-- robust-to:begin -->", "<!-- robust-to:end -->"
# The agent's training, on reproduce.py's RL settings (train.DEMO's, and its steps) so it gets what the direct
# runs got.
AGENT_FLAGS = dict(reproduce.RL_FLAGS, rl_steps=reproduce.VLM["rl_steps"], synthesis_tokens=160)
for _k in ("reeval_period", "unanswerable_below"):  # ROVA's memory and curriculum flags: not the agent's
    AGENT_FLAGS.pop(_k)
# The warm-up: train.DEMO's SFT epochs and batch, at a third of its learning rate (it starts from a trained
# checkpoint, not from scratch).
WARMUP_FLAGS = dict(sft_epochs=10, sft_batch_size=16, sft_lr=1e-3)
SMOKE = dict(rl_steps=2, batch_size=2, group_size=2, max_new_tokens=8, synthesis_tokens=8, save_every=1,
             sft_epochs=1, sft_batch_size=2, clips=2, eval_limit=3, seeds="0")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    a = ap.add_argument
    a("--from", dest="start", default="runs/reproduce", help="experiments/reproduce.py's OUT (sft/, runs/)")
    a("--out", default="runs/robust-to", help="working folder")
    a("--results", default=str(ROOT / "docs" / "RESULTS.md"), help="markdown file whose marked section is rewritten")
    a("--seeds", default="0,1,2", help="comma list of RL seeds (the direct runs of these seeds must exist)")
    a("--direct", default="grpo,rova", help="reproduce.py modes evaluated as the direct models")
    a("--rl-steps", type=int, default=AGENT_FLAGS["rl_steps"])
    a("--sft-epochs", type=float, default=WARMUP_FLAGS["sft_epochs"], help="epochs of the agent's warm-up")
    a("--synthesis-tokens", type=int, default=AGENT_FLAGS["synthesis_tokens"])
    a("--clips", type=int, default=12, help="clips of bench_reliability.py")
    a("--eval-limit", type=int, default=0, help="questions evaluated (0: all)")
    a("--smoke", action="store_true", help="tiny settings: checks the pipeline, measures nothing")
    args = ap.parse_args(argv)
    args.command = "python experiments/robust_to.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])
                                                        if (argv if argv is not None else sys.argv[1:]) else "")
    args.agent = dict(AGENT_FLAGS, rl_steps=args.rl_steps, synthesis_tokens=args.synthesis_tokens)
    args.warmup = dict(WARMUP_FLAGS, sft_epochs=args.sft_epochs)
    if args.smoke:
        for k, v in SMOKE.items():
            if k in args.agent:
                args.agent[k] = v
            elif k in args.warmup:
                args.warmup[k] = v
            else:
                setattr(args, k, v)
    args.seeds = [int(s) for s in str(args.seeds).split(",") if s.strip()]
    args.direct = [m for m in args.direct.split(",") if m]
    start = Path(args.start)
    needed = [start / "sft" / "final", start / "sft" / "synthetic" / "train.json"]
    needed += [start / "runs" / f"{m}-s{s}" / "final" for m in args.direct for s in args.seeds]
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        ap.error(f"--from {start}: missing {', '.join(missing)}; run experiments/reproduce.py --out {start} first")
    return args


def main(argv=None):
    args = parse_args(argv)
    out, start = Path(args.out).resolve(), Path(args.start).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    py, st = sys.executable, reproduce.Stages(out)
    sft, synth = start / "sft" / "final", start / "sft" / "synthetic"

    rel_json = out / "bench_reliability.json"
    st.run("reliability", [py, "benchmarks/bench_reliability.py", "--clips", str(args.clips), "--json", str(rel_json)],
           rel_json.is_file)

    def evaluate(name, model, *extra):
        cmd = [py, "-m", "extensions.robust_to.eval", "--model", str(model), "--model-name", name,
               "--benchmark", f"synthetic={synth}", "--protocol", "robust-to", "--assign", "all", "--judge", "none",
               "--out", str(out / "eval"), *extra]
        if args.eval_limit:
            cmd += ["--limit", str(args.eval_limit)]
        st.run(f"eval-{name}", cmd, lambda: latest_results(out / "eval" / name) is not None)

    evaluate("sft-direct", sft)
    for mode in args.direct:
        for seed in args.seeds:
            evaluate(f"{mode}-s{seed}-direct", start / "runs" / f"{mode}-s{seed}" / "final")
    evaluate("sft-agent", f"robust-to:{sft}", "--synthesis-tokens", str(args.agent["synthesis_tokens"]))
    evaluate("sft-agent-rules", f"robust-to:{sft}", "--agent-synthesis", "rules")

    warm = out / "agent-sft"
    common = ["--data", str(synth / "train.json"), "--mode", "grpo-aug", "--resume", "auto"]
    trainer = [py, "-m", "extensions.robust_to.train"]
    st.run("agent-warmup", [*trainer, "--model", str(sft), "--out", str(warm), *common, "--seed", "0",
                            *reproduce.flags(args.warmup), *reproduce.flags(dict(args.agent, rl_steps=0))],
           lambda: (warm / "summary.json").is_file())
    synth_tokens = ["--synthesis-tokens", str(args.agent["synthesis_tokens"])]
    evaluate("agent-warmup", f"robust-to:{warm / 'final'}", *synth_tokens)
    for seed in args.seeds:
        run = out / "runs" / f"agent-s{seed}"
        st.run(f"agent-rl-s{seed}", [*trainer, "--model", str(warm / "final"), "--out", str(run), *common,
                                     "--seed", str(seed), "--sft-epochs", "0", *reproduce.flags(args.agent)],
               lambda run=run: (run / "summary.json").is_file())
        evaluate(f"agent-s{seed}", f"robust-to:{run / 'final'}", *synth_tokens)

    text = render(args, out, st)
    (out / "results.md").write_text(text)
    reproduce.write_marked(Path(args.results), text, BEGIN, END)
    print(f"tables in {out / 'results.md'} and {args.results}")


# ----------------------------------------------------------------------------- tables

def accuracy(res):
    """Per corruption, Avg. (the mean over the five), its drop and Orig. of one results.json."""
    pvr = res["results"]["pvrbench"]
    row = {s: pvr["overall"].get(s) for s, _ in COLUMNS}
    row.update(avg=pvr["accuracy"]["avg"], drop=pvr["accuracy"]["drop"], orig=pvr["accuracy"]["orig"])
    return row


def per_task(res):
    """{task: (clean score, score over the corrupted conditions)} on the synthetic benchmark, as
    eval_pvrbench.py computed them (its results.json's per_task)."""
    pt = res["results"]["sources"]["synthetic"]["per_task"]
    return {t: (pt["clean"].get(t), pt["perturbed"].get(t)) for t in pt["clean"]}


def direct_steps(args, mode):
    """The RL steps of reproduce.py's ``mode`` runs, from their summary.json ("?" when it does not say)."""
    steps = set()
    for seed in args.seeds:
        f = Path(args.start) / "runs" / f"{mode}-s{seed}" / "summary.json"
        steps.add(json.loads(f.read_text()).get("config", {}).get("rl_steps", "?") if f.is_file() else "?")
    return "/".join(map(str, sorted(steps, key=str)))


def render(args, out, st):
    def results(name):
        return latest_results(out / "eval" / name)

    rows = [("direct: SFT checkpoint (start of every run)", ["sft-direct"])]
    rows += [(f"direct: + {m} ({direct_steps(args, m)} steps)", [f"{m}-s{s}-direct" for s in args.seeds])
             for m in args.direct]
    rows += [("agent around the SFT checkpoint, untrained for its prompts", ["sft-agent"]),
             ("agent, tier rules applied by code (tools and tiers alone)", ["sft-agent-rules"]),
             (f"agent after its warm-up ({args.warmup['sft_epochs']:g} epoch(s))", ["agent-warmup"]),
             (f"agent, warm-up + confidence-cost GRPO ({args.agent['rl_steps']} steps)",
              [f"agent-s{s}" for s in args.seeds])]
    first = results("sft-direct")
    L = [f"Measured by `{args.command}` ({time.strftime('%Y-%m-%d')}; seeds {', '.join(map(str, args.seeds))}; "
         f"total wall time {sum(st.timings.values()) / 60:.1f} min over the stages below).", "",
         "### Direct model vs orchestrated agent under Robust-TO's five corruptions", "",
         "`python -m extensions.robust_to.eval --protocol robust-to --assign all` on the synthetic benchmark's "
         "held-out questions: "
         f"each clean and under each corruption ({first['n_samples'] if first else '?'} scored samples per model); "
         "task-mean accuracy (MRA for counting); Avg. is the mean over the five corruptions, drop its relative "
         "loss against Orig. (clean); mean ± standard deviation over seeds where there are several.", "",
         "| model | " + " | ".join(lbl for _, lbl in COLUMNS) + " | Avg. | drop | Orig. |",
         "|---|" + "---|" * (len(COLUMNS) + 3)]
    for label, names in rows:
        got = [accuracy(r) for r in map(results, names) if r]
        if not got:
            continue
        sd = len(got) > 1

        def cell(key, digits=2, got=got, sd=sd):
            m, s = mean_sd([g[key] for g in got])
            return fmt(m, s if sd else None, digits)

        drop_m, drop_s = mean_sd([g["drop"] for g in got])
        L.append(f"| {label} | " + " | ".join(cell(s) for s, _ in COLUMNS)
                 + f" | {cell('avg')} | {pct(drop_m, drop_s if sd else None)} | {cell('orig')} |")

    tasks = {label: [per_task(r) for r in map(results, names) if r] for label, names in rows}
    names = sorted({t for ts in tasks.values() for d in ts for t in d})
    if names:
        L += ["", "Per task, clean / mean over the five corruptions (seed means):", "",
              "| model | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for label, ts in tasks.items():
            if not any(ts):
                continue
            cells = []
            for t in names:
                pairs = [d[t] for d in ts if t in d]
                cells.append(f"{fmt(mean_sd([p[0] for p in pairs])[0], digits=2)} / "
                             f"{fmt(mean_sd([p[1] for p in pairs])[0], digits=2)}")
            L.append(f"| {label} | " + " | ".join(cells) + " |")

    runs = [out / "runs" / f"agent-s{s}" for s in args.seeds]
    dyn = [reproduce.rl_records(run) for run in runs if (run / "log.jsonl").is_file()]
    if dyn:
        keys = (("r_accuracy", "accuracy"), ("r_format", "format"), ("r_reliability", "r^Rel"),
                ("subqueries", "sub-queries"), ("evidence_high", "HIGH evidence"), ("sec_step", "s/step"))
        L += ["", "Agent GRPO, from each run's log.jsonl (first quarter of the steps → last quarter; seed means):",
              "", "| " + " | ".join(lbl for _, lbl in keys) + " |", "|" + "---|" * len(keys)]
        ends = {k: [reproduce.first_last(recs, k) for recs in dyn] for k, _ in keys}
        L.append("| " + " | ".join(
            f"{fmt(mean_sd([f for f, _ in ends[k]])[0], digits=2)} → "
            f"{fmt(mean_sd([l for _, l in ends[k]])[0], digits=2)}" for k, _ in keys) + " |")

    rel_path = out / "bench_reliability.json"
    if rel_path.is_file():
        rel = json.loads(rel_path.read_text())
        order = list(perturb.PROTOCOLS["robust-to"]) + [s for s in rel["subtypes"]
                                                       if s not in perturb.PROTOCOLS["robust-to"]]
        L += ["", "### How well the reliability scores rank corrupted frames", "",
              f"`benchmarks/bench_reliability.py --clips {rel['clips']}`: {rel['clips']} synthetic clips, each subtype "
              f"at eta {', '.join(f'{e:g}' for e in rel['etas'])}; Spearman rho between eta and each frame's score, "
              "all frames pooled / median per clip; Robust-TO's five first.", "",
              "| corruption | axis | rho (axis) | rho (1 - reliability) | 1 - reliability by eta |",
              "|---|---|---|---|---|"]
        for s in order:
            r = rel["subtypes"].get(s)
            if not r:
                continue
            ax = r.get("axis")
            axis = (f"{fmt(ax['pooled'], digits=2)} / {fmt(ax['per_clip_median'], digits=2)}" if isinstance(ax, dict)
                    else "–")
            u = r["unrel"]
            L.append(f"| {s} | {(ax and reliability_axis(s)) or '–'} | {axis} | {fmt(u['pooled'], digits=2)} / "
                     f"{fmt(u['per_clip_median'], digits=2)} | {' '.join(f'{v:.2f}' for v in u['mean_by_eta'])} |")
        L += ["", f"Mean rho of 1 - reliability over Robust-TO's five: `robust_to_mean_rho="
                  f"{rel['robust_to_mean_rho']:.3f}`."]

    L += st.report()
    return "\n".join(L) + "\n"


def reliability_axis(subtype):
    import bench_reliability
    return bench_reliability.AXIS.get(subtype)


if __name__ == "__main__":
    main()
