"""extensions/robust_to/eval.py: eval_pvrbench.py with Robust-TO's parts: the orchestrated agent as the model
evaluated (--model robust-to:PATH, its rules ablation), the robust-to protocol and its table, and --help."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import perturb
from extensions.robust_to import eval as rt_eval

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tiny(tiny_path, synthetic_factory):
    return synthetic_factory(n=4, seed=3, num_frames=8, size=56, eval_fraction=0.5), tiny_path


def test_eval_runs_the_agent_under_the_robust_to_protocol(tiny, tmp_path):
    synth, path = tiny
    out = rt_eval.main(["--model", f"robust-to:{path}", "--protocol", "robust-to", "--benchmark",
                        f"synthetic={synth}", "--out", str(tmp_path), "--judge", "none", "--limit", "3",
                        "--max-new-tokens", "6"])
    assert out["config"]["model_name"] == "robust-to-tiny" and out["n_errors"] == 0
    conds = {r for r in out["results"]["pvrbench"]["overall"]}
    assert conds <= {"clean", *perturb.PROTOCOLS["robust-to"]} and len(conds) >= 2
    table = (tmp_path / "robust-to-tiny" / "table.md").read_text()
    assert "| Blur | Noise | Glare | Occl. | Low light |" in table
    # the rules ablation: its own results folder, and every answer is the tiers' (here from the tools)
    out = rt_eval.main(["--model", f"robust-to:{path}", "--agent-synthesis", "rules", "--protocol", "robust-to",
                        "--benchmark", f"synthetic={synth}", "--out", str(tmp_path), "--judge", "none",
                        "--limit", "3", "--max-new-tokens", "6", "--synthesis-tokens", "5"])
    assert out["config"]["model_name"] == "robust-to-tiny-rules" and out["n_errors"] == 0
    keyed, = [json.loads(f.read_text()) for f in (tmp_path / "robust-to-tiny-rules").glob("run_*/config.json")]
    assert keyed["agent_synthesis"] == "rules" and keyed["synthesis_tokens"] == 5
    rows = [json.loads(x) for f in (tmp_path / "robust-to-tiny-rules").glob("*_samples_*.jsonl")
            for x in f.read_text().splitlines()]
    assert rows and all(r["response"].startswith("<think>") and "<answer>" in r["response"] for r in rows)


def test_the_robust_to_subtypes_and_their_table():
    assert rt_eval.ev.parse_subtypes("all", "robust-to") == ["motion_blur", "noise", "overexposure", "static", "night"]
    assert rt_eval.ev.parse_subtypes("fog,noise,motion_blur") == ["fog", "motion_blur", "noise"]  # Table 8's first
    pvr = {"accuracy": {"avg": 0.4, "drop": 0.2, "orig": 0.5},
           "overall": {"clean": 0.5, "motion_blur": 0.25, "noise": 0.5, "night": 0.45}}
    head, rule, row = rt_eval.robust_to_table("m", 8, pvr).splitlines()
    assert head == "| Model | #Fr | Blur | Noise | Glare | Occl. | Low light | Avg. | Orig. |"
    assert rule == "|---" * 9 + "|" and row == "| m | 8 | .25 | .50 | – | – | .45 | .40 ↓20% | .50 |"


def test_help_lists_the_core_flags_and_robust_tos():
    out = subprocess.run([sys.executable, "-m", "extensions.robust_to.eval", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0
    for flag in ("--model", "--benchmark", "--judge", "--agent-k", "--agent-synthesis", "--synthesis-tokens",
                 "robust-to", "\nRobust-TO:\n"):
        assert flag in out.stdout
    assert "--perceiver" not in out.stdout
