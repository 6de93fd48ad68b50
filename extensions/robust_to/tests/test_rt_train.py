"""extensions/robust_to/train.py's own checks, as a user meets them (a subprocess)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_a_rollout_engine_it_never_uses_is_refused_in_one_line_before_any_work(tmp_path):
    """The agent generates with transformers and its update syncs no engine: --rollout-engine vllm would build an
    engine after SFT and leave it unused. Refused by the flag check: one line, exit 2, nothing written."""
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "extensions.robust_to.train", "--out", str(out), "--mode", "grpo",
                           "--rollout-engine", "vllm"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "error: --rollout-engine vllm: Robust-TO's agent" in lines[-1], done.stderr
    assert "use --rollout-engine hf" in lines[-1] and not out.exists()
