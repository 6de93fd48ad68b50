"""The paper's claims at CPU scale (Tables 2, 3, 13, 14; App. H.1), version 4: a start that uses the video, a
toy whose corruptions degrade its answers instead of breaking its text, an RL learning rate chosen by a rule fixed
before the runs on a validation set, then SFT / standard GRPO / GRPO on corrupted clips / naive dual-branch / ROVA
over five seeds and ROVA's ablations over three, each evaluated on PVRBench's static protocol of the synthetic
benchmark, the step cost, and each claim's verdict by its stated rule. Everything measured goes to
experiments/results/v4.json (rewritten after every stage, so a stopped reproduction leaves its finished part there) and
is rendered into OUT/RESULTS.md (docs/RESULTS.md holds the current reproduction, v5; v4's page is in git history).

    python experiments/reproduce.py                 # about 5 hours on a 2-core laptop
    python experiments/reproduce.py --smoke --out /tmp/r --results /tmp/r/RESULTS.md --summary /tmp/r/v4.json

Every stage is one of the project's own commands (printed, and listed in the results), run as a subprocess; a
stage whose output exists is skipped, an interrupted training run resumes from its last checkpoint (--resume
auto), an interrupted evaluation from its sample store: the same command continues where it stopped. Stages:

1. SFT: `python train.py --out OUT/sft --rl-steps 0` (the CPU demo: tiny model, synthetic benchmark, 30 epochs of
   task SFT with a photometric jitter of its clips, and the answerability warm-up at App. D's eta), on the toy's
   question families (TOY["families"]),
   evaluated at the toy's corruption intensities (TOY["eta"], calibrated on this start by
   experiments/calibrate_toy.py). The gate: every task's clean
   accuracy above its best constant answer by more than 2 SE (diagnostics.py). A start that fails it stops the
   reproduction (RL from a model that does not use the video cannot test the paper).
2. Budget: `--mode grpo-aug --seed 0` at each of --lrs in ascending order, evaluated on a validation benchmark
   (the same renderer, another seed: never reported as a result). The rule, fixed before any run: the smallest
   learning rate whose paired gain in corrupted-clip accuracy over the SFT start (the same validation
   questions and conditions) exceeds twice its standard error; if none does, the one with the largest gain.
   It targets robustness, the paper's objective, at the lowest learning rate that measurably reaches it.
3. RL: `python train.py --model OUT/sft/final --data OUT/sft/synthetic/train.json --sft-epochs 0 --mode M --seed S`
   for each row and seed (MAIN over --seeds, ABLATIONS over --ablation-seeds), the demo's RL settings at the
   chosen learning rate, each evaluated as soon as it ends: `python eval_pvrbench.py --model RUN/final
   --benchmark synthetic=OUT/sft/synthetic --assign all --judge none --eta TOY_ETA` (every held-out question
   clean and under all 12 subtypes). Then each mode without a curriculum again at the snapshot where it had
   trained as many completions as `rova` at its end (equal trained completions, seed by seed).
4. Cost (run before stage 3, being short): `python benchmarks/bench_step.py --model OUT/sft/final ...` (grpo /
   dual / rova interleaved; Tables 13-14) on the v4 start at the chosen learning rate.

`--policy text` runs stages 1 and 3 for Embodied-R's pipeline (Embodied-R Sec. 2; ROVA Table 2's "Embodied-R"
rows): a tiny text-only LM (`python -m extensions.embodied_r.train`) that reads a frozen perceiver's text of each
clean or corrupted video (`--perceiver`, default cv), trained and evaluated from its own SFT checkpoint; its
tables go between `<!-- reproduce-text:begin -->` and `<!-- reproduce-text:end -->`.

    python experiments/reproduce.py --policy text --modes grpo,rova --out runs/reproduce-text
"""
import argparse
import dataclasses
import glob
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]
from machinery.datasets import synthetic  # noqa: E402
import train  # noqa: E402  (its modes and the CPU demo's settings)
from reproduce_report import (BEGIN, CATEGORIES, COMPARED, END, RULES, claims, fmt, mean_sd, paired,  # noqa: E402, F401
                              pct, render, write_marked)

