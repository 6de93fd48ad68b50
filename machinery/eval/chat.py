"""An OpenAI-compatible chat-completions client and a persistent reply cache (support module).

Everything in this project that asks a remote language model goes through here: the GPT-4o judge of
Sec. 3.3 / App. C (``judge.OpenAIJudge``), eval_pvrbench.py's API models and the extensions' API models.

* :class:`ChatClient`: one user message (optional video frames as base64 JPEG image parts, then the
  text) to ``{base_url}/chat/completions`` of OpenAI or any compatible server (vLLM, SGLang); retries
  with backoff; the key comes from an environment variable and is never stored, logged or returned;
  batches on a thread pool. Replies are never cached here.
* :class:`ReplyCache`: one SQLite file of raw reply texts keyed by (backend, model, prompt), safe to
  share between threads and processes.
"""
from __future__ import annotations

import base64
import concurrent.futures
import email.utils
import hashlib
import io
import json
import logging
import os
import random
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def jpegs(frames) -> list[bytes]:
    """Frames (numpy HxWx3 uint8, PIL images or JPEG bytes; None = none) as JPEG bytes (quality 90)."""
    if frames is None:
        return []
    from PIL import Image
    out = []
    for im in frames:
        if isinstance(im, bytes | bytearray):
            out.append(bytes(im))
            continue
        if not isinstance(im, Image.Image):
            im = Image.fromarray(np.asarray(im, dtype=np.uint8))
        buf = io.BytesIO()
        im.convert("RGB").save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _content(prompt: str, images: list[bytes], video: bool = False):
    """The user message's content: the prompt alone, or the frames first and then the text. The frames go as
    base64 JPEG image parts (as GPT-4o-style APIs take them), or, `video`, as ONE video part whose data URL
    holds the JPEG frames comma-separated (``data:video/jpeg;base64,<f1>,<f2>,...``: what vLLM's
    VideoMediaIO reads as a video), so that a served Qwen-VL sees a video, with temporal positions."""
    if not images:
        return prompt
    if video:
        frames = [{"type": "video_url", "video_url": {"url": "data:video/jpeg;base64," + ",".join(map(_b64, images))}}]
    else:
        frames = [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + _b64(b)}} for b in images]
    return frames + [{"type": "text", "text": prompt}]


def mp4_content(prompt: str, mp4: bytes):
    """The user message's content with the clip as one mp4 video part (``data:video/mp4;base64``), then the text:
    what a served model gets from eval_pvrbench.py --video-format mp4, and from lmms-eval's openai model with
    pass_video_url (a file:// URL; vLLM decodes both with the same loader)."""
    return [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + _b64(mp4)}},
            {"type": "text", "text": prompt}]


def video_kwargs(fps: float) -> dict:
    """How a video part's frame rate reaches a served Qwen-VL: vLLM (checked in 0.32.0's code and against its
    server) decodes a ``data:video/jpeg`` part with the per-request ``media_io_kwargs["video"]`` and builds the
    video's metadata from their ``fps`` (default 1, whatever the clip's rate), from which Qwen2.5-VL's processor
    derives the temporal spacing (``second_per_grid_ts``); ``num_frames: -1`` keeps every frame sent (a request
    that sets fps alone would drop the server's own ``num_frames`` and keep the first 32). vLLM refuses
    per-request ``media_io_kwargs`` unless the server runs with ``--trust-request-mm-kwargs``; it ignores
    ``mm_processor_kwargs.fps`` for such a part."""
    return {"video": {"fps": float(fps), "num_frames": -1}}


def server_message(resp) -> str:
    """A refusal's own words: the ``error.message`` of an OpenAI-style error body (whole), else the body (up to
    1,000 characters)."""
    try:
        error = resp.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if isinstance(message, str) and message:
            return message
    except (ValueError, AttributeError):
        pass
    return resp.text[:1000]


OPENAI_URL = "https://api.openai.com/v1"


