"""experiments/reproduce.py (with benchmarks/bench_step.py) and experiments/robust_to.py with tiny settings: every
stage runs, the tables are written between the markers (text around them kept), and a second run redoes nothing."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vlm_smoke(tmp_path_factory):
    """One `reproduce.py --smoke` run (grpo-aug and rova), shared by the tests that read it."""
    tmp_path = tmp_path_factory.mktemp("reproduce")
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\nhand-written discussion\n\n<!-- reproduce:begin -->\nold\n"
                       "<!-- reproduce:end -->\n\ntail\n")
    cmd = [sys.executable, "experiments/reproduce.py", "--smoke", "--modes", "grpo-aug,rova",
           "--out", str(tmp_path / "r"), "--results", str(results), "--summary", str(tmp_path / "v4.json")]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    return tmp_path, results, cmd, first


@pytest.mark.slow
def test_reproduce_smoke_writes_the_tables_and_resumes(vlm_smoke):
    tmp_path, results, cmd, first = vlm_smoke
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    text = results.read_text()
    assert text.startswith("# Results\n\nhand-written discussion\n") and text.rstrip().endswith("tail")
    assert "\nold\n" not in text
    for row in ("| SFT start |", "| + grpo-aug |", "| + rova |", "### RL learning rate", "| 0.0001 (chosen) |",
                "### At equal trained completions", "| + rova (end) |", "### Claims",
                "Table 3: ROVA's Avg. above naive dual-branch's", "The start's gate"):
        assert row in text, row
    summary = json.loads((tmp_path / "v4.json").read_text())
    assert summary["version"] == 4 and set(summary["runs"]) == {"grpo-aug-s0", "rova-s0"}
    run = summary["runs"]["rova-s0"]
    for key in ("orig", "avg", "drop", "categories", "one_answer_share", "tasks", "collapsed", "rho", "defer",
                "discard", "completions", "wall_s"):
        assert key in run, key
    assert summary["lr"]["value"] == 1e-4 and summary["budget"]["0.0001"]["n"] > 0
    assert {c["verdict"] for c in summary["claims"]} <= {"holds", "mixed", "does not hold", "not measured"}
    bench = json.loads((tmp_path / "r" / "bench_step.json").read_text())
    assert set(bench["modes"]) == {"grpo", "dual", "rova"}
    for mode, r in bench["modes"].items():  # the components and "other" add up to the mean step
        assert abs(sum(r["components"].values()) - r["sec_per_step"]) < 1e-9
        assert r["components"]["rollout"] > 0  # both branches in one generation call
    assert bench["rova_over_grpo"] == bench["modes"]["rova"]["sec_per_step"] / bench["modes"]["grpo"]["sec_per_step"]
    timings = json.loads((tmp_path / "r" / "timings.json").read_text())
    equal = [k for k in timings if k.startswith("eval-grpo-aug-s0-at")]   # the snapshot at rova's completions
    assert len(equal) == 1 and equal[0][len("eval-grpo-aug-s0-at"):] in ("1", "2")
    assert set(timings) - set(equal) == {"sft", "eval-sft", "validation-sft", "rl-budget-lr0.0001",
                                         "validation-budget-lr0.0001", "rl-grpo-aug-s0", "rl-rova-s0",
                                         "eval-grpo-aug-s0", "eval-rova-s0", "bench-step"}
    budget = lines_of(tmp_path / "r" / "validation" / "budget-lr0.0001")
    assert "clean" in budget and len(budget) > 1   # the budget stage measures corrupted clips
    assert (tmp_path / "r" / "validation" / "eval.jsonl").is_file()
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    # the summary records every stage after the SFT start, whose checkpoint is there: nothing runs
    assert again.returncode == 0 and "kept from" in again.stdout, again.stdout[-2000:] + again.stderr[-2000:]
    assert again.stdout.count("done already, skipped") == 1 and "[rl-" not in again.stdout
    assert json.loads((tmp_path / "r" / "timings.json").read_text()) == timings
    assert json.loads((tmp_path / "v4.json").read_text())["runs"] == summary["runs"]


@pytest.mark.slow
def test_reproduce_continues_from_its_summary_in_a_new_working_folder(vlm_smoke):
    """The next session has the committed summary but not the working folder: the SFT start is trained again
    (the same weights, by hash), and nothing the summary records runs again."""
    tmp_path, results, cmd, first = vlm_smoke
    assert first.returncode == 0
    summary = json.loads((tmp_path / "v4.json").read_text())
    fresh = [*cmd[:cmd.index("--out") + 1], str(tmp_path / "new"), *cmd[cmd.index("--out") + 2:]]
    again = subprocess.run(fresh, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    ran = [x.split("]")[0][1:] for x in again.stdout.splitlines() if x.startswith("[") and "skipped" not in x]
    assert set(ran) == {"sft"}, ran
    after = json.loads((tmp_path / "v4.json").read_text())
    assert after["runs"] == summary["runs"] and after["start"] == summary["start"]
    assert after["timings"]["sft"] == summary["timings"]["sft"]
    # a start trained to other weights here (another CPU's kernels) is replaced by the copy beside the summary
    final = tmp_path / "new" / "sft" / "final" / "model.safetensors"
    saved = (tmp_path / "v4-start" / "model.safetensors").read_bytes()
    final.write_bytes(saved[:-1] + bytes([saved[-1] ^ 1]))
    restored = subprocess.run(fresh, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert restored.returncode == 0 and "continuing from the copy" in restored.stdout, restored.stderr[-2000:]
    assert final.read_bytes() == saved
    # another start (different weights, no copy of them) is refused, not mixed with the recorded runs
    after["start"]["weights"] = "0" * 64
    (tmp_path / "v4.json").write_text(json.dumps(after))
    refused = subprocess.run(fresh, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "is not the one" in refused.stderr
    (tmp_path / "v4.json").write_text(json.dumps(summary))


@pytest.mark.slow
def test_render_writes_the_page_from_the_summary_alone(vlm_smoke, tmp_path):
    smoke, results, cmd, first = vlm_smoke
    assert first.returncode == 0
    summary = json.loads((smoke / "v4.json").read_text())
    (tmp_path / "v4.json").write_text(json.dumps(summary))
    page = tmp_path / "RESULTS.md"
    done = subprocess.run([sys.executable, "experiments/reproduce.py", "--render",
                           "--summary", str(tmp_path / "v4.json"), "--results", str(page)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    text = page.read_text()
    assert "| + rova |" in text and "### Commands" in text and summary["commands"][0] in text
    assert "default: re-evaluation by the verdict's one forward" in text   # the defaults' claims (no seeds here)
    assert not list(tmp_path.glob("*/"))                                    # nothing was run


def lines_of(folder):
    """The conditions of an evaluation's stored samples."""
    return {json.loads(x)["condition"] for f in folder.glob("run_*/samples_*.jsonl")
            for x in f.read_text().splitlines()}