MODES = ("grpo", "grpo-aug", "dual", "rova")  # train.MODES, in the tables' order
assert set(MODES) == set(train.MODES)
# The table's rows: label -> (train.py mode, extra train.py flags). MAIN is the comparison (--seeds); ABLATIONS
# each change one thing of `rova` (--ablation-seeds).
MAIN = {m: (m, []) for m in MODES}
ABLATIONS = {
    "rova-reassess-rule": ("rova", ["--set", "reassess=rule"]),              # Eq. 5 by G rollouts per entry
    "rova-verdict": ("rova", ["--set", "assess=verdict"]),                    # App. C.2's YES / NO alone
    "rova+eq2": ("rova", ["--set", "temporal_corruption=1"]),                 # Eq. 2 with its frame permutation
    "rova+tgrpo": ("rova", ["--temporal-grpo", "4"]),                         # T-GRPO's G~ = 4 (App. D)
    "rova+h1": ("rova", ["--set", "advantage=per_component"]),                # App. H.1's per-component advantages
    "rova-fixed-norm": ("rova", ["--set", "loss_norm=fixed"]),                # Eq. 7 over N x G, Dr. GRPO
}
ROWS = {**MAIN, **ABLATIONS}
# The train.py demo's RL settings when v4 ran (train.DEMO's then), passed as flags because --model/--data turn the
# preset off.
RL_FLAGS = dict(frames=8, max_pixels=56 * 56, lr=3e-5, rl_steps=100, batch_size=4, group_size=8, max_new_tokens=64,
                reeval_period=10, unanswerable_below=0.0, video_cache=4096)
RL_FLAGS.update(save_every=25, snapshot_every=10)
# The toy (experiments/calibrate_toy.py): the question families the tiny model learns from the demo's data (its
# 10-epoch SFT answers the others no better than their best constant); a photometric jitter of the SFT clips
# (without it an 8-grey-level brightening breaks the tiny model's text: format rate .07 under overexposure at
# eta 0.05); and per-subtype intensities at which an oracle still answers, the SFT start keeps its answer format
# and loses at most 45% (Table 2's worst category).
TOY = dict(families="next_action", sft_jitter=0.15,   # eta: calibrate_toy.py's choice on the v4 start (RESULTS.md)
           eta="0.7,dusk=0.1,night=0.1,overexposure=0.2,shadow=1,translation=1,zoom=1,rotation=1,static=1,"
               "dynamic=0.85,fog=0.35,rain=1,snow=1")
