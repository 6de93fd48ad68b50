"""The machinery of eval_pvrbench.py: reading a clip as the model sees it, the models asked (a local checkpoint,
its clip's prefill shared by the clip's questions; a served model, every request in flight), the resumable
store of generations and verdicts, and the Runner that generates and judges a window of videos at a time
(the run hash and the results' files: run_files.py).
The benchmark's protocol (which questions, which corruption, how they are scored) is eval_pvrbench.py's: it
gives the machinery its command line's settings as an EvalSettings, built once (never its argparse namespace),
and corrupts the clips itself (Runner.generate and Exporter.write take the corrupted frames).
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import itertools
import json
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from machinery import cli, video
from machinery.corruption import depth as depths
from machinery.datasets import answers, data
from machinery.eval import chat


SHARE_MIN = 4   # questions on one (video, condition) from which HFModel shares its prefill (Runner.batches)


@dataclass(frozen=True)
class EvalSettings:
    """What the machinery reads of eval_pvrbench.py's command line, its defaults resolved: each field a flag's
    value (eval_pvrbench.eval_settings builds it once from the parsed flags; an extension's evaluate goes through
    the same)."""
    frames: int               # --frames: frames read per video (App. D: 32)
    max_pixels: int           # --max-pixels: the pixel budget of a frame (smart_resize)
    fps: float | str          # --fps: the fps the model is told, or "video" (qwen-vl-utils' sample fps)
    style: str                # --style: the prompt and the scoring rules (data.STYLES)
    scoring: str              # --scoring: VSI-Bench's numeric-answer rule (answers.SCORINGS)
    max_new_tokens: int       # --max-new-tokens: a generation's budget
    batch_size: int           # --batch-size: samples a local model decodes at once (the Runner's window)
    stop_after: int           # --stop-after: stop as if killed after this many generated samples (0: never)
    judge_frames: int         # --judge-frames: frames an openai: judge sees of the clip it rates (0: text only)
    judge_concurrency: int    # --judge-concurrency: an openai: judge's requests in flight
    depth_model: str          # --depth-model: where a clip's depth comes from (depth.Depth)
    depth_cache: str          # --depth-cache: the depth maps' cache folder ("": the default one)
    eta: float | dict         # --eta: the corruption's intensity, one number or per subtype (the run hash)
    etas: tuple               # --etas: a sweep's intensities (() : one point, --eta; the run hash)
    assign: str               # --assign: cycle or all, the conditions of a question (the run hash)
    adapter: str              # --adapter: a peft LoRA adapter folder ("": none; the run hash)
    base_url: str             # --base-url: an openai: model's server ("": $OPENAI_BASE_URL or OpenAI; the run hash)
    video_format: str         # --video-format: how an openai: model gets the frames (VIDEO_FORMATS; the run hash)
    export: str               # --export / --export-lmms-eval: the folder of the exported clips ("": no export)
    benchmark: str            # --benchmark as given (the lmms-eval task's export.json)


def row_condition(row):
    """A manifest row's condition: its subtype, or the condition a sweep's row names (fog@0.3)."""
    return row.get("condition", row["subtype"])


def manifest_specs(manifest):
    """{(source, video id, condition): spec} of the manifest's rows."""
    return {(r["source"], r["video_id"], row_condition(r)): r["spec"] for r in manifest}


def read_for_model(group, settings: EvalSettings, read_kwargs, with_indices=False):
    """A question group's clip as the model is shown it: (frames, fps[, the frame indices read]) or a VideoError;
    fps: qwen-vl-utils' sample fps, or --fps. read_kwargs: an extension's video.read_frames arguments (a frame
    sampler)."""
    frames, indices, fps = video.read_frames(group.path, num_frames=settings.frames, max_pixels=settings.max_pixels,
                                             **read_kwargs)
    if settings.fps != "video":
        fps = float(settings.fps)
    else:
        fps = len(indices) / (int(indices[-1]) + 1) * fps if fps > 0 else 2.0
    return (frames, fps, indices) if with_indices else (frames, fps)


