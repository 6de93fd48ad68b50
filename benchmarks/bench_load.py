"""How much a second busy process slows training on a shared CPU, with libgomp's default spin-wait and with
the project's setting (cli.GOMP_SPINCOUNT).

    python benchmarks/bench_load.py            # ~3 min on 2 cores

A worker process times the demo's two hot loops on the tiny Qwen2.5-VL: SFT steps (16 clips of 8x56x56,
forward + backward + AdamW) and rollouts (4 clips x 8 samples of 64 tokens), medians over repeats. It runs
once alone and once beside a busy process of the same kind (the same worker, looping), first with libgomp's
own default (GOMP_SPINCOUNT=300000: an idle OpenMP thread spins that long before it sleeps), then with the
project's (cli.GOMP_SPINCOUNT, what the scripts set when the user has set neither OMP_WAIT_POLICY nor
GOMP_SPINCOUNT). Sharing the cores with one equal process should cost about 2x on a machine with as many
cores as one process uses threads; much more than that is the spinning threads of each process stealing
the cores the other's working threads need.

Prints per setting `<setting>: sft alone X s, busy Y s (Z x); rollout ...` and the summary line
`busy_over_alone_default=Z1 busy_over_alone_project=Z2` (mean of the SFT and rollout ratios).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBGOMP_DEFAULT = "300000"  # libgomp's GOMP_SPINCOUNT when neither it nor OMP_WAIT_POLICY is set


def worker(assets: Path, repeats: int, busy: bool):
    sys.path.insert(0, str(ROOT))
    # before torch, as the scripts do (it leaves a given GOMP_SPINCOUNT alone)
    from machinery import cli  # noqa: F401
    import numpy as np
    import torch

    from machinery.datasets import data

    from machinery.model import policy
    from machinery.training import clips as clips_mod
    import train

    model, processor = policy.load_policy(str(assets / "tiny"), device="cpu")
    samples, _ = data.load_video_r1(assets / "synth" / "train.json")
    cfg = train.Config(frames=8, max_pixels=56 * 56, video_cache=64)
    clips, observer = clips_mod.Clips(cfg, [], len(samples)), train.Observer(cfg)
    batch = samples[:16]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    prompts = policy.make_inputs(processor, [data.build_messages(s) for s in batch[:4]],
                                 [clips.get(s) for s in batch[:4]])
    if busy:
        print("ready", flush=True)
    sft, roll = [], []
    while busy or len(sft) < repeats:
        t0 = time.perf_counter()
        train.sft_step(cfg, model, processor, batch, clips, observer)
        opt.step()
        opt.zero_grad()
        t1 = time.perf_counter()
        policy.rollout(model, processor, prompts, n=8, max_new_tokens=64)
        sft.append(t1 - t0)
        roll.append(time.perf_counter() - t1)
    print(json.dumps({"sft": float(np.median(sft[2:])), "rollout": float(np.median(roll[2:]))}), flush=True)


def measure(assets, spincount, repeats, busy):
    env = {**os.environ, "GOMP_SPINCOUNT": spincount}
    env.pop("OMP_WAIT_POLICY", None)
    cmd = [sys.executable, __file__, "--worker", str(assets), "--repeats", str(repeats)]
    other = None
    if busy:
        other = subprocess.Popen(cmd + ["--busy"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 text=True)
        assert other.stdout.readline().strip() == "ready"
    try:
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    finally:
        if other is not None:
            other.kill()
            other.wait()
    return json.loads(run.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=12, help="timed SFT steps and rollouts per measurement")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--busy", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(Path(args.worker), args.repeats, args.busy)
    sys.path.insert(0, str(ROOT))
    from machinery import cli
    with tempfile.TemporaryDirectory() as tmp:
        assets = Path(tmp)
        subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                        "from machinery.datasets import synthetic; "
                        "from machinery.model import tiny as tiny_model; tiny_model.build_tiny(sys.argv[2] + '/tiny'); "
                        "synthetic.make_synthetic(sys.argv[2] + '/synth', n=16, seed=0, num_frames=8, size=56)",
                        str(ROOT), tmp], check=True, capture_output=True)
        ratios = {}
        for label, spin in (("default", LIBGOMP_DEFAULT), ("project", cli.GOMP_SPINCOUNT)):
            alone = measure(assets, spin, args.repeats, busy=False)
            shared = measure(assets, spin, args.repeats, busy=True)
            r = {k: shared[k] / alone[k] for k in alone}
            ratios[label] = sum(r.values()) / len(r)
            print(f"{label} (GOMP_SPINCOUNT={spin}): sft alone {alone['sft']:.3f} s, busy {shared['sft']:.3f} s "
                  f"({r['sft']:.2f}x); rollout alone {alone['rollout']:.3f} s, busy {shared['rollout']:.3f} s "
                  f"({r['rollout']:.2f}x)", flush=True)
    print(f"busy_over_alone_default={ratios['default']:.2f} busy_over_alone_project={ratios['project']:.2f}")


if __name__ == "__main__":
    main()