def test_paired_claims_follow_the_stated_rule():
    sys.path.insert(0, str(ROOT / "experiments"))
    import reproduce
    # d = (.1, .1, .1): mean .1 > 2 SE (0)
    assert reproduce.paired([0.5, 0.6, 0.7], [0.4, 0.5, 0.6])[1] == "holds"
    # d = (.1, .1, -.05): mean .05, sd .0866, SE .05: 0 < mean <= 2 SE
    assert reproduce.paired([0.5, 0.6, 0.3], [0.4, 0.5, 0.35])[1] == "mixed"
    assert reproduce.paired([0.4, 0.6], [0.5, 0.55])[1] == "does not hold"          # -.1, +.05: mean < 0
    diff, verdict = reproduce.paired([None, 0.2], [0.1, 0.1])
    assert verdict == "holds" and diff.startswith("+0.100 ± 0.000")                 # a missing seed is left out
    assert reproduce.paired([], []) == ("–", "not measured")


def test_collapse_rule_by_hand():
    sys.path.insert(0, str(ROOT / "experiments"))
    import reproduce

    def task(acc, const, se):
        return {"accuracy": acc, "best_constant": "A", "constant_accuracy": const, "margin": acc - const, "se": se,
                "collapsed": acc - const <= 2 * se, "top_share": 0.5}   # as diagnostics.constant_margin sets it
    rec = {"one_answer_share": 0.1,
           "tasks": {"t": {"clean": task(0.9, 0.33, 0.05), "perturbed": task(0.6, 0.33, 0.05)}}}
    assert reproduce.collapsed(rec) == []
    rec["tasks"]["t"]["perturbed"] = task(0.42, 0.33, 0.05)       # margin .09 <= 2 SE
    assert len(reproduce.collapsed(rec)) == 1
    rec["one_answer_share"] = 0.25
    assert len(reproduce.collapsed(rec)) == 2


