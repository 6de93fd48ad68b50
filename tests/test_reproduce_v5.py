"""experiments/reproduce_v5.py --quick: every stage runs and the summary has the keys the issue names; a rerun
(the same command, a later chunk) runs nothing; a chunk whose minutes are spent starts no stage. The claims'
arithmetic is checked against hand-made summaries."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import reproduce_v5_report as report  # noqa: E402


@pytest.mark.slow
def test_quick_pipeline_writes_the_summary_and_continues(tmp_path):
    out, summary = tmp_path / "r", tmp_path / "v5.json"
    cmd = [sys.executable, "experiments/reproduce_v5.py", "--quick", "--out", str(out), "--summary", str(summary),
           "--results", str(tmp_path / "RESULTS.md")]
    stopped = subprocess.run([*cmd, "--chunk-minutes", "0"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert stopped.returncode == 0 and "chunk over" in stopped.stdout and not (out / "sft").exists()
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    s = json.loads(summary.read_text())
    import reproduce_v5
    assert s["version"] == 5 and s["rules_commit"] == reproduce_v5.rules_commit()   # (git's answer here)
    assert not (ROOT / ".git").exists() or len(s["rules_commit"]) == 40
    assert {"seeds", "mde"} <= set(s["power"]) and {"orig", "avg"} <= set(s["start"])
    assert set(s["runs"]) == {"rova-s0", "dual-s0", "rova-random-s0"}
    for name, run in s["runs"].items():
        for key in ("row", "seed", "orig", "avg", "updates", "steps", "samples_seen", "curriculum", "reeval",
                    "zero_variance_share", "rho", "rho_fresh", "promoted_trained"):
            assert key in run, (name, key)
        assert set(run["reeval"]) >= {"promoted", "evicted_easy", "evicted_nmax", "kept"}
        assert run["curriculum"] and set(run["curriculum"][0]) == {"steps", "easy_discarded", "hard_deferred", "rho",
                                                                    "buffer"}
    assert s["runs"]["dual-s0"]["updates"] == s["runs"]["dual-s0"]["steps"] == 4
    assert all({"claim", "difference", "se", "mde", "verdict"} <= set(c) for c in s["claims"])
    assert (tmp_path / "v5-start" / "config.json").is_file() and (out / "v5-curriculum.png").is_file()
    page = (tmp_path / "RESULTS.md").read_text()
    assert "<!-- reproduce-v5:begin -->" in page and "| Table 12 steps |" in page and "**primary**" in page
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "kept from" in again.stdout
    assert "[rl-" not in again.stdout.replace("done already", "")   # nothing trained again
    shown = page.split("<!-- reproduce-v5:begin -->\n")[1].split("<!-- reproduce-v5:end -->")[0]
    rendered = subprocess.run([sys.executable, "experiments/reproduce_v5.py", "--render", "--print", "--summary",
                               str(summary)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0 and rendered.stdout == shown   # the page's section from the summary alone


def _summary(rova, dual, start=(0.8, 0.5), seeds=2):
    """A summary with per-clip [orig, avg] for rova and dual at each seed (lists of {clip: [o, a]})."""
    runs = {f"rova-s{i}": {"clips": rova[i]} for i in range(seeds)}
    runs |= {f"dual-s{i}": {"clips": dual[i]} for i in range(seeds)}
    clips = {c: list(start) for c in rova[0]}
    return {"start": {"clips": clips, "orig": start[0]}, "power": {"seeds": seeds},
            "settings": {"ablation_seeds": [0], "ablations": {}}, "runs": runs}


def test_the_primary_claim_by_hand():
    # seed 0: rova - dual = +0.02 on both clips; seed 1: +0.04 and 0.0 -> matrix [[.02, .02], [.04, 0]], mean .02
    rova = [{"a": [0.9, 0.62], "b": [0.9, 0.52]}, {"a": [0.9, 0.64], "b": [0.9, 0.50]}]
    dual = [{"a": [0.9, 0.60], "b": [0.9, 0.50]}, {"a": [0.9, 0.60], "b": [0.9, 0.50]}]
    c = next(x for x in report.claims(_summary(rova, dual)) if x["primary"])
    assert abs(c["difference"] - 0.02) < 1e-12 and c["seeds"] == 2
    # V_seed = var(.02, .02) / 2 = 0; V_clip = var(.03, .01) / 2 = 1e-4; V_cell = var(.02, .02, .04, 0) / 4
    # = (2.667e-4) / 4: V = 0 + 1e-4 - 6.67e-5 < V_clip, so V = 1e-4 and SE = 0.01
    assert abs(c["se"] - 0.01) < 1e-9 and abs(c["p"] - 0.0455) < 1e-4 and c["verdict"] == "holds"   # z = 2
    # the start is 0.5 on every clip: ROVA above it by .12 / .02 / .14 / 0 -> a secondary claim, Holm-adjusted
    robust = next(x for x in report.claims(_summary(rova, dual)) if x["claim"].startswith("robust training"))
    assert abs(robust["difference"] - 0.07) < 1e-12 and robust["p_holm"] >= robust["p"]


def test_the_main_rows_get_the_seeds_the_rest_of_the_budget_affords():
    import reproduce_v5 as v5
    args = v5.parse_args(["--hours", "2"])
    # the pilot: rova 300 s, dual 200 s, evaluations 50 s; 1,800 s spent before the rows
    timings = {"sft": 400.0, "rl-budget-lr0.0001": 500.0, "rl-pilot-rova-s100": 280.0, "rl-pilot-rova-s101": 320.0,
               "rl-pilot-dual-s100": 200.0, "validation-pilot-rova-s100": 50.0, "validation-pilot-dual-s100": 50.0}
    assert sum(timings.values()) == 1800.0
    # per seed: 300 + 3 * 200 + 4 * 50 = 1,100 s; ablations: 4 rows x 3 seeds x (300 + 50) = 4,200 s;
    # left: 7,200 - 1,800 - 4,200 = 1,200 s -> 1 seed
    assert v5.affordable_seeds(timings, args) == 1
    assert v5.affordable_seeds(timings, v5.parse_args(["--hours", "4"])) == 7   # (14,400 - 6,000) // 1,100


def test_the_recorded_rl_commands_are_built_again_with_the_fill_up_pinned(tmp_path, monkeypatch):
    """v5's ROVA steps filled their batch (train.py's fill_rounds 4 then, 0 now): a reproduction builds each recorded
    train.py command again, with that setting pinned."""
    import shutil
    import reproduce_v5 as v5
    summary = tmp_path / "v5.json"
    shutil.copy(ROOT / "experiments" / "results" / "v5.json", summary)
    out = tmp_path / "runs" / "reproduce-v5"
    r = v5.Reproduction(v5.parse_args(["--out", str(out), "--summary", str(summary), "--results",
                                       str(tmp_path / "RESULTS.md")]))
    built = []
    monkeypatch.setattr(r, "run", lambda name, cmd, done: built.append(
        " ".join(cmd).replace(sys.executable, "python").replace(str(tmp_path) + "/", "")))
    r.train("rova-s0", "rova", 0, out / "runs" / "rova-s0", r.rl_settings())
    r.train("rova-no-reeval-s1", "rova", 1, out / "runs" / "rova-no-reeval-s1",
            r.rl_settings(v5.ABLATIONS["rova-no-reeval"][1]))
    # (a chunk that ran on another path recorded absolute ones)
    recorded = [re.sub(r"/\S*?/(runs/reproduce-v5)", r"\1", c) for c in json.loads(summary.read_text())["commands"]]
    for cmd in built:
        assert cmd.endswith(" --set fill_rounds=4") and cmd[:-len(" --set fill_rounds=4")] in recorded, cmd


def test_v5s_claims_keep_the_pre_registered_figures_beside_students_t():
    """The claims again from experiments/results/v5.json's data: the committed rule's p, MDE and verdict as recorded, and
    Student's t at G - 1 df beside them (what the summary holds)."""
    s = json.loads((ROOT / "experiments" / "results" / "v5.json").read_text())
    again = report.claims(s)
    for recorded, new in zip(s["claims"], again):
        assert recorded == new   # the summary holds the t columns too, and nothing pre-registered moved
    robust = next(c for c in again if c["claim"].startswith("robust training"))
    # t = 0.04751 / 0.01769 = 2.686 at 5 df: p 0.0435; Holm ranks it 5th of 10: 6 x 0.0435 = 0.261
    assert robust["p_holm"] == pytest.approx(0.0362, abs=1e-4) and robust["verdict"] == "holds"
    assert robust["p_holm_t"] == pytest.approx(0.261, abs=1e-3) and robust["verdict_t"] == "inconclusive"
    table2 = next(c for c in again if c["claim"].startswith("Table 2"))
    assert table2["p_holm_t"] == pytest.approx(0.0487, abs=1e-4) and table2["verdict_t"] == "holds"   # 7 x 0.00695
    fig4c = next(c for c in again if c["claim"].startswith("Fig. 4c"))
    assert fig4c["df"] == 2 and (fig4c["verdict"], fig4c["verdict_t"]) == ("does not hold", "inconclusive")
    primary = next(c for c in again if c["primary"])
    assert primary["mde"] == pytest.approx(0.0185, abs=1e-4) and primary["mde_t"] == pytest.approx(0.0230, abs=1e-4)
    cost = next(c for c in again if c["claim"] in report.RELABELLED)
    assert cost["verdict"] == "does not hold" and cost["relabel"].startswith("uninformative")


