"""perceive_cv.py, the classical-vision backend (CVPerceiver, the CPU stand-in for Embodied-R's VLM, Sec. 2.2):
colour blobs, ego-motion sign conventions on rendered clips with known motion, the PAIR_PROMPT format and
its round trip through the parsers, the vocabulary, and degradation under PVRBench corruptions."""
import functools
import re
import time

import cv2
import numpy as np
import pytest


from machinery.datasets import synthetic
from extensions.embodied_r import perceive
import perturb
from extensions.embodied_r.perceive import ACTIONS, make_perceiver, parse_pair
from extensions.embodied_r.perceive_cv import CVPerceiver, colour_blobs, cv_corpus, ego_motion

# A fixed scene: objects ahead at 5-13 m, left and right of the path, plus some off to the sides that a
# turn brings into view. Positions (x right, z forward) in metres; the camera starts at the origin.
SCENE = [
    {"colour": "red", "shape": "pillar", "pos": (-1.6, 5.0)},
    {"colour": "blue", "shape": "cube", "pos": (1.8, 7.0)},
    {"colour": "yellow", "shape": "slab", "pos": (0.2, 10.0)},
    {"colour": "green", "shape": "block", "pos": (-2.5, 12.0)},
    {"colour": "purple", "shape": "cube", "pos": (3.0, 11.0)},
    {"colour": "orange", "shape": "block", "pos": (-5.5, 6.0)},   # off to the left
    {"colour": "green", "shape": "pillar", "pos": (5.5, 7.0)},    # off to the right
]
MOTIONS = {"left": (0.045, 0.2), "right": (-0.045, 0.2), "forward": (0.0, 0.2), "static": (0.0, 0.0)}  # yaw, speed
EXPECTED = {"left": "rotate left", "right": "rotate right", "forward": "move forward", "static": "stay"}
QUESTION = "How many red objects appear in the video?"


@functools.cache
def clip(motion, size=56, frames=8):
    """A rendered clip of SCENE with a known camera motion (read-only: it is shared between tests)."""
    yaw, speed = MOTIONS[motion]
    out, _, _ = synthetic.render_synthetic(SCENE, yaw, speed, num_frames=frames, size=size)
    out.setflags(write=False)
    return out


def frac(actions, want):
    return sum(a == want for a in actions) / len(actions)


# --------------------------------------------------------------------------- make_perceiver
def test_make_perceiver_cv():
    p = make_perceiver("cv")
    assert isinstance(p, CVPerceiver) and p.name == "cv:v1"
    assert isinstance(make_perceiver(" CV "), CVPerceiver)
    assert "cv" in perceive.PERCEIVER_SPECS
    for bad in ("cv:", "cv:x", "cvx"):
        with pytest.raises(ValueError, match="valid forms"):
            make_perceiver(bad)


# --------------------------------------------------------------------------- ego_motion
@pytest.mark.parametrize("size", [56, 112])
@pytest.mark.parametrize("motion", ["left", "right", "forward", "static"])
def test_ego_motion_on_rendered_clips(motion, size):
    """synthetic.render_synthetic's positive yaw rate is a left turn: the ground truth for the sign."""
    frames = clip(motion, size)
    results = [ego_motion(frames[j - 1], frames[j]) for j in range(1, len(frames))]
    actions = [a for a, _ in results]
    assert all(a in ACTIONS for a in actions)
    assert all(0.0 <= c <= 1.0 for _, c in results)
    if motion in ("left", "right", "static"):
        assert actions == [EXPECTED[motion]] * len(actions), actions
    else:
        assert frac(actions, "move forward") >= 0.8, actions
    if motion == "static":
        assert all(c == 1.0 for _, c in results)


def test_ego_motion_with_frames_further_apart():
    """Key frames two renders apart (a bigger turn and step): still right on every pair."""
    for motion in ("left", "right", "forward"):
        frames = clip(motion, 112, 12)
        actions = [ego_motion(frames[j - 2], frames[j])[0] for j in range(2, len(frames), 2)]
        assert frac(actions, EXPECTED[motion]) >= 0.8, (motion, actions)


def test_ego_motion_signs_from_crops():
    """Shifting the window over a still image: content moving down = the camera tilted up, content moving
    right = it turned left, a magnified centre = it moved forward."""
    big = synthetic.render_synthetic(SCENE, 0.0, 0.0, num_frames=1, size=160)[0][0]

    def win(y, x):
        return np.ascontiguousarray(big[y:y + 112, x:x + 112])

    ref = win(24, 24)
    assert ego_motion(ref, win(20, 24))[0] == "tilt up"     # window moved up: content moves down
    assert ego_motion(ref, win(28, 24))[0] == "tilt down"
    assert ego_motion(ref, win(24, 20))[0] == "rotate left"  # window moved left: content moves right
    assert ego_motion(ref, win(24, 28))[0] == "rotate right"
    zoom = cv2.resize(big[34:126, 34:126], (112, 112), interpolation=cv2.INTER_AREA)
    assert ego_motion(ref, zoom)[0] == "move forward"
    assert ego_motion(zoom, ref)[0] == "move backward"
    assert ego_motion(ref, ref) == ("stay", 1.0)


