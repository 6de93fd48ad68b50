"""PVRBench evaluation throughput: the paths eval_pvrbench.py had before against today's, in one process.

    python benchmarks/bench_eval.py            # ~2 min on 2 cores

Both parts run eval_pvrbench.main on one benchmark built here (the synthetic scenes, 32 frames of 224x224:
App. D's 32 frames, at the tiny processor's largest size; each video asked several questions) and compare the
two runs' records.

API: a local OpenAI-compatible server (threads, a fixed latency per request, 200 ms by default) answers the
model and the judge (openai:, 4 frames), at the real-benchmark defaults (--assign cycle: every question clean
and under one subtype, of all 12; --batch-size 8). Before: batches of --batch-size requests, the next batch
waiting for the slowest; each request's frames encoded to JPEG again; each window judged before the next
generates, one request per (video, condition) batch of pairs at a time, 8 in flight (the judge's old
default). After: --api-concurrency (64) requests in flight, a finished one replaced at once, in (video,
condition) order; each clip encoded once; each window judged in the background while the next generates,
--judge-concurrency (32) verdicts in flight. The server counts the requests of each (prompt, frames): every
sample asked exactly once in each run, none lost (each run's store holds every sample). A third run, stopped
after 60 samples with 64 requests in flight and run again, must ask nothing it had stored.

transformers: the tiny Qwen2.5-VL (its matrices redrawn with std 0.2 so that greedy tokens depend on the
prompt: 0.1 is not enough beside 1024 video tokens), 16 questions per (video, condition) (--assign all
--subtypes fog), official prompts with 16 new tokens, --batch-size 8. Before (HFModel.share_clips off):
batches of 8 prompts, each with its own copy of the video through the processor, the ViT and the prefill.
After: each clip's video encoded and its prefix prefilled once, its 16 questions decoded from copies of that KV
cache, 8 at a time. Greedy texts must be identical. Long answers shrink the gain (decoding dominates): the
--reason line measures 256-token reasoning prompts.

Speed is a ratio of two runs on the same machine (questions per second, each run's whole wall time), never an
absolute. The last line is `api_speedup=<x> hf_speedup=<x> identical=<True|False>`; identical is True when
both parts' records match and no request was lost or repeated.
"""
from __future__ import annotations

import contextlib
import hashlib
import http.server
import io
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from machinery import cli  # noqa: E402,F401 - before torch: the OpenMP wait policy (cli.GOMP_SPINCOUNT)
import numpy as np  # noqa: E402

import eval_pvrbench as ev  # noqa: E402
from machinery import hub  # noqa: E402
from machinery.datasets import synthetic  # noqa: E402
from machinery.eval import evaluation  # noqa: E402


# ----------------------------------------------------------------------------- the benchmark and the server

def make_benchmark(folder, videos, questions, frames=32, size=224):
    """The synthetic scenes as a VSI-Bench file where each video has `questions` questions (its own three,
    repeated with a numbered suffix so that every prompt differs)."""
    synthetic.make_synthetic(folder, n=videos, seed=0, num_frames=frames, size=size, eval_fraction=1.0)
    rows = [json.loads(x) for x in (folder / "eval.jsonl").read_text().splitlines()]
    by_video = defaultdict(list)
    for r in rows:
        by_video[r["scene_name"]].append(r)
    out = []
    for scene, own in by_video.items():
        for k in range(questions):
            r = dict(own[k % len(own)])
            r["id"], r["question"] = f"{r['id']}_{k}", f"{r['question']} (question {k})"
            out.append(r)
    (folder / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    return folder


def _digest(body):
    """(kind, prompt text, sha256 of the frames) of a chat-completions request, whatever the frames' format."""
    parts = body["messages"][0]["content"]
    text = "".join(p["text"] for p in parts if p["type"] == "text")
    urls = [p.get("image_url", p.get("video_url", {})).get("url", "") for p in parts if p["type"] != "text"]
    frames = [f for u in urls for f in u.split(",", 1)[1].split(",")] if urls else []
    return body["model"], text, hashlib.sha256("".join(frames).encode()).hexdigest()


class Server(http.server.BaseHTTPRequestHandler):
    """Answers after `latency` seconds, deterministically from the request's (prompt, frames): the model
    "bench-vlm" a reasoning trace and a letter or a number, the judge "bench-judge" the five metrics.
    GET /counts: how many times each (model, prompt, frames) was asked."""
    latency, seen, lock = 0.2, Counter(), threading.Lock()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = _digest(body)
        with Server.lock:
            Server.seen[key] += 1
        time.sleep(Server.latency)
        h = int(hashlib.sha256(repr(key).encode()).hexdigest(), 16)
        if body["model"] == "bench-judge":
            content = json.dumps({k: (h >> (3 * i)) % 6 for i, k in enumerate(ev.QUALITY)})
        else:
            answer = "ABCD"[h % 4] if "Options" in key[1] else str(h % 7)
            content = f"<think>I look at the frames.</think><answer>{answer}</answer>"
        self.reply({"choices": [{"message": {"content": content}}]})

    def do_GET(self):
        with Server.lock:
            self.reply([[*k, n] for k, n in Server.seen.items()])

    def reply(self, obj):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(obj).encode())

    def log_message(self, *a):
        pass