def export_depth(root, g, frames, indices, source):
    """(the depth a clip is corrupted with, the manifest's "depth") of an exported clip: "proxy", or the clip's
    depth (its own or --depth-model's) written to <video id>/depth.npy (float16 [T,H,W]: the spec, the clean frames
    and this file regenerate the corrupted clip bit for bit, Eq. 4, without the model)."""
    if source.kind(g.path) == "proxy":
        return None, "proxy"
    d, f = source(frames, g.video_id, indices, video_path=g.path), Path(g.video_id) / "depth.npy"
    depths.write(root / f, d)
    return d, {**source.describe(g.path), "file": str(f),
               "sha256": hashlib.sha256((root / f).read_bytes()).hexdigest()}


class Exporter:
    """--export DIR: the clean and corrupted clips as lossless mp4 (the frames the models see, at the fps they are
    told), their depth maps with --depth-model (export_depth), and the manifest. The stage writes each corrupted
    clip (write) that `clips` asks for; close() returns ({(video id, condition): file relative to DIR}, the number
    of clips not read)."""

    def __init__(self, manifest, settings: EvalSettings, read_kwargs):
        self.root, self.settings, self.read_kwargs = Path(settings.export), settings, read_kwargs
        self.source = depths.Depth(settings.depth_model, settings.depth_cache or None)
        self.specs, self.written, self.rows, self.shown = defaultdict(list), {}, [], {}
        for row in manifest:
            self.specs[(row["source"], row["video_id"])].append(row)

    def clips(self, groups):
        """(manifest row, clean frames, depth) of each corrupted clip, its video's clean clip and depth written
        first; a video not read: its rows kept with the error."""
        for g in groups:
            try:
                frames, fps, indices = read_for_model(g, self.settings, self.read_kwargs, with_indices=True)
            except Exception as e:  # noqa: BLE001 - recorded, never fatal
                self.rows += [dict(r, error=f"{type(e).__name__}: {e}") for r in self.specs[(g.source, g.video_id)]]
                continue
            clean = self.written[(g.video_id, "clean")] = str(Path(g.video_id) / "clean.mp4")
            video.write_video(self.root / clean, frames, fps=fps, lossless=True)
            d, entry = export_depth(self.root, g, frames, indices, self.source)
            self.shown[g.video_id] = dict(clean_file=clean, source_video=g.path, fps=fps, depth=entry,
                                          frames=self.settings.frames, max_pixels=self.settings.max_pixels)
            for r in self.specs[(g.source, g.video_id)]:
                yield r, frames, d

    def write(self, row, frames):
        """A manifest row's corrupted clip (the stage's: the row's spec applied to the clean frames)."""
        cond = row_condition(row)
        f = self.written[(row["video_id"], cond)] = str(Path(row["video_id"]) / f"{cond}.mp4")
        shown = self.shown[row["video_id"]]
        video.write_video(self.root / f, frames, fps=shown["fps"], lossless=True)
        self.rows.append(dict(row, file=f, **shown))

    def close(self):
        write_jsonl(self.root / "manifest.jsonl", self.rows)
        errors = sum("error" in r for r in self.rows)
        print(f"exported {sum('file' in r for r in self.rows)} corrupted videos ({errors} errors) and "
              f"{self.root / 'manifest.jsonl'}")
        return self.written, errors


def parameters(model):
    """The evaluated model's parameter count (a local checkpoint's), or None (a served or an extension's model)."""
    inner = getattr(model, "model", None)
    return sum(p.numel() for p in inner.parameters()) if hasattr(inner, "parameters") else None