class ChatClient:
    """GPT-4o or any OpenAI-compatible chat-completions server (vLLM, SGLang).

    POST {base_url}/chat/completions with {"model", "messages": [one user message], "temperature",
    "max_tokens"}; ``Authorization: Bearer $<api_key_env>`` only when that variable is set (a local
    server needs none). The key is read from the environment at each request, never stored on the
    object, and masked out of every log line and reply. Retries with exponential backoff and jitter
    on 429, 5xx, connection errors and timeouts, honouring Retry-After (capped at ``backoff_max``);
    another 4xx is final. ``stats``: retries (repeated attempts) and errors (requests that failed for
    good, each then a None reply). ``base_url``: the server; empty or None means $OPENAI_BASE_URL when
    set (a vLLM/SGLang server), else OpenAI's."""

    def __init__(self, base_url: str | None = None, model: str = "gpt-4o",
                 api_key_env: str = "OPENAI_API_KEY", timeout: float = 60, max_retries: int = 5,
                 concurrency: int = 8, temperature: float = 0, backoff_base: float = 1.0, backoff_max: float = 60.0):
        import requests

        base_url = base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_URL
        self.base_url, self.model, self.api_key_env = base_url.rstrip("/"), model, api_key_env
        self.timeout, self.max_retries, self.concurrency = timeout, max(0, int(max_retries)), max(1, int(concurrency))
        self.temperature, self.backoff_base, self.backoff_max = temperature, backoff_base, backoff_max
        self.stats = {"retries": 0, "errors": 0}
        self.rejected = None  # the last request the server refused for good (4xx): its reason
        self._stats_lock = threading.Lock()
        self._session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=self.concurrency)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)

    def __repr__(self):
        state = "set" if os.environ.get(self.api_key_env) else "unset"
        return (f"ChatClient(model={self.model!r}, base_url={self.base_url!r}, api_key_env={self.api_key_env!r} "
                f"({state}))")

    def _count(self, key: str) -> None:
        with self._stats_lock:
            self.stats[key] = self.stats.get(key, 0) + 1

    def _mask(self, text) -> str:
        text = str(text)
        key = os.environ.get(self.api_key_env)
        return text.replace(key, "***") if key else text

    def complete(self, prompt: str, max_tokens: int, frames=None, video_fps: float | None = None,
                 mp4: bytes | None = None) -> str | None:
        """One chat completion (frames, if any, before the text: image parts, or with `video_fps` one video
        part at that frame rate, see :func:`video_kwargs`): the reply text with the key masked, or None after
        failures (counted in stats["errors"]). `mp4`: the clip as one mp4 video part instead (every frame kept,
        the frame rate the container's)."""
        return self._post(prompt, max_tokens, jpegs(frames), video_fps, mp4)

    def complete_many(self, prompts, max_tokens: int, frames=None) -> list:
        """:meth:`complete` for each prompt (the same frames with every one) on a pool of
        ``concurrency`` threads; replies in input order."""
        images = jpegs(frames)
        if len(prompts) == 1 or self.concurrency == 1:
            return [self._post(p, max_tokens, images) for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(lambda p: self._post(p, max_tokens, images), prompts))

    def _backoff(self, attempt: int) -> float:
        return min(self.backoff_max, self.backoff_base * 2 ** attempt) * random.uniform(0.5, 1.0)

    def _retry_after(self, value) -> float | None:
        """Retry-After in seconds (a number or an HTTP date), capped at backoff_max; None if absent."""
        if not value:
            return None
        try:
            seconds = float(value)
        except ValueError:
            try:
                seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
            except (TypeError, ValueError):
                return None
        return min(max(seconds, 0.0), self.backoff_max)

    def payload(self, prompt: str, max_tokens: int, images: list[bytes], video_fps: float | None = None,
                mp4: bytes | None = None) -> dict:
        """The request body: one user message (the frames, as one video part at `video_fps`, as image parts or
        as one mp4, then the prompt)."""
        video = video_fps is not None and bool(images)
        content = mp4_content(prompt, mp4) if mp4 is not None else _content(prompt, images, video)
        payload = {"model": self.model, "messages": [{"role": "user", "content": content}],
                   "temperature": self.temperature, "max_tokens": max_tokens}
        if video or mp4 is not None:
            payload["media_io_kwargs"] = video_kwargs(video_fps) if video else {"video": {"num_frames": -1}}
        return payload

    def _post(self, prompt: str, max_tokens: int, images: list[bytes], video_fps: float | None = None,
              mp4: bytes | None = None) -> str | None:
        """The retry loop around :meth:`_attempt`."""
        payload = self.payload(prompt, max_tokens, images, video_fps, mp4)
        for attempt in range(self.max_retries + 1):
            final, reply, reason, wait = self._attempt(payload, attempt)
            if final:
                return reply
            if attempt == self.max_retries:
                break
            delay = wait if wait is not None else self._backoff(attempt)
            self._count("retries")
            log.info("chat %s: %s; retry %d/%d in %.2f s", self.model, reason, attempt + 1, self.max_retries, delay)
            time.sleep(delay)
        log.warning("chat %s: giving up after %d attempts (%s)", self.model, self.max_retries + 1, reason)
        self._count("errors")
        return None

    def _attempt(self, payload: dict, attempt: int):
        """One POST: (final, reply, reason, wait). final: the reply (None after a failure not worth
        retrying, counted); else reason (for the log) and wait (Retry-After in seconds, or None)."""
        import requests

        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        try:
            resp = self._session.post(f"{self.base_url}/chat/completions", json=payload, headers=headers,
                                      timeout=self.timeout)
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as e:
            return False, None, f"{type(e).__name__}: {self._mask(e)[:200]}", None
        except requests.RequestException as e:   # a bad URL and the like: retrying will not help
            return self._fail("request failed, not retried (%s: %s)", type(e).__name__, self._mask(e)[:200])
        if resp.status_code == 200:
            try:
                reply = resp.json()["choices"][0]["message"]["content"]
            except (ValueError, KeyError, IndexError, TypeError):
                return self._fail("unreadable response body: %s", self._mask(resp.text[:200]))
            log.debug("chat %s: HTTP 200 after %d attempt(s)", self.model, attempt + 1)
            return True, self._mask(reply or ""), None, None
        reason = f"HTTP {resp.status_code}: {self._mask(server_message(resp))}"
        if resp.status_code != 429 and resp.status_code < 500:
            self.rejected = reason
            return self._fail("request rejected, not retried (%s)", reason)
        return False, None, reason, self._retry_after(resp.headers.get("Retry-After"))

    def _fail(self, message: str, *args):
        log.warning("chat %s: " + message, self.model, *args)
        self._count("errors")
        return True, None, None, None

    def close(self) -> None:
        self._session.close()