# 30 SFT epochs: the toy's one family is a quarter of the demo's questions, so as many steps as the demo's 10
# (10 left the jittered start at chance: 0.33 clean); the demo's 100 RL steps.
VLM = dict(sft_epochs=30.0, rl_steps=RL_FLAGS["rl_steps"])
SMOKE = dict(demo_clips=16, sft_epochs=1.0, rl_steps=2, batch_size=2, group_size=2, max_new_tokens=8, save_every=1,
             snapshot_every=1, reeval_period=2, bench_steps=2, eval_limit=3, seeds="0", ablation_seeds="",
             lrs="1e-4", val_clips=8)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    a = ap.add_argument
    a("--out", default="runs/reproduce", help="working folder (every stage's output)")
    a("--results", default="", help="markdown file whose marked section is rewritten (default: OUT/RESULTS.md)")
    a("--summary", default=str(ROOT / "experiments" / "results" / "v4.json"), help="the machine-readable summary")
    a("--seeds", default="0,1,2,3,4", help="RL seeds of the main rows (comma list)")
    a("--ablation-seeds", default="0,1,2", help="RL seeds of the ablation rows (comma list; empty: none)")
    a("--modes", default=None, help="comma list of rows (" + ", ".join(ROWS) + "); default all of them "
      "(--policy text: the four modes)")
    a("--rl-steps", type=int, default=None, help=f"default {VLM['rl_steps']} (the demo's)")
    a("--lrs", default="3e-5,1e-4,3e-4", help="the budget stage's learning rates (comma list, ascending)")
    a("--lr", type=float, default=None, help="RL learning rate: skips the budget stage")
    a("--demo-clips", type=int, default=480, help="clips of the synthetic benchmark (train.py's demo_clips)")
    a("--val-clips", type=int, default=160, help="clips of the validation benchmark (the budget stage's)")
    a("--families", default=TOY["families"], help="the toy's question families (synthetic.SYNTH_FAMILIES)")
    a("--eta", default=TOY["eta"], help="the toy's corruption intensity, per subtype (train.py --eta)")
    a("--sft-jitter", type=float, default=TOY["sft_jitter"], help="photometric jitter of the SFT clips (train.py's "
      "sft_jitter)")
    a("--sft-epochs", type=float, default=None, help=f"default {VLM['sft_epochs']:g}")
    a("--bench-steps", type=int, default=30, help="timed steps per mode of bench_step.py")
    a("--eval-limit", type=int, default=0, help="questions evaluated (0: all)")
    a("--variant", action="append", default=[], metavar="NAME='MODE FLAGS'",
      help="an extra row (ablation seeds): a mode with other train.py flags, e.g. rova-amin0.125='rova --a-min "
           "0.125' (repeatable)")
    a("--policy", default="vlm", choices=["vlm", "text"], help="text: Embodied-R's perception + text LM pipeline "
      "(python -m extensions.embodied_r.train) instead of the VLM")
    a("--perceiver", default="cv", help="--policy text: the perception model (hf:PATH | openai:MODEL | cv)")
    a("--smoke", action="store_true", help="tiny settings: checks the pipeline, measures nothing (no gate)")
    a("--render", action="store_true", help="run nothing: the claims and the results page again from --summary")
    a("--print", action="store_true", help="with --render: print the page's section instead of writing the files")
    args = ap.parse_args(argv)
    args.results = args.results or str(Path(args.out) / "RESULTS.md")
    args.command = " ".join(["python experiments/reproduce.py", *(argv if argv is not None else sys.argv[1:])])
    args.sft_epochs = VLM["sft_epochs"] if args.sft_epochs is None else args.sft_epochs
    args.rl = dict(RL_FLAGS, rl_steps=args.rl_steps or VLM["rl_steps"], eta=args.eta)
    if args.smoke:
        for k, v in SMOKE.items():
            if k in args.rl:
                args.rl[k] = v
            else:
                setattr(args, k, v)
    if args.policy == "text":
        args.rl.pop("snapshot_every")
        args.rl.pop("eta")
        args.lr = args.rl["lr"] if args.lr is None else args.lr
    args.seeds = _ints(args.seeds)
    args.ablation_seeds = _ints(args.ablation_seeds)
    args.lrs = sorted(float(x) for x in str(args.lrs).split(",") if x.strip())
    args.rows = parse_rows(ap, args)
    return args


def _ints(text):
    return [int(x) for x in str(text).split(",") if x.strip()]


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


def seeds_of(args, row):
    return args.seeds if row in MAIN else args.ablation_seeds


# train.py's settings without a flag of their own go through --set NAME=VALUE
SETTINGS = {f.name for f in dataclasses.fields(train.Config) if f.metadata.get("group") is None}


def flags(d):
    return [x for k, v in d.items()
            for x in (("--set", f"{k}={v}") if k in SETTINGS else ("--" + k.replace("_", "-"), str(v)))]


# The demo's settings that came after the recorded SFT starts (v4's here, v5's): a start trained again gets their
# earlier values, so that it is the recorded one.
START_PINS = {"freeze_vision": False, "answerability_lr": 0.0, "eta": "0.7", "eval_assign": "cycle"}


class Stages:
    """Runs commands, skipping those whose output exists; keeps wall times across resumed runs, and across
    reproduce.py processes that share OUT with disjoint --seeds (the second with --lr, so that only the
    first runs the budget stage)."""

    def __init__(self, out, timings=None, commands=()):
        self.out = out
        self.timings_path = out / "timings.json"
        self.timings = dict(timings or {})   # a summary's, when OUT is new but the summary not
        if self.timings_path.is_file():
            self.timings.update(json.loads(self.timings_path.read_text()))
        self.commands = list(commands)   # (a summary's, kept across sessions)

    def run(self, name, cmd, done):
        shown = " ".join(cmd).replace(sys.executable, "python").replace(str(ROOT) + "/", "")
        if shown not in self.commands:
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
        write_json(self.timings_path, self.timings)
        print(f"[{name}] {seconds:.0f} s", flush=True)

    def report(self):
        """The "Commands and wall time" section of a results file: each stage's seconds, then the commands."""
        return (["", "### Commands and wall time", "", "| stage | seconds |", "|---|---|"]
                + [f"| {k} | {v:.0f} |" for k, v in self.timings.items()] + ["", "```"] + self.commands + ["```"])


