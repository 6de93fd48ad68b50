"""Tests for chat.py: the OpenAI-compatible chat-completions client against a scripted fake server on
127.0.0.1 (request shape, frames as JPEG image parts, retries, Retry-After, 4xx, the key masked, the
thread pool keeping input order) and the SQLite reply cache (threads, connections, a file written by
an earlier version). The fake server is shared with test_judge.py."""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections import defaultdict, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from machinery.eval import chat

SECRET = "sk-test-9f3a7c1e-DO-NOT-LEAK-4b2d"


# --------------------------------------------------------------------------- the fake server
class FakeServer:
    """A chat-completions endpoint on 127.0.0.1 with scripted behaviour.

    ``script[marker]`` is a queue of actions for requests whose prompt contains `marker`, consumed one
    per request: ("status", code, headers, body), ("sleep", seconds) then the default reply,
    ("text", content). Without a matching action the reply is ``respond(prompt)`` (default "1").
    Every request is recorded in ``hits`` (prompt, Authorization header, payload)."""

    def __init__(self):
        self.hits, self.script, self.lock = [], defaultdict(deque), threading.Lock()
        self.respond = lambda prompt: "1"
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                content = body["messages"][0]["content"]
                prompt = content if isinstance(content, str) else content[-1]["text"]
                with server.lock:
                    server.hits.append({"path": self.path, "auth": self.headers.get("Authorization"),
                                        "prompt": prompt, "payload": body})
                    action = None
                    for marker, queue in server.script.items():
                        if marker in prompt and queue:
                            action = queue.popleft()
                            break
                try:
                    if action and action[0] == "status":
                        _, code, headers, text = action
                        if text == "ECHO_AUTH":   # a server that quotes the key back in its error
                            text = f"invalid key {self.headers.get('Authorization')}"
                        self.send_response(code)
                        for k, v in headers.items():
                            self.send_header(k, v)
                        self.send_header("Content-Length", str(len(text.encode())))
                        self.end_headers()
                        self.wfile.write(text.encode())
                        return
                    if action and action[0] == "sleep":
                        time.sleep(action[1])
                    reply = action[1] if action and action[0] == "text" else server.respond(prompt)
                    out = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}]}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except (BrokenPipeError, ConnectionResetError):
                    pass   # the client gave up (timeout test)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def count(self, marker=""):
        with self.lock:
            return sum(marker in h["prompt"] for h in self.hits)


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def make_client(server, **kw):
    kw = {"timeout": 5, "max_retries": 3, "backoff_base": 0.01, "backoff_max": 2.0, **kw}
    return chat.ChatClient(base_url=server.url + "/", model="fake-model", **kw)


# --------------------------------------------------------------------------- the client
def test_request_shape_text_and_frames(server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.respond = lambda p: f"reply to {p}"
    c = make_client(server, temperature=0.2)
    assert c.base_url == server.url and c.complete("hello", 7) == "reply to hello"
    hit = server.hits[0]
    assert hit["path"] == "/v1/chat/completions" and hit["auth"] is None    # no key: no header (vLLM)
    assert hit["payload"] == {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}],
                              "temperature": 0.2, "max_tokens": 7}
    frames = [np.zeros((8, 8, 3), np.uint8), np.full((8, 8, 3), 200, np.uint8)]
    assert c.complete("look", 5, frames=frames) == "reply to look"
    content = server.hits[1]["payload"]["messages"][0]["content"]
    assert [p["type"] for p in content] == ["image_url", "image_url", "text"] and content[-1]["text"] == "look"
    jpeg = base64.b64decode(content[1]["image_url"]["url"].removeprefix("data:image/jpeg;base64,"))
    assert jpeg == chat.jpegs(frames)[1] and jpeg[:2] == b"\xff\xd8"
    assert c.stats == {"retries": 0, "errors": 0}
    c.close()


def test_jpegs_takes_arrays_pil_images_and_bytes():
    from PIL import Image
    a = np.full((6, 6, 3), 90, np.uint8)
    out = chat.jpegs([a, Image.fromarray(a), b"raw", bytearray(b"ba")])
    assert out[0] == out[1] and out[0][:2] == b"\xff\xd8" and out[2:] == [b"raw", b"ba"]
    assert chat.jpegs(None) == [] and chat.jpegs([]) == [] and len(chat.jpegs(np.stack([a, a]))) == 2