def serve(latency, conn):
    """The fake server, in its own process (a real server does not share the client's interpreter)."""
    Server.latency = latency
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Server)
    server.daemon_threads = True
    conn.send(server.server_address[1])
    server.serve_forever()


def asked(url, model="bench-vlm"):
    """Counter {(prompt, frames digest): times asked} of one model, so far."""
    with urllib.request.urlopen(url.rsplit("/v1", 1)[0] + "/counts") as r:
        return Counter({(k[1], k[2]): k[3] for k in json.loads(r.read()) if k[0] == model})


# ----------------------------------------------------------------------------- the paths as they were

class BatchedAPIModel:
    """The API path before: batches of --batch-size requests, each waiting for its slowest (no `stream`: the
    Runner's batch loop), and each request's frames encoded to JPEG on their own (a copy per request)."""

    def __init__(self, api):
        self.api = api

    def generate(self, samples, prompts, clips, fps, style, max_new_tokens):
        return self.api.generate(samples, prompts, [np.array(c) for c in clips], fps, style, max_new_tokens)


class JudgeAfterWindow(evaluation.Runner):
    """The Runner before: each window judged before the next one generates, one batch of pairs per (video,
    condition) at a time (the judge's thread pool spreading each batch's requests)."""

    def start_judge(self, window):
        if self.judge is not None:
            t0 = time.perf_counter()
            for g in window.groups:
                pend = self.store.to_judge(g, self.judge)
                if not pend:
                    continue
                for cond in dict.fromkeys(p[0][1] for p in pend):
                    ps = [p for p in pend if p[0][1] == cond]
                    verdicts = self.judge.reasoning_quality_batch([p[1:] for p in ps],
                                                                  images=self.judge_images(g, cond, window))
                    self.store.append(f"judge-{self.store.tag}", g.source, [
                        {"doc_id": k[0], "condition": k[1], "judge": v} for (k, *_), v in zip(ps, verdicts)])
            self.sec_judge += time.perf_counter() - t0


def run_eval(argv, before):
    """(results dict, wall seconds, {(doc_id, condition): response}) of one eval_pvrbench run; `before`: the
    paths as they were (the API's batches, the judge after each window, HFModel without shared clips)."""
    saved = evaluation.Runner, evaluation.HFModel.share_clips, ev.MODELS["openai"]
    if before:
        evaluation.Runner, evaluation.HFModel.share_clips = JudgeAfterWindow, False
        ev.MODELS["openai"] = lambda args, name: BatchedAPIModel(evaluation.APIModel(
            name, args.base_url, args.api_retries, args.api_timeout, args.batch_size, "video"))
    try:
        t0 = time.perf_counter()
        out = quiet(ev.main, argv)
        wall = time.perf_counter() - t0
    finally:
        evaluation.Runner, evaluation.HFModel.share_clips, ev.MODELS["openai"] = saved
    return out, wall, stored(Path(out["config"]["run_dir"]))


def quiet(fn, *args):
    """fn(*args) with its printing and progress bars kept off the benchmark's output."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return fn(*args)


def stored(run_dir):
    """{(doc_id, condition): response} of a run's store (the last line of each key), and how many lines."""
    rows = [json.loads(x) for f in sorted(run_dir.glob("samples_*.jsonl")) for x in f.read_text().splitlines()]
    return {(r["doc_id"], r["condition"]): r["response"] for r in rows}, len(rows)


# ----------------------------------------------------------------------------- the two parts