class ReplyCache:
    """A persistent cache of model replies: one SQLite file, one row per prompt, keyed by the sha256 of
    (backend, model, prompt) (:meth:`key`; callers put request parameters such as max_tokens into the
    prompt string they key on), value = the raw reply text (parsed on read, so a better parser applies
    to old replies). The judges store unparsable replies too (temperature 0: asking again would give
    the same), never failed requests. A rerun asks nothing twice.

    Thread-safe (one connection behind a lock) and process-safe (SQLite file locks, WAL, a busy
    timeout); autocommit, so each ``put`` is durable on return. ``path=None`` keeps the cache in
    memory for the life of the object."""

    def __init__(self, path=None, timeout: float = 60.0):
        self.path = None if path is None else str(path)
        if self.path:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path or ":memory:", timeout=timeout, check_same_thread=False,
                                   isolation_level=None)
        with self._lock:
            if self.path:
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, backend TEXT, "
                             "model TEXT, reply TEXT NOT NULL, created REAL)")

    @staticmethod
    def key(backend: str, model: str, prompt: str) -> str:
        return hashlib.sha256(json.dumps([backend, model, prompt]).encode("utf-8")).hexdigest()

    def get(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def put(self, key: str, reply: str, backend: str = "", model: str = "") -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?, ?)",
                             (key, backend, model, reply, time.time()))

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM replies").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __repr__(self):
        return f"ReplyCache({self.path or ':memory:'})"