def test_ego_motion_blank_frames_and_bad_input():
    grey = np.full((56, 56, 3), 128, np.uint8)
    action, conf = ego_motion(grey, grey)
    assert action == "stay" and conf == 0.0  # nothing textured: no evidence
    with pytest.raises(ValueError):
        ego_motion(grey[..., 0], grey)
    with pytest.raises(ValueError):
        ego_motion(grey.astype(np.float32), grey)


# --------------------------------------------------------------------------- colour_blobs
@pytest.mark.parametrize("size", [56, 112])
def test_colour_blobs_red_pillar_on_the_left(size):
    frame = synthetic.render_synthetic([SCENE[0], SCENE[1]], 0.0, 0.0, num_frames=1, size=size)[0][0]
    blobs = colour_blobs(frame)
    assert [b["colour"] for b in blobs] == ["red", "blue"]  # left to right
    red, blue = blobs
    assert red["shape"] == "tall" and red["position"] == "left" and red["distance"] == "near"
    assert blue["position"] == "right" and blue["shape"] == "boxy"
    assert red["cx"] < 1 / 3 < 2 / 3 < blue["cx"]
    _, _, w, h = red["bbox"]
    assert 0 < red["area"] <= w * h / size ** 2 and h > 1.6 * w
    assert set(red) == {"colour", "bbox", "area", "cx", "shape", "position", "distance"}


@pytest.mark.parametrize("size", [56, 112])
def test_colour_blobs_finds_every_colour_of_the_scene(size):
    colours = {b["colour"] for b in colour_blobs(clip("static", size)[0])}
    assert colours == {"red", "blue", "yellow", "green", "purple"}  # the orange block is out of view


def test_sky_and_ground_are_not_objects():
    empty = synthetic.render_synthetic([], 0.0, 0.2, num_frames=3, size=112)[0]
    for frame in empty:
        assert colour_blobs(frame) == []
        assert colour_blobs(np.ascontiguousarray(frame[:40])) == []  # the light-blue sky alone
    p = CVPerceiver()
    assert p(perceive.FIRST_FRAME_PROMPT.format(question=QUESTION), [empty[0]]) == "no distinct objects"


def test_min_area_scales_with_the_frame():
    img = np.full((112, 112, 3), 128, np.uint8)
    img[50:53, 50:53] = (220, 30, 30)  # a 9 px red speck: noise at 112x112 (min area 13 px) ...
    assert colour_blobs(img) == []
    assert [b["colour"] for b in colour_blobs(img, min_area=4)] == ["red"]
    small = cv2.resize(img, (56, 56), interpolation=cv2.INTER_NEAREST)  # ... but not at 56x56 (4 px)
    assert [b["colour"] for b in colour_blobs(small)] == ["red"]


def test_colour_cast_is_not_a_colour():
    """Grey-world balance: a uniformly orange-tinted frame shows the same objects, not an orange ground."""
    frame = clip("static", 112)[0].astype(np.float32)
    tinted = np.clip(frame * np.array([1.15, 0.8, 0.5]), 0, 255).astype(np.uint8)
    assert "orange" not in {b["colour"] for b in colour_blobs(tinted)}
    assert len(colour_blobs(tinted)) <= len(colour_blobs(clip("static", 112)[0]))


# --------------------------------------------------------------------------- CVPerceiver
def test_pair_reply_format_and_round_trip():
    frames = clip("left", 112)
    p = CVPerceiver()
    for j in range(1, len(frames)):
        reply = p(perceive.PAIR_PROMPT.format(question=QUESTION), [frames[j - 1], frames[j]])
        lines = reply.split("\n")
        assert len(lines) == 3 and lines[0].startswith("Action: ") and lines[1].startswith("New: ")
        assert lines[2].startswith("Relevant: ")
        assert parse_pair(reply) == {"action": lines[0][8:], "new": lines[1][5:], "relevant": lines[2][10:]}
        assert parse_pair(reply)["action"] == "rotate left"
    desc = p(perceive.FIRST_FRAME_PROMPT.format(question=QUESTION), [frames[0]])
    assert perceive.parse_description(desc) == desc
    assert desc.startswith("a red tall object on the left, near")


