"""train.py --rollout-engine vllm (machinery/model/engine.py), in the vLLM environment: requirements-vllm.txt, built by
`python checks/vllm_check.py --install-only`; .ci/run runs this folder with that venv's python. Each run is a
subprocess: a process holds one engine (vLLM's parallel state is per process)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed in this environment: tests/with_vllm run with the vLLM "
                    "venv's python (python checks/vllm_check.py --install-only; .ci/run)")

from machinery.datasets import synthetic  # noqa: E402
from machinery.model import tiny as tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "ROVA_DIST_TIMEOUT": "120", "VLLM_CPU_KVCACHE_SPACE": "1",
       "TOKENIZERS_PARALLELISM": "false"}
TOLERANCE = 1e-4   # the mean |engine - policy| log-prob per token, float32 on both sides (measured ~2e-7)
BF16_TOLERANCE = 5e-3   # a bf16 engine against the float32 policy (measured 0.7e-3 to 1.1e-3 per token)
MAX_GAP = 0.05   # train.Config.engine_max_gap's default: the guard's limit
GUARD = "error: --rollout-engine vllm: the engine's log-probs were"   # the guard's line (engine.SyncGuard)
DRIVE = ROOT / "tests" / "with_vllm" / "drive.py"   # train.main with engine.SYNC less one call, or no sync at all


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


def run(argv, drop="none", torchrun=0, timeout=300, engine_dtype=""):
    head = [sys.executable] + (["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(torchrun)]
                               if torchrun else [])
    env = {**os.environ, **ENV, "ROVA_TEST_ENGINE_DTYPE": engine_dtype}
    try:
        return subprocess.run(head + [str(DRIVE), drop, *map(str, argv)], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:   # a stale engine may hang ("Encoder cache miss", then a generate that waits)
        return subprocess.CompletedProcess(head, -9, "", f"timed out after {timeout} s")


def records(out):
    log = Path(out) / "log.jsonl"
    recs = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    return [r for r in recs if r["stage"] == "rl"]


def gaps(out):
    return [r.get("engine_logprob_gap") for r in records(out)]


def stopped_by_the_guard(done, out):
    """The run stopped in one line naming the cause (exit 2) at step 4: steps 1-3 logged, the first in sync (the
    engine loaded the policy's start), the next two above the limit, and no final weights."""
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    g = gaps(out)
    assert done.returncode == 2 and last.startswith(GUARD) and "engine_max_gap 0.05" in last, done.stderr[-3000:]
    assert len(g) == 3 and g[0] <= BF16_TOLERANCE and min(g[1:]) > MAX_GAP, g
    assert not (Path(out) / "final").exists()


def test_the_engine_stays_in_sync_with_the_policy_after_every_update(assets, tmp_path):
    """Sampling at temperature 0.7 and top-p 0.9: the gap is taken at temperature 1 on both sides (vLLM's raw
    log-probs), so the sampling settings leave it at float32's rounding."""
    done = run(args(assets, tmp_path / "ok", "--set", "temperature=0.7", "--set", "top_p=0.9"))
    assert done.returncode == 0, done.stderr[-3000:]
    g = gaps(tmp_path / "ok")
    assert len(g) == 3 and all(x is not None for x in g), g
    assert max(g) <= TOLERANCE, g


@pytest.mark.parametrize("drop", ["_reload", "_reset_encoder_cache", "_reset_prefix_cache"])
def test_leaving_out_any_sync_call_stops_the_run(assets, tmp_path, drop):
    """Without the reload or the prefix-cache reset the guard sees stale rollouts and stops the run; without the
    encoder-cache reset the engine fails at a video it has seen before."""
    done = run(args(assets, tmp_path / drop, "--rl-steps", "5", "--save-every", "5"), drop=drop)
    if drop == "_reset_encoder_cache":
        assert done.returncode != 0 and "Encoder cache miss" in done.stderr, done.stderr[-3000:]
    else:
        stopped_by_the_guard(done, tmp_path / drop)


@pytest.mark.parametrize("kind", ["full", "lora-bf16"])
def test_a_skipped_sync_stops_the_run_in_one_line(assets, tmp_path, kind):
    """Engine.sync doing nothing (the engine keeps the weights it loaded): at the default engine_max_gap the run
    stops on the 3rd step in a row above it; under LoRA on a bf16 engine too (its own gap, ~1e-3, stays below)."""
    extra = ["--lora-r", "4", "--lr", "3e-2"] if kind == "lora-bf16" else []
    done = run(args(assets, tmp_path / kind, "--rl-steps", "6", "--save-every", "6", *extra), drop="sync",
               engine_dtype="bfloat16" if kind == "lora-bf16" else "")
    stopped_by_the_guard(done, tmp_path / kind)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lora_with_dropout_is_served_in_sync(assets, tmp_path, dtype):
    """LoRA at its default dropout (0.05), served as a LoRA (vLLM's enable_lora; a bf16 engine: the split adapter
    of rank 3r): the gap, taken without dropout, stays at the engine's precision while the adapter moves the
    policy away from its reference (KL > 0 from the second step). float32: after an SFT epoch, so that the model
    holds the KL's frozen "reference" adapter beside the trained one, which the engine must not serve."""
    sft = ["--sft-epochs", "1"] if dtype == "float32" else []
    done = run(args(assets, tmp_path / dtype, "--lora-r", "4", "--lr", "3e-2", *sft),
               engine_dtype="" if dtype == "float32" else dtype)
    assert done.returncode == 0, done.stderr[-3000:]
    recs = records(tmp_path / dtype)
    g, kl = [r["engine_logprob_gap"] for r in recs], [r["kl"] for r in recs]
    assert len(g) == 3 and max(g) <= (TOLERANCE if dtype == "float32" else BF16_TOLERANCE), g
    assert all(k is not None and 0 < k < 10 for k in kl[1:]), kl
    if dtype == "float32":
        assert (tmp_path / dtype / "reference" / "adapter_model.safetensors").is_file()   # (two adapters in RL)


def test_rova_with_reevaluation_samples_on_the_engine_in_sync(assets, tmp_path):
    """--mode rova, the buffer re-evaluated every step by rollouts (reassess=rule: they run on the engine, after
    the sync); the steps that train something (a step may select nothing) measure the engine in sync."""
    out = tmp_path / "rova"
    done = run(args(assets, out, "--mode", "rova", "--reeval-period", "1", "--rl-steps", "4", "--save-every", "4",
                    "--set", "reassess=rule"))
    assert done.returncode == 0, done.stderr[-3000:]
    recs = records(out)
    g = [r["engine_logprob_gap"] for r in recs if r["engine_logprob_gap"] is not None]
    assert len(recs) == 4 and len(g) >= 3 and max(g) <= TOLERANCE, [r["engine_logprob_gap"] for r in recs]
    assert sum(r["promoted"] + r["evicted"] for r in recs) > 0, recs   # the buffer was re-evaluated


@pytest.mark.parametrize("kind", ["fsdp2", "ddp-lora"])
def test_two_ranks_each_keep_their_engine_in_sync(assets, tmp_path, kind):
    """torchrun, 2 processes: FSDP2 (each tensor gathered for the sync) or DDP over LoRA adapters (each rank's engine
    loads the adapter; LoRA's dropout on); the logged gap is the mean over both ranks' tokens."""
    extra = ["--sharding", "fsdp"] if kind == "fsdp2" else ["--lora-r", "4", "--lr", "3e-2"]
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