def test_retries_retry_after_and_final_errors(server):
    server.script["R503"].append(("status", 503, {"Retry-After": "0.3"}, "busy"))
    server.script["R404"].append(("status", 404, {}, "no such model"))
    server.script["RBAD"].append(("text", None))
    c = make_client(server, backoff_base=0.001)
    t = time.perf_counter()
    assert c.complete("R503", 4) == "1" and time.perf_counter() - t >= 0.25   # waited Retry-After
    assert c.stats == {"retries": 1, "errors": 0}
    assert c.complete("R404", 4) is None and server.count("R404") == 1          # another 4xx: not retried
    assert c.complete("RBAD", 4) == ""                                          # a null content: empty text
    assert c._retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0 and c._retry_after("") is None
    assert c._retry_after("999") == 2.0 and c._retry_after("soon") is None      # capped at backoff_max
    server.script["RDOWN"].extend([("status", 500, {}, "down")] * 2)
    assert make_client(server, max_retries=1).complete("RDOWN", 4) is None and server.count("RDOWN") == 2
    assert c.stats == {"retries": 1, "errors": 1}


def test_key_masked_in_replies_and_logs(server, monkeypatch, caplog):
    monkeypatch.setenv("MY_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    server.script["K401"].append(("status", 401, {}, "ECHO_AUTH"))
    server.respond = lambda p: f"echo {SECRET}"
    c = make_client(server, api_key_env="MY_KEY")
    assert c.complete("K401", 4) is None and c.complete("hi", 4) == "echo ***"
    assert server.hits[0]["auth"] == f"Bearer {SECRET}" and "invalid key Bearer ***" in caplog.text
    for where in (caplog.text, repr(c), str(vars(c))):
        assert SECRET not in where
    assert "'MY_KEY' (set)" in repr(c)


def test_complete_many_is_concurrent_and_keeps_input_order(server):
    server.respond = lambda p: (time.sleep(0.05 * (4 - int(p[-1]))), p.upper())[1]
    c = make_client(server, concurrency=4)
    t = time.perf_counter()
    assert c.complete_many([f"p{i}" for i in range(4)], 4) == ["P0", "P1", "P2", "P3"]
    assert time.perf_counter() - t < 0.45                       # in parallel: not 0.05 * (4 + 3 + 2 + 1)
    frames = [np.zeros((4, 4, 3), np.uint8)]
    assert make_client(server, concurrency=1).complete_many(["p1", "p2"], 4, frames) == ["P1", "P2"]
    assert all(len(h["payload"]["messages"][0]["content"]) == 2 for h in server.hits[-2:])


# --------------------------------------------------------------------------- the reply cache
def test_cache_survives_concurrent_threads_and_connections(tmp_path):
    path = tmp_path / "threads.sqlite"
    caches = [chat.ReplyCache(path), chat.ReplyCache(path)]    # two connections to one file
    errors = []

    def work(t):
        try:
            c = caches[t % 2]
            for i in range(60):
                k = chat.ReplyCache.key("b", "m", f"prompt {t} {i}")
                c.put(k, f"reply {t} {i}")
                assert c.get(k) == f"reply {t} {i}"
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(caches[0]) == len(caches[1]) == 8 * 60
    assert caches[1].get(chat.ReplyCache.key("b", "m", "prompt 7 59")) == "reply 7 59"
    memory = chat.ReplyCache(None)
    memory.put("k", "v")
    assert memory.get("k") == "v" and memory.get("other") is None and memory.path is None


def test_cache_reads_a_file_written_before_the_move(tmp_path):
    """The schema and the key of judge.VerdictCache, which ReplyCache replaced: old caches stay valid."""
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE replies (key TEXT PRIMARY KEY, backend TEXT, model TEXT, reply TEXT NOT NULL, "
               "created REAL)")
    db.execute("INSERT INTO replies VALUES ('996a89cf532a8597e138e5e2644f7c9797f37ded1c245620734eb0d2ed27d48e', "
               "'openai', 'gpt-4o', 'Score: 1', 0)")
    db.commit()
    db.close()
    key = chat.ReplyCache.key("openai", "gpt-4o", "temperature=0|max_tokens=16\nhi")
    want = hashlib.sha256(json.dumps(["openai", "gpt-4o", "temperature=0|max_tokens=16\nhi"]).encode())
    assert key == want.hexdigest()
    cache = chat.ReplyCache(path)
    assert cache.get(key) == "Score: 1" and len(cache) == 1 and repr(cache) == f"ReplyCache({path})"
    cache.close()
