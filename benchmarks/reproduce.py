"""The paper's claims at CPU scale (Table 2, 3, 13, 14): standard GRPO, GRPO on corrupted clips, naive
dual-branch and ROVA, trained from one SFT checkpoint for the same number of steps over several seeds,
each evaluated on PVRBench (static protocol) of the synthetic benchmark; then the step-cost benchmark.

    python benchmarks/reproduce.py                 # about 45 minutes on a 2-core laptop; writes docs/RESULTS.md
    python benchmarks/reproduce.py --smoke --out /tmp/r --results /tmp/r/RESULTS.md   # a 2-minute check

Every stage is one of the project's own commands (printed, and listed in the results), run as a
subprocess; a stage whose output exists is skipped, and an interrupted training run resumes from its
last checkpoint (--resume auto), an interrupted evaluation from its sample store, so running the same
command again after a kill loses at most one checkpoint interval. Stages:

1. SFT: `python train.py --out OUT/sft --rl-steps 0` (the CPU demo's tiny model, synthetic benchmark and
   SFT warm-up; its final/ is every RL run's start and reference model).
2. RL: `python train.py --model OUT/sft/final --data OUT/sft/synthetic/train.json --sft-epochs 0
   --mode M --seed S ...` for each mode and seed, with the demo's RL settings (100 steps, 4 videos x 8
   rollouts, lr 1e-4, 8 frames of 56x56, re-evaluation every 10 steps).
3. Evaluation: `python eval_pvrbench.py --model RUN/final --benchmark synthetic=OUT/sft/synthetic
   --assign all --judge none` (every held-out question clean and under all 12 subtypes).
4. Cost: `python benchmarks/bench_step.py --model OUT/sft/final ...` (grpo / dual / rova interleaved).
5. Diagnosis: `python benchmarks/diagnose.py --model OUT/sft/final ...` (what each training signal can
   teach the SFT checkpoint: GRPO signal per category, alignment reward, curriculum decisions).

The measured tables go to OUT/results.md and, between the markers `<!-- reproduce:begin -->` and
`<!-- reproduce:end -->`, into --results (docs/RESULTS.md); text outside the markers is kept.

`--policy text` runs the same stages for Embodied-R's pipeline (Embodied-R Sec. 2; ROVA Table 2's
"Embodied-R" and "Embodied-R + ROVA" rows): a tiny text-only LM (`python -m extensions.embodied_r.train`) that reads a
frozen perceiver's text of each clean or corrupted video (`--perceiver`, default cv, perceive.py's
classical-vision stand-in), trained and evaluated from its own SFT checkpoint; perception texts are
shared by every stage through OUT/perception_cache.sqlite. Its tables go between
`<!-- reproduce-text:begin -->` and `<!-- reproduce-text:end -->`; bench-step and diagnose are VLM-only
and skipped.

    python benchmarks/reproduce.py --policy text --modes grpo,rova --out runs/reproduce-text
"""
import argparse
import dataclasses
import glob
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
import train  # noqa: E402  (its modes and the CPU demo's settings)

MODES = ("grpo", "grpo-aug", "dual", "rova")  # train.MODES, in the tables' order
assert set(MODES) == set(train.MODES)
CATEGORIES = (("lighting", "Lig."), ("occlusion", "Occ."), ("camera", "Sha."), ("weather", "Wea."))
BEGIN, END = "<!-- reproduce:begin -->", "<!-- reproduce:end -->"  # --policy text: reproduce-text

# The train.py demo's RL settings (train.DEMO), passed as flags because --model/--data turn the preset off.
RL_FLAGS = {k: train.DEMO[k] for k in ("frames", "max_pixels", "lr", "rl_steps", "batch_size", "group_size",
                                     "max_new_tokens", "reeval_period", "unanswerable_below", "video_cache")}
