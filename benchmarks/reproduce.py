"""The paper's claims at CPU scale (Table 2, 3, 13, 14), version 3: an RL budget in which standard GRPO
measurably learns, then standard GRPO, GRPO on corrupted clips, naive dual-branch, ROVA with its
self-assessment by the accuracy rule (Sec. 3.2) and by App. C.2's verdict, and the ablations that explain
them, trained from one SFT checkpoint over several seeds, each evaluated on PVRBench (static protocol)
of the synthetic benchmark; then the step-cost benchmark and the per-claim verdicts.

    python benchmarks/reproduce.py                 # about 4.5 hours on a 2-core laptop; writes docs/RESULTS.md
    python benchmarks/reproduce.py --smoke --out /tmp/r --results /tmp/r/RESULTS.md   # a few minutes' check

Every stage is one of the project's own commands (printed, and listed in the results), run as a
subprocess; a stage whose output exists is skipped, and an interrupted training run resumes from its
last checkpoint (--resume auto), an interrupted evaluation from its sample store, so running the same
command again after a kill loses at most one checkpoint interval. Stages:

1. SFT: `python train.py --out OUT/sft --rl-steps 0 --sft-epochs 3` (the CPU demo's tiny model, synthetic
   benchmark, task SFT and answerability warm-up, but 3 epochs of task SFT, not the demo's 10: from the
   converged checkpoint GRPO gains nothing on held-out clips, so a comparison of RL methods would compare
   noise; its final/ is every RL run's start and reference model), evaluated.
2. Budget: `--mode grpo --seed 0` at each of --lrs, evaluated on the held-out questions' clean videos
   (`--subtypes none`). The rule, fixed before any run: the learning rate with the highest held-out clean
   accuracy pooled over the questions (ties: the smaller one); GRPO counts as measurably learning when that
   accuracy's paired gain over the SFT checkpoint exceeds twice its standard error. It is chosen on
   standard GRPO's own objective, the baseline's, so if it favours a mode it favours that one. `--lr X`
   skips the stage.
3. RL: `python train.py --model OUT/sft/final --data OUT/sft/synthetic/train.json --sft-epochs 0
   --mode M --seed S ...` for each row of ROWS and seed, with the demo's RL settings (4 videos x 8 rollouts,
   8 frames of 56x56, re-evaluation every 10 steps) but App. D's 300 steps, at the chosen learning rate,
   weights saved every 10 steps (`snapshot_every`).
4. Evaluation: `python eval_pvrbench.py --model RUN/final --benchmark synthetic=OUT/sft/synthetic
   --assign all --judge none` (every held-out question clean and under all 12 subtypes); then, for the
   single-curriculum-free modes, the snapshot at which they had trained as many completions as `rova`
   had at its end (per seed: equal trained completions, not only equal steps).
5. Cost: `python benchmarks/bench_step.py --model OUT/sft/final ...` (grpo / dual / rova interleaved).
6. Diagnosis: `python benchmarks/diagnose.py --model OUT/sft/final ...` (what each training signal can
   teach the SFT checkpoint: GRPO signal per category, alignment reward, curriculum decisions).

The measured tables and the claims' verdicts go to OUT/results.md and, between the markers
`<!-- reproduce:begin -->` and `<!-- reproduce:end -->`, into --results (docs/RESULTS.md); text outside
the markers is kept.

`--policy text` runs the same stages for Embodied-R's pipeline (Embodied-R Sec. 2; ROVA Table 2's
"Embodied-R" and "Embodied-R + ROVA" rows): a tiny text-only LM (`python -m extensions.embodied_r.train`) that reads a
frozen perceiver's text of each clean or corrupted video (`--perceiver`, default cv, perceive.py's
classical-vision stand-in), trained and evaluated from its own SFT checkpoint; perception texts are
shared by every stage through OUT/perception_cache.sqlite. Its tables go between
`<!-- reproduce-text:begin -->` and `<!-- reproduce-text:end -->`; the budget, equal-completion,
bench-step and diagnose stages are VLM-only and skipped (--lr defaults to the demo's there).

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
# The table's rows: label -> (train.py mode, extra train.py flags). The first five are the comparison; the
# rest are the ablations that explain it (each changes one thing of `rova`).
ROWS = {
    "grpo": ("grpo", []),
    "grpo-aug": ("grpo-aug", []),
    "dual": ("dual", []),
    "rova": ("rova", []),                                                       # Sec. 3.2's accuracy rule (default)
    "rova-verdict": ("rova", ["--set", "assess=verdict"]),                      # App. C.2's YES / NO alone
    "rova+temporal": ("rova", ["--set", "temporal_corruption=1"]),              # Eq. 2 with its frame permutation
    "rova+tgrpo": ("rova", ["--temporal-grpo", "4"]),                           # T-GRPO's G~ = 4 (App. D)
    "rova-alg2-order": ("rova", ["--set", "assess_after_update=true"]),         # Alg. 2 l.5 before l.6
}
COMPARED = ("grpo", "grpo-aug", "dual")   # rho = 1: evaluated again at rova's trained completions
CATEGORIES = (("lighting", "Lig."), ("occlusion", "Occ."), ("camera", "Sha."), ("weather", "Wea."))
BEGIN, END = "<!-- reproduce:begin -->", "<!-- reproduce:end -->"  # --policy text: reproduce-text

# The train.py demo's RL settings (train.DEMO), passed as flags because --model/--data turn the preset off.
RL_FLAGS = {k: train.DEMO[k] for k in ("frames", "max_pixels", "lr", "rl_steps", "batch_size", "group_size",
                                     "max_new_tokens", "reeval_period", "unanswerable_below", "video_cache")}
RL_FLAGS.update(save_every=25, snapshot_every=10)
# The VLM reproduction's start and length: a 3-epoch SFT (the demo's 10 epochs leave GRPO nothing to gain on
# held-out clips: measured, docs/RESULTS.md) and App. D's 300 RL steps (100 are not enough to learn the motion cue).
VLM = dict(sft_epochs=3.0, rl_steps=300)
SMOKE = dict(demo_clips=16, sft_epochs=1.0, rl_steps=2, batch_size=2, group_size=2, max_new_tokens=8, save_every=1,
             snapshot_every=1, reeval_period=2, bench_steps=2, eval_limit=3, diagnose_samples=4, seeds="0",
             lrs="1e-4")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a = ap.add_argument
    a("--out", default="runs/reproduce", help="working folder (every stage's output)")
    a("--results", default=str(ROOT / "docs" / "RESULTS.md"), help="markdown file whose marked section is rewritten")
    a("--seeds", default="0,1,2", help="comma list of RL seeds")
    a("--modes", default=None, help="comma list of rows (ROWS: " + ", ".join(ROWS) + "); default all of them "
      "(--policy text: the four modes)")
    a("--rl-steps", type=int, default=None, help=f"default {VLM['rl_steps']} (App. D; --policy text: the demo's "
      f"{RL_FLAGS['rl_steps']})")
    a("--lrs", default="3e-4,1e-3", help="the budget stage's learning rates (comma list)")
    a("--lr", type=float, default=None, help="RL learning rate: skips the budget stage")
    a("--demo-clips", type=int, default=480, help="clips of the synthetic benchmark (train.py --demo-clips)")
    a("--sft-epochs", type=float, default=None, help=f"default {VLM['sft_epochs']:g}: short of the demo's "
      f"{train.DEMO['sft_epochs']:g}, so that RL has something left to learn (--policy text: the demo's)")
    a("--bench-steps", type=int, default=30, help="timed steps per mode of bench_step.py")
    a("--eval-limit", type=int, default=0, help="questions evaluated (0: all)")
    a("--diagnose-samples", type=int, default=96, help="training questions of diagnose.py")
    a("--variant", action="append", default=[], metavar="NAME='MODE FLAGS'",
      help="an extra row: a mode with other train.py flags, e.g. rova-amin0.125='rova --set assess=accuracy "
           "--a-min 0.125' (repeatable)")
    a("--policy", default="vlm", choices=["vlm", "text"], help="text: Embodied-R's perception + text LM pipeline "
      "(python -m extensions.embodied_r.train) instead of the VLM")
    a("--perceiver", default="cv", help="--policy text: the perception model (hf:PATH | openai:MODEL | cv)")
    a("--smoke", action="store_true", help="tiny settings: checks the pipeline, measures nothing")
    args = ap.parse_args(argv)
    args.command = " ".join(["python benchmarks/reproduce.py", *(argv if argv is not None else sys.argv[1:])])
    if args.policy == "vlm":
        args.sft_epochs = VLM["sft_epochs"] if args.sft_epochs is None else args.sft_epochs
        args.rl_steps = args.rl_steps or VLM["rl_steps"]
    args.rl = dict(RL_FLAGS, rl_steps=args.rl_steps or RL_FLAGS["rl_steps"])
    if args.smoke:
        for k, v in SMOKE.items():
            if k in args.rl:
                args.rl[k] = v
            else:
                setattr(args, k, v)
    if args.policy == "text":
        args.rl.pop("snapshot_every")
        args.lr = args.rl["lr"] if args.lr is None else args.lr
    args.seeds = [int(s) for s in str(args.seeds).split(",") if s.strip()]
    args.lrs = [float(x) for x in str(args.lrs).split(",") if x.strip()]
    args.rows = parse_rows(ap, args)
    return args


def parse_rows(ap, args):
    """--modes (rows of ROWS) and --variant (extra rows) -> {label: (train.py mode, extra flags)}."""
    modes = args.modes or ",".join(MODES if args.policy == "text" else ROWS)
    args.modes = [m.strip() for m in modes.split(",") if m.strip()]
    bad = set(args.modes) - set(ROWS)
    if bad:
        ap.error(f"unknown rows {sorted(bad)}; choose from {', '.join(ROWS)}")
    rows = {m: ROWS[m] for m in args.modes}
    for v in args.variant:
        label, _, spec = v.partition("=")
        words = spec.split()
        if not label or not words or words[0] not in MODES or label in rows:
            ap.error(f"--variant wants NAME='MODE [train.py flags]' with a new NAME and a mode of {MODES}, got {v!r}")
        rows[label] = (words[0], words[1:])
    return rows


# train.py's settings without a flag of their own go through --set NAME=VALUE
SETTINGS = {f.name for f in dataclasses.fields(train.Config) if f.metadata.get("group") is None}


def flags(d):
    return [x for k, v in d.items()
            for x in (("--set", f"{k}={v}") if k in SETTINGS else ("--" + k.replace("_", "-"), str(v)))]


class Stages:
    """Runs commands, skipping those whose output exists; keeps wall times across resumed runs, and across
    reproduce.py processes that share OUT with disjoint --seeds (the second with --lr, so that only the
    first runs the budget stage)."""

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
        seconds = self.timings.get(name, 0.0) + time.time() - t0
        # read again before writing: another reproduce.py on the same OUT (other --seeds) may have added stages
        self.timings = json.loads(self.timings_path.read_text()) if self.timings_path.is_file() else {}
        self.timings[name] = seconds
        tmp = self.timings_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.timings, indent=1))
        tmp.replace(self.timings_path)
        print(f"[{name}] {seconds:.0f} s", flush=True)

    def report(self):
        """The "Commands and wall time" section of a results file: each stage's seconds, then the commands."""
        return (["", "### Commands and wall time", "", "| stage | seconds |", "|---|---|"]
                + [f"| {k} | {v:.0f} |" for k, v in self.timings.items()] + ["", "```"] + self.commands + ["```"])