def test_table13_from_app_g_is_decided_when_measured():
    s = json.loads((ROOT / "experiments" / "results" / "v5.json").read_text())
    s.pop("cost_app_g", None)
    page = report.render(s)
    assert "uninformative: the fill-up trains a full batch" in page and report.APP_G_COMMAND in page
    assert "extra self-assessment rollouts" not in page and "1.84x" in page   # 1,102 samples rolled out vs 600
    modes = ("grpo", "dual", "rova")
    comp = {m: {"rollout": 1.0, "self_assessment": 0.1, "alignment_reward": 0.5, "backward": 1.0} for m in modes}
    cost = {"rova_over_dual": 0.9, "rova_over_grpo": 1.5, "rho": 0.5, "trained_share": 0.55, "predicted_ratio": 0.8,
            "components": comp, "sec_per_step": {m: 2.6 for m in modes}, "samples_per_step": {m: 4 for m in modes},
            "trained_per_step": {m: 4 for m in modes}, "repeats": 2, "steps": 10, "warmup": 2, "fill_rounds": 0,
            "spread": {}, "command": "python benchmarks/bench_step.py --v5", "date": "2026-12-08", "commit": "abc",
            "per_repeat": [{"rova_over_dual": 0.95}, {"rova_over_dual": 0.85}]}
    assert "Table 13 (a ROVA step cheaper than a dual step): **holds**" in report.render(dict(s, cost_app_g=cost))
    cost["per_repeat"][0]["rova_over_dual"] = 1.02
    assert report.app_g_verdict(cost) == "mixed"
    cost["per_repeat"] = [{"rova_over_dual": 1.1}, {"rova_over_dual": 1.2}]
    assert report.app_g_verdict(cost) == "does not hold"
