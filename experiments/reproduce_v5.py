"""The paper's claims at CPU scale, version 5: the curriculum at the paper's operating point (Table 12), every step
an optimiser update, RL that moves the model, and the primary claim (ROVA against naive dual-branch, Table 3)
decided by a test whose rules were committed before the first run (experiments/results/v5-rules.md; its commit is
written into the summary). Everything measured goes to experiments/results/v5.json, rewritten after every stage.

    python experiments/reproduce_v5.py --chunk-minutes 90    # one chunk; the same command continues
    python experiments/reproduce_v5.py --quick --out /tmp/r5 --summary /tmp/r5/v5.json   # the pipeline in minutes
    python experiments/reproduce_v5.py --render       # docs/RESULTS.md's section again from the summary alone
    python experiments/reproduce_v5.py --claims       # the claims again from the summary's data, then --render

Stages, in order; each is skipped when the summary already records it, so a chunk on a fresh machine (the
working folder gone) continues where the last one stopped. The start's weights are saved beside the summary
(experiments/results/v5-start) so that runs recorded on another machine keep their start.

1. start: `python train.py --rl-steps 0` on the toy (TOY: the next-action questions, turns down to slight ones,
   photometric jitter), evaluated on the reported questions and on the validation split (another seed's clips).
2. budget (validation only): `--mode dual --seed 0` at each learning rate of LRS for STEPS_MAX steps with
   snapshots; the rate with dual's largest gain in corrupted Avg. over the start; the steps: the first snapshot
   where that gain reaches 5 points (else STEPS_MAX, and the shortfall is reported).
3. pilot (validation only): rova and dual at PILOT_SEEDS; the seeds x clips matrix of their Avg. difference gives
   the number of seeds whose MDE is at most one point (powered.seeds_needed), capped by what the rest of the
   budget (--hours) affords at the pilot's measured seconds per run (`affordable_seeds`) and by --max-seeds.
4. runs: every main row at seeds 0..S-1 and every ablation at ABLATION_SEEDS, seed-major, each evaluated on the
   reported questions (clean and under all 12 subtypes) when it ends.
5. claims: reproduce_v5_report.claims by the committed rules.
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]
import measure_v5 as measure  # noqa: E402
import powered  # noqa: E402
import reproduce as v4  # noqa: E402  (Stages, flags, write_json, the weights' and data's hashes)
import reproduce_v5_report as report  # noqa: E402
from machinery.datasets import synthetic  # noqa: E402

RULES_FILES = ("experiments/results/v5-rules.md", "experiments/powered.py", "experiments/reproduce_v5_report.py")
MAIN = ("rova", "dual", "grpo", "grpo-aug")
# Each changes one thing of `rova` (Table 13's rows, Fig. 5a, Fig. 4c, App. H.1). "w/o self-assessment" is `dual`:
# with nothing assessed, nothing is discarded or deferred, the buffer stays empty, and the run is dual's.
ABLATIONS = {
    "rova-no-reeval": ("rova", {"reeval_period": 10 ** 6}),          # the buffer is never re-evaluated
    "rova-no-align": ("rova", {"alpha_r": 0.0, "alpha_a": 0.0}),     # r^A = 0
    "rova-random": ("rova", {"assess": "random"}),                   # discards at random, at its seed's rova rho
    "rova+h1": ("rova", {"advantage": "per_component"}),             # App. H.1's per-component advantages
}
# The toy, calibrated on the validation split (experiments/results/v5-rules.md, "The toy"): the etas are calibrate_toy.py's
# rule applied there.
TOY = dict(demo_families="next_action", sft_jitter=0.15, demo_turn="0.005,0.05", demo_clips=480, sft_epochs=20.0,
           eta="0.7,dusk=1,night=0.35,overexposure=0.35,shadow=0.85,translation=0.85,zoom=1,rotation=1,static=1,"
               "dynamic=0.1,fog=0.35,rain=1,snow=1")
RL = dict(frames=8, max_pixels=56 * 56, batch_size=4, group_size=8, max_new_tokens=64, reeval_period=10,
          unanswerable_below=0.0, video_cache=4096, save_every=25)
# Settings whose default changed after v5's recorded runs, pinned to what those runs used, outside `settings` (the
# summary's settings are what was recorded, and a changed dict would start the reproduction afresh): v5's ROVA steps
# drew from the stream until batch_size samples were selected (train.py's fill_rounds, 4 when v5 ran; the default
# is now 0, App. G's step), so every step trained a full batch.
RL_PINS = {"fill_rounds": 4}
LRS, STEPS_MAX, SNAPSHOTS, GAIN_TARGET = (3e-5, 1e-4, 3e-4), 150, 50, 0.05
PILOT_SEEDS, ABLATION_SEEDS, VAL_CLIPS, WINDOW = (100, 101, 102), (0, 1, 2), 160, 20
QUICK = dict(demo_clips=16, sft_epochs=1.0, steps_max=4, snapshots=2, lrs=(1e-4,), pilot_seeds=(100,),
             ablation_seeds=(0,), val_clips=6, window=2, max_seeds=1, eval_limit=2, main=("rova", "dual"),
             ablations=("rova-random",),
             rl=dict(batch_size=2, group_size=2, max_new_tokens=8, save_every=2, reeval_period=2))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    a = ap.add_argument
    a("--out", default="runs/reproduce-v5", help="working folder (every stage's output)")
    a("--summary", default=str(ROOT / "experiments" / "results" / "v5.json"), help="the machine-readable summary")
    a("--results", default=str(ROOT / "docs" / "RESULTS.md"), help="markdown file whose v5 section is rewritten")
    a("--chunk-minutes", type=float, default=90.0, help="start no stage after this many minutes (the same command "
      "continues)")
    a("--max-seeds", type=int, default=10, help="at most this many seeds per main row")
    a("--hours", type=float, default=6.0, help="the whole reproduction's budget of stage time; after the pilot, "
      "the main rows get as many seeds as the rest affords (at least 2)")
    a("--figure", default=None, help="Fig. 4a's kind of chart, ROVA's discard rates per window (default "
      "experiments/results/v5-curriculum.png; --quick: in OUT)")
    a("--quick", action="store_true", help="tiny settings: checks the pipeline, measures nothing")
    a("--render", action="store_true", help="run nothing: the results page's section again from --summary")
    a("--print", action="store_true", help="with --render: print the section instead of writing --results")
    a("--claims", action="store_true", help="run nothing: the claims (reproduce_v5_report.claims) again from the "
      "summary's data, written into --summary, then --render")
    args = ap.parse_args(argv)
    args.command = " ".join(["python experiments/reproduce_v5.py", *(argv if argv is not None else sys.argv[1:])])
    q = QUICK if args.quick else {}
    args.toy = dict(TOY, **{k: q[k] for k in ("demo_clips", "sft_epochs") if k in q})
    args.rl = dict(RL, **q.get("rl", {}))
    args.lrs, args.steps_max = q.get("lrs", LRS), q.get("steps_max", STEPS_MAX)
    args.snapshots, args.window = q.get("snapshots", SNAPSHOTS), q.get("window", WINDOW)
    args.pilot_seeds, args.ablation_seeds = q.get("pilot_seeds", PILOT_SEEDS), q.get("ablation_seeds", ABLATION_SEEDS)
    args.val_clips, args.eval_limit = q.get("val_clips", VAL_CLIPS), q.get("eval_limit", 0)
    args.max_seeds = q.get("max_seeds", args.max_seeds)
    args.main, args.ablations = q.get("main", MAIN), q.get("ablations", tuple(ABLATIONS))
    args.figure = args.figure or str(Path(args.out) / "v5-curriculum.png" if args.quick
                                     else ROOT / "experiments" / "results" / "v5-curriculum.png")
    return args


def rules_commit():
    """The last commit that changed the rules (the summary records it; runs must come after it)."""
    out = subprocess.run(["git", "log", "-1", "--format=%H", "--", *RULES_FILES], cwd=ROOT, capture_output=True,
                         text=True)
    return out.stdout.strip() or None


class ChunkOver(Exception):
    """The chunk's minutes are spent: the summary is saved, and the same command continues."""