def latest_results(folder):
    found = sorted(glob.glob(str(folder / "*_results.json")))
    return json.loads(Path(found[-1]).read_text()) if found else None


def clean_scores(folder):
    """Each question's score on its clean video in an evaluation's latest sample log: doc_id -> score."""
    found = sorted(glob.glob(str(folder / "*_samples_*.jsonl")))
    rows = (json.loads(x) for x in Path(found[-1]).read_text().splitlines() if x.strip()) if found else ()
    return {r["doc_id"]: r["score"] for r in rows if r["condition"] == "clean"}


def paired_gain(after, before):
    """Pooled accuracy gain over the questions both evaluations scored (doc_id -> score) and its standard
    error: the sd of the per-question differences / sqrt(n). Paired, because the questions are the same, so it
    is much smaller than either accuracy's own binomial error when few answers change."""
    d = [after[k] - before[k] for k in before if k in after]
    if len(d) < 2:
        return None, None, len(d)
    return statistics.fmean(d), statistics.stdev(d) / len(d) ** 0.5, len(d)


class Reproduction:
    """The stages of one reproduction (see the module's docstring), in order; each knows its output."""

    def __init__(self, args):
        self.args, self.out, self.py = args, Path(args.out).resolve(), sys.executable
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        self.st = Stages(self.out)
        self.text = args.policy == "text"
        self.sft = self.out / "sft"
        self.synth, self.start = self.sft / "synthetic", self.sft / "final"
        self.cache = (["--perceiver", args.perceiver, "--perception-cache", str(self.out / "perception_cache.sqlite")]
                      if self.text else [])
        self.trainer = [self.py, "-m", "extensions.embodied_r.train"] if self.text else [self.py, "train.py"]
        self.runs = {}     # name -> (row, seed, run folder)
        self.budget = {}   # lr -> (run folder, results, held-out clean scores: doc_id -> score)
        self.equal = {}    # name -> (row, seed, step, rova's trained completions)

    def train_sft(self):
        args = self.args
        cmd = [*self.trainer, "--out", str(self.sft), "--rl-steps", "0", *flags({"demo_clips": args.demo_clips}),
               "--resume", "auto", *self.cache] + (["--sft-epochs", str(args.sft_epochs)]
                                                   if args.sft_epochs is not None else [])
        if args.smoke:
            cmd += flags({"eval_limit": 4})
        self.st.run("sft", cmd, lambda: (self.sft / "summary.json").is_file())
        self.evaluate("sft", self.start)

    def train(self, name, mode, seed, run, rl, extra=()):
        self.st.run(f"rl-{name}", [*self.trainer, "--model", str(self.start), "--data", str(self.synth / "train.json"),
                                   "--out", str(run), "--mode", mode, "--seed", str(seed), "--sft-epochs", "0",
                                   "--resume", "auto", *flags(rl), *self.cache, *extra],
                    lambda: (run / "summary.json").is_file())

    def evaluate(self, name, model, subtypes=None):
        args = self.args
        evaluator = [self.py, "-m", "extensions.embodied_r.eval"] if self.text else [self.py, "eval_pvrbench.py"]
        cmd = [*evaluator, "--model", str(model), "--model-name", name, "--benchmark", f"synthetic={self.synth}",
               "--out", str(self.out / "eval"), "--judge", "none",
               "--assign", "cycle" if args.smoke else "all", *self.cache]
        if subtypes:
            cmd += ["--subtypes", subtypes]
        if args.eval_limit:
            cmd += ["--limit", str(args.eval_limit)]
        self.st.run(f"eval-{name}", cmd, lambda: latest_results(self.out / "eval" / name) is not None)
        return latest_results(self.out / "eval" / name)

    def choose_budget(self):
        """Stage 2: standard GRPO (seed 0) at each of --lrs; the highest pooled held-out clean accuracy wins."""
        args = self.args
        if args.lr is not None:
            return args.lr
        for lr in args.lrs:
            run = self.out / "runs" / f"budget-lr{lr:g}"
            self.train(f"budget-lr{lr:g}", "grpo", 0, run, dict(args.rl, lr=lr))
            res = self.evaluate(f"budget-lr{lr:g}", run / "final", subtypes="none")
            self.budget[lr] = (run, res, clean_scores(self.out / "eval" / f"budget-lr{lr:g}"))
        pooled = {lr: statistics.fmean(scores.values()) for lr, (_, _, scores) in self.budget.items()}
        return max(sorted(pooled), key=pooled.get)  # ties: the smaller (max keeps the first)

    def train_rows(self, lr):
        args = self.args
        rl = dict(args.rl, lr=lr)
        for seed in args.seeds:
            for row, (mode, extra) in args.rows.items():
                name = f"{row}-s{seed}"
                run = self.out / "runs" / name
                if row == "grpo" and seed == 0 and lr in self.budget:  # the budget stage's run is this one
                    run = self.budget[lr][0]
                self.runs[name] = (row, seed, run)
                self.train(name, mode, seed, run, rl, extra)
        for name, (_, _, run) in self.runs.items():
            self.evaluate(name, run / "final")

    def equal_completions(self):
        """Stage 4b: each compared mode's snapshot nearest to rova's trained completions, seed by seed."""
        every = self.args.rl.get("snapshot_every", 0)
        if self.text or not every or "rova" not in self.args.rows:
            return
        for seed in self.args.seeds:
            target = trained_completions(self.runs[f"rova-s{seed}"][2])
            for row in (r for r in COMPARED if r in self.args.rows):
                run = self.runs[f"{row}-s{seed}"][2]
                recs = rl_records(run)
                per_step = trained_completions(run, recs) / max(1, len(recs))
                step = min(len(recs), max(every, every * round(target / per_step / every)))
                model = run / "final" if step >= len(recs) else run / "snapshots" / f"step_{step}"
                name = f"{row}-s{seed}-at{step}"
                self.equal[name] = (row, seed, step, target)
                self.evaluate(name, model)

    def cost(self):
        args, out = self.args, self.out
        bench_json = out / "bench_step.json"
        bench = [self.py, "benchmarks/bench_step.py", "--model", str(self.start), "--data",
                 str(self.synth / "train.json"), "--work", str(out / "bench_step"), "--json", str(bench_json),
                 "--steps", str(args.bench_steps), "--lr", str(self.lr)]
        for k in ("batch_size", "group_size", "max_new_tokens", "frames", "max_pixels", "reeval_period"):
            bench += ["--" + k.replace("_", "-"), str(args.rl[k])]
        if args.smoke:
            bench += ["--warmup", "0"]
        self.st.run("bench-step", bench, bench_json.is_file)
        diag_json = out / "diagnose.json"
        diag = [self.py, "benchmarks/diagnose.py", "--model", str(self.start), "--data", str(self.synth / "train.json"),
                "--json", str(diag_json), "--samples", str(args.diagnose_samples)]
        for k in ("batch_size", "group_size", "max_new_tokens", "frames", "max_pixels"):
            diag += ["--" + k.replace("_", "-"), str(args.rl[k])]
        self.st.run("diagnose", diag, diag_json.is_file)