class HFModel:
    """Any AutoModelForImageTextToText checkpoint (policy.load_policy), optionally with a peft LoRA adapter;
    greedy generation. `share_clips`: the Runner gives it each (video, condition)'s questions together, and
    the clip is encoded and its prefix prefilled once for all of them (policy.answer_same_video, decoding
    `batch_size` at a time); off (what benchmarks/bench_eval.py measures it against): batches of `batch_size`
    prompts, each with its own copy of the video (policy.rollout). Both give the same greedy texts."""
    failure = "generation failed"  # the reason recorded for a sample that fails alone
    share_clips = True

    def __init__(self, path, adapter=None, batch_size=8):
        from machinery.model import policy
        self.policy, self.batch_size = policy, batch_size
        self.model, self.processor = policy.load_policy(path)
        if adapter:
            from peft import PeftModel
            self.model = PeftModel.from_pretrained(self.model, adapter).eval()
        self.text = policy.is_text_model(self.model)
        self.check_kind(path)

    def check_kind(self, path):
        if self.text:   # (a text-only reasoner reads a perceiver's text of the videos: an extension's entry point)
            raise cli.UserError(f"{path} is a text-only LM: it cannot see the videos (an extension's entry point "
                                "can give it a perceiver's text of them: python -m extensions.<name>.eval)")

    def generate(self, samples, prompts, clips, fps, style, max_new_tokens):
        """[(text, None)], or [(None, reason)] for a sample that fails alone (a failed batch is split)."""
        try:
            return [(t, None) for t in self._texts(samples, clips, fps, style, max_new_tokens)]
        except (RuntimeError, ValueError) as e:   # e.g. out of memory on one long video
            if len(samples) == 1:
                return [(None, f"{self.failure}: {type(e).__name__}: {str(e)[:300]}")]
            return [o for k in range(len(samples)) for o in self.generate(
                samples[k:k + 1], prompts[k:k + 1], clips[k:k + 1], fps[k:k + 1], style, max_new_tokens)]

    def _texts(self, samples, clips, fps, style, max_new_tokens):
        messages = [data.build_messages(s, style) for s in samples]
        if self.share_clips and len({id(c) for c in clips}) == 1 and len(samples) > 1:   # one clip's questions
            return self.policy.answer_same_video(self.model, self.processor, messages, clips[0], fps[0],
                                                 max_new_tokens, self.batch_size)
        inputs = self.policy.make_inputs(self.processor, messages, clips, fps=fps)
        return self.policy.rollout(self.model, self.processor, inputs, n=1, max_new_tokens=max_new_tokens,
                                   do_sample=False).texts


VIDEO_FORMATS = ("auto", "video", "images", "mp4")


def video_format(requested, base_url):
    """--video-format auto: one video part for a self-hosted server (--base-url or $OPENAI_BASE_URL: vLLM,
    SGLang), so that a served Qwen-VL sees a video as transformers does; image parts for OpenAI's API, which
    takes no video (the paper evaluates GPT-4o so)."""
    if requested != "auto":
        return requested
    return "video" if (base_url or os.environ.get("OPENAI_BASE_URL")) else "images"


def video_refused(base_url, reason):
    """The one-line error for a server that refused a request carrying the clip as one video part: its own words,
    whole, and the fix that matches them."""
    text = reason.lower()
    if "trust-request-mm-kwargs" in text or "media_io_kwargs" in text:
        fix = ("start the server with --trust-request-mm-kwargs: the clip's frame rate goes with each request as "
               "media_io_kwargs, which Qwen-VL's temporal positions are computed from")
    elif "at most" in text and "video" in text:
        fix = "start the server with --limit-mm-per-prompt '{\"video\": 1}'"
    else:
        fix = "if the served model takes no video, use --video-format images"
    return f"{base_url} refused a request with the clip as one video part ({reason}): {fix}"


class APIModel:
    """An OpenAI-compatible chat-completions model (OpenAI, vLLM, SGLang) through chat.ChatClient: the frames as
    one video part (`video_format` "video", at the clip's fps), as base64 JPEG image parts, or as one lossless mp4
    ("mp4": the frames exactly, at the clip's fps), then the prompt;
    temperature 0; retries with backoff; the key from $OPENAI_API_KEY, never stored, logged or written;
    `concurrency` requests at a time. A server that refuses the video part stops the run, saying how to switch."""

    def __init__(self, name, base_url, retries=5, timeout=120.0, concurrency=64, video_format="images"):
        self.concurrency, self.video, self.mp4 = max(1, concurrency), video_format == "video", video_format == "mp4"
        self.window = 2 * self.concurrency  # samples per Runner window: the pool stays full across videos
        self.client = chat.ChatClient(base_url=base_url, model=name, max_retries=retries, timeout=timeout,
                                      concurrency=self.concurrency)

    def stream(self, samples, prompts, clips, fps, style, max_new_tokens):
        """(index, (text, error)) of each request as it finishes, `concurrency` in flight: a finished request
        is replaced at once (no batch waits for its slowest). `clips`: frames, or futures of frames (the stage
        corrupts the window's clips while the first requests are in flight); each clip is one object, its
        JPEGs encoded once for all its questions, by the pool, ahead of their requests (first in, first
        out: a request never waits for an encoding that has not started). Closing the generator cancels what
        has not started."""
        pool = concurrent.futures.ThreadPoolExecutor(min(self.concurrency, max(1, len(prompts))))
        encoded, futures = {}, {}

        def encode(clip, fps):
            frames = clip.result() if isinstance(clip, concurrent.futures.Future) else clip
            return video.mp4_bytes(frames, fps) if self.mp4 else chat.jpegs(frames)

        def one(k):
            data = encoded[id(clips[k])].result()
            reply = self.client.complete(prompts[k], max_new_tokens, frames=None if self.mp4 else data,
                                         video_fps=fps[k] if self.video else None, mp4=data if self.mp4 else None)
            return (reply, None) if reply is not None else (None, "API: no response after retries (see the log)")
        for k, clip in enumerate(clips):
            if id(clip) not in encoded:
                encoded[id(clip)] = pool.submit(encode, clip, fps[k])
            futures[pool.submit(one, k)] = k
        try:
            for fut in concurrent.futures.as_completed(futures):
                out = fut.result()
                if (self.video or self.mp4) and out[0] is None and self.client.rejected:
                    raise cli.UserError(video_refused(self.client.base_url, self.client.rejected))
                yield futures[fut], out
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def generate(self, samples, prompts, clips, fps, style, max_new_tokens):
        outs = dict(self.stream(samples, prompts, clips, fps, style, max_new_tokens))
        return [outs[k] for k in range(len(prompts))]


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