def write_json(path, obj):
    """Whole or not at all: a kill never leaves half a file to read back."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)


def latest_results(folder):
    found = sorted(glob.glob(str(folder / "*_results.json")))
    return json.loads(Path(found[-1]).read_text()) if found else None


def sample_scores(folder, clean: bool):
    """An evaluation's latest sample log: (doc_id, condition) -> score, the clean videos' or the corrupted ones'."""
    found = sorted(glob.glob(str(folder / "*_samples_*.jsonl")))
    rows = (json.loads(x) for x in Path(found[-1]).read_text().splitlines() if x.strip()) if found else ()
    return {(r["doc_id"], r["condition"]): r["score"] for r in rows
            if (r["condition"] == "clean") == clean and r["score"] is not None}


def clean_scores(folder):
    """Each question's score on its clean video: doc_id -> score."""
    return {doc: v for (doc, _), v in sample_scores(folder, clean=True).items()}


def paired_gain(after, before):
    """Pooled accuracy gain over the items both evaluations scored (key -> score) and its standard error: the
    sd of the per-item differences / sqrt(n). Paired, because the items are the same, so it is much smaller
    than either accuracy's own binomial error when few answers change."""
    d = [after[k] - before[k] for k in before if k in after]
    if len(d) < 2:
        return None, None, len(d)
    return statistics.fmean(d), statistics.stdev(d) / len(d) ** 0.5, len(d)