def main(argv=None):
    args = parse_args(argv)
    r = Reproduction(args)
    r.train_sft()
    r.lr = r.choose_budget()   # (--policy text: --lr or the demo's; parse_args sets it)
    r.train_rows(r.lr)
    r.equal_completions()
    if not r.text:  # bench_step / diagnose measure the VLM's step
        r.cost()
    text = render(args, r)
    (r.out / "results.md").write_text(text)
    tag = "reproduce-text" if r.text else "reproduce"
    write_marked(Path(args.results), text, f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->")
    print(f"tables in {r.out / 'results.md'} and {args.results}")


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


def trained_completions(run, recs=None):
    """The completions a run's GRPO updates were computed on: selected samples x G, summed over its steps
    (`recs`: its RL records, if already read)."""
    g = json.loads((run / "summary.json").read_text())["config"]["group_size"]
    return sum(r.get("selected", 0) for r in (rl_records(run) if recs is None else recs)) * g


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
            "clip": avg("clip_fraction", recs), "sec_step": avg("sec_step", recs), "steps": len(recs),
            "completions": trained_completions(run, recs), "categories": category_rates(recs)}


def category_rates(recs):
    """Per corruption category over a run: (samples, rho, defer rate, discard rate) from the cat_* counts."""
    out = {}
    for cat, _ in CATEGORIES:
        n = sum(r.get(f"cat_{cat}_samples", 0) for r in recs)
        out[cat] = {"n": n} | {k: (sum(r.get(f"cat_{cat}_{k}", 0) for r in recs) / n if n else None)
                               for k in ("trained", "deferred", "discarded")}
    return out