RL_FLAGS["save_every"] = 25
SMOKE = dict(demo_clips=16, sft_epochs=1.0, rl_steps=2, batch_size=2, group_size=2, max_new_tokens=8, save_every=1,
             reeval_period=2, bench_steps=2, eval_limit=3, diagnose_samples=4, seeds="0")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a = ap.add_argument
    a("--out", default="runs/reproduce", help="working folder (every stage's output)")
    a("--results", default=str(ROOT / "docs" / "RESULTS.md"), help="markdown file whose marked section is rewritten")
    a("--seeds", default="0,1,2", help="comma list of RL seeds")
    a("--modes", default=",".join(MODES), help="comma list of train.py modes")
    a("--rl-steps", type=int, default=RL_FLAGS["rl_steps"])
    a("--demo-clips", type=int, default=480, help="clips of the synthetic benchmark (train.py --demo-clips)")
    a("--sft-epochs", type=float, default=None, help="default: train.py's demo (10)")
    a("--bench-steps", type=int, default=30, help="timed steps per mode of bench_step.py")
    a("--eval-limit", type=int, default=0, help="questions evaluated (0: all)")
    a("--diagnose-samples", type=int, default=96, help="training questions of diagnose.py")
    a("--variant", action="append", default=[], metavar="NAME='MODE FLAGS'",
      help="an extra row: a mode with other train.py flags, e.g. rova-amin0.125='rova --a-min 0.125' (repeatable)")
    a("--policy", default="vlm", choices=["vlm", "text"], help="text: Embodied-R's perception + text LM pipeline "
      "(python -m extensions.embodied_r.train) instead of the VLM")
    a("--perceiver", default="cv", help="--policy text: the perception model (hf:PATH | openai:MODEL | cv)")
    a("--smoke", action="store_true", help="tiny settings: checks the pipeline, measures nothing")
    args = ap.parse_args(argv)
    args.command = " ".join(["python benchmarks/reproduce.py", *(argv if argv is not None else sys.argv[1:])])
    args.rl = dict(RL_FLAGS, rl_steps=args.rl_steps)
    if args.smoke:
        for k, v in SMOKE.items():
            if k in args.rl:
                args.rl[k] = v
            else:
                setattr(args, k, v)
    args.seeds = [int(s) for s in str(args.seeds).split(",") if s.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = set(args.modes) - set(MODES)
    if bad:
        ap.error(f"unknown modes {sorted(bad)}; choose from {', '.join(MODES)}")
    args.rows = {m: (m, []) for m in args.modes}  # table row -> (train.py mode, extra train.py flags)
    for v in args.variant:
        label, _, spec = v.partition("=")
        words = spec.split()
        if not label or not words or words[0] not in MODES or label in args.rows:
            ap.error(f"--variant wants NAME='MODE [train.py flags]' with a new NAME and a mode of {MODES}, got {v!r}")
        args.rows[label] = (words[0], words[1:])
    return args


# train.py's settings without a flag of their own go through --set NAME=VALUE
SETTINGS = {f.name for f in dataclasses.fields(train.Config) if f.metadata.get("group") is None}


def flags(d):
    return [x for k, v in d.items()
            for x in (("--set", f"{k}={v}") if k in SETTINGS else ("--" + k.replace("_", "-"), str(v)))]


class Stages:
    """Runs commands, skipping those whose output exists; keeps wall times across resumed runs."""

    def __init__(self, out):
        self.out = out
        self.timings_path = out / "timings.json"
        self.timings = json.loads(self.timings_path.read_text()) if self.timings_path.is_file() else {}
        self.commands = []

    def run(self, name, cmd, done):
        shown = " ".join(cmd).replace(sys.executable, "python").replace(str(ROOT) + "/", "")
        self.commands.append(shown)
        if done():
            print(f"[{name}] done already, skipped", flush=True)
            return
        print(f"[{name}] {shown}", flush=True)
        t0 = time.time()
        with open(self.out / "logs" / f"{name}.log", "a") as logf:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT).returncode
        if rc != 0 or not done():
            raise SystemExit(f"[{name}] failed (exit {rc}); see {self.out / 'logs' / (name + '.log')}")
        self.timings[name] = self.timings.get(name, 0.0) + time.time() - t0
        self.timings_path.write_text(json.dumps(self.timings, indent=1))
        print(f"[{name}] {self.timings[name]:.0f} s", flush=True)

    def report(self):
        """The "Commands and wall time" section of a results file: each stage's seconds, then the commands."""
        return (["", "### Commands and wall time", "", "| stage | seconds |", "|---|---|"]
                + [f"| {k} | {v:.0f} |" for k, v in self.timings.items()] + ["", "```"] + self.commands + ["```"])


