"""benchmarks/bench_step.py: Eq. 15's predicted ratio by hand, v5's settings, and a smoke run that writes
`cost_app_g` into a summary (an untrained tiny model: the figures say nothing, the keys and sums must hold)."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_step  # noqa: E402


def test_eq15_predicted_ratio_by_hand():
    # App. G Eq. 19's own numbers, per sample in units of C_fwd: rollout 2 G = 24, judge 0.4, alignment 2 x 0.9 = 1.8,
    # backward 1.5 G = 18, rho 0.869: (24 + 0.4 + 0.869 x 19.8) / (24 + 1.8 + 18) = 41.606 / 43.8 = 0.9499 (the
    # paper: 41.60 / 43.80 = 0.950)
    assert bench_step.predicted_ratio(0.869, 24, 0.4, 1.8, 18) == pytest.approx(41.6062 / 43.8)
    # per step of N = 4: rollout 2 s, judge 0.5 s, alignment 1 s, backward 1 s, rho 0.5: (2 + 0.5 + 1) / 4 = 0.875
    assert bench_step.predicted_ratio(0.5, 2.0, 0.5, 1.0, 1.0) == 0.875
    assert bench_step.predicted_ratio(1.0, 2.0, 0.0, 1.0, 1.0) == 1.0   # nothing filtered, nothing assessed
    # from a run's modes: dual's rollout, alignment and backward, rova's self-assessment and trained share
    modes = {"dual": {"components": {"rollout": 2.0, "alignment_reward": 1.0, "backward": 1.0,
                                     "self_assessment": 9.0}},
             "rova": {"components": {"rollout": 9.0, "alignment_reward": 9.0, "backward": 9.0,
                                     "self_assessment": 0.5}, "trained_share": 0.5, "rho": 0.1}}
    assert bench_step.predicted(modes) == 0.875


def test_v5_settings_from_the_summary_explicit_flags_win():
    args = bench_step.parse_args(["--v5", "--steps", "3", "--batch-size", "2"])
    s = json.loads((ROOT / "experiments" / "results" / "v5.json").read_text())
    assert args.model == str(ROOT / "experiments" / "results" / "v5-start") and args.lr == s["budget"]["lr"] == 1e-4
    assert (args.group_size, args.max_new_tokens, args.frames, args.max_pixels, args.reeval_period) == (8, 64, 8, 3136,
                                                                                                        10)
    assert args.eta == s["settings"]["toy"]["eta"] and args.batch_size == 2 and args.steps == 3
    assert args.fill_rounds == 0   # App. G's step (train.py's default)


@pytest.mark.slow
def test_smoke_run_writes_cost_app_g(tmp_path, capsys):
    summary = tmp_path / "v5.json"
    summary.write_text(json.dumps({"version": 5, "runs": {}}))
    bench_step.main(["--steps", "1", "--warmup", "0", "--repeats", "2", "--batch-size", "2", "--group-size", "2",
                     "--max-new-tokens", "8", "--reeval-period", "1", "--work", str(tmp_path / "w"),
                     "--json", str(tmp_path / "out.json"), "--write", str(summary)])
    out = json.loads((tmp_path / "out.json").read_text())
    assert [r["seed"] for r in out["repeats"]] == [0, 1]
    for mode, r in out["modes"].items():   # means over repeats; the components and "other" add up to the step
        assert abs(sum(r["components"].values()) - r["sec_per_step"]) < 1e-9
        assert r["sec_per_step"] == pytest.approx(sum(x["modes"][mode]["sec_per_step"] for x in out["repeats"]) / 2)
    assert out["rova_over_dual"] == out["modes"]["rova"]["sec_per_step"] / out["modes"]["dual"]["sec_per_step"]
    assert out["modes"]["dual"]["rho"] == 1.0 and out["modes"]["rova"]["samples_per_step"] == 2
    s = json.loads(summary.read_text())
    cost = s["cost_app_g"]
    assert s["version"] == 5 and {"rova_over_dual", "rova_over_grpo", "rho", "predicted_ratio", "components",
                                  "command", "date", "commit", "repeats", "spread"} <= set(cost)
    assert cost["repeats"] == 2 and cost["fill_rounds"] == 0 and cost["command"].startswith(
        "python benchmarks/bench_step.py --steps 1")
    assert cost["spread"]["rova_over_dual"]["min"] <= cost["spread"]["rova_over_dual"]["max"]
    assert cost["predicted_ratio"] == pytest.approx(bench_step.predicted(out["modes"]))
    assert "predicted_ratio=" in capsys.readouterr().out