class Reproduction:
    def __init__(self, args):
        self.args, self.out, self.py = args, Path(args.out).resolve(), sys.executable
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        self.sft, self.val = self.out / "sft", self.out / "validation"
        self.synth, self.start_dir = self.sft / "synthetic", self.sft / "final"
        self.saved_start = Path(args.summary).with_name(Path(args.summary).stem + "-start")
        self.deadline = time.time() + 60 * args.chunk_minutes
        settings = {"toy": args.toy, "rl": args.rl, "lrs": list(args.lrs), "steps_max": args.steps_max,
                    "pilot_seeds": list(args.pilot_seeds), "ablation_seeds": list(args.ablation_seeds),
                    "main": list(args.main), "ablations": {k: list(ABLATIONS[k]) for k in args.ablations},
                    "max_seeds": args.max_seeds, "hours": args.hours,
                    "val_clips": args.val_clips, "window": args.window}
        self.summary = {"version": 5, "command": args.command, "rules_commit": rules_commit(), "settings": settings,
                        "start": None, "budget": None, "pilot_runs": {}, "pilot": None, "power": None, "runs": {},
                        "claims": []}
        prior = json.loads(Path(args.summary).read_text()) if Path(args.summary).is_file() else None
        if prior and prior.get("version") == 5 and prior.get("settings") == settings:
            for key in ("rules_commit", "start", "budget", "pilot_runs", "pilot", "power", "runs", "timings",
                        "commands", "cpu_s"):
                if prior.get(key) is not None:
                    self.summary[key] = prior[key]
            print(f"kept from {args.summary}: {len(self.summary['runs'])} runs", flush=True)
        elif prior:
            print(f"{args.summary} holds another reproduction's settings: starting afresh", flush=True)
        self.st = v4.Stages(self.out, self.summary.get("timings"), self.summary.get("commands", ()))
        self.cpu = dict(self.summary.get("cpu_s") or {})

    # -- running
    def run(self, name, cmd, done):
        """One stage's command (v4.Stages), its children's CPU-seconds recorded; none starts past the chunk."""
        if not done() and time.time() > self.deadline:
            raise ChunkOver(name)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.st.run(name, cmd, done)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if used:
            self.cpu[name] = self.cpu.get(name, 0.0) + used

    def train(self, name, mode, seed, run, settings, model=None):
        cmd = [self.py, "train.py", "--model", str(model or self.start_dir), "--data", str(self.synth / "train.json"),
               "--out", str(run), "--mode", mode, "--seed", str(seed), "--sft-epochs", "0", "--resume", "auto",
               "--eta", self.args.toy["eta"], *v4.flags(settings | RL_PINS)]
        self.run(f"rl-{name}", cmd, lambda: (run / "summary.json").is_file())

    def evaluate(self, name, model, bench, folder):
        cmd = [self.py, "eval_pvrbench.py", "--model", str(model), "--model-name", name, "--benchmark",
               f"synthetic={bench}", "--out", str(self.out / folder), "--judge", "none", "--assign", "all",
               "--eta", self.args.toy["eta"]]
        if self.args.eval_limit:
            cmd += ["--limit", str(self.args.eval_limit)]
        self.run(f"{folder}-{name}", cmd, lambda: v4.latest_results(self.out / folder / name) is not None)
        return measure.evaluation(self.out / folder / name)

    # -- stages
    def start(self):
        """Stage 1: the SFT start (or, when the summary records it, the same weights again)."""
        args, toy = self.args, self.args.toy
        cmd = [self.py, "train.py", "--out", str(self.sft), "--rl-steps", "0", "--resume", "auto",
               "--sft-epochs", str(toy["sft_epochs"]),
               *v4.flags({k: v for k, v in toy.items() if k not in ("sft_epochs", "eta")} | v4.START_PINS)]
        if args.quick:
            cmd += v4.flags({"eval_limit": 4})
        self.run("sft", cmd, lambda: (self.sft / "summary.json").is_file())
        if not (self.val / "eval.jsonl").is_file():
            synthetic.make_synthetic(self.val, n=args.val_clips, seed=1, num_frames=args.rl["frames"], size=56,
                                     eval_fraction=1.0, families=toy["demo_families"].split(","),
                                     turn=synthetic.parse_turn(toy["demo_turn"]))
        if self.summary["start"]:
            self.same_start()
            return
        reported = self.evaluate("start", self.start_dir, self.synth, "eval")
        validation = self.evaluate("start", self.start_dir, self.val, "validation")
        self.summary["start"] = dict(reported, validation=validation, weights=v4.weights_hash(self.start_dir),
                                     data=v4.data_hash(self.synth))
        shutil.rmtree(self.saved_start, ignore_errors=True)
        shutil.copytree(self.start_dir, self.saved_start)
        self.save()

    def same_start(self):
        """The recorded start: the one trained here when its weights match, else the copy beside the summary."""
        recorded = self.summary["start"]["weights"]
        if v4.data_hash(self.synth) != self.summary["start"]["data"]:
            raise SystemExit(f"{self.synth} is not the benchmark {self.args.summary} records")
        if v4.weights_hash(self.start_dir) != recorded:
            if not (self.saved_start.is_dir() and v4.weights_hash(self.saved_start) == recorded):
                raise SystemExit(f"neither {self.start_dir} nor {self.saved_start} holds the recorded start")
            print(f"continuing from the recorded start in {self.saved_start} (this CPU trained other weights)")
            shutil.rmtree(self.start_dir)
            shutil.copytree(self.saved_start, self.start_dir)

    def budget(self):
        """Stage 2 (validation): dual seed 0 at each rate; the rate of the largest gain; the steps."""
        if self.summary["budget"]:
            return
        args, grid = self.args, {}
        base = self.summary["start"]["validation"]["avg"]
        for lr in args.lrs:
            run = self.out / "runs" / f"budget-lr{lr:g}"
            settings = dict(args.rl, lr=lr, rl_steps=args.steps_max, snapshot_every=args.snapshots)
            self.train(f"budget-lr{lr:g}", "dual", 0, run, settings)
            grid[f"{lr:g}"] = {"gain": self.evaluate(f"budget-lr{lr:g}", run / "final", self.val, "validation")["avg"]
                               - base, "run": str(run)}
        best = max(grid, key=lambda k: grid[k]["gain"])
        steps, gains = args.steps_max, {}
        for step in range(args.snapshots, args.steps_max, args.snapshots):
            model = Path(grid[best]["run"]) / "snapshots" / f"step_{step}"
            gains[step] = self.evaluate(f"budget-lr{best}-at{step}", model, self.val, "validation")["avg"] - base
            if gains[step] >= GAIN_TARGET:
                steps = step
                break
        gains[args.steps_max] = grid[best]["gain"]
        self.summary["budget"] = {"grid": {k: v["gain"] for k, v in grid.items()}, "lr": float(best),
                                  "steps": steps, "gains_at_steps": gains,
                                  "reached": max(gains.values()) >= GAIN_TARGET}
        self.save()

    def rl_settings(self, extra=None):
        b = self.summary["budget"]
        return dict(self.args.rl, lr=b["lr"], rl_steps=b["steps"], **(extra or {}))

    def pilot(self):
        """Stage 3 (validation): rova and dual at the pilot seeds -> the seeds of the main rows."""
        if self.summary["pilot"]:
            return
        clips = self.summary["pilot_runs"]   # each run's per-clip scores, kept as it ends (a chunk may stop between)
        for seed in self.args.pilot_seeds:
            for mode in ("rova", "dual"):
                name = f"pilot-{mode}-s{seed}"
                if name in clips:
                    continue
                run = self.out / "runs" / name
                self.train(name, mode, seed, run, self.rl_settings())
                clips[name] = self.evaluate(name, run / "final", self.val, "validation")["clips"]
                self.save()
        matrix = report.difference_matrix([clips[f"pilot-rova-s{s}"] for s in self.args.pilot_seeds],
                                          [clips[f"pilot-dual-s{s}"] for s in self.args.pilot_seeds])
        afford = affordable_seeds(self.st.timings, self.args)
        most = min(self.args.max_seeds, max(2, afford))
        seeds, planned = powered.seeds_needed(matrix, most=most)
        mean, se = powered.two_way_se(matrix)
        self.summary["pilot"] = {"seeds": list(self.args.pilot_seeds), "difference": mean, "se": se,
                                 "seeds_needed": seeds, "planned_mde": planned, "affordable_seeds": afford}
        self.summary["power"] = {"seeds": seeds or most, "planned_mde": planned, "mde": None}
        self.save()

    def rows(self):
        """Stage 4: seed-major, rova first (rova-random discards at its seed's rova rho)."""
        seeds = list(range(self.summary["power"]["seeds"]))
        for seed in sorted(set(seeds) | set(self.args.ablation_seeds)):
            names = [m for m in self.args.main if seed in seeds] + [a for a in self.args.ablations
                                                                    if seed in self.args.ablation_seeds]
            for row in names:
                name = f"{row}-s{seed}"
                if name in self.summary["runs"]:
                    continue
                mode, extra = (row, {}) if row in MAIN else ABLATIONS[row]
                if extra.get("assess") == "random":   # (v5's rho: trained / rolled out, promotions included, as
                    # recorded; Table 12's rho over fresh samples, rho_fresh, is lower when the buffer promotes)
                    extra = dict(extra, random_keep=round(self.summary["runs"][f"rova-s{seed}"]["rho"], 4))
                run = self.out / "runs" / name
                self.train(name, mode, seed, run, self.rl_settings(extra))
                self.summary["runs"][name] = dict(row=row, seed=seed, **self.evaluate(name, run / "final", self.synth,
                                                                                      "eval"),
                                                  **measure.training(run, self.args.window),
                                                  cpu_s=self.cpu.get(f"rl-{name}"),
                                                  wall_s=self.st.timings.get(f"rl-{name}"))
                self.save()

    def save(self):
        s = self.summary
        s["timings"], s["commands"], s["cpu_s"] = self.st.timings, self.st.commands, self.cpu
        s["wall_s"], s["date"] = sum(self.st.timings.values()), time.strftime("%Y-%m-%d")
        s["claims"], s["power"] = report.claims(s), report.power(s)
        v4.write_json(self.args.summary, s)
        v4.write_marked(Path(self.args.results), report.render(s), report.BEGIN, report.END)
        report.chart(s, Path(self.args.figure))