def table2(rows):
    """Table 2's accuracy columns: (label, [result rows over seeds]) -> markdown lines (mean ± sd)."""
    L = ["| Model | " + " | ".join(lbl for _, lbl in CATEGORIES) + " | Avg. | drop | Orig. |",
         "|---|" + "---|" * (len(CATEGORIES) + 3)]
    for label, res in rows:
        cells = [fmt(*mean_sd([r[k] for r in res])) for k, _ in CATEGORIES]
        L.append(f"| {label} | " + " | ".join(cells) + f" | {fmt(*mean_sd([r['avg'] for r in res]))} | "
                 f"{pct(*mean_sd([r['drop'] for r in res]))} | {fmt(*mean_sd([r['orig'] for r in res]))} |")
    return L


def paired(a, b):
    """A claim "a > b" over seeds (the runs of one seed share data order and spec stream): the per-seed
    differences a - b, their mean ± sd, and the verdict by the rule stated in the results: holds if every
    seed's difference is > 0, mixed if the mean is > 0 but not every seed's, does not hold otherwise."""
    d = [x - y for x, y in zip(a, b) if x is not None and y is not None]
    if not d:
        return "–", "not measured"
    m, sd = mean_sd(d)
    verdict = "holds" if all(x > 0 for x in d) else ("mixed" if m > 0 else "does not hold")
    return f"{m:+.3f} ± {sd:.3f} ({', '.join(f'{x:+.3f}' for x in d)})", verdict


