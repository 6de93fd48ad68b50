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
                            "bench-step"}
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("done already, skipped") == len(timings)
    assert json.loads((tmp_path / "r" / "timings.json").read_text()) == timings