class Store:
    """Append-only JSONL per source: samples_<source>.jsonl (generations) and judge-<judge>_<source>.jsonl
    (verdicts), flushed per batch; the last line of a key wins; a torn last line (a kill) is skipped."""

    def __init__(self, run_dir, judge_tag):
        self.dir, self.tag = Path(run_dir), judge_tag
        self.gen, self.jdg, self.lock = defaultdict(dict), defaultdict(dict), threading.Lock()
        for kind, table in (("samples", self.gen), (f"judge-{judge_tag}", self.jdg)):
            for f in self.dir.glob(f"{kind}_*.jsonl"):
                for line in f.read_text().splitlines():
                    try:
                        r = json.loads(line)
                    except ValueError:
                        continue
                    table[f.stem.rsplit("_", 1)[1]][(r["doc_id"], r["condition"])] = r

    def done(self, src, key):
        """Generated without error (an error, e.g. an unreadable video or a failed API call, is tried again)."""
        r = self.gen[src].get(key)
        return r is not None and r.get("error") is None

    def append(self, kind, src, rows):
        if not rows:
            return
        path = self.dir / f"{kind}_{src}.jsonl"
        with self.lock:   # (the judge appends from its own thread)
            torn = False
            if path.exists() and path.stat().st_size:
                with open(path, "rb") as f:
                    torn = f.seek(-1, 2) >= 0 and f.read(1) != b"\n"
            with open(path, "a") as f:
                f.write(("\n" if torn else "") + "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
                f.flush()
                os.fsync(f.fileno())
            table = self.gen if kind == "samples" else self.jdg
            table[src].update({(r["doc_id"], r["condition"]): r for r in rows})

    def pending(self, g):
        """(sample, condition) of a group still to generate."""
        return [(s, c) for s, conds in g.items for c in conds if not self.done(g.source, (s.id, c))]

    def to_judge(self, g, judge):
        """(key, question, reference, candidate) still to judge in a group: clean with itself (Orig.+), each
        perturbed response against the clean one."""
        if judge is None:
            return []
        out = []
        for s, conds in g.items:
            clean = self.gen[g.source].get((s.id, "clean"))
            if clean is None or clean.get("error") is not None:
                continue
            for c in conds:
                r = self.gen[g.source].get((s.id, c))
                if r is not None and r.get("error") is None and (s.id, c) not in self.jdg[g.source]:
                    out.append(((s.id, c), data.question_text(s), clean["response"], r["response"]))
        return out

    def unjudged(self, g):
        """The conditions of a group's (question, condition) pairs without a verdict (a judge rates each once its
        answers are in: after this window's generation too)."""
        return [c for s, conds in g.items for c in conds if (s.id, c) not in self.jdg[g.source]]

    def records(self, groups, style="reason", scoring=answers.SCORINGS[0]):
        """{source: the final records, in plan order, each with its verdict}, scored again from the stored response
        under the current rules (a store written before a change of the scoring code gets today's scores)."""
        flat = defaultdict(list)
        for g in groups:
            for s, conds in g.items:
                for c in conds:
                    r = self.gen[g.source][(s.id, c)]
                    flat[g.source].append(dict(r, **scored(s, r["response"], r.get("error"), style, scoring),
                                               judge=self.jdg[g.source].get((s.id, c), {}).get("judge")))
        return flat


def record(g, s, cond, prompt, text, error, style="reason", scoring=answers.SCORINGS[0]):
    return {"doc_id": s.id, "condition": cond, "video_id": g.video_id, "task": s.task, "input": prompt,
            "target": s.answer, "response": text, **scored(s, text, error, style, scoring), "error": error}


def scored(s, text, error, style="reason", scoring=answers.SCORINGS[0]):
    """A sample's extracted answer (filtered_resps) and score under --style / --scoring (None after an error)."""
    if error is not None:
        return {"filtered_resps": None, "score": None}
    pred, score = answers.read_and_score(text, s.source, s.problem_type, s.answer, style, scoring)
    return {"filtered_resps": pred, "score": score}


@dataclass
class Window:
    """A window of videos (Runner.windows), read; the stage corrupts its clips (conditions) for Runner.generate."""
    groups: list            # the groups whose clip was read
    clean: dict             # video id -> (frames, fps) of the clean clip
    indices: dict           # video id -> the frame indices read (the depth cache's key)
    todo: list              # the pending (group, sample, condition), in (video, condition) order
    judged: list            # (group, condition) of the clips a served judge rates (--judge-frames)
    specs: dict             # the manifest's {(source, video id, condition): spec}
    corrupted: dict         # the stage's {(video id, condition): frames, or a Future of them}
    memo: depths.ClipMemo   # the window's clips' depth, computed once each

    def depth(self, g):
        """The depth a clean clip is corrupted with (depth.Depth: its own, or a model's, cached on disk; thread-safe),
        or None: perturb's depth proxy."""
        return self.memo(self.clean[g.video_id][0], g.video_id, self.indices[g.video_id], video_path=g.path)

    def conditions(self):
        """(group, condition, clean frames, manifest spec) of each corrupted clip the window needs: those its samples
        are generated from, in their order (a served model's first requests need the first clips), then the judge's."""
        by_id = {g.video_id: g for g in self.groups}
        keys = dict.fromkeys([(g.video_id, c) for g, _, c in self.todo] + [(g.video_id, c) for g, c in self.judged])
        return [(by_id[v], c, self.clean[v][0], self.specs[by_id[v].source, v, c]) for v, c in keys if c != "clean"]

    def frames(self, g, cond):
        """The frames of a (video, condition): the clean clip's, or the stage's corrupted ones (or the Future they
        are being rendered in)."""
        return self.clean[g.video_id][0] if cond == "clean" else self.corrupted[(g.video_id, cond)]

    def clip(self, g, cond):
        """(frames, fps) of a (video, condition), the corrupted frames waited for."""
        c = self.frames(g, cond)
        return (c.result() if isinstance(c, concurrent.futures.Future) else c), self.clean[g.video_id][1]


class Runner:
    """Generation and judging, a window of videos at a time (about --batch-size samples; 2 x --api-concurrency
    for a served model): each video decoded once (windows), each (video, condition) corrupted once by the
    stage (eval_pvrbench.corrupted: Sec. 4 is the stage's), its pending samples generated clip by clip, in
    (video, condition) order (a server's prefix cache sees one clip's questions together), each stored as it
    finishes (generate). A window's pairs are judged in the background while the next window generates (at most
    one window waits for its judge). Used as a context manager: leaving it waits for the last judge."""

    def __init__(self, settings: EvalSettings, store, model, judge, manifest, read_kwargs, pending):
        from tqdm import tqdm
        self.settings, self.store, self.model, self.judge, self.read_kwargs = settings, store, model, judge, read_kwargs
        self.specs = manifest_specs(manifest)
        self.depth = depths.Depth(settings.depth_model, settings.depth_cache or None)
        self.generated, self.sec_generate, self.sec_judge = 0, 0.0, 0.0
        self.bar = tqdm(total=pending, desc="generate", dynamic_ncols=True) if pending else None
        self.judging = None   # the background judge of the last window: (thread, {"error": ...})

    def __enter__(self):
        return self

    def __exit__(self, kind, *_):   # (a kill does not wait for the judge: what it had not stored is asked again)
        if self.bar is not None:
            self.bar.close()
        if kind is None:
            self.wait_judge()

    def windows(self, groups):
        """Each window of `groups` with something to generate or judge, as a Window (its clips read)."""
        window, size = [], 0
        for k, g in enumerate(groups):
            window.append(g)
            size += sum(len(c) for _, c in g.items)
            if size >= getattr(self.model, "window", self.settings.batch_size) or k == len(groups) - 1:
                if (ready := self.prepare(window)).groups:
                    yield ready
                window, size = [], 0

    def prepare(self, groups):
        """The Window of `groups`: their clean clips read; an unreadable video's samples stored as errors (its
        reason, never fatal)."""
        pending = [(g, self.store.pending(g)) for g in groups]
        pending = [(g, pend) for g, pend in pending if pend or self.store.to_judge(g, self.judge)]
        window = Window([], {}, {}, [], [], self.specs, {}, depths.ClipMemo(self.depth, len(groups)))
        for (g, pend), clip in zip(pending, self.read([g for g, _ in pending])):
            if isinstance(clip, str):
                self.store.append("samples", g.source, [record(g, s, c, None, None, clip) for s, c in pend])
            else:
                self.add(window, g, clip, pend)
        return window

    def add(self, window, g, clip, pend):
        """A group whose clip was read (frames, fps, indices) into `window`: its pending samples clip by clip (clean,
        then each subtype), and the clips a served judge with --judge-frames will see (every unjudged pair's)."""
        frames, fps, window.indices[g.video_id] = clip
        window.groups.append(g)
        window.clean[g.video_id] = (frames, fps)
        conds = list(dict.fromkeys(c for _, c in pend))
        window.todo += [(g, s, c) for cond in conds for s, c in pend if c == cond]
        if getattr(self.judge, "served", False) and self.settings.judge_frames > 0:
            window.judged += [(g, c) for c in dict.fromkeys(self.store.unjudged(g))]

    def read(self, groups):
        """Each group's clean clip (frames, fps, indices), or the reason it cannot be read; in parallel (decoding
        and resizing run in C)."""
        with concurrent.futures.ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
            reads = [pool.submit(read_for_model, g, self.settings, self.read_kwargs, True) for g in groups]
        out = []
        for r in reads:
            try:
                out.append(r.result())
            except Exception as e:  # noqa: BLE001 - recorded per sample
                out.append(f"{type(e).__name__}: {e}")
        return out

    def generate(self, window, corrupted):
        """A window's pending samples, each stored as it finishes, then its judge started in the background (it
        may need clips that nothing generated from); `corrupted`: the stage's clips ({(video id, condition):
        frames, or a Future of them}). False when --stop-after is reached: the judge waited for, the clips not yet
        started cancelled."""
        window.corrupted, done = corrupted, False
        try:
            done = (self.generate_stream if hasattr(self.model, "stream") else self.generate_batches)(window)
        finally:
            if not done:   # stopped, or failed: what is not rendered yet is not needed
                for c in corrupted.values():
                    if isinstance(c, concurrent.futures.Future):
                        c.cancel()
        if not done:
            self.wait_judge()
            return False
        self.start_judge(window)
        return True

    def batches(self, todo):
        """The model's calls: --batch-size samples each; for a model that shares a clip's prefill
        (HFModel.share_clips), a clip with at least SHARE_MIN questions gets a call of its own, and the
        clips with fewer are batched together (one question per clip, a call each decoded ~10x slower)."""
        size = self.settings.batch_size
        if not getattr(self.model, "share_clips", False):
            return [todo[k:k + size] for k in range(0, len(todo), size)]
        out, rest = [], []
        for _, run in itertools.groupby(todo, key=lambda t: (t[0].video_id, t[2])):
            run = list(run)
            if len(run) >= SHARE_MIN:
                out.append(run)
            else:
                rest.extend(run)
        return out + [rest[k:k + size] for k in range(0, len(rest), size)]

    def generate_batches(self, window):
        """A local model: the window's samples a batch at a time (batches)."""
        for batch in self.batches(window.todo):
            clips = [window.clip(g, c) for g, _, c in batch]
            prompts = [data.build_prompt(s, self.settings.style) for _, s, _ in batch]
            t0 = time.perf_counter()
            outs = self.model.generate([s for _, s, _ in batch], prompts, [v for v, _ in clips],
                                       [f for _, f in clips], self.settings.style, self.settings.max_new_tokens)
            self.sec_generate += time.perf_counter() - t0
            rows = defaultdict(list)
            for (g, s, c), p, (text, err) in zip(batch, prompts, outs):
                rows[g.source].append(record(g, s, c, p, text, err, self.settings.style, self.settings.scoring))
            for src, rs in rows.items():
                self.store.append("samples", src, rs)
            self.generated += len(batch)
            if self.bar is not None:
                self.bar.update(len(batch))
            if self.settings.stop_after and self.generated >= self.settings.stop_after:
                return False
        return True

    def generate_stream(self, window):
        """A served model: every pending sample of the window in flight (up to its concurrency), each finished
        one stored at once, so that a killed run neither loses nor repeats a finished request."""
        todo = window.todo
        if not todo:
            return True
        clips = [window.frames(g, c) for g, _, c in todo]   # (a Future's frames are encoded once ready)
        fps = [window.clean[g.video_id][1] for g, _, _ in todo]
        prompts = [data.build_prompt(s, self.settings.style) for _, s, _ in todo]
        t0 = time.perf_counter()
        results = self.model.stream([s for _, s, _ in todo], prompts, clips, fps, self.settings.style,
                                    self.settings.max_new_tokens)
        try:
            for k, (text, err) in results:
                g, s, c = todo[k]
                self.store.append("samples", g.source, [record(g, s, c, prompts[k], text, err, self.settings.style,
                                                               self.settings.scoring)])
                self.generated += 1
                if self.bar is not None:
                    self.bar.update(1)
                if self.settings.stop_after and self.generated >= self.settings.stop_after:
                    return False
        finally:
            results.close()
            self.sec_generate += time.perf_counter() - t0
        return True

    def start_judge(self, window):
        """Judge a window in a background thread (the next window generates meanwhile), once the previous
        window's judge has finished. A judge's failure stops the run."""
        self.wait_judge()
        if self.judge is None:
            return
        state = {"error": None}

        def work():
            try:
                self.judge_window(window)
            except BaseException as e:  # noqa: BLE001 - raised again in the main thread by wait_judge
                state["error"] = e
        thread = threading.Thread(target=work, name="judge", daemon=True)  # (a kill does not wait for it)
        thread.start()
        self.judging = (thread, state)

    def wait_judge(self):
        if self.judging is not None:
            thread, state = self.judging
            thread.join()
            self.judging = None
            if state["error"] is not None:
                raise state["error"]

    def judge_window(self, window):
        """A window's pairs (Store.to_judge), each verdict stored as it comes. An openai: judge: every pair in
        flight at once, --judge-concurrency at a time, each with --judge-frames frames of the clip it rates
        (encoded once per clip); another judge: one batch per video."""
        t0 = time.perf_counter()
        served, jobs = getattr(self.judge, "served", False), []
        for g in window.groups:
            pend = self.store.to_judge(g, self.judge)
            if not pend:
                continue
            if not served:
                jobs.append((g.source, pend, None))
                continue
            shown = {}
            for p in pend:
                cond = p[0][1]
                if cond not in shown:
                    shown[cond] = self.judge_images(g, cond, window)
                jobs.append((g.source, [p], shown[cond]))

        def one(job):
            src, ps, images = job
            verdicts = self.judge.reasoning_quality_batch([p[1:] for p in ps], images=images)
            self.store.append(f"judge-{self.store.tag}", src, [
                {"doc_id": k[0], "condition": k[1], "judge": v} for (k, *_), v in zip(ps, verdicts)
                if any(x is not None for x in v.values())])
        if served and len(jobs) > 1:
            with concurrent.futures.ThreadPoolExecutor(min(len(jobs), self.settings.judge_concurrency)) as pool:
                list(pool.map(one, jobs))
        else:
            for job in jobs:
                one(job)
        self.sec_judge += time.perf_counter() - t0

    def judge_images(self, g, cond, window):
        """--judge-frames frames of the clip, evenly spaced, as JPEG (None: a text-only judge)."""
        if self.settings.judge_frames <= 0:
            return None
        frames = window.clip(g, cond)[0]
        return chat.jpegs(list(frames[np.linspace(0, len(frames) - 1, self.settings.judge_frames).round().astype(int)]))