def test_stages_keep_the_timings_of_another_process(tmp_path):
    """Two reproduce.py processes on one OUT (disjoint --seeds): a stage's time is added to the file as it is
    now, not to the copy read at start, so neither loses the other's stages."""
    sys.path.insert(0, str(ROOT / "experiments"))
    import reproduce
    (tmp_path / "logs").mkdir()
    st = reproduce.Stages(tmp_path)
    (tmp_path / "timings.json").write_text(json.dumps({"rl-grpo-s1": 5.0}))   # the other process's stage
    done = tmp_path / "done"
    st.run("mine", [sys.executable, "-c", f"open({str(done)!r}, 'w')"], done.is_file)
    timings = json.loads((tmp_path / "timings.json").read_text())
    assert set(timings) == {"rl-grpo-s1", "mine"} and timings["rl-grpo-s1"] == 5.0 and timings["mine"] > 0


def test_paired_gain_by_hand():
    sys.path.insert(0, str(ROOT / "experiments"))
    import reproduce
    before = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.5}
    after = {"a": 1.0, "b": 1.0, "c": 0.0, "e": 1.0}   # d unscored after, e unscored before: both left out
    g, se, n = reproduce.paired_gain(after, before)
    # differences (0, 1, 0): mean 1/3, sd sqrt(((1/3)^2 * 2 + (2/3)^2) / 2) = sqrt(1/3), SE sqrt(1/3) / sqrt(3) = 1/3
    assert n == 3 and abs(g - 1 / 3) < 1e-12 and abs(se - 1 / 3) < 1e-12
    assert reproduce.paired_gain({"a": 1.0}, {"a": 0.0}) == (None, None, 1)


def test_diagnose_within_group_correlation_by_hand():
    sys.path.insert(0, str(ROOT / "experiments"))
    import diagnose
    assert diagnose.within_corr([[0, 1, 2]], [[0, 2, 4]]) == 1.0
    # group means removed: dx = (-.5, .5, .5, -.5), dy = (-.5, .5, -.5, .5) -> sum dx dy = 0
    assert diagnose.within_corr([[0, 1], [1, 0]], [[0, 1], [0, 1]]) == 0.0
    # a shift of one whole group does not count: (0, 1) and (10, 11) vs (1, 0) and (0, 1) -> 0
    assert diagnose.within_corr([[0, 1], [10, 11]], [[1, 0], [0, 1]]) == 0.0
    assert diagnose.within_corr([[1, 1]], [[0, 1]]) is None
    assert diagnose.varies([0, 0.5]) and not diagnose.varies([1.0, 1.0])


