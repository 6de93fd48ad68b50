"""Embodied-R's perception stage (perceive.py): parsing, rendering, the call pattern of Eq. 1, the cache,
failure handling, and the plumbing of the HF backend on the tiny offline model."""
import numpy as np
import pytest

from extensions.embodied_r import perceive
from extensions.embodied_r.perceive import (
    ACTIONS,
    PerceptionCache,
    make_perceiver,
    normalize_action,
    parse_pair,
    render,
)
from extensions.embodied_r.perceive import perceive as run


# --------------------------------------------------------------------------- parse_pair
def test_parse_clean_reply():
    reply = "Action: move forward\nNew: a red door on the left.\nRelevant: the chair is now visible."
    assert parse_pair(reply) == {"action": "move forward", "new": "a red door on the left",
                                 "relevant": "the chair is now visible"}


def test_parse_messy_markdown():
    reply = ("Sure! Comparing the two frames:\n\n"
             "- **Action:** Turn left\n"
             "- **New information**: a tall *glass* tower appears on the right\n"
             "- **Question-related content:** none\n\n"
             "Let me know if you need more.")
    assert parse_pair(reply) == {"action": "rotate left", "new": "a tall glass tower appears on the right",
                                 "relevant": "none"}


def test_parse_labels_case_numbering_and_value_on_next_line():
    reply = "1. ACTION: ascending slowly\n2. new:\n   a bridge appears below\n3. relevant: the bridge is ahead"
    assert parse_pair(reply) == {"action": "move up", "new": "a bridge appears below",
                                 "relevant": "the bridge is ahead"}


def test_parse_inline_labels():
    assert parse_pair("Action: rotate right. New: a tower. Relevant: none") == {
        "action": "rotate right", "new": "a tower", "relevant": "none"}


def test_parse_unknown_action_and_missing_fields():
    assert parse_pair("Action: jump over it\nNew: a fence") == {"action": "unknown", "new": "a fence", "relevant": ""}
    assert parse_pair("Relevant: the car") == {"action": "", "new": "", "relevant": "the car"}
    assert parse_pair("") == {"action": "", "new": "", "relevant": ""}
    assert parse_pair(None) == {"action": "", "new": "", "relevant": ""}
    # no label at all: the text is kept as the new information
    assert parse_pair("a dog runs by") == {"action": "", "new": "a dog runs by", "relevant": ""}


@pytest.mark.parametrize("text,action", [
    ("move forward", "move forward"), ("Move Backward.", "move backward"), ("rotate left (slightly)", "rotate left"),
    ("turn left", "rotate left"), ("turning right", "rotate right"), ("pan left", "rotate left"),
    ("forward", "move forward"), ("goes straight ahead", "move forward"), ("back", "move backward"),
    ("look up", "tilt up"), ("tilts downward", "tilt down"), ("ascend", "move up"), ("descending", "move down"),
    ("strafe left", "move left"), ("slide to the right", "move right"), ("hovering", "stay"),
    ("no movement", "stay"), ("stay", "stay"), ("turn left and move forward", "rotate left"),
    ("teleport", "unknown"), ("", "unknown")])
def test_normalize_action(text, action):
    assert normalize_action(text) == action


def test_every_action_maps_to_itself():
    assert all(normalize_action(a) == a for a in ACTIONS)


# --------------------------------------------------------------------------- render
def test_render_exact():
    pairs = [{"action": "move forward", "new": "a red door.", "relevant": "the chair is visible."},
             {"action": "rotate left", "new": "", "relevant": "none"},
             {"action": "unknown", "new": "a tree", "relevant": ""},
             {"action": "", "new": "", "relevant": ""}]
    assert render("A street with\nparked cars.", pairs) == (
        "Frame 0: Observe: A street with parked cars\n"
        "Frame 1: After move forward, Observe: a red door. Relevant: the chair is visible\n"
        "Frame 2: After rotate left. Relevant: none\n"
        "Frame 3: Observe: a tree\n"
        "Frame 4: (no description)")
    assert render("", []) == "Frame 0: (no description)"


# --------------------------------------------------------------------------- perceive
class Scripted:
    """A backend that records its calls and answers from a script (a reply, None or an exception)."""

    def __init__(self, replies=None, name="scripted"):
        self.name, self.calls, self.replies = name, [], list(replies or [])

    def __call__(self, prompt, images):
        self.calls.append((prompt, [np.array(im) for im in images]))
        if self.replies:
            r = self.replies.pop(0)
        elif "Action:" not in prompt:  # the first-frame prompt
            r = "A corridor with a chair on the left."
        else:
            r = f"Action: move forward\nNew: object {len(self.calls)}\nRelevant: chair"
        if isinstance(r, Exception):
            raise r
        return r


def clip(t=3, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (t, 8, 8, 3), dtype=np.uint8)


EXPECTED = ("Frame 0: Observe: A corridor with a chair on the left\n"
            "Frame 1: After move forward, Observe: object 2. Relevant: chair\n"
            "Frame 2: After move forward, Observe: object 3. Relevant: chair")


