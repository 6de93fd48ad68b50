"""Time every perturbation subtype on a 16x448x448 clip against np.copy of the same clip.

    python benchmarks/bench_perturb.py [--frames 16 --size 448 --repeats 9]
    python benchmarks/bench_perturb.py --baseline OLD/perturb.py   # and each subtype against another engine

Ratios to np.copy, measured in the same process, are what to compare across machines (these machines
are noisy; absolute milliseconds are not). Each figure is the median of `repeats` timed runs after 12
warm-up runs (steady state); np.copy is the minimum over many runs, as it sits in cache and wanders.
Ends with the line `median_ratio_vs_copy=<x> max_ratio_vs_copy=<y>`. With a CUDA device, GPU figures
follow.

np.copy of a 16x448x448 clip (9.6 MB) runs at cache speed where the CPU's last-level cache holds the clip
(this project's 2-core machines have 16 to 32 MiB) and at memory speed where it does not, so the same engine's
ratios differ about 2x between such machines. --baseline PATH (another perturb.py, e.g. a git worktree of an
older commit, with the machinery beside it) times that engine on the same clip, interleaved run by run with this
one, and adds each subtype's ms ratio (this / baseline) and the line `median_ratio_vs_baseline=<x>
max_ratio_vs_baseline=<y>`: the comparison that does not depend on the cache.
"""
import argparse
import importlib.util
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import perturb  # noqa: E402
from machinery.datasets import synthetic  # noqa: E402


def load_engine(path):
    """perturb.py from this checkout, or the perturb.py at `path` with the machinery beside it (another checkout's
    engine: its kernels, scene and occluders too, not this checkout's), imported apart from this checkout's
    modules, which are put back afterwards."""
    if not path:
        import perturb
        return perturb
    ours = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "perturb" or k.split(".")[0] == "machinery"}
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        spec = importlib.util.spec_from_file_location("perturb", os.path.abspath(path))
        engine = importlib.util.module_from_spec(spec)
        sys.modules["perturb"] = engine  # dataclasses look their module up
        spec.loader.exec_module(engine)
    finally:
        sys.path.pop(0)
        for k in [k for k in sys.modules if k == "perturb" or k.split(".")[0] == "machinery"]:
            del sys.modules[k]
        sys.modules.update(ours)
    return engine


def timed(fn, repeats, sync=lambda: None, warmup=12):
    """Timed runs after `warmup` untimed ones: the first ~10 applies of a process are slower while
    the allocator settles on reusing its large blocks (measured: ~25 ms, then a steady ~17 ms)."""
    for _ in range(warmup):
        fn()
    sync()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        runs.append(time.perf_counter() - t0)
    return runs


def interleaved(fns, repeats, rounds=3):
    """Median seconds of each fn over `rounds` rounds, each timing every fn in turn (`repeats` runs after 4
    warm-up runs), so that all see the same machine. (Blocks, not single runs in turn: each switch of engine
    changes what the allocator and the caches hold.)"""
    runs = [[] for _ in fns]
    for _ in range(rounds):
        for fn, r in zip(fns, runs):
            r += timed(fn, repeats, warmup=4)
    return [statistics.median(r) for r in runs]


def cpu_table(clip, args, base):
    """({subtype: seconds}, {subtype: the baseline engine's seconds} or {}, the np.copy floor in seconds)."""
    copy_s = min(timed(lambda: np.copy(clip), 200))
    print(f"clip {clip.shape} uint8, np.copy {copy_s * 1e3:.3f} ms (min of 200)")
    seconds, before = {}, {}
    for i, sub in enumerate(perturb.SUBTYPES):
        spec = perturb.PerturbSpec(sub, eta=args.eta, seed=i)
        if base is None:
            seconds[sub] = statistics.median(timed(lambda: perturb.apply(clip, spec), args.repeats))
        else:
            old = base.PerturbSpec(sub, eta=args.eta, seed=i)
            seconds[sub], before[sub] = interleaved([lambda: perturb.apply(clip, spec),
                                                     lambda: base.apply(clip, old)], args.repeats)
        copy_s = min(copy_s, min(timed(lambda: np.copy(clip), 20)))  # re-measured beside each subtype
    print(f"np.copy floor over the run: {copy_s * 1e3:.3f} ms")
    return seconds, before, copy_s


def report(seconds, before, copy_s):
    extra = f"{'baseline ms':>13}{'x baseline':>12}" if before else ""
    print(f"{'subtype':<14}{'ms/clip':>10}{'x copy':>10}{extra}")
    for sub, s in seconds.items():
        extra = f"{before[sub] * 1e3:>13.2f}{s / before[sub]:>12.2f}" if before else ""
        print(f"{sub:<14}{s * 1e3:>10.2f}{s / copy_s:>10.1f}{extra}")
    vals = [s / copy_s for s in seconds.values()]
    print(f"median_ratio_vs_copy={statistics.median(vals):.1f} max_ratio_vs_copy={max(vals):.1f}")
    if before:
        vs = [seconds[sub] / before[sub] for sub in before]
        print(f"median_ratio_vs_baseline={statistics.median(vs):.2f} max_ratio_vs_baseline={max(vs):.2f}")


def gpu_table(clip, args):
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        return
    x = torch.from_numpy(clip).cuda()
    sync = torch.cuda.synchronize
    gcopy = statistics.median(timed(lambda: x.clone(), 50, sync))
    print(f"GPU ({torch.cuda.get_device_name()}): clone {gcopy * 1e3:.3f} ms")
    for i, sub in enumerate(perturb.SUBTYPES):
        spec = perturb.PerturbSpec(sub, eta=args.eta, seed=i)
        ms = statistics.median(timed(lambda: perturb.apply(x, spec), args.repeats, sync))
        print(f"{sub:<14}{ms * 1e3:>10.2f} ms  {ms / gcopy:>8.1f} x clone")


def main():
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--size", type=int, default=448)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--eta", type=float, default=perturb.DEFAULT_ETA)
    ap.add_argument("--baseline", help="another perturb.py to time beside this one, subtype by subtype")
    args = ap.parse_args()
    clip, _ = synthetic.sample_clip(args.frames, args.size, args.size)
    report(*cpu_table(clip, args, load_engine(args.baseline) if args.baseline else None))
    gpu_table(clip, args)


if __name__ == "__main__":
    main()