@pytest.mark.slow
def test_reproduce_smoke_text_policy(tmp_path):
    """Embodied-R's pipeline (--policy text, the cv perceiver): SFT, RL, evaluation, its own marked section."""
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\n<!-- reproduce:begin -->\nvlm tables\n<!-- reproduce:end -->\n")
    cmd = [sys.executable, "experiments/reproduce.py", "--smoke", "--policy", "text", "--modes", "rova",
           "--out", str(tmp_path / "r"), "--results", str(results)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    text = results.read_text()
    assert "<!-- reproduce:begin -->\nvlm tables\n<!-- reproduce:end -->" in text  # the VLM section is kept
    section = text.split("<!-- reproduce-text:begin -->", 1)[1].split("<!-- reproduce-text:end -->", 1)[0]
    assert "| + rova |" in section and "--policy text" in section and "--perceiver cv" in section
    assert set(json.loads((tmp_path / "r" / "timings.json").read_text())) == {"sft", "rl-rova-s0", "eval-sft",
                                                                             "eval-rova-s0"}
    assert (tmp_path / "r" / "perception_cache.sqlite").is_file()


@pytest.mark.slow
def test_robust_to_smoke_writes_its_section_and_resumes(vlm_smoke, tmp_path):
    """experiments/robust_to.py on reproduce.py's smoke output: every stage runs, its own marked section is
    written (the other sections kept), the rules row is there, and a second run redoes nothing."""
    start = vlm_smoke[0] / "r"
    assert vlm_smoke[3].returncode == 0
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\n<!-- reproduce:begin -->\nvlm tables\n<!-- reproduce:end -->\n")
    cmd = [sys.executable, "experiments/robust_to.py", "--smoke", "--from", str(start), "--direct", "grpo-aug,rova",
           "--out", str(tmp_path / "rt"), "--results", str(results)]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    text = results.read_text()
    assert "<!-- reproduce:begin -->\nvlm tables\n<!-- reproduce:end -->" in text
    section = text.split("<!-- robust-to:begin -->", 1)[1].split("<!-- robust-to:end -->", 1)[0]
    for row in ("| direct: SFT checkpoint", "| direct: + grpo-aug (2 steps) |", "| direct: + rova (2 steps) |",
                "| agent, tier rules applied by code", "| agent, warm-up + confidence-cost GRPO (2 steps) |",
                "| Blur | Noise | Glare | Occl. | Low light |", "robust_to_mean_rho=", "--agent-synthesis rules"):
        assert row in section, row
    timings = json.loads((tmp_path / "rt" / "timings.json").read_text())
    assert set(timings) == {"reliability", "eval-sft-direct", "eval-grpo-aug-s0-direct", "eval-rova-s0-direct",
                            "eval-sft-agent", "eval-sft-agent-rules", "agent-warmup", "eval-agent-warmup",
                            "agent-rl-s0", "eval-agent-s0"}
    log = [json.loads(x) for x in (tmp_path / "rt" / "runs" / "agent-s0" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["stage"] == "rl"] == [1, 2]
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("done already, skipped") == len(timings)


def test_robust_to_needs_the_reproduce_checkpoints(tmp_path):
    run = subprocess.run([sys.executable, "experiments/robust_to.py", "--from", str(tmp_path / "none")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "run experiments/reproduce.py" in run.stderr and "sft/final" in run.stderr


def test_robust_to_labels_the_direct_runs_with_their_own_rl_steps(tmp_path, monkeypatch):
    """The direct rows name the RL steps of reproduce.py's runs (from their summary.json), not the agent's
    --rl-steps; a run whose summary is missing or silent shows '?'."""
    import argparse
    import importlib

    monkeypatch.syspath_prepend(str(ROOT / "experiments"))
    robust_to = importlib.import_module("robust_to")
    for seed, steps in ((0, 100), (1, 100), (2, 300)):
        run = tmp_path / "runs" / f"grpo-s{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"config": {"rl_steps": steps}}))
    args = argparse.Namespace(start=str(tmp_path), seeds=[0, 1])
    assert robust_to.direct_steps(args, "grpo") == "100"
    assert robust_to.direct_steps(argparse.Namespace(start=str(tmp_path), seeds=[0, 2]), "grpo") == "100/300"
    assert robust_to.direct_steps(argparse.Namespace(start=str(tmp_path), seeds=[0, 3]), "grpo") == "100/?"