class Tables:
    """The results page, section by section, from a finished Reproduction."""

    def __init__(self, args, r):
        self.args, self.r = args, r
        self.acc = {name: accuracy_row(latest_results(r.out / "eval" / name)) for name in r.runs}
        self.stats = {name: training_stats(run) for name, (_, _, run) in r.runs.items()}
        self.sft = latest_results(r.out / "eval" / "sft")

    def by_row(self, row, table="acc"):
        src = self.acc if table == "acc" else self.stats
        return [src[f"{row}-s{s}"] for s in self.args.seeds]

    def header(self):
        a, r = self.args, self.r
        return [f"Measured by `{a.command}` ({time.strftime('%Y-%m-%d')}; seeds {', '.join(map(str, a.seeds))}; "
                f"{a.rl['rl_steps']} RL steps per run at lr {r.lr:g}; total wall time "
                f"{sum(r.st.timings.values()) / 60:.1f} min over the stages below).", ""]

    def budget(self):
        if not self.r.budget:
            return []
        orig, sft = accuracy_row(self.sft)["orig"], clean_scores(self.r.out / "eval" / "sft")
        L = ["### RL budget (standard GRPO, seed 0)", "",
             f"Held-out clean accuracy after {self.args.rl['rl_steps']} steps of `--mode grpo` from the SFT checkpoint, "
             f"pooled over the questions (SFT {statistics.fmean(sft.values()):.3f}) and as Table 2's task mean "
             f"(Orig., SFT {orig:.3f}). The rule: the highest pooled accuracy wins, ties to the smaller learning rate; "
             "GRPO measurably learns where its paired gain over the SFT checkpoint (the same questions) exceeds "
             "twice its standard error.", "",
             "| lr | pooled | paired gain vs SFT ± SE (questions) | measured | Orig. |", "|---|---|---|---|---|"]
        for lr, (_, res, scores) in sorted(self.r.budget.items()):
            g, se, n = paired_gain(scores, sft)
            gain, yes = ("–", "–") if g is None else (f"{g:+.3f} ± {se:.3f} ({n})", "yes" if g > 2 * se else "no")
            L.append(f"| {lr:g}{' (chosen)' if lr == self.r.lr else ''} | {statistics.fmean(scores.values()):.3f} | "
                     f"{gain} | {yes} | {res['results']['pvrbench']['accuracy']['orig']:.3f} |")
        return L + [""]

    def accuracy(self):
        n_q = self.sft["n_samples"] if self.sft else None
        rows = ([("SFT checkpoint (start of every run)", [accuracy_row(self.sft)])] if self.sft else [])
        rows += [(f"+ {row}", self.by_row(row)) for row in self.args.rows]
        L = ["### Accuracy under perturbation (Table 2's columns)", "",
             f"PVRBench static protocol on the synthetic benchmark's held-out questions, every question clean and "
             f"under each of the 12 subtypes ({n_q} scored samples per model); task-mean accuracy (MRA for counting) "
             "as eval_pvrbench.py, Avg. the mean of the four categories; mean ± standard deviation over seeds.", "",
             *table2(rows)]
        L += ["", "Per seed (Avg. / Orig.):", "", "| row | " + " | ".join(f"seed {s}" for s in self.args.seeds)
              + " |", "|---|" + "---|" * len(self.args.seeds)]
        for row in self.args.rows:
            L.append(f"| {row} | " + " | ".join(f"{fmt(x['avg'])} / {fmt(x['orig'])}" for x in self.by_row(row)) + " |")
        return L

    def equal(self):
        if not self.r.equal:
            return []
        by = {}
        for name, (row, seed, step, target) in self.r.equal.items():
            res = accuracy_row(latest_results(self.r.out / "eval" / name))
            by.setdefault(row, []).append((seed, step, target, res))
        L = ["", "### At equal trained completions", "",
             "Each mode without a curriculum evaluated at its weights snapshot nearest to the completions `rova` "
             "trained on in the same seed (selected samples x G over its run; snapshots every "
             f"{self.args.rl['snapshot_every']} steps); `rova` itself at its end.", ""]
        rows = [("+ rova (end)", self.by_row("rova"))]
        rows += [(f"+ {row} at step " + "/".join(str(st) for _, st, _, _ in v), [x for *_, x in v])
                 for row, v in by.items()]
        targets = [t for _, _, t, _ in next(iter(by.values()))]
        return L + table2(rows) + ["", "rova's trained completions per seed: " + ", ".join(map(str, targets))]

    def dynamics(self):
        L = ["", "### Training dynamics (from each run's log.jsonl; means over seeds)", "",
             "Rollout accuracy (mean reward 1[a = g] over the G rollouts, first vs last quarter of the steps), "
             "alignment reward r^A and its answer part Sim^a, the effective training ratio rho, the curriculum's "
             "rates, Eq. 7's clip fraction, the completions trained on, and the mean step time during training.", "",
             "| row | clean rollouts | corrupted rollouts | r^A | Sim^a | rho | deferred | discarded | clipped | "
             "completions | s/step |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in self.args.rows:
            ts = self.by_row(row, "stats")

            def m(key):
                return mean_sd([t[key] for t in ts])[0]

            def arrow(a, b):
                return "–" if m(a) is None else f"{m(a):.2f} → {m(b):.2f}"

            L.append(f"| {row} | {arrow('acc_clean_first', 'acc_clean_last')} | "
                     f"{arrow('acc_pert_first', 'acc_pert_last')} | {fmt(m('r_alignment'), digits=2)} | "
                     f"{fmt(m('sim_a'), digits=2)} | {fmt(m('rho'), digits=2)} | {fmt(m('defer'), digits=2)} | "
                     f"{fmt(m('discard'), digits=2)} | {fmt(m('clip'), digits=3)} | {m('completions'):.0f} | "
                     f"{fmt(m('sec_step'), digits=2)} |")
        return L

    def curriculum(self):
        rows = [row for row, (mode, _) in self.args.rows.items() if mode == "rova"]
        if not rows:
            return []
        L = ["", "### The curriculum per corruption category (Table 12's rates; means over seeds)", "",
             "Share of a category's samples trained (rho), deferred to the buffer and discarded as easy; "
             "promoted samples count as samples of their category.", "",
             "| row | " + " | ".join(f"{lbl} rho / defer / discard" for _, lbl in CATEGORIES) + " |",
             "|---|" + "---|" * len(CATEGORIES)]
        for row in rows:
            cats = [t["categories"] for t in self.by_row(row, "stats")]
            cells = []
            for cat, _ in CATEGORIES:
                v = [mean_sd([c[cat][k] for c in cats])[0] for k in ("trained", "deferred", "discarded")]
                cells.append(" / ".join(fmt(x, digits=2) for x in v))
            L.append(f"| {row} | " + " | ".join(cells) + " |")
        return L

    def cost(self):
        bench_path, diag_path, L = self.r.out / "bench_step.json", self.r.out / "diagnose.json", []
        if bench_path.is_file():
            import bench_step
            b = json.loads(bench_path.read_text())
            L += ["", "### Cost per step (Table 13, Table 14)", "",
                  f"`benchmarks/bench_step.py`: {b['config']['steps']} timed steps per mode after "
                  f"{b['config']['warmup']} warm-up steps, the three modes interleaved in one process from the SFT "
                  "checkpoint.", "", "```", bench_step.report(b), "```"]
        if diag_path.is_file():
            import diagnose
            L += ["", "### What the training signals can teach the SFT checkpoint", "",
                  "`benchmarks/diagnose.py`: the rollout groups of RL's first steps on the SFT checkpoint, measured "
                  "once without training (train.py's spec stream, judge and curriculum thresholds).", "", "```",
                  diagnose.report(json.loads(diag_path.read_text())), "```"]
        return L

    def claims(self):
        """Each claim of the paper as a paired comparison over seeds (see `paired` for the rule)."""
        have = set(self.args.rows)
        acc = {row: self.by_row(row) for row in have}
        sec = {row: [t["sec_step"] for t in self.by_row(row, "stats")] for row in have}
        rows = []

        def claim(text, a, b):
            if a[0] in have and b[0] in have:
                rows.append((text, *paired(a[1](a[0]), b[1](b[0]))))

        def neg(v):
            return None if v is None else -v

        avg = lambda row: [x["avg"] for x in acc[row]]            # noqa: E731
        less_drop = lambda row: [neg(x["drop"]) for x in acc[row]]  # noqa: E731
        faster = lambda row: [neg(x) for x in sec[row]]            # noqa: E731
        claim("Table 2: ROVA's drop smaller than standard GRPO's (drop_grpo - drop_rova)", ("rova", less_drop),
              ("grpo", less_drop))
        claim("Table 3: ROVA's Avg. above naive dual-branch's", ("rova", avg), ("dual", avg))
        claim("Table 3: naive dual-branch's Avg. above standard GRPO's", ("dual", avg), ("grpo", avg))
        claim("ROVA's Avg. above GRPO on corrupted clips (generic augmentation)", ("rova", avg), ("grpo-aug", avg))
        claim("Table 13: a ROVA step cheaper than a naive dual-branch step (s, training logs)", ("rova", faster),
              ("dual", faster))
        L = ["", "### The paper's claims, seed by seed", "",
             "Each claim as a difference between two rows, computed per seed (the two runs of a seed share the data "
             "order and the corruption-spec stream) and shown as mean ± sd (each seed's). The rule, fixed before the "
             "runs: holds if every seed's difference has the claimed sign, mixed if only the mean has it, does not "
             "hold otherwise.", "", "| claim | difference | verdict |", "|---|---|---|"]
        L += [f"| {t} | {d} | {v} |" for t, d, v in rows]
        bench_path = self.r.out / "bench_step.json"
        if bench_path.is_file():
            b = json.loads(bench_path.read_text())["modes"].get("rova", {}).get("share", {})
            sa, rv = 100 * b.get("self_assessment", 0), 100 * b.get("memory_reevaluation", 0)
            L.append(f"| Table 14: self-assessment and re-evaluation small shares of a ROVA step (paper 4.6% and "
                     f"1.5%; rule: each under 10%) | {sa:.1f}% and {rv:.1f}% (bench_step.py) | "
                     f"{'holds' if sa < 10 and rv < 10 else 'does not hold'} |")
        return L


def render(args, r):
    t = Tables(args, r)
    L = (t.header() + t.budget() + t.accuracy() + t.equal() + t.claims() + t.dynamics() + t.curriculum()
         + t.cost() + r.st.report())
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