def api_part(bench, out, latency, judge_frames=4):
    parent, child = multiprocessing.Pipe()
    server = multiprocessing.Process(target=serve, args=(latency, child), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{parent.recv()}/v1"
    base = ["--benchmark", f"vsibench={bench / 'eval.jsonl'}", "--video-root", str(bench / "videos"),
            "--model", "openai:bench-vlm", "--base-url", url, "--judge", "openai:bench-judge",
            "--judge-base-url", url, "--judge-frames", str(judge_frames), "--frames", "32",
            "--max-pixels", str(224 * 224), "--fps", "2", "--batch-size", "8",
            "--depth-model", "proxy"]   # (the scenes are read as VSI-Bench: auto would want the depth model)
    os.environ.setdefault("OPENAI_API_KEY", "bench-no-key")
    report, runs = {}, {}
    try:
        for name, before in (("before", True), ("after", False)):
            start = asked(url)
            old = ["--judge-concurrency", "8"] if before else []   # (the judge's thread pool before)
            res, wall, (responses, lines) = run_eval(base + old + ["--out", str(out / name)], before)
            now = asked(url) - start
            runs[name] = (res, responses)
            report[name] = dict(wall=wall, samples=res["n_samples"], qps=res["n_samples"] / wall,
                                once=len(now) == res["n_samples"] and set(now.values()) == {1},
                                stored=len(responses) == lines == res["n_samples"])
        start = asked(url)   # killed with 64 in flight, then run again: nothing stored is asked again
        quiet(ev.main, base + ["--out", str(out / "resumed"), "--stop-after", "60"])
        (run_dir,) = (out / "resumed" / "bench-vlm").glob("run_*")
        kept, middle = len(stored(run_dir)[0]), asked(url)
        quiet(ev.main, base + ["--out", str(out / "resumed")])
        again = sum((asked(url) - middle).values())
        n = runs["after"][0]["n_samples"]   # (every request differs: a question's prompt and its clip)
        report["resume"] = dict(stored_first=kept, asked_first=sum((middle - start).values()),
                                repeats=again - (n - kept), complete=len(stored(run_dir)[0]) == n)
    finally:
        server.terminate()
    same = runs["before"][0]["results"] == runs["after"][0]["results"] and runs["before"][1] == runs["after"][1]
    return report, same


def hf_part(bench, out, tiny, style, max_new_tokens):
    base = ["--benchmark", f"vsibench={bench / 'eval.jsonl'}", "--video-root", str(bench / "videos"),
            "--model", str(tiny), "--judge", "none", "--frames", "32", "--max-pixels", str(224 * 224), "--fps", "2",
            "--assign", "all", "--subtypes", "fog", "--style", style, "--max-new-tokens", str(max_new_tokens),
            "--batch-size", "8", "--depth-model", "proxy"]
    runs = {name: run_eval(base + ["--out", str(out / f"{style}_{name}")], before)
            for name, before in (("before", True), ("after", False))}
    qps = {name: r[0]["n_samples"] / r[1] for name, r in runs.items()}
    same = runs["before"][2] == runs["after"][2] and runs["before"][0]["results"] == runs["after"][0]["results"]
    distinct = len(set(runs["after"][2][0].values()))
    return qps, same, distinct, runs["after"][0]["n_samples"]


def sharpened_tiny(folder):
    import torch

    from machinery.model import policy
    from machinery.model import tiny as tiny_model
    from bench_rollout import sharpen
    model, processor = policy.load_policy(tiny_model.build_tiny(folder / "build"), dtype=torch.float32)
    sharpen(model, std=0.2)
    policy.save(model, processor, folder / "sharpened", dtype=torch.float32)
    return folder / "sharpened"


def main(argv=None):
    ap = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latency", type=float, default=0.2, help="seconds per request of the fake server")
    ap.add_argument("--api-videos", type=int, default=24)
    ap.add_argument("--api-questions", type=int, default=8, help="questions per video (API part)")
    ap.add_argument("--hf-videos", type=int, default=3)
    ap.add_argument("--reason", action="store_true", help="also measure the transformers path with reasoning "
                    "prompts and 256 new tokens")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        quiet(hub.versions)   # (imports what results.json lists: paid here, not by the first run timed)
        api, api_same = api_part(make_benchmark(tmp / "api_bench", args.api_videos, args.api_questions),
                                 tmp / "api", args.latency)
        b, a = api["before"], api["after"]
        print(f"API ({args.latency * 1000:.0f} ms per request, {a['samples']} samples, judge openai: with 4 frames): "
              f"before {b['qps']:.1f} q/s ({b['wall']:.1f} s), after {a['qps']:.1f} q/s ({a['wall']:.1f} s); "
              f"each sample asked once: {b['once']}/{a['once']}; all stored: {b['stored']}/{a['stored']}; "
              f"results identical: {api_same}", flush=True)
        r = api["resume"]
        print(f"API stopped after {r['stored_first']} stored samples ({r['asked_first']} asked, 64 in flight) and "
              f"run again: {r['repeats']} stored samples asked again, complete: {r['complete']}", flush=True)
        hf_bench = make_benchmark(tmp / "hf_bench", args.hf_videos, 16)
        tiny = quiet(sharpened_tiny, tmp / "tiny")   # (and imports the model's code before the runs timed)
        qps, hf_same, distinct, n = hf_part(hf_bench, tmp / "hf", tiny, "official", 16)
        print(f"transformers (tiny Qwen2.5-VL, {n} samples, 16 questions per (video, condition), official prompts, "
              f"16 new tokens): before {qps['before']:.2f} q/s, after {qps['after']:.2f} q/s, "
              f"{qps['after'] / qps['before']:.2f}x; greedy texts identical: {hf_same} ({distinct} distinct)",
              flush=True)
        if args.reason:
            rq, r_same, _, _ = hf_part(hf_bench, tmp / "hf", tiny, "reason", 256)
            print(f"transformers, reasoning prompts, 256 new tokens: {rq['after'] / rq['before']:.2f}x; identical: "
                  f"{r_same}", flush=True)
            hf_same = hf_same and r_same
    identical = api_same and hf_same and all(api[k]["once"] and api[k]["stored"] for k in ("before", "after")) \
        and api["resume"]["repeats"] == 0 and api["resume"]["complete"]
    print(f"api_speedup={a['qps'] / b['qps']:.2f} hf_speedup={qps['after'] / qps['before']:.2f} identical={identical}")


if __name__ == "__main__":
    main()