class Reproduction:
    """The stages of one reproduction (see the module's docstring), in order; each knows its output. After
    every stage the summary (experiments/results/v4.json) and the results page are written again."""

    def __init__(self, args):
        self.args, self.out, self.py = args, Path(args.out).resolve(), sys.executable
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        self.text = args.policy == "text"
        self.sft = self.out / "sft"
        self.synth, self.start, self.val = self.sft / "synthetic", self.sft / "final", self.out / "validation"
        self.saved_start = Path(args.summary).with_name(Path(args.summary).stem + "-start")   # experiments/results/v4-start
        self.cache = (["--perceiver", args.perceiver, "--perception-cache", str(self.out / "perception_cache.sqlite")]
                      if self.text else [])
        self.trainer = [self.py, "-m", "extensions.embodied_r.train"] if self.text else [self.py, "train.py"]
        self.toy = [] if self.text else ["--eta", args.eta]
        self.lr = args.lr
        self.summary = {"version": 4, "command": args.command, "rules": RULES, "settings": {
            "rl": args.rl, "sft_epochs": args.sft_epochs, "demo_clips": args.demo_clips, "families": args.families,
            "sft_jitter": args.sft_jitter,
            "eta": args.eta, "seeds": args.seeds, "ablation_seeds": args.ablation_seeds, "lrs": args.lrs,
            "rows": {k: [m, *x] for k, (m, x) in args.rows.items()}},
            "start": None, "budget": {}, "lr": None, "runs": {}, "equal": {}, "cost": None, "claims": []}
        self.resume_from_summary()
        self.st = Stages(self.out, self.summary.get("timings"), self.summary.get("commands", ()))

    def resume_from_summary(self):
        """A reproduction spans sessions whose working folder (OUT) is lost but whose committed summary is not:
        with the same settings, every stage the summary records is kept and not run again (the SFT start is
        trained again, and must be the same weights: its hash is recorded)."""
        path = Path(self.args.summary)
        if self.text or not path.is_file():
            return
        prior = json.loads(path.read_text())
        if prior.get("version") != 4 or prior.get("settings") != self.summary["settings"]:
            print(f"{path} holds another reproduction's settings: starting afresh (it will be overwritten)",
                  flush=True)
            return
        for key in ("start", "budget", "lr", "runs", "equal", "cost", "timings", "commands"):
            if prior.get(key) is not None:
                self.summary[key] = prior[key]
        print(f"kept from {path}: " + ", ".join(f"{k}" for k in ("start", "lr", "cost") if prior.get(k)) +
              f", {len(self.summary['runs'])} runs, {len(self.summary['equal'])} equal-completion evaluations",
              flush=True)

    # -- stages
    def train_sft(self):
        args = self.args
        # (the answerability warm-up corrupts its clips at App. D's eta: the start does not depend on the toy's)
        cmd = [*self.trainer, "--out", str(self.sft), "--rl-steps", "0", *flags({"demo_clips": args.demo_clips}),
               "--resume", "auto", "--sft-epochs", str(args.sft_epochs), *self.cache]
        if not self.text:
            cmd += flags({"demo_families": args.families, "sft_jitter": args.sft_jitter, **START_PINS})
        if args.smoke:
            cmd += flags({"eval_limit": 4})
        kept_seconds = self.st.timings.get("sft")
        self.st.run("sft", cmd, lambda: (self.sft / "summary.json").is_file())
        if self.summary["start"]:   # kept from the summary: the runs it records started from these weights
            self.st.timings["sft"] = kept_seconds   # (training it again is the session's cost, not the stage's)
            self.check_start()
            return
        res = self.evaluate("sft", self.start)
        rec = evaluation_record(res)
        gate = start_gate(rec)
        self.summary["start"] = dict(rec, wall_s=self.wall("sft", "eval-sft"), gate=gate,
                                     weights=weights_hash(self.start), data=data_hash(self.synth))
        if not self.text:   # (next to the summary: another machine's kernels may train other weights)
            shutil.rmtree(self.saved_start, ignore_errors=True)
            shutil.copytree(self.start, self.saved_start)
        self.save()
        if gate["failed"] and not args.smoke and not self.text:
            raise SystemExit("the SFT start fails the gate (" + "; ".join(gate["failed"]) + "): RL from it cannot "
                             "test the paper (see diagnostics in " + str(self.out / "eval" / "sft") + ")")

    def check_start(self):
        """The start the summary's runs began from: the retrained one if it has the recorded weights, else the
        copy saved beside the summary (float kernels differ between CPUs); the benchmark must be the same."""
        start, recorded = self.summary["start"], self.summary["start"].get("weights")
        if start.get("data") and data_hash(self.synth) != start["data"]:
            raise SystemExit(f"the synthetic benchmark in {self.synth} is not the one {self.args.summary} records: "
                             "its runs cannot be continued; use another --summary to start afresh")
        here = weights_hash(self.start)
        if here == recorded:
            return
        if self.saved_start.is_dir() and weights_hash(self.saved_start) == recorded:
            print(f"the SFT start trained here differs from the recorded one (weights {here[:12]} "
                  f"vs {recorded[:12]}): continuing from the copy in {self.saved_start}", flush=True)
            shutil.rmtree(self.start)
            shutil.copytree(self.saved_start, self.start)
            return
        raise SystemExit(f"the SFT start in {self.start} (weights {here[:12]}) is not the one "
                         f"{self.args.summary} records ({str(recorded)[:12]}), and {self.saved_start} does not hold "
                         "it: its runs cannot be continued; use another --summary to start afresh")

    def train(self, name, mode, seed, run, rl, extra=()):
        self.st.run(f"rl-{name}", [*self.trainer, "--model", str(self.start), "--data", str(self.synth / "train.json"),
                                   "--out", str(run), "--mode", mode, "--seed", str(seed), "--sft-epochs", "0",
                                   "--resume", "auto", *flags(rl), *self.cache, *extra],
                    lambda: (run / "summary.json").is_file())

    def evaluate(self, name, model, bench=None, folder="eval"):
        args = self.args
        evaluator = [self.py, "-m", "extensions.embodied_r.eval"] if self.text else [self.py, "eval_pvrbench.py"]
        cmd = [*evaluator, "--model", str(model), "--model-name", name, "--benchmark",
               f"synthetic={bench or self.synth}", "--out", str(self.out / folder), "--judge", "none",
               "--assign", "cycle" if args.smoke else "all", *self.cache, *self.toy]
        if args.eval_limit:
            cmd += ["--limit", str(args.eval_limit)]
        self.st.run(f"{folder}-{name}", cmd, lambda: latest_results(self.out / folder / name) is not None)
        return latest_results(self.out / folder / name)

    def choose_budget(self):
        """Stage 2 (the module docstring's rule): grpo-aug (seed 0) at each of --lrs, ascending, on the validation
        benchmark; the first whose corrupted-clip gain over the SFT start exceeds 2 SE."""
        args = self.args
        if self.lr is not None:
            self.summary["lr"] = {"value": self.lr, "chosen_by": "--lr"}
            return self.lr
        if self.summary["lr"]:   # chosen in an earlier session
            self.lr = self.summary["lr"]["value"]
            return self.lr
        if not (self.val / "eval.jsonl").is_file():
            synthetic.make_synthetic(self.val, n=args.val_clips, seed=1, num_frames=args.rl["frames"], size=56,
                                     eval_fraction=1.0, families=args.families.split(","))
        self.evaluate("sft", self.start, self.val, "validation")
        before = sample_scores(self.out / "validation" / "sft", clean=False)
        for lr in args.lrs:
            run = self.out / "runs" / f"budget-lr{lr:g}"
            self.train(f"budget-lr{lr:g}", "grpo-aug", 0, run, dict(args.rl, lr=lr))
            res = self.evaluate(f"budget-lr{lr:g}", run / "final", self.val, "validation")
            g, se, n = paired_gain(sample_scores(self.out / "validation" / f"budget-lr{lr:g}", clean=False), before)
            self.summary["budget"][f"{lr:g}"] = {"gain": g, "se": se, "n": n, "orig": orig_of(res),
                                                 "avg": res["results"]["pvrbench"]["accuracy"]["avg"]}
            self.save()
            if g is not None and g > 2 * se:
                break
        gains = {float(k): v["gain"] for k, v in self.summary["budget"].items() if v["gain"] is not None}
        passed = [float(k) for k, v in self.summary["budget"].items()
                  if v["gain"] is not None and v["gain"] > 2 * v["se"]]
        self.lr = min(passed) if passed else max(sorted(gains), key=gains.get)
        self.summary["lr"] = {"value": self.lr, "chosen_by": "rule: gain > 2 SE" if passed else "rule: largest gain"}
        self.save()
        return self.lr

    def train_rows(self):
        """Stage 3: seed-major (every row of a seed before the next seed; `rova` first), each run evaluated when
        it ends, and each mode without a curriculum again at `rova`'s trained completions. A run the summary
        already records is not run again."""
        args = self.args
        rl = dict(args.rl, lr=self.lr)
        for seed in sorted(set(args.seeds) | set(args.ablation_seeds)):
            for row in sorted(args.rows, key=lambda r: r != "rova"):
                mode, extra = args.rows[row]
                name = f"{row}-s{seed}"
                if seed not in seeds_of(args, row) or name in self.summary["runs"]:
                    continue
                run = self.out / "runs" / name
                self.train(name, mode, seed, run, rl, extra)
                res = self.evaluate(name, run / "final")
                self.summary["runs"][name] = dict(row=row, seed=seed, **evaluation_record(res), **training_record(run),
                                                  wall_s=self.wall(f"rl-{name}", f"eval-{name}"))
                self.save()
                if row in COMPARED:
                    self.equal_completions(row, seed, run)

    def equal_completions(self, row, seed, run):
        """A mode without a curriculum at its snapshot nearest to `rova`'s trained completions in the same seed
        (before its run folder is gone: the working folder does not outlive a session)."""
        every = self.args.rl.get("snapshot_every", 0)
        rova = self.summary["runs"].get(f"rova-s{seed}")
        if self.text or not every or rova is None:
            return
        recs = rl_records(run)
        per_step = trained_completions(run, recs) / max(1, len(recs))
        step = min(len(recs), max(every, every * round(rova["completions"] / per_step / every)))
        model = run / "final" if step >= len(recs) else run / "snapshots" / f"step_{step}"
        name = f"{row}-s{seed}-at{step}"
        res = self.evaluate(name, model)
        self.summary["equal"][name] = dict(row=row, seed=seed, step=step, rova_completions=rova["completions"],
                                           **evaluation_record(res))
        self.save()

    def cost(self):
        args, out = self.args, self.out
        bench_json = out / "bench_step.json"
        if self.summary["cost"]:   # measured in an earlier session
            return
        bench = [self.py, "benchmarks/bench_step.py", "--model", str(self.start), "--data",
                 str(self.synth / "train.json"), "--work", str(out / "bench_step"), "--json", str(bench_json),
                 "--steps", str(args.bench_steps), "--lr", str(self.lr), "--eta", args.eta]
        for k in ("batch_size", "group_size", "max_new_tokens", "frames", "max_pixels", "reeval_period"):
            bench += ["--" + k.replace("_", "-"), str(args.rl[k])]
        if args.smoke:
            bench += ["--warmup", "0"]
        self.st.run("bench-step", bench, bench_json.is_file)
        b = json.loads(bench_json.read_text())
        self.summary["cost"] = {"rova_over_grpo": b["rova_over_grpo"], "rova_over_dual": b["rova_over_dual"],
                                "modes": b["modes"], "steps": b["config"]["steps"]}
        self.save()

    # -- bookkeeping
    def wall(self, *stages):
        return sum(self.st.timings.get(s, 0.0) for s in stages)

    def save(self):
        """The summary, its claims and the results page, as they stand."""
        self.summary["timings"], self.summary["commands"] = self.st.timings, self.st.commands
        self.summary["wall_s"] = sum(self.st.timings.values())
        self.summary["date"] = time.strftime("%Y-%m-%d")   # the page shows it: rendering again keeps it
        if self.text:
            write_json(self.out / "summary.json", self.summary)
        else:
            self.summary["claims"] = claims(self.summary)
            write_json(self.args.summary, self.summary)
        text = render(self.summary)
        (self.out / "results.md").write_text(text)
        tag = "reproduce-text" if self.text else "reproduce"
        write_marked(Path(self.args.results), text, f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->")


def main(argv=None):
    args = parse_args(argv)
    if args.render:
        summary = json.loads(Path(args.summary).read_text())
        summary["claims"] = claims(summary)
        if args.print:
            print(render(summary), end="")
            return
        write_json(args.summary, summary)
        write_marked(Path(args.results), render(summary))
        print(f"{args.results} rendered from {args.summary}")
        return
    r = Reproduction(args)
    r.train_sft()
    r.choose_budget()   # (--policy text: --lr or the demo's; parse_args sets it)
    if not r.text:  # bench_step measures the VLM's step (short: before the long stage)
        r.cost()
    r.train_rows()
    r.save()
    print(f"summary in {args.summary if not r.text else r.out / 'summary.json'}; tables in {args.results}")


# ----------------------------------------------------------------------------- what a run measured

def orig_of(res):
    return res["results"]["pvrbench"]["accuracy"]["orig"]


def evaluation_record(res):
    """Table 2's columns and the collapse diagnostics of one evaluation's results.json."""
    acc = res["results"]["pvrbench"]["accuracy"]
    rec = {"orig": acc["orig"], "avg": acc["avg"], "drop": acc["drop"], "categories": dict(acc["categories"])}
    diag = res["results"].get("diagnostics", {}).get("sources", {})
    tasks, share, fmt_rate = {}, [], {}
    for src, d in diag.items():
        share.append(d.get("one_answer_share"))
        fmt_rate.update(d.get("format_rate", {}))
        for task, conds in d["tasks"].items():
            tasks[task] = {c: {k: v[k] for k in ("accuracy", "best_constant", "constant_accuracy", "margin", "se",
                                                 "collapsed", "top_share")} for c, v in conds.items() if v}
    rec.update(one_answer_share=max((x for x in share if x is not None), default=None), tasks=tasks,
               format_rate=fmt_rate)
    rec["collapsed"] = collapsed(rec)
    return rec


def within_noise(b):
    """A task block of diagnostics.py not above its best constant by more than 2 SE: its own `collapsed` flag,
    or a margin or SE it could not measure."""
    return bool(b.get("collapsed")) or b.get("margin") is None or b.get("se") is None


def collapsed(rec):
    """RULES["collapse"]: the reasons a run counts as collapsed (empty: it does not)."""
    why = []
    if rec["one_answer_share"] is not None and rec["one_answer_share"] > 0.2:
        why.append(f"one answer to {rec['one_answer_share']:.0%} of the questions")
    for task, conds in rec["tasks"].items():
        for cond, v in conds.items():
            if within_noise(v):
                why.append(f"{task} ({cond}): {v['accuracy']:.3f} vs {v['constant_accuracy']:.3f} for "
                           f"'{v['best_constant']}'")
    return why


def start_gate(rec):
    """RULES["gate"] on the SFT start's evaluation record: the tasks whose clean margin is not above 2 SE."""
    failed = [f"{t}: clean {c['clean']['accuracy']:.3f} vs {c['clean']['constant_accuracy']:.3f} for "
              f"'{c['clean']['best_constant']}' (margin {c['clean']['margin'] or 0:+.3f} ± "
              f"{c['clean']['se'] or 0:.3f})"
              for t, c in rec["tasks"].items() if c.get("clean") and within_noise(c["clean"])]
    return {"failed": failed, "rule": RULES["gate"]}


def files_hash(files):
    """sha256 of the files' bytes, in the order given (missing files left out)."""
    import hashlib
    h = hashlib.sha256()
    for f in files:
        if Path(f).is_file():
            h.update(Path(f).read_bytes())
    return h.hexdigest()


def weights_hash(model_dir):
    """A checkpoint's weight files (safetensors), in name order."""
    return files_hash(sorted(Path(model_dir).glob("*.safetensors")))


def data_hash(bench):
    """A synthetic benchmark's question files (its videos are rendered from the same seeds)."""
    return synthetic.questions_hash(bench)


def rl_records(run):
    """The RL steps' records of a train.py run's log.jsonl."""
    recs = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in recs if r["stage"] == "rl"]


