"""benchmarks/reproduce.py and bench_step.py with tiny settings: every stage runs, the tables are written
between the markers (text around them kept), and a second run redoes nothing."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_reproduce_smoke_writes_the_tables_and_resumes(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\nhand-written discussion\n\n<!-- reproduce:begin -->\nold\n<!-- reproduce:end -->\n\ntail\n")
    cmd = [sys.executable, "benchmarks/reproduce.py", "--smoke", "--modes", "grpo-aug,rova", "--out", str(tmp_path / "r"),
           "--results", str(results)]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    text = results.read_text()
    assert text.startswith("# Results\n\nhand-written discussion\n") and text.rstrip().endswith("tail")
    assert "\nold\n" not in text
    for row in ("| SFT checkpoint", "| + grpo-aug |", "| + rova |", "rova_over_grpo=", "rova_over_dual="):
        assert row in text, row
    bench = json.loads((tmp_path / "r" / "bench_step.json").read_text())
    assert set(bench["modes"]) == {"grpo", "dual", "rova"}
    for mode, r in bench["modes"].items():  # the components and "other" add up to the mean step
        assert abs(sum(r["components"].values()) - r["sec_per_step"]) < 1e-9
        assert r["components"]["clean_rollout"] > 0
        assert (r["components"]["perturbed_rollout"] > 0) == (mode != "grpo")
    assert bench["rova_over_grpo"] == bench["modes"]["rova"]["sec_per_step"] / bench["modes"]["grpo"]["sec_per_step"]
    timings = json.loads((tmp_path / "r" / "timings.json").read_text())
    assert set(timings) == {"sft", "rl-grpo-aug-s0", "rl-rova-s0", "eval-sft", "eval-grpo-aug-s0", "eval-rova-s0",
                            "bench-step", "diagnose"}
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("done already, skipped") == len(timings)
    assert json.loads((tmp_path / "r" / "timings.json").read_text()) == timings


def test_diagnose_within_group_correlation_by_hand():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import diagnose
    assert diagnose.within_corr([[0, 1, 2]], [[0, 2, 4]]) == 1.0
    # group means removed: dx = (-.5, .5, .5, -.5), dy = (-.5, .5, -.5, .5) -> sum dx dy = 0
    assert diagnose.within_corr([[0, 1], [1, 0]], [[0, 1], [0, 1]]) == 0.0
    # a shift of one whole group does not count: (0, 1) and (10, 11) vs (1, 0) and (0, 1) -> 0
    assert diagnose.within_corr([[0, 1], [10, 11]], [[1, 0], [0, 1]]) == 0.0
    assert diagnose.within_corr([[1, 1]], [[0, 1]]) is None
    assert diagnose.varies([0, 0.5]) and not diagnose.varies([1.0, 1.0])


def test_reproduce_smoke_text_policy(tmp_path):
    """Embodied-R's pipeline (--policy text, the cv perceiver): SFT, RL, evaluation, its own marked section."""
    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\n<!-- reproduce:begin -->\nvlm tables\n<!-- reproduce:end -->\n")
    cmd = [sys.executable, "benchmarks/reproduce.py", "--smoke", "--policy", "text", "--modes", "rova",
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