def affordable_seeds(timings, args):
    """How many seeds of the main rows the rest of the budget affords after the ablations, at the pilot's mean
    seconds per run and per evaluation (grpo and grpo-aug are costed as dual, which has two branches to their one:
    an upper bound)."""
    def mean(prefix):
        t = [v for k, v in timings.items() if k.startswith(prefix)]
        return sum(t) / len(t) if t else 0.0
    rova, dual, evaluation = mean("rl-pilot-rova"), mean("rl-pilot-dual"), mean("validation-pilot-")
    per_seed = rova + (len(args.main) - 1) * dual + len(args.main) * evaluation
    ablations = len(args.ablations) * len(args.ablation_seeds) * (rova + evaluation)
    left = args.hours * 3600 - sum(timings.values()) - ablations
    return int(left // per_seed) if per_seed > 0 else args.max_seeds


def main(argv=None):
    args = parse_args(argv)
    if args.claims:
        s = json.loads(Path(args.summary).read_text())
        s["claims"] = report.claims(s)
        s["power"] = report.power(s)
        v4.write_json(args.summary, s)
        args.render = True
    if args.render:
        text = report.render(json.loads(Path(args.summary).read_text()))
        if args.print:
            print(text, end="")
        else:
            v4.write_marked(Path(args.results), text, report.BEGIN, report.END)
        return
    r = Reproduction(args)
    try:
        r.start()
        r.budget()
        r.pilot()
        r.rows()
    except ChunkOver as e:
        print(f"chunk over ({args.chunk_minutes:g} min) before stage {e}: rerun the same command to continue")
    r.save()
    print(f"summary in {args.summary}")


if __name__ == "__main__":
    main()