def latest_results(folder):
    found = sorted(glob.glob(str(folder / "*_results.json")))
    return json.loads(Path(found[-1]).read_text()) if found else None


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out).resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    py = sys.executable
    st = Stages(out)
    sft = out / "sft"
    text = args.policy == "text"
    cache = ["--perceiver", args.perceiver, "--perception-cache", str(out / "perception_cache.sqlite")] if text else []
    trainer = [py, "-m", "extensions.embodied_r.train"] if text else [py, "train.py"]  # --policy text: its default
    sft_cmd = [*trainer, "--out", str(sft), "--rl-steps", "0", *flags({"demo_clips": args.demo_clips}),
               "--resume", "auto", *cache] + (["--sft-epochs", str(args.sft_epochs)]
                                                  if args.sft_epochs is not None else [])
    if args.smoke:
        sft_cmd += flags({"eval_limit": 4})
    st.run("sft", sft_cmd, lambda: (sft / "summary.json").is_file())
    synth, start = sft / "synthetic", sft / "final"

    runs = {}
    for seed in args.seeds:
        for row, (mode, extra) in args.rows.items():
            name = f"{row}-s{seed}"
            run = out / "runs" / name
            runs[name] = (row, seed, run)
            st.run(f"rl-{name}", [*trainer, "--model", str(start), "--data", str(synth / "train.json"),
                                  "--out", str(run), "--mode", mode, "--seed", str(seed), "--sft-epochs", "0",
                                  "--resume", "auto", *flags(args.rl), *cache, *extra],
                   lambda run=run: (run / "summary.json").is_file())

    evals = {"sft": start} | {name: run / "final" for name, (_, _, run) in runs.items()}
    for name, model in evals.items():
        evaluator = [py, "-m", "extensions.embodied_r.eval"] if text else [py, "eval_pvrbench.py"]  # --perceiver
        cmd = [*evaluator, "--model", str(model), "--model-name", name, "--benchmark",
               f"synthetic={synth}", "--out", str(out / "eval"), "--judge", "none",
               "--assign", "cycle" if args.smoke else "all", *cache]
        if args.eval_limit:
            cmd += ["--limit", str(args.eval_limit)]
        st.run(f"eval-{name}", cmd, lambda name=name: latest_results(out / "eval" / name) is not None)

    if text:  # bench_step / diagnose measure the VLM's step
        return finish(args, out, runs, st)
    bench_json = out / "bench_step.json"
    bench = [py, "benchmarks/bench_step.py", "--model", str(start), "--data", str(synth / "train.json"),
             "--work", str(out / "bench_step"), "--json", str(bench_json), "--steps", str(args.bench_steps)]
    for k in ("batch_size", "group_size", "max_new_tokens", "frames", "max_pixels", "reeval_period"):
        bench += ["--" + k.replace("_", "-"), str(args.rl[k])]
    if args.smoke:
        bench += ["--warmup", "0"]
    st.run("bench-step", bench, bench_json.is_file)

    diag_json = out / "diagnose.json"
    diag = [py, "benchmarks/diagnose.py", "--model", str(start), "--data", str(synth / "train.json"),
            "--json", str(diag_json), "--samples", str(args.diagnose_samples)]
    for k in ("batch_size", "group_size", "max_new_tokens", "frames", "max_pixels"):
        diag += ["--" + k.replace("_", "-"), str(args.rl[k])]
    st.run("diagnose", diag, diag_json.is_file)
    return finish(args, out, runs, st)