def first_last(recs, key):
    """The mean of ``key`` over the first and over the last quarter of the steps (at least one step each)."""
    q = max(1, len(recs) // 4)
    return mean_sd([r.get(key) for r in recs[:q]])[0], mean_sd([r.get(key) for r in recs[-q:]])[0]


def trained_completions(run, recs=None):
    """The completions a run's GRPO updates were computed on: trained samples x G, summed over its steps
    (`recs`: its RL records, if already read). `trained`: the fresh samples selected and the buffer's promotions;
    a record without it (v4's) counted both in `selected`."""
    g = json.loads((run / "summary.json").read_text())["config"]["group_size"]
    return sum(r.get("trained", r.get("selected", 0)) for r in (rl_records(run) if recs is None else recs)) * g


def training_record(run):
    """What a run's log.jsonl says: rollout accuracies (first vs last quarter), the curriculum's rates, the
    completions trained, seconds per step."""
    recs = rl_records(run)

    def avg(key):
        return mean_sd([r.get(key) for r in recs])[0]

    return {"acc_clean_rollouts": first_last(recs, "acc_clean"),
            "acc_corrupted_rollouts": first_last(recs, "acc_perturbed"),
            "r_alignment": avg("r_alignment"), "rho": avg("rho"), "defer": avg("defer_rate"),
            "discard": avg("discard_rate"), "sec_step": avg("sec_step"), "steps": len(recs),
            "completions": trained_completions(run, recs), "curriculum": category_rates(recs)}


def category_rates(recs):
    """Per corruption category over a run: (samples, rho, defer rate, discard rate) from the cat_* counts."""
    out = {}
    for cat, _ in CATEGORIES:
        n = sum(r.get(f"cat_{cat}_samples", 0) for r in recs)
        out[cat] = {"n": n} | {k: (sum(r.get(f"cat_{cat}_{k}", 0) for r in recs) / n if n else None)
                               for k in ("trained", "deferred", "discarded")}
    return out


if __name__ == "__main__":
    main()
