"""Behaviour across a refactor: hashes that a change claiming to change no behaviour must leave equal.

- the final weights (every tensor's bytes, sorted by name) of a seeded short run of each mode of train.py
  (half an SFT epoch + 4 RL steps from reproduction v4's start, which answers, so that rewards and advantages
  vary), of Embodied-R's VLM and text policies and of Robust-TO's agent;
- eval_pvrbench.py's outputs and scores on the synthetic benchmark (reason and official styles);
- perturb.apply on the built-in clip for every subtype of the protocols at three intensities.

    python tools/behaviour.py --out runs/behaviour                           # print the hashes
    python tools/behaviour.py --write tools/behaviour-reference.json         # record them (before a refactor)
    python tools/behaviour.py --check tools/behaviour-reference.json         # compare (after it)
    python tools/behaviour.py --demo OUT --check tools/behaviour-reference.json
        # a finished CPU demo (`python train.py --out OUT`, ~9 min): its final weights and before/after table

Float kernels differ between CPUs, so a recorded file is compared on the machine (and library versions) that
wrote it; the file records both.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

START = ROOT / "experiments" / "results" / "v4-start"  # reproduction v4's SFT start: it answers, so rewards vary
RUN = ["--frames", "8", "--max-pixels", str(56 * 56), "--sft-epochs", "0.5", "--sft-batch-size", "4", "--rl-steps",
       "4", "--batch-size", "2", "--group-size", "4", "--max-new-tokens", "64", "--save-every", "2", "--seed", "3",
       "--reeval-period", "1", "--lr", "1e-4", "--sft-lr", "1e-4"]
RUNS = {  # name: (entry point, extra flags)
    "rova": (["train.py"], ["--mode", "rova"]),
    "dual": (["train.py"], ["--mode", "dual", "--temporal-grpo", "2"]),
    "grpo": (["train.py"], ["--mode", "grpo"]),
    "grpo-aug": (["train.py"], ["--mode", "grpo-aug"]),
    "rova-lora": (["train.py"], ["--mode", "rova", "--lora-r", "4"]),
    "embodied-r-vlm": (["-m", "extensions.embodied_r.train"], ["--mode", "rova", "--policy", "vlm",
                                                               "--reward-weights", "1=7:3:0,2-=1:7:2"]),
    "embodied-r-text": (["-m", "extensions.embodied_r.train"], ["--mode", "dual", "--policy", "text",
                                                                "--perceiver", "cv"]),
    "robust-to": (["-m", "extensions.robust_to.train"], ["--mode", "grpo-aug", "--agent-k", "2",
                                                         "--synthesis-tokens", "5"]),
}


def modules():
    """The project's modules wherever the layout keeps them (top level before the restructuring, then machinery/,
    then its sub-packages; build_tiny in policy before tiny.py)."""
    import importlib
    out = {}
    for name in ("policy", "tiny", "synthetic", "perturb", "video"):
        for where in (name, f"machinery.{name}", *(f"machinery.{pkg}.{name}" for pkg in ("model", "datasets"))):
            try:
                out[name] = importlib.import_module(where)
                break
            except ModuleNotFoundError:
                continue
    return out


def tensors_hash(folder):
    from safetensors.torch import load_file
    h = hashlib.sha256()
    for f in sorted(Path(folder).glob("*.safetensors")):
        for k, v in sorted(load_file(str(f)).items()):
            h.update(k.encode())
            h.update(v.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def sh(argv, log):
    res = subprocess.run([sys.executable, *map(str, argv)], cwd=ROOT, capture_output=True, text=True)
    log.write_text(res.stdout + res.stderr)
    if res.returncode:
        raise SystemExit(f"{' '.join(map(str, argv))} failed (rc {res.returncode}); see {log}")


def assets(out, m):
    tiny, text, synth = START, out / "tiny_text", out / "synth"
    if not (text / "config.json").is_file():
        from extensions.embodied_r import perceive
        m.get("tiny", m["policy"]).build_tiny(text, arch="qwen2", extra_texts=perceive.tokenizer_corpus())
    if not (synth / "summary.json").is_file():
        m["synthetic"].make_synthetic(synth, n=12, seed=1, num_frames=8, size=56, eval_fraction=0.25,
                                    families=["next_action"])
    return tiny, text, synth


def training(out, tiny, text, synth):
    got = {}
    for name, (entry, extra) in RUNS.items():
        run = out / "runs" / name
        if not (run / "final").is_dir():
            model = text if "--policy" in extra and extra[extra.index("--policy") + 1] == "text" else tiny
            sh([*entry, "--model", model, "--data", synth / "train.json", "--out", run, "--overwrite", *RUN, *extra],
               out / f"{name}.log")
        got[name] = tensors_hash(run / "final")
        print(f"weights {name:<16} {got[name]}", flush=True)
    return got


def evaluation(out, tiny, synth):
    got = {}
    for style in ("reason", "official"):
        res = out / "eval" / style
        if not any(res.rglob("*_results.json")):
            sh(["eval_pvrbench.py", "--model", tiny, "--benchmark", f"synthetic={synth}", "--style", style,
                "--frames", "8", "--max-pixels", str(56 * 56), "--max-new-tokens", "64", "--out", res],
               out / f"eval-{style}.log")
        h = hashlib.sha256()
        for f in sorted(res.rglob("*_samples_pvrbench_*.jsonl")):
            for line in f.read_text().splitlines():
                h.update(json.dumps(drop_timing(json.loads(line)), sort_keys=True).encode())
        results = json.loads(next(res.rglob("*_results.json")).read_text())
        h.update(json.dumps(drop_timing(results.get("results", results)), sort_keys=True).encode())
        got[style] = h.hexdigest()[:16]
        print(f"eval {style:<19} {got[style]}", flush=True)
    return got


def drop_timing(obj):
    if isinstance(obj, dict):
        return {k: drop_timing(v) for k, v in obj.items()
                if not any(t in k for t in ("time", "timing", "_s", "date", "path", "dir", "version", "host"))}
    if isinstance(obj, list):
        return [drop_timing(v) for v in obj]
    return obj


def perturbations(m):
    perturb = m["perturb"]
    from extensions.robust_to import corruptions  # noqa: F401 - its protocol's subtypes too
    clip, depth = m["synthetic"].sample_clip(8, 64, 64)
    h, per = hashlib.sha256(), {}
    subtypes = sorted({s for p in perturb.PROTOCOLS.values() for s in p})
    for sub in subtypes:
        hs = hashlib.sha256()
        for i, eta in enumerate((0.3, 0.7, 1.0)):
            spec = perturb.sample_spec(i, subtype=sub, eta=eta)
            hs.update(np.ascontiguousarray(perturb.apply(clip, spec, depth)).tobytes())
            hs.update(np.ascontiguousarray(perturb.apply(clip, spec, None)).tobytes())  # the depth proxy
        per[sub] = hs.hexdigest()[:16]
        h.update(per[sub].encode())
    print(f"perturbations ({len(subtypes)} subtypes) {h.hexdigest()[:16]}", flush=True)
    return {"all": h.hexdigest()[:16], **per}


def main(argv=None):
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/behaviour", help="working folder (finished runs are reused)")
    ap.add_argument("--write", default="", help="record the hashes in this JSON file")
    ap.add_argument("--check", default="", help="compare the hashes with this JSON file; exit 1 if any differ")
    ap.add_argument("--demo", default="", help="a finished demo's OUT: compare (or --write) its weights and table")
    args = ap.parse_args(argv)
    if args.demo:
        return demo(Path(args.demo), args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    m = modules()
    tiny, text, synth = assets(out, m)
    import torch
    import transformers
    got = {"machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                       "transformers": transformers.__version__},
           "perturb": perturbations(m), "weights": training(out, tiny, text, synth),
           "eval": evaluation(out, tiny, synth)}
    if args.write:
        Path(args.write).write_text(json.dumps(got, indent=1) + "\n")
    if args.check:
        want = json.loads(Path(args.check).read_text())
        diff = [f"{part}.{k}" for part in ("perturb", "weights", "eval") for k in want[part]
                if got[part].get(k) != want[part][k]]
        print(f"behaviour_identical={not diff} compared={sum(len(want[p]) for p in ('perturb', 'weights', 'eval'))}"
              + (f" differ={','.join(diff)}" if diff else ""))
        sys.exit(1 if diff else 0)


def demo(folder, args):
    """The CPU demo's final weights and its before/after table (summary.json), against (or into) the file's "demo"."""
    summary = json.loads((folder / "summary.json").read_text())
    got = {"command": "python train.py --out OUT", "final_weights": tensors_hash(folder / "final"),
           "table": {k: summary.get(k) for k in ("before", "after_sft", "after")}}
    print(f"demo weights {got['final_weights']} table {json.dumps(got['table'])}")
    if args.write:
        d = json.loads(Path(args.write).read_text()) if Path(args.write).is_file() else {}
        Path(args.write).write_text(json.dumps({**d, "demo": got}, indent=1) + "\n")
    if args.check:
        same = json.loads(Path(args.check).read_text())["demo"] == got
        print(f"demo_identical={same}")
        sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