def test_perceive_calls_and_text():
    frames, b = clip(), Scripted()
    stats = {}
    assert run(frames, "Where is the chair?", b, stats=stats) == EXPECTED
    assert len(b.calls) == 3
    (p0, i0), (p1, i1), (p2, i2) = b.calls
    assert "Where is the chair?" in p0 and p0 == perceive.FIRST_FRAME_PROMPT.format(question="Where is the chair?")
    assert p1 == p2 == perceive.PAIR_PROMPT.format(question="Where is the chair?")
    assert len(i0) == 1 and np.array_equal(i0[0], frames[0])
    assert [np.array_equal(a, b_) for a, b_ in zip(i1 + i2, [frames[0], frames[1], frames[1], frames[2]])] == [True] * 4
    assert stats == {"calls": 3, "retries": 0, "failures": 0, "cache_hits": 0}


def test_prompts_name_every_action():
    assert all(a in perceive.PAIR_PROMPT for a in ACTIONS)
    assert "{question}" in perceive.FIRST_FRAME_PROMPT and "{question}" in perceive.PAIR_PROMPT


def test_cache_hit_miss_and_reopen(tmp_path):
    path = tmp_path / "perception.sqlite"
    frames, spec = clip(), {"style": "fog", "eta": 0.7, "seed": 3}
    cache = PerceptionCache(path)
    b = Scripted()
    first = run(frames, "q?", b, cache=cache, video_id="v1", indices=[0, 5, 9])
    assert len(b.calls) == 3 and len(cache) == 1
    b2 = Scripted(replies=["never used"])
    stats = {}
    assert run(frames, "q?", b2, cache=cache, video_id="v1", indices=[0, 5, 9], stats=stats) == first
    assert b2.calls == [] and stats["cache_hits"] == 1
    cache.close()
    reopened = PerceptionCache(path)  # a new process would see the same
    b3 = Scripted()
    assert run(frames, "q?", b3, cache=reopened, video_id="v1", indices=[0, 5, 9]) == first and b3.calls == []
    # a different spec, question, backend or frame indices is a miss
    for kw in ({"spec": spec}, {"indices": [0, 5, 10]}):
        b4 = Scripted()
        run(frames, "q?", b4, cache=reopened, video_id="v1", **({"indices": [0, 5, 9]} | kw))
        assert len(b4.calls) == 3
    b5 = Scripted(name="other")
    run(frames, "q?", b5, cache=reopened, video_id="v1", indices=[0, 5, 9])
    assert len(b5.calls) == 3
    # spec key order does not matter
    b6 = Scripted()
    run(frames, "q?", b6, cache=reopened, video_id="v1", indices=[0, 5, 9], spec=dict(reversed(list(spec.items()))))
    assert b6.calls == []
    reopened.close()


def test_retry_once_then_success():
    b = Scripted(replies=[RuntimeError("server hiccup"), "A corridor with a chair on the left.",
                          None, "Action: move forward\nNew: object 2\nRelevant: chair"])
    stats = {}
    text = run(clip(2), "q?", b, stats=stats)
    assert text == "\n".join(EXPECTED.split("\n")[:2])
    assert len(b.calls) == 4 and stats == {"calls": 4, "retries": 2, "failures": 0, "cache_hits": 0}


def test_backend_always_none_never_crashes(tmp_path):
    class Dead:
        name, calls, reply = "dead", 0, None

        def __call__(self, prompt, images):
            Dead.calls += 1
            return self.reply

    cache, stats = PerceptionCache(tmp_path / "c.sqlite"), {}
    text = run(clip(3), "q?", Dead(), cache=cache, stats=stats)
    assert text == "Frame 0: (no description)\nFrame 1: (no description)\nFrame 2: (no description)"
    assert Dead.calls == 6 and stats["failures"] == 3 and stats["retries"] == 3
    assert len(cache) == 0  # a failed perception is not cached: a rerun asks again


def test_perceive_rejects_bad_frames():
    with pytest.raises(ValueError):
        run(np.zeros((0, 8, 8, 3), np.uint8), "q?", Scripted())
    with pytest.raises(ValueError):
        run(np.zeros((2, 8, 8, 3), np.float32), "q?", Scripted())


# --------------------------------------------------------------------------- backends
def test_make_perceiver_errors():
    for bad in ("", None, "hf", "hf:", "openai:", "local", "gpt-4o", "vllm:model"):
        with pytest.raises(ValueError, match="valid forms"):
            make_perceiver(bad)


def test_openai_perceiver_wraps_judge(monkeypatch):
    p = make_perceiver("openai:gpt-4o", base_url="http://localhost:1/v1", max_tokens=64)
    seen = {}

    def fake(prompt, max_tokens=None, frames=None):
        seen.update(prompt=prompt, max_tokens=max_tokens, n=len(frames))
        return "Action: stay\nNew: -\nRelevant: none"

    monkeypatch.setattr(p.client, "complete", fake)
    assert p("hi", list(clip(2))) == "Action: stay\nNew: -\nRelevant: none"
    assert seen == {"prompt": "hi", "max_tokens": 64, "n": 2}
    assert p.name.startswith("openai:gpt-4o@http://localhost:1/v1")


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return tiny_path


def test_hf_perceiver_on_tiny_model(tiny, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    p = make_perceiver(f"hf:{tiny}", max_new_tokens=8, device="cpu")
    frames = np.random.default_rng(0).integers(0, 256, (2, 56, 56, 3), dtype=np.uint8)
    reply = p(perceive.PAIR_PROMPT.format(question="Where is the door?"), list(frames))
    assert isinstance(reply, str)
    assert p("describe", [frames[0]]) is not None  # one image works too
    text = run(frames, "Where is the door?", p)  # the whole stage on gibberish: still a 2-line text
    assert text.startswith("Frame 0:") and text.count("\n") == 1