def test_new_and_relevant():
    p = CVPerceiver()
    before = synthetic.render_synthetic([SCENE[1]], 0.0, 0.0, num_frames=1, size=112)[0][0]
    after = synthetic.render_synthetic([SCENE[0], SCENE[1]], 0.0, 0.0, num_frames=1, size=112)[0][0]
    out = parse_pair(p(perceive.PAIR_PROMPT.format(question=QUESTION), [before, after]))
    assert out["new"] == "a red tall object on the left, near"
    assert out["relevant"] == "a red tall object on the left, near"  # the question names red
    out = parse_pair(p(perceive.PAIR_PROMPT.format(question="Which object is closest to the pillar?"),
                       [after, after]))
    assert out == {"action": "stay", "new": "nothing new", "relevant": "a red tall object on the left, near"}
    out = parse_pair(p(perceive.PAIR_PROMPT.format(question="Which action is the agent taking?"), [after, after]))
    assert out["relevant"] == "none"
    # no "Question:" line: the whole prompt is the question
    assert "blue" in parse_pair(p("what is blue here?", [after, after]))["relevant"]


def test_perceive_end_to_end():
    frames = clip("left", 56)
    stats = {}
    text = perceive.perceive(frames, QUESTION, CVPerceiver(), stats=stats)
    lines = text.split("\n")
    assert len(lines) == len(frames) and stats["calls"] == len(frames) and stats["failures"] == 0
    assert lines[0].startswith("Frame 0: Observe: a red tall object on the left")
    assert all(line.startswith(f"Frame {j}: After rotate left") for j, line in enumerate(lines[1:], 1))
    assert "red" in text and "blue" in text
    assert text == perceive.perceive(frames, QUESTION, make_perceiver("cv"))  # deterministic
    cache = perceive.PerceptionCache()
    assert perceive.perceive(frames, QUESTION, CVPerceiver(), cache=cache) == text and len(cache) == 1


def test_bad_images_are_a_failed_call_not_a_crash():
    p = CVPerceiver()
    with pytest.raises(ValueError):
        p("x", [])
    with pytest.raises(ValueError):
        p("x", [np.zeros((8, 8), np.uint8)])


def test_every_word_is_in_the_corpus():
    vocab = set(re.findall(r"[a-z]+", " ".join(cv_corpus()).lower()))
    assert {"an", "orange", "tall", "flat", "wide", "boxy", "near", "far", "centre", "none", "nothing"} <= vocab
    p = CVPerceiver()
    said = []
    for motion in MOTIONS:
        frames = clip(motion, 56)
        said.append(p(perceive.FIRST_FRAME_PROMPT.format(question=QUESTION), [frames[0]]))
        said += [p(perceive.PAIR_PROMPT.format(question=q), [frames[j - 1], frames[j]])
                 for j in range(1, len(frames)) for q in (QUESTION, "Where is the cube?")]
    said.append(p(perceive.PAIR_PROMPT.format(question=QUESTION), [clip("static", 56)[0], clip("left", 56)[-1]]))
    for s in said:
        assert set(re.findall(r"[a-z]+", s.lower())) <= vocab, s


def test_fast():
    frames = clip("forward", 112)
    p = CVPerceiver()
    prompt = perceive.PAIR_PROMPT.format(question=QUESTION)
    p(prompt, [frames[0], frames[1]])
    start = time.perf_counter()
    for j in range(1, len(frames)):
        p(prompt, [frames[j - 1], frames[j]])
    per_call = (time.perf_counter() - start) / (len(frames) - 1)
    assert per_call < 0.05  # a few ms on a laptop core; generous for a loaded CI machine


# --------------------------------------------------------------------------- corruption
@pytest.mark.parametrize("subtype", ["night", "fog", "dusk", "snow", "rain", "static"])
def test_heavy_corruption_hides_objects(subtype):
    """PVRBench corruptions at full intensity: the perceiver sees fewer objects than on the clean clip
    (a property of the pixels it is given, not of any metadata). Overexposure, shadow and the camera
    warps barely hide the synthetic objects, and dynamic occluders add some (people and cars are
    objects too), so they are not asserted."""
    frames = np.ascontiguousarray(clip("left", 56))
    bad = perturb.apply(frames, perturb.static_spec("cv-test", subtype, eta=1.0))
    clean_n = sum(len(colour_blobs(f)) for f in frames)
    bad_n = sum(len(colour_blobs(f)) for f in bad)
    assert bad_n < clean_n, (subtype, bad_n, clean_n)
    text = perceive.perceive(bad, QUESTION, CVPerceiver())
    assert len(text.split("\n")) == len(frames)


@pytest.mark.parametrize("subtype", ["dusk", "night", "overexposure", "shadow", "fog", "rain", "snow"])
def test_corruption_of_an_empty_scene_makes_no_objects(subtype):
    """Tints, darkness, glare, haze and particles are not objects (grey-world balance, the value floor,
    the background rules)."""
    empty = np.ascontiguousarray(synthetic.render_synthetic([], 0.04, 0.2, num_frames=6, size=56)[0])
    bad = perturb.apply(empty, perturb.static_spec("cv-empty", subtype, eta=1.0))
    assert [colour_blobs(f) for f in bad] == [[]] * len(bad)
