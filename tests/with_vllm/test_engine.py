"""train.py --rollout-engine vllm (machinery/model/engine.py), in the vLLM environment: requirements-vllm.txt, built by
`python benchmarks/vllm_check.py --install-only`; .ci/run runs this folder with that venv's python. Each run is a
subprocess: a process holds one engine (vLLM's parallel state is per process)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed in this environment: tests/with_vllm run with the vLLM "
                    "venv's python (python benchmarks/vllm_check.py --install-only; .ci/run)")

from machinery.datasets import synthetic  # noqa: E402
from machinery.model import tiny as tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "ROVA_DIST_TIMEOUT": "120", "VLLM_CPU_KVCACHE_SPACE": "1",
       "TOKENIZERS_PARALLELISM": "false"}
TOLERANCE = 1e-4   # float32 on both sides: kernel rounding (measured <= 1.4e-5)
DRIVE = ROOT / "tests" / "with_vllm" / "drive.py"   # train.main with engine.SYNC less one call


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine")
    tiny = tiny_model.build_tiny(root / "tiny")
    synthetic.make_synthetic(root / "synth", n=4, seed=1, num_frames=4, size=56, eval_fraction=0.25)
    return root, tiny, root / "synth" / "train.json"


def args(assets, out, *extra):
    """--mode grpo on every clip each step: the trained branch's videos recur, so a stale encoder cache shows."""
    root, tiny, train_json = assets
    n = len(json.loads(Path(train_json).read_text()))
    return ["--model", str(tiny), "--data", str(train_json), "--out", str(out), "--frames", "4",
            "--max-pixels", str(56 * 56), "--sft-epochs", "0", "--rl-steps", "3", "--batch-size", str(n),
            "--group-size", "4", "--max-new-tokens", "8", "--save-every", "3", "--mode", "grpo", "--judge", "none",
            "--lr", "3e-3", "--rollout-engine", "vllm", *extra]


def run(argv, drop="none", torchrun=0, timeout=300):
    head = [sys.executable] + (["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(torchrun)]
                               if torchrun else [])
    try:
        return subprocess.run(head + [str(DRIVE), drop, *map(str, argv)], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, **ENV})
    except subprocess.TimeoutExpired:   # a stale engine may hang ("Encoder cache miss", then a generate that waits)
        return subprocess.CompletedProcess(head, -9, "", f"timed out after {timeout} s")


def gaps(out):
    recs = [json.loads(line) for line in (Path(out) / "log.jsonl").read_text().splitlines()]
    return [r.get("engine_logprob_gap") for r in recs if r["stage"] == "rl"]


def test_the_engine_stays_in_sync_with_the_policy_after_every_update(assets, tmp_path):
    done = run(args(assets, tmp_path / "ok"))
    assert done.returncode == 0, done.stderr[-3000:]
    g = gaps(tmp_path / "ok")
    assert len(g) == 3 and all(x is not None for x in g), g
    assert max(g) <= TOLERANCE, g


@pytest.mark.parametrize("drop", ["_reload", "_reset_encoder_cache", "_reset_prefix_cache"])
def test_leaving_out_any_sync_call_is_caught(assets, tmp_path, drop):
    """Without one of the three calls, the check sees stale rollouts (or the engine fails): it checks something."""
    done = run(args(assets, tmp_path / drop), drop=drop)
    caught = done.returncode != 0 or max(x or 0.0 for x in gaps(tmp_path / drop)) > 100 * TOLERANCE
    assert caught, (drop, gaps(tmp_path / drop))


@pytest.mark.parametrize("kind", ["fsdp2", "ddp-lora"])
def test_two_ranks_each_keep_their_engine_in_sync(assets, tmp_path, kind):
    """torchrun, 2 processes: FSDP2 (each tensor gathered for the sync) or DDP over LoRA adapters (merged for it;
    without dropout, whose noise the update's log-probs would hold); the logged gap is the largest over both ranks."""
    extra = ["--sharding", "fsdp"] if kind == "fsdp2" else ["--lora-r", "4", "--lr", "3e-2", "--set", "lora_dropout=0"]
    done = run(args(assets, tmp_path / kind, *extra), torchrun=2, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    g = gaps(tmp_path / kind)
    assert len(g) == 3 and max(g) <= TOLERANCE, g
    summary = json.loads((tmp_path / kind / "summary.json").read_text())
    assert len(summary["rank_checksums"]) == 2


def test_rewards_and_weights_move_like_the_hf_engines(assets, tmp_path):
    """Same seed, same data, both engines: sampling differs (two samplers), so the rewards agree statistically and
    both runs move the weights by similar amounts."""
    from safetensors.torch import load_file
    hf, vl = tmp_path / "hf", tmp_path / "vllm"
    base = args(assets, hf)
    base[base.index("--rollout-engine") + 1] = "hf"
    assert run(base).returncode == 0
    assert run(args(assets, vl)).returncode == 0
    start = load_file(str(Path(assets[1]) / "model.safetensors"))

    def moved(out):
        w = load_file(str(out / "final" / "model.safetensors"))
        return float(np.sqrt(sum(((w[k].float() - start[k].float()) ** 2).sum().item() for k in start)))
    rewards = {o: [json.loads(x)["r_total"] for x in (o / "log.jsonl").read_text().splitlines()
                   if json.loads(x)["stage"] == "rl"] for o in (hf, vl)}
    assert abs(np.mean(rewards[hf]) - np.mean(rewards[vl])) < 0.5, rewards
    assert 0.5 < moved(vl) / moved(hf) < 2.0, (moved(vl), moved(hf))