def finish(args, out, runs, st):
    text = render(args, out, runs, st)
    (out / "results.md").write_text(text)
    tag = "reproduce-text" if args.policy == "text" else "reproduce"
    write_marked(Path(args.results), text, f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->")
    print(f"tables in {out / 'results.md'} and {args.results}")


# ----------------------------------------------------------------------------- tables

def mean_sd(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt(m, sd=None, digits=3):
    if m is None:
        return "–"
    return f"{m:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None else "")


def pct(m, sd=None):
    if m is None:
        return "–"
    return f"{100 * m:.0f}%" + (f" ± {100 * sd:.0f}" if sd is not None else "")


def accuracy_row(res):
    acc = res["results"]["pvrbench"]["accuracy"]
    row = {key: acc["categories"].get(key) for key, _ in CATEGORIES}
    row.update(avg=acc["avg"], orig=acc["orig"], drop=acc["drop"])
    return row


def rl_records(run):
    """The RL steps' records of a train.py run's log.jsonl."""
    recs = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in recs if r["stage"] == "rl"]


def first_last(recs, key):
    """The mean of ``key`` over the first and over the last quarter of the steps (at least one step each)."""
    q = max(1, len(recs) // 4)
    return mean_sd([r.get(key) for r in recs[:q]])[0], mean_sd([r.get(key) for r in recs[-q:]])[0]


def training_stats(run):
    recs = rl_records(run)

    def avg(key, part):
        return mean_sd([r.get(key) for r in part])[0]

    (acc_clean_first, acc_clean_last), (acc_pert_first, acc_pert_last) = (first_last(recs, "acc_clean"),
                                                                          first_last(recs, "acc_perturbed"))
    return {"acc_clean_first": acc_clean_first, "acc_clean_last": acc_clean_last,
            "acc_pert_first": acc_pert_first, "acc_pert_last": acc_pert_last,
            "r_alignment": avg("r_alignment", recs), "sim_a": avg("sim_a", recs), "sim_r": avg("sim_r", recs),
            "rho": avg("rho", recs), "defer": avg("defer_rate", recs), "discard": avg("discard_rate", recs),
            "sec_step": avg("sec_step", recs), "steps": len(recs)}


def render(args, out, runs, st):
    L = [f"Measured by `{args.command}` "
         f"({time.strftime('%Y-%m-%d')}; seeds {', '.join(map(str, args.seeds))}; {args.rl['rl_steps']} RL steps per run; "
         f"total wall time {sum(st.timings.values()) / 60:.1f} min over the stages below).", ""]
    sft_res = latest_results(out / "eval" / "sft")
    per_mode = {m: [] for m in args.rows}
    for name, (mode, seed, run) in runs.items():
        res = latest_results(out / "eval" / name)
        per_mode[mode].append((seed, accuracy_row(res), training_stats(run)))
    n_q = sft_res["n_samples"] if sft_res else None
    L += ["### Accuracy under perturbation (Table 2's columns)", "",
          f"PVRBench static protocol on the synthetic benchmark's held-out questions, every question clean and under "
          f"each of the 12 subtypes ({n_q} scored samples per model); task-mean accuracy (MRA for counting) as "
          "eval_pvrbench.py; mean ± standard deviation over seeds.", "",
          "| Model | " + " | ".join(lbl for _, lbl in CATEGORIES) + " | Avg. | drop | Orig. |",
          "|---|" + "---|" * (len(CATEGORIES) + 3)]
    if sft_res:
        r = accuracy_row(sft_res)
        L.append("| SFT checkpoint (start of every run) | " + " | ".join(fmt(r[k]) for k, _ in CATEGORIES)
                 + f" | {fmt(r['avg'])} | {pct(r['drop'])} | {fmt(r['orig'])} |")
    for mode in args.rows:
        rows = [r for _, r, _ in per_mode[mode]]
        cells = [fmt(*mean_sd([r[k] for r in rows])) for k, _ in CATEGORIES]
        L.append(f"| + {mode} | " + " | ".join(cells) + f" | {fmt(*mean_sd([r['avg'] for r in rows]))} | "
                 f"{pct(*mean_sd([r['drop'] for r in rows]))} | {fmt(*mean_sd([r['orig'] for r in rows]))} |")
    subtypes = [k for k in (sft_res or {}).get("results", {}).get("pvrbench", {}).get("overall", {}) if k != "clean"]
    if subtypes:
        L += ["", "Per subtype (mean over seeds; Table 8's order):", "",
              "| Model | " + " | ".join(subtypes) + " |", "|---|" + "---|" * len(subtypes)]
        L.append("| SFT | " + " | ".join(fmt(sft_res["results"]["pvrbench"]["overall"][k], digits=2) for k in subtypes) + " |")
        for mode in args.rows:
            res = [latest_results(out / "eval" / f"{mode}-s{seed}") for seed in args.seeds]
            L.append(f"| {mode} | " + " | ".join(
                fmt(mean_sd([r["results"]["pvrbench"]["overall"].get(k) for r in res])[0], digits=2)
                for k in subtypes) + " |")
    L += ["", "Per seed (Avg. / Orig.):", "", "| mode | " + " | ".join(f"seed {s}" for s in args.seeds) + " |",
          "|---|" + "---|" * len(args.seeds)]
    for mode in args.rows:
        by_seed = {s: r for s, r, _ in per_mode[mode]}
        L.append(f"| {mode} | " + " | ".join(f"{fmt(by_seed[s]['avg'])} / {fmt(by_seed[s]['orig'])}" for s in args.seeds)
                 + " |")
    L += ["", "### Training dynamics (from each run's log.jsonl; means over seeds)", "",
          "Rollout accuracy (mean reward 1[a = g] over the G rollouts, first vs last quarter of the steps), "
          "alignment reward r^A and its answer part Sim^a, the effective training ratio rho and the curriculum's "
          "rates, and the mean step time during training.", "",
          "| mode | clean rollouts | corrupted rollouts | r^A | Sim^a | rho | deferred | discarded | s/step |",
          "|---|---|---|---|---|---|---|---|---|"]
    for mode in args.rows:
        ts = [t for _, _, t in per_mode[mode]]

        def m(key):
            return mean_sd([t[key] for t in ts])[0]

        def arrow(a, b):
            return "–" if m(a) is None else f"{m(a):.2f} → {m(b):.2f}"

        L.append(f"| {mode} | {arrow('acc_clean_first', 'acc_clean_last')} | {arrow('acc_pert_first', 'acc_pert_last')} "
                 f"| {fmt(m('r_alignment'), digits=2)} | {fmt(m('sim_a'), digits=2)} | {fmt(m('rho'), digits=2)} "
                 f"| {fmt(m('defer'), digits=2)} | {fmt(m('discard'), digits=2)} | {fmt(m('sec_step'), digits=2)} |")
    bench_path = out / "bench_step.json"
    if bench_path.is_file():
        import bench_step
        b = json.loads(bench_path.read_text())
        L += ["", "### Cost per step (Table 13, Table 14)", "",
              f"`benchmarks/bench_step.py`: {b['config']['steps']} timed steps per mode after {b['config']['warmup']} "
              "warm-up steps, the three modes interleaved in one process from the SFT checkpoint.", "", "```",
              bench_step.report(b), "```"]
    diag_path = out / "diagnose.json"
    if diag_path.is_file():
        import diagnose
        L += ["", "### What the training signals can teach the SFT checkpoint", "",
              "`benchmarks/diagnose.py`: the rollout groups of RL's first steps on the SFT checkpoint, measured once "
              "without training (train.py's spec stream, judge and curriculum thresholds).", "", "```",
              diagnose.report(json.loads(diag_path.read_text())), "```"]
    L += st.report()
    return "\n".join(L) + "\n"


def write_marked(path, text, begin=BEGIN, end=END):
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.is_file() else f"# Results\n\n{begin}\n{end}\n"
    if begin not in old or end not in old:
        old = old.rstrip() + f"\n\n{begin}\n{end}\n"
    head, rest = old.split(begin, 1)
    tail = rest.split(end, 1)[1]
    path.write_text(f"{head}{begin}\n{text}{end}{tail}")


if __name__ == "__main__":
    main()
