"""Embodied-R's perception stage: a frozen VLM turns key frames into text (Embodied-R Sec. 2.2, Eq. 1).

Embodied-R does not let its small reasoner see pixels. A large frozen VLM (Qwen2.5-VL-72B-Instruct in
the paper) walks through the key frames f_{k_0}, ..., f_{k_n} (Sec. 2.1, ``keyframes.keyframes``) once:

* frame 0: a description of the scene (objects, attributes, positions), given the question q;
* frame j >= 1: from the pair (f_{k_{j-1}}, f_{k_j}) and q, a three-part "differential, q-conditioned"
  caption (Eq. 1: s_{k_j} ~ psi_theta(s | f_{k_{j-1}}, f_{k_j}; q)): the agent's **action** inferred
  from the change between the frames, the **new information** (objects that appeared, changed spatial
  relations), and the **question-related content** visible in the new view.

The sequence s = [s_{k_0}, ..., s_{k_n}] is rendered as plain text (:func:`render`) and handed to a
text-only LM, which Embodied-R trains with GRPO (Sec. 2.3). The paper runs the VLM zero-shot and does
not print its prompts; ours (:data:`FIRST_FRAME_PROMPT`, :data:`PAIR_PROMPT`) are written from Sec. 2.2's
description, with a fixed action vocabulary (:data:`ACTIONS`) so that actions are comparable across
frames, videos and backends.

Backends are callables ``backend(prompt, images) -> str | None`` with a ``name`` (part of the cache
key): :class:`HFPerceiver` (a local transformers VLM), :class:`OpenAIPerceiver` (any OpenAI-compatible
server, through ``chat.ChatClient``), :class:`CVPerceiver` (below), or any object of that shape (tests
use scripted ones). :func:`make_perceiver` builds one from "hf:PATH" / "openai:MODEL" / "cv".

:class:`CVPerceiver` ("cv") is a classical-vision stand-in, not the paper's VLM: OpenCV and numpy, no
model, a few milliseconds a frame on a CPU, so that the Embodied-R pipeline (perception text -> small
text LM) runs and can be compared offline on a laptop. It sees only saturated colour blobs
(:func:`colour_blobs`: colour, rough shape, left/centre/right, near/far) and the global image motion
(:func:`ego_motion`: optical flow plus blob landmarks -> rotate / move forward / tilt / stay), and
writes them in a small fixed vocabulary (:func:`cv_corpus`). It reads only the pixels it is given,
never dataset metadata, so corrupted videos (night, fog, occluders, shake) degrade its text as they
degrade the images. It fits scenes of distinctly coloured objects such as the synthetic benchmark
(``synthetic.make_synthetic``); on real footage it says far less than a VLM would.

The VLM is the expensive part, so :class:`PerceptionCache` stores each video's rendered text on disk,
keyed by everything that decides it (video, question, perturbation spec, backend, frame indices, prompt
version).

CLI: ``python -m extensions.embodied_r.perceive VIDEO --question "..." --backend hf:PATH|cv [--frames 8]``
prints the text.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re

import numpy as np

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- action vocabulary
# The camera/agent motions a pair of key frames can show: translations along the three axes, yaw
# (rotate) and pitch (tilt) - the moves of UrbanVideo-Bench's drones and VSI-Bench's walk-throughs.
# "stay" (no motion between the frames) is our addition: the paper names no vocabulary at all, and a
# hovering drone or a paused walker otherwise has to be forced into a motion it did not make.
ACTIONS = ("move forward", "move backward", "move left", "move right", "move up", "move down",
           "rotate left", "rotate right", "tilt up", "tilt down", "stay")
UNKNOWN_ACTION = "unknown"  # what parse_pair returns for an action it cannot map onto ACTIONS

# --------------------------------------------------------------------------- prompts (Sec. 2.2)
# Bump PROMPT_VERSION whenever a prompt, the parser or the rendering changes: it is part of the cache
# key, so old cached texts are not served for the new prompts.
PROMPT_VERSION = "embodied-r-perceive-v1"

# Frame 0 (Sec. 2.2: "the first frame describes the scene: objects, attributes, positions"). One image.
FIRST_FRAME_PROMPT = """You are the eyes of an embodied agent (a person walking or a drone flying) that must \
later answer a question about what it saw. This image is the first frame of its video.

Question: {question}

Describe the scene in this frame in a few sentences: the main objects with their attributes (colour, \
size, type) and their positions relative to the camera and to each other (left, right, ahead, near, \
far, above, below), the layout of the space, and everything that is relevant to the question. Do not \
answer the question; only describe what you see."""

# Frame j >= 1 (Sec. 2.2, Eq. 1): two consecutive key frames, previous first. Three labelled lines,
# one per part of the paper's caption (Action, Delta-information, q-related content).
PAIR_PROMPT = """You are the eyes of an embodied agent (a person walking or a drone flying) that must \
later answer a question about what it saw. The two images are consecutive key frames of its video: \
the first is the previous view, the second the current view.

Question: {question}

Compare the two views and reply with exactly three lines, in this format:
Action: <the agent's motion from the previous view to the current one, one of: """ + ", ".join(ACTIONS) + """>
New: <newly visible objects or information, and how the positions of known objects relative to the \
agent changed>
Relevant: <what in the current view is related to the question; "none" if nothing is>

Write nothing else."""

# --------------------------------------------------------------------------- parsing
_FIELD_NAMES = ("action", "new", "relevant")
# Label spellings accepted for each field (case-insensitive); longer forms first.
_LABELS = {
    "action": r"(?:agent(?:'s)?\s+)?action",
    "new": r"new(?:ly[\s-]visible)?(?:\s+(?:information|info|objects?|content))?|(?:delta|Δ)\s*[- ]?\s*information",
    "relevant": r"(?:question|q)[\s-]*related(?:\s+(?:content|information|info))?"
                r"|relevan(?:t|ce)(?:\s+(?:content|information|info))?",
}
_LABEL_RE = re.compile(
    r"(?:^|(?<=[\s.;,|>(\[]))(?P<label>" + "|".join(f"(?P<{k}>{v})" for k, v in _LABELS.items()) + r")\s*[:：=]",
    re.IGNORECASE | re.MULTILINE)
_BULLET = re.compile(r"^[ \t]*(?:[-*•+>]+|\d+[.)](?=\s)|#+)[ \t]*", re.MULTILINE)

# Keyword rules for an action outside the vocabulary, first match wins: rotation and tilt before the
# bare directions ("turn left" is a rotation, "look up" a tilt), vertical before horizontal.
_ACTION_RULES = (
    ("rotate left", r"\b(?:turn(?:s|ed|ing)?|rotat\w*|pan(?:s|ned|ning)?|yaw\w*|spin\w*)\b.*\b(?:left|counter-?clockwise|anti-?clockwise)\b"),
    ("rotate right", r"\b(?:turn(?:s|ed|ing)?|rotat\w*|pan(?:s|ned|ning)?|yaw\w*|spin\w*)\b.*\b(?:right|clockwise)\b"),
    ("tilt up", r"\b(?:tilt\w*|pitch\w*|look(?:s|ed|ing)?)\b.*\bup(?:ward)?s?\b"),
    ("tilt down", r"\b(?:tilt\w*|pitch\w*|look(?:s|ed|ing)?)\b.*\bdown(?:ward)?s?\b"),
    ("stay", r"\b(?:stay\w*|stop\w*|static|still|stationary|hover\w*|no (?:motion|movement|change)|none|idle|pause\w*)\b"),
    ("move up", r"\b(?:up(?:ward)?s?|ascend\w*|ris(?:e|es|ing)|climb\w*|higher|elevat\w*)\b"),
    ("move down", r"\b(?:down(?:ward)?s?|descend\w*|lower\w*|drop\w*|sink\w*)\b"),
    ("move forward", r"\b(?:forwards?|ahead|advanc\w*|straight|approach\w*|onward)\b"),
    ("move backward", r"\b(?:backwards?|back|revers\w*|retreat\w*)\b"),
    ("move left", r"\bleft(?:ward)?s?\b"),
    ("move right", r"\bright(?:ward)?s?\b"),
)


def _clean(text) -> str:
    """A reply without <think> blocks, code fences, markdown emphasis, headings and bullet marks."""
    if not isinstance(text, str):
        return ""
    text = re.sub(r"<think>.*?(?:</think>|$)", " ", text, flags=re.DOTALL | re.IGNORECASE)
    text = re.sub(r"```[a-zA-Z]*", " ", text)
    text = text.replace("**", "").replace("__", "").replace("`", "")
    text = re.sub(r"(?<!\w)\*(?=\S)|(?<=\S)\*(?!\w)", "", text)  # *italic*
    return _BULLET.sub("", text)


def _one_line(text: str) -> str:
    """Whitespace collapsed, surrounding quotes/brackets and trailing punctuation removed."""
    text = " ".join(str(text).split()).strip(" \"'<>[]")
    return text.rstrip(" .;,")


def normalize_action(text) -> str:
    """An action text mapped onto :data:`ACTIONS`: itself when it is one (any case, extra words and
    punctuation allowed, e.g. "Move forward." or "rotate left (slightly)"), else by keyword rules
    ("turn left" -> "rotate left", "forward" -> "move forward", "ascending" -> "move up", "hovering" ->
    "stay"); the first rule that matches wins, so a compound "turn left and move forward" is a
    rotation. Nothing matches -> "unknown"."""
    t = " ".join(re.sub(r"[^a-z\s-]", " ", str(text or "").lower()).replace("-", " ").split())
    if not t:
        return UNKNOWN_ACTION
    for a in sorted(ACTIONS, key=len, reverse=True):
        if t == a or t.startswith(a + " "):
            return a
    for action, pattern in _ACTION_RULES:
        if re.search(pattern, t):
            return action
    return UNKNOWN_ACTION


def parse_pair(reply) -> dict:
    """``{"action", "new", "relevant"}`` from a VLM's reply to :data:`PAIR_PROMPT`.

    Tolerant: labels in any case, with markdown bullets or bold, on separate lines or run together on
    one ("Action: move up. New: a tower. Relevant: none"), with text before, between or after them;
    longer label forms ("New information:", "Question-related content:") are accepted. A field's value
    is the rest of its label's line up to the next label (or, when that is empty, the next non-empty
    line); the first occurrence of a label wins. The action goes through :func:`normalize_action`
    ("unknown" if it cannot be mapped). A missing field is "" (a missing action too). A reply with no
    label at all (a model that ignored the format) keeps its text as ``new``, so nothing seen is lost.
    """
    text = _clean(reply)
    out = dict.fromkeys(_FIELD_NAMES, "")
    matches = list(_LABEL_RE.finditer(text))
    if not matches:
        out["new"] = _one_line(text)
        return out
    for m, nxt in zip(matches, matches[1:] + [None]):
        field = next(k for k in _FIELD_NAMES if m.group(k) is not None)
        if out[field]:
            continue
        segment = text[m.end():nxt.start() if nxt is not None else len(text)]
        lines = [ln for ln in segment.split("\n") if ln.strip()]
        first = segment.split("\n", 1)[0]
        value = _one_line(first if first.strip() else (lines[0] if lines else ""))
        out[field] = value
    if matches and any(m.group("action") for m in matches):
        out["action"] = normalize_action(out["action"])
    return out


def parse_description(reply) -> str:
    """The first frame's description from a VLM's reply: markdown stripped, one line, a leading
    "Description:"/"Scene:" label dropped."""
    text = _one_line(_clean(reply))
    return re.sub(r"^(?:scene\s+)?(?:description|scene|observation)\s*[:：]\s*", "", text, flags=re.IGNORECASE)


# --------------------------------------------------------------------------- rendering
def render(first_description: str, pairs) -> str:
    """The text sequence s = [s_{k_0}, ..., s_{k_n}] handed to the reasoning LM, one line per key frame::

        Frame 0: Observe: <first_description>
        Frame 1: After <action>, Observe: <new>. Relevant: <relevant>
        Frame 2: ...

    ``pairs``: one ``{"action", "new", "relevant"}`` dict per consecutive key-frame pair (from
    :func:`parse_pair`). Each field is collapsed to one line with its trailing period removed. Empty
    parts are skipped cleanly: no action (or "unknown") drops "After <action>, " (the line then reads
    "Frame j: Observe: <new>. Relevant: <relevant>"), no new information drops "Observe: <new>" (then
    "Frame j: After <action>. Relevant: <relevant>"), no relevant content drops ". Relevant: ...". A
    frame with nothing at all reads "Frame j: (no description)", so the frame count stays visible.
    """
    desc = _one_line(first_description or "")
    lines = [f"Frame 0: Observe: {desc}" if desc else "Frame 0: (no description)"]
    for j, p in enumerate(pairs, start=1):
        action = _one_line(p.get("action") or "")
        new, relevant = _one_line(p.get("new") or ""), _one_line(p.get("relevant") or "")
        head = f"After {action}" if action and action != UNKNOWN_ACTION else ""
        observe = f"Observe: {new}" if new else ""
        first = ", ".join(s for s in (head, observe) if s)
        parts = [s for s in (first, f"Relevant: {relevant}" if relevant else "") if s]
        lines.append(f"Frame {j}: " + (". ".join(parts) if parts else "(no description)"))
    return "\n".join(lines)


# --------------------------------------------------------------------------- the reasoner's prompt
# What the text policy (Embodied-R's LM, Sec. 2.3) reads where a VLM would see the video. The paper
# prints no reasoning prompt; ours keeps the project's own prompt (Video-R1's template, the benchmark's
# question) and puts the perception text, introduced by this line, in the video's place.
OBSERVATIONS_HEADER = "Observations of the video, one line per key frame:"


def text_messages(messages, text: str) -> list[dict]:
    """Chat messages for a text-only LM: each ``{"type": "video"}`` (or image) item of ``messages``
    (``data.build_messages``' layout) is replaced by :data:`OBSERVATIONS_HEADER` and the perception
    ``text``; text items are kept in order; every message's content becomes one string (the form every
    text chat template takes)."""
    out = []
    for m in messages:
        content = m["content"]
        if not isinstance(content, str):
            parts = []
            for item in content:
                if item.get("type") in ("video", "image"):
                    parts.append(f"{OBSERVATIONS_HEADER}\n{text}\n")
                elif item.get("type") == "text":
                    parts.append(item["text"])
                else:
                    raise ValueError(f"text_messages: unsupported content item {item.get('type')!r}")
            content = "\n".join(parts)
        out.append({**m, "content": content})
    return out


def tokenizer_corpus() -> list[str]:
    """Text with every fixed word of the perception stage (header, rendering, actions, and the cv
    backend's vocabulary): what a tiny offline reasoner's tokenizer is trained on (tiny.build_tiny)."""
    corpus = [OBSERVATIONS_HEADER, "Frame 0: Observe: (no description)",
              "Frame 1: After move forward, Observe: nothing new. Relevant: none",
              ", ".join(ACTIONS), "After " + ", After ".join(ACTIONS)]
    cv = globals().get("cv_corpus")
    return corpus + (list(cv()) if cv else [])


# --------------------------------------------------------------------------- backends
def _as_images(images) -> list[np.ndarray]:
    out = []
    for im in images or []:
        a = np.asarray(im)
        if a.ndim != 3 or a.shape[-1] != 3 or a.dtype != np.uint8:
            raise ValueError(f"images must be uint8 [H, W, 3] arrays, got {a.dtype} {a.shape}")
        out.append(np.ascontiguousarray(a))
    return out


class HFPerceiver:
    """A local transformers VLM (Qwen2.5-VL style, e.g. Qwen2.5-VL-72B-Instruct, the paper's choice).

    AutoModelForImageTextToText + AutoProcessor; the chat template gets one ``{"type": "image"}`` entry
    per frame, then the prompt; frames go to the processor as separate images (not a 2-frame video:
    the two key frames of a pair can be far apart in time, and Qwen's video path would merge them into
    one temporal patch). Greedy decoding, vision special tokens suppressed (a weak model emits them),
    only the new tokens decoded. ``max_pixels`` resizes larger frames first (``video.smart_resize``);
    None leaves sizing to the processor. ``name`` = "hf:PATH|max_new_tokens=N" (the cache key)."""

    def __init__(self, model_path, device=None, max_new_tokens: int = 128, dtype=None, max_pixels: int | None = None):
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        self.model_path, self.max_new_tokens, self.max_pixels = str(model_path), int(max_new_tokens), max_pixels
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dtype is None:
            dtype = torch.bfloat16 if self.device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
        self.processor = AutoProcessor.from_pretrained(self.model_path)
        self.model = AutoModelForImageTextToText.from_pretrained(self.model_path, dtype=dtype).to(self.device).eval()
        self.name = f"hf:{self.model_path}|max_new_tokens={self.max_new_tokens}"
        tok = self.processor.tokenizer
        vision = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
        self._suppress = [i for i in (tok.convert_tokens_to_ids(t) for t in vision)
                          if isinstance(i, int) and i != tok.unk_token_id] or None

    def __repr__(self):
        return f"HFPerceiver({self.model_path!r}, device={str(self.device)!r})"

    def _resize(self, im: np.ndarray) -> np.ndarray:
        if not self.max_pixels or im.shape[0] * im.shape[1] <= self.max_pixels:
            return im
        import cv2

        from machinery import video
        h, w = video.smart_resize(im.shape[0], im.shape[1], max_pixels=self.max_pixels)
        return cv2.resize(im, (w, h), interpolation=cv2.INTER_AREA)

    def __call__(self, prompt: str, images) -> str | None:
        import torch
        from PIL import Image
        from transformers import GenerationConfig

        frames = [Image.fromarray(self._resize(im)) for im in _as_images(images)]
        messages = [{"role": "user", "content": [{"type": "image"} for _ in frames] + [{"type": "text", "text": prompt}]}]
        text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = self.processor(text=[text], images=frames or None, return_tensors="pt").to(self.device)
        gen = self.model.generation_config
        config = GenerationConfig(max_new_tokens=self.max_new_tokens, do_sample=False, repetition_penalty=1.0,
                                  eos_token_id=gen.eos_token_id, pad_token_id=gen.pad_token_id,
                                  suppress_tokens=self._suppress)  # plain greedy: no checkpoint sampling defaults
        with torch.no_grad():
            seq = self.model.generate(**inputs, generation_config=config)
        new = seq[0, inputs["input_ids"].shape[1]:]
        return self.processor.tokenizer.decode(new, skip_special_tokens=True).strip()


class OpenAIPerceiver:
    """An API VLM (GPT-4o, or Qwen2.5-VL-72B behind vLLM/SGLang) through ``chat.ChatClient.complete``:
    frames as base64 JPEG image parts before the text, retries with backoff, the key from
    ``$api_key_env`` (never stored, logged or put in ``name``). ``base_url`` defaults to
    $OPENAI_BASE_URL, else OpenAI. A failed request returns None. ``name`` =
    "openai:MODEL@BASE_URL|max_tokens=N" (the cache key)."""

    def __init__(self, model: str, base_url: str | None = None, api_key_env: str = "OPENAI_API_KEY",
                 max_tokens: int = 256, temperature: float = 0.0, timeout: float = 60, max_retries: int = 5):
        from machinery import chat

        self.max_tokens = int(max_tokens)
        self.client = chat.ChatClient(base_url=base_url, model=model, api_key_env=api_key_env, timeout=timeout,
                                      max_retries=max_retries, temperature=temperature)
        self.name = f"openai:{model}@{self.client.base_url}|max_tokens={self.max_tokens}"

    def __repr__(self):
        return f"OpenAIPerceiver({self.client!r})"

    def __call__(self, prompt: str, images) -> str | None:
        return self.client.complete(prompt, self.max_tokens, frames=_as_images(images))


PERCEIVER_SPECS = ("hf:PATH", "openai:MODEL", "cv")


def make_perceiver(spec, **kwargs):
    """A backend from a command-line spec: "hf:PATH" (:class:`HFPerceiver`), "openai:MODEL"
    (:class:`OpenAIPerceiver`; ``base_url=`` or $OPENAI_BASE_URL for a vLLM/SGLang server) or "cv"
    (:class:`CVPerceiver`, the classical-vision CPU stand-in; no argument). ``kwargs`` go to the
    backend's constructor. Anything else -> ValueError."""
    kind, sep, arg = str(spec or "").strip().partition(":")
    kind, arg = kind.lower(), arg.strip()
    if kind == "cv" and not sep:
        return CVPerceiver(**kwargs)
    if sep and arg and kind == "hf":
        return HFPerceiver(arg, **kwargs)
    if sep and arg and kind == "openai":
        return OpenAIPerceiver(arg, **kwargs)
    raise ValueError(f"unknown perceiver {spec!r}; valid forms: {', '.join(PERCEIVER_SPECS)}")


# --------------------------------------------------------------------------- classical-vision backend (CPU stand-in)
# A model-free backend with the interface above, so that Embodied-R's pipeline (perception text -> small
# text LM, Sec. 2.2-2.3) can run and be compared offline on a laptop CPU. It is not the paper's
# Qwen2.5-VL-72B: it sees saturated colour blobs and the global image motion, nothing else, and it
# answers in a small fixed vocabulary (:func:`cv_corpus`). It reads only the pixels it is given (never
# dataset metadata), so corrupted frames (night, fog, occluders, rain, shake: perturb.py) degrade its
# text the way they degrade the images.

# Hue bins on OpenCV's 0-180 hue circle (degrees / 2), [lo, hi); red wraps around 0.
_CV_HUE_BINS = (("red", 0, 8), ("orange", 8, 20), ("yellow", 20, 35), ("green", 35, 85),
                ("blue", 85, 128), ("purple", 128, 165), ("red", 165, 180))
CV_COLOURS = ("red", "orange", "yellow", "green", "blue", "purple")
_CV_HUE_LUT = np.zeros(256, np.uint8)  # OpenCV hue (0-179) -> index into CV_COLOURS
_CV_HUE_LUT[:180] = [next(CV_COLOURS.index(n) for n, lo, hi in _CV_HUE_BINS if lo <= h < hi) for h in range(180)]
CV_SHAPES = ("tall", "flat", "wide", "boxy")
_CV_MIN_SAT = 0.45      # HSV saturation: a light-blue sky is ~0.36, grey-green ground ~0.25, haze ~0.1
_CV_MIN_CHROMA = 40     # max - min of RGB (0-255): dark, noisy pixels with a high "saturation" are not colour
_CV_MIN_VALUE = 64      # HSV value (0-255): darker is shade or night, whatever its hue (painted faces: > 85)
_CV_MAX_AREA = 0.30     # a saturated region over 30% of the frame (or across 90% of its width) is background
_CV_NEAR_ROW = 0.5      # a bottom edge below this fraction of the height is "near" (ground-plane cue)
_CV_STILL = 0.004       # flow under this many widths (half a pixel at 112 px) is no motion
_CV_LANDMARK_SHIFT = 0.035   # landmarks shifted this many widths: a rotation, when flow saw much less
_CV_LANDMARK_GROWTH = 0.08   # landmarks grown (shrunk) this much, not shifted: forward (backward)
_CV_FARNEBACK = (0.6, 5, 21, 3, 7, 1.5, 0)  # pyr_scale, levels, winsize, iterations, poly_n, poly_sigma, flags
# Question words that name the kind of object a shape word describes (Relevant:, when no colour is named).
_CV_SHAPE_NOUNS = {"tall": ("tall", "pillar", "pillars", "pole", "poles", "tower", "towers", "column", "post"),
                   "flat": ("flat", "slab", "slabs", "mat", "plate", "board", "rug"),
                   "wide": ("wide", "block", "blocks", "bench", "wall", "car", "cars"),
                   "boxy": ("boxy", "cube", "cubes", "box", "boxes", "crate")}


def _cv_image(im) -> np.ndarray:
    a = np.asarray(im)
    if a.ndim != 3 or a.shape[-1] != 3 or a.dtype != np.uint8:
        raise ValueError(f"images must be uint8 [H, W, 3] arrays, got {a.dtype} {a.shape}")
    return np.ascontiguousarray(a)


def _cv_shape(w: int, h: int) -> str:
    """A shape word from a bbox's aspect ratio h / w."""
    r = h / max(w, 1)
    return "tall" if r >= 1.6 else "flat" if r <= 0.45 else "wide" if r <= 0.8 else "boxy"


def colour_blobs(image, min_area: int | None = None) -> list[dict]:
    """The saturated connected regions of one RGB uint8 [H, W, 3] frame, each of one basic colour.

    The frame is first white-balanced (grey world: each channel scaled to the frame's mean grey, gains
    in [0.5, 2]), so that a colour cast (dusk, tinted light) is not taken for coloured objects. A pixel
    is colour when its HSV saturation is >= 0.45, its chroma (max - min of RGB) >= 40 and its value
    >= 64: grey or grey-green ground, haze, fog, a light-blue sky (saturation ~0.36), shade and dark
    sensor noise are not.
    Colour pixels go to hue bins (red, orange, yellow, green, blue, purple); the 8-connected regions of
    each bin are the blobs. Regions under ``min_area`` pixels (default max(4, 0.1% of the frame): 4 px at
    56x56, 13 px at 112x112) are noise, regions over 30% of the frame or across 90% of its width are
    background (a tinted sky or ground, a wall), and one-pixel-thin
    regions touching a larger region of a neighbouring hue are its anti-aliased edge. Each blob is a dict:
    ``colour``, ``bbox`` (x, y, w, h) in pixels, ``area`` (fraction of the frame), ``cx`` (centroid x in
    [0, 1]), ``shape`` (bbox aspect ratio h / w: "tall" >= 1.6, "flat" <= 0.45, "wide" <= 0.8, else
    "boxy"), ``position`` ("left" / "centre" / "right": thirds of the width) and ``distance`` ("near"
    when the bottom edge lies in the lower half of the frame, else "far": on a ground plane, lower in
    the image is nearer). Sorted left to right."""
    import cv2

    img = _cv_image(image)
    H, W = img.shape[:2]
    if min_area is None:
        min_area = max(4, round(0.001 * H * W))
    mean = np.asarray(cv2.mean(img)[:3]) + 1e-3  # grey-world white balance: a colour cast is not a colour
    gain = np.clip(mean.mean() / mean, 0.5, 2.0)
    lut = np.clip(np.arange(256)[:, None] * gain[None, :] + 0.5, 0, 255).astype(np.uint8).reshape(256, 1, 3)
    hsv = cv2.cvtColor(cv2.LUT(img, lut), cv2.COLOR_RGB2HSV)
    sat, val = hsv[..., 1].astype(np.int32), hsv[..., 2].astype(np.int32)
    colourful = ((sat >= round(_CV_MIN_SAT * 255)) & (val >= _CV_MIN_VALUE)
                 & (sat * val >= _CV_MIN_CHROMA * 255))  # chroma = max - min = S V / 255
    bins = np.where(colourful, _CV_HUE_LUT[hsv[..., 0]], 255).astype(np.uint8)
    comps, size_of = [], np.zeros((H, W), np.int32)  # size_of: each colour pixel's region size
    for c in np.unique(bins):
        if c == 255:
            continue
        n, labels, stats, cents = cv2.connectedComponentsWithStats((bins == c).astype(np.uint8), connectivity=8)
        size_of[bins == c] = stats[labels[bins == c], cv2.CC_STAT_AREA]
        comps += [(int(c), labels, i, stats[i], cents[i]) for i in range(1, n)]
    blobs = []
    for c, labels, i, st, cent in comps:
        x, y, w, h, area = (int(v) for v in st)
        if area < min_area or area > _CV_MAX_AREA * H * W or w >= 0.9 * W:  # (a band across the view: sky, ground)
            continue
        if min(w, h) <= 1 and _cv_fringe(bins, size_of, labels, i, c, (x, y, w, h)):
            continue
        cx = (float(cent[0]) + 0.5) / W
        blobs.append({"colour": CV_COLOURS[c], "bbox": (x, y, w, h), "area": area / (H * W), "cx": cx,
                      "shape": _cv_shape(w, h),
                      "position": "left" if cx < 1 / 3 else "right" if cx > 2 / 3 else "centre",
                      "distance": "near" if (y + h) / H > _CV_NEAR_ROW else "far"})
    blobs.sort(key=lambda b: (b["cx"], b["colour"], b["bbox"]))
    return blobs


def _cv_fringe(bins, size_of, labels, i, c, bbox) -> bool:
    """Whether region ``i`` of colour ``c`` (one pixel thin) is the anti-aliased edge of a larger region
    of a neighbouring hue, which it touches (red against a grey-green ground blends to orange)."""
    import cv2

    x, y, w, h = bbox
    y0, y1, x0, x1 = max(0, y - 1), min(bins.shape[0], y + h + 1), max(0, x - 1), min(bins.shape[1], x + w + 1)
    mask = (labels[y0:y1, x0:x1] == i).astype(np.uint8)
    ring = (cv2.dilate(mask, np.ones((3, 3), np.uint8)) > 0) & (mask == 0)
    near, sizes = bins[y0:y1, x0:x1][ring], size_of[y0:y1, x0:x1][ring]
    n = len(CV_COLOURS)
    return bool(np.any((sizes > int(mask.sum())) & ((near == (c + 1) % n) | (near == (c - 1) % n))))


def ego_motion(prev, cur) -> tuple[str, float]:
    """The camera's motion from frame ``prev`` to frame ``cur`` (RGB uint8 [H, W, 3]): ``(action,
    confidence)``, the action one of :data:`ACTIONS` (Embodied-R Sec. 2.2: the action inferred from the
    change between two key frames), the confidence in [0, 1] (how consistent the evidence is).

    Two cues, both from the pixels alone:

    * dense optical flow (Farneback, grayscale) of the textured pixels, fitted by u = a + d_u x and
      v = b + d_v y (x, y from the image centre, in widths): a is the common horizontal shift, b the
      vertical one, d_u + d_v the divergence. Fitting the divergence apart keeps the radial flow of a
      forward motion (whose focus is at the horizon, not the centre) out of a and b. Decision, first
      match: a horizontal shift -> rotation; expansion / contraction -> "move forward" / "move backward";
      a vertical shift -> tilt; else "stay". Confidence: the share of textured pixels whose flow agrees
      with the decision (for "stay": whose flow is negligible).
    * landmarks: colour blobs (:func:`colour_blobs`) matched by colour between the frames. A blob that
      grows by s (sqrt of its area ratio) moves outward by (s - 1) x under a forward motion; the rest of
      its displacement is the rotation. They work when the frames are far apart, where flow on a repetitive
      ground texture (a checkerboard, tiles) locks onto the wrong period. They overrule the flow only
      when clear: a shift of >= 3.5% of the width (twice what flow saw, or the other way), or a growth
      of >= 8% with no shift (seen on >= 3 blobs when flow says rotation). Confidence: the share of
      matched blobs that agree.

    Signs: when the camera turns left, image content moves RIGHT (a > 0) -> "rotate left", and content
    moving left -> "rotate right"; content moving DOWN -> "tilt up", up -> "tilt down". A turn made while
    walking forward is a rotation (the turn is the decision). Sideways and vertical moves ("move left",
    "move up"...) are never reported: without depth one camera cannot tell them from rotation and tilt."""
    a0, a1 = _cv_image(prev), _cv_image(cur)
    return _ego_motion(a0, a1, colour_blobs(a0), colour_blobs(a1))


def _ego_motion(prev, cur, blobs0, blobs1) -> tuple[str, float]:
    action, conf, shift_flow = _flow_motion(prev, cur)
    lm = _landmark_motion(blobs0, blobs1, prev.shape[1])
    if lm is None:
        return action, conf
    shift, growth, n_growing, agree = lm
    if abs(shift) >= _CV_LANDMARK_SHIFT and (abs(shift) >= 2 * abs(shift_flow) or shift * shift_flow < 0):
        return ("rotate left" if shift > 0 else "rotate right"), agree
    if abs(shift) < 0.5 * _CV_LANDMARK_SHIFT and abs(growth) >= _CV_LANDMARK_GROWTH:
        move = "move forward" if growth > 0 else "move backward"
        if action != move and n_growing >= (3 if action.startswith("rotate") else 1):
            return move, agree
    return action, conf


def _landmark_motion(blobs0, blobs1, width):
    """(rotation shift in widths, growth, how many blobs show that growth, agreement) from the blobs
    matched by colour (the same number of that colour in both frames, paired left to right; blobs cut
    by a side edge skipped), or None when nothing matches. Growth is the sqrt of the area ratio (less
    quantised than a small bbox's height)."""
    est = []
    for c in CV_COLOURS:
        p = [b for b in blobs0 if b["colour"] == c]
        q = [b for b in blobs1 if b["colour"] == c]
        if not p or len(p) != len(q):
            continue
        for u, v in zip(p, q):
            if any(b["bbox"][0] <= 0 or b["bbox"][0] + b["bbox"][2] >= width for b in (u, v)):
                continue
            s = (v["area"] / u["area"]) ** 0.5
            est.append(((v["cx"] - 0.5) - s * (u["cx"] - 0.5), s - 1.0))
    if not est:
        return None
    e = np.asarray(est)
    shift, growth = float(np.median(e[:, 0])), float(np.median(e[:, 1]))
    n_growing = int(np.sum((np.sign(e[:, 1]) == np.sign(growth)) & (np.abs(e[:, 1]) >= _CV_LANDMARK_GROWTH / 2)))
    col = e[:, 0] if abs(shift) >= _CV_LANDMARK_SHIFT else e[:, 1]
    agree = round(float(np.mean(np.sign(col) == np.sign(np.median(col)))), 3)
    return shift, growth, n_growing, agree


def _flow_motion(prev, cur) -> tuple[str, float, float]:
    """(action, confidence, horizontal shift in widths) from Farneback flow (see :func:`ego_motion`)."""
    import cv2

    g0 = cv2.cvtColor(prev, cv2.COLOR_RGB2GRAY)
    g1 = cv2.cvtColor(cur, cv2.COLOR_RGB2GRAY)
    if g1.shape != g0.shape:
        g1 = cv2.resize(g1, (g0.shape[1], g0.shape[0]), interpolation=cv2.INTER_AREA)
    H, W = g0.shape
    if max(H, W) != 96:  # flow at 96 px on the long side: enough support per pyramid level, and fast
        k = 96.0 / max(H, W)
        size = (max(8, round(W * k)), max(8, round(H * k)))
        interp = cv2.INTER_LINEAR if k > 1 else cv2.INTER_AREA
        g0, g1 = cv2.resize(g0, size, interpolation=interp), cv2.resize(g1, size, interpolation=interp)
        H, W = g0.shape
    flow = cv2.calcOpticalFlowFarneback(g0, g1, None, *_CV_FARNEBACK) / W  # in widths
    # Textured pixels only (a flat sky or face carries no motion), away from the border.
    eig = cv2.cornerMinEigenVal(g0.astype(np.float32) / 255.0, 5)
    m = max(2, round(0.04 * min(H, W)))
    valid = np.zeros((H, W), bool)
    valid[m:H - m, m:W - m] = True
    valid &= eig > max(1e-4, 0.05 * float(eig.max()))
    if valid.sum() < 16:  # a blank, black or fogged-out pair: nothing seen to move
        return "stay", 0.0, 0.0
    ys, xs = np.nonzero(valid)
    x, y = (xs + 0.5 - W / 2) / W, (ys + 0.5 - H / 2) / W
    u, v = flow[..., 0][valid], flow[..., 1][valid]
    a, du = _robust_line(x, u)
    b, dv = _robust_line(y, v)
    div = 0.25 * 0.5 * (du + dv)  # the radial flow a quarter width away from the focus of expansion
    if abs(a) >= _CV_STILL and abs(a) >= 0.5 * abs(div) and abs(a) >= 0.7 * abs(b):
        action = "rotate left" if a > 0 else "rotate right"
        agree = np.sign(u - du * x) == np.sign(a)
    elif abs(div) >= _CV_STILL:
        action = "move forward" if div > 0 else "move backward"
        x0 = -a / du if abs(du) > 1e-9 else 0.0
        y0 = -b / dv if abs(dv) > 1e-9 else 0.0
        agree = np.sign(u * (x - x0) + v * (y - y0)) == np.sign(div)
    elif abs(b) >= _CV_STILL:
        action = "tilt up" if b > 0 else "tilt down"
        agree = np.sign(v - dv * y) == np.sign(b)
    else:
        action = "stay"
        agree = np.hypot(u, v) < _CV_STILL
    return action, round(float(np.mean(agree)), 3), a


def _robust_line(x, y, iters: int = 3) -> tuple[float, float]:
    """(intercept, slope) of y ~ c + s x: least squares, reweighted (Huber) against outliers."""
    A = np.stack([np.ones_like(x), x], 1)
    w = np.ones_like(x)
    coef = np.zeros(2)
    for _ in range(iters):
        sw = np.sqrt(w)
        coef = np.linalg.lstsq(A * sw[:, None], y * sw, rcond=None)[0]
        r = np.abs(y - A @ coef)
        scale = 1.4826 * float(np.median(r)) + 1e-9
        w = np.minimum(1.0, 1.5 * scale / np.maximum(r, 1e-12))
    return float(coef[0]), float(coef[1])


def _blob_phrase(b: dict) -> str:
    where = "in the centre" if b["position"] == "centre" else f"on the {b['position']}"
    article = "an" if b["colour"][0] in "aeiou" else "a"
    return f"{article} {b['colour']} {b['shape']} object {where}, {b['distance']}"


def _question_of(prompt: str) -> str:
    """The question in one of our prompts (the "Question:" line up to the next blank line), else the
    whole prompt."""
    m = re.search(r"^[ \t]*Question:[ \t]*(.*?)(?:\n[ \t]*\n|\Z)", str(prompt or ""), re.MULTILINE | re.DOTALL)
    return m.group(1) if m else str(prompt or "")


class CVPerceiver:
    """Classical-vision perception backend (OpenCV + numpy, no model): a CPU stand-in for Embodied-R's
    frozen VLM (Sec. 2.2), with the same call shape ``backend(prompt, images) -> str``.

    One image (frame 0): the blobs of :func:`colour_blobs` (at most ``max_objects``, the largest, listed
    left to right) as "a red tall object on the left, near; a blue boxy object in the centre, far", or
    "no distinct objects". Two images (previous, current; of more, the last two): the three lines
    :data:`PAIR_PROMPT` asks for (Eq. 1's action, new information, question-related content):
    ``Action:`` :func:`ego_motion`'s action; ``New:`` the current frame's blobs of a colour seen more
    often than in the previous frame (those farthest from the previous frame's blobs of that colour;
    every blob of a colour the previous frame lacked), or "nothing new"; ``Relevant:`` the current
    frame's blobs whose colour the question names (when it names none: whose kind of shape it names,
    e.g. "pillar" -> tall), or "none". The question is read from the prompt's "Question:" line (the
    whole prompt when there is none). Deterministic; a few milliseconds a call at 112x112. Every word it
    writes is in :func:`cv_corpus`. ``name`` = "cv:v1" (the cache key; bump the version when the output
    changes). Same-colour objects that touch in the image merge into one blob, so counts run low."""

    version = "v1"

    def __init__(self, max_objects: int = 8):
        self.max_objects = int(max_objects)
        self.name = f"cv:{self.version}" + (f"|max_objects={self.max_objects}" if self.max_objects != 8 else "")

    def __repr__(self):
        return f"CVPerceiver(max_objects={self.max_objects})"

    def _list(self, blobs) -> str:
        keep = sorted(sorted(blobs, key=lambda b: -b["area"])[:self.max_objects], key=lambda b: b["cx"])
        return "; ".join(_blob_phrase(b) for b in keep)

    def __call__(self, prompt: str, images) -> str:
        frames = _as_images(images)
        if not frames:
            raise ValueError("CVPerceiver needs one or two images")
        cur = frames[-1]
        blobs = colour_blobs(cur)
        if len(frames) == 1:
            return self._list(blobs) or "no distinct objects"
        prev = frames[-2]
        before = colour_blobs(prev)
        action, _ = _ego_motion(prev, cur, before, blobs)
        new = []
        for c in CV_COLOURS:
            now = [b for b in blobs if b["colour"] == c]
            then = [b["cx"] for b in before if b["colour"] == c]
            if len(now) > len(then):  # the extra ones: those farthest from where that colour was
                now.sort(key=lambda b: -min((abs(b["cx"] - x) for x in then), default=1.0))
                new += now[:len(now) - len(then)]
        q = _question_of(prompt).lower()
        named = [c for c in CV_COLOURS if re.search(rf"\b{c}\b", q)]
        if named:
            relevant = [b for b in blobs if b["colour"] in named]
        else:
            kinds = {s for s, nouns in _CV_SHAPE_NOUNS.items() if any(re.search(rf"\b{w}\b", q) for w in nouns)}
            relevant = [b for b in blobs if b["shape"] in kinds]
        return (f"Action: {action}\nNew: {self._list(new) or 'nothing new'}\n"
                f"Relevant: {self._list(relevant) or 'none'}")


def cv_corpus() -> list[str]:
    """Strings that together hold every word :class:`CVPerceiver` can write (for a tiny tokenizer)."""
    blobs = [f"{'an' if c[0] in 'aeiou' else 'a'} {c} {s} object {where}, {d}" for c, s, where, d in
             zip(CV_COLOURS * 2, CV_SHAPES * 3, ("on the left", "in the centre", "on the right") * 4,
                 ("near", "far") * 6)]
    return (["; ".join(blobs[:6]), "; ".join(blobs[6:]), "no distinct objects"]
            + [f"Action: {a}\nNew: nothing new\nRelevant: none" for a in ACTIONS])


# --------------------------------------------------------------------------- cache
def _jsonable(x):
    if hasattr(x, "to_dict"):
        return x.to_dict()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"cannot put {type(x).__name__} in a perception cache key")


class PerceptionCache:
    """Rendered perception texts on disk, one SQLite file (``chat.ReplyCache``: WAL, autocommit,
    so each ``put`` is durable on return, a killed run loses nothing already written, and the file is
    safe to reopen and to share between processes). Key = sha256 of the sorted JSON of (video id,
    question, perturbation spec or None for the clean video, backend name, frame indices, prompt
    version). ``path=None`` keeps it in memory."""

    def __init__(self, path=None):
        from machinery import chat

        self.path = None if path is None else str(path)
        self._store = chat.ReplyCache(self.path)

    @staticmethod
    def key(video_id, question, spec, backend_name, indices, prompt_version: str = PROMPT_VERSION) -> str:
        if spec is not None and hasattr(spec, "to_dict"):
            spec = spec.to_dict()
        item = {"video_id": None if video_id is None else str(video_id), "question": str(question), "spec": spec,
                "backend": str(backend_name), "indices": None if indices is None else [int(i) for i in indices],
                "prompt_version": prompt_version}
        blob = json.dumps(item, sort_keys=True, separators=(",", ":"), default=_jsonable)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def get(self, key: str) -> str | None:
        return self._store.get(key)

    def put(self, key: str, text: str, backend_name: str = "") -> None:
        self._store.put(key, text, "perceive", backend_name)

    def __len__(self) -> int:
        return len(self._store)

    def close(self) -> None:
        self._store.close()

    def __repr__(self):
        return f"PerceptionCache({self.path or ':memory:'})"


# --------------------------------------------------------------------------- the stage
def _ask(backend, prompt, images, stats, what) -> str | None:
    """One backend call with one retry (on None or an exception); None after two failures (counted)."""
    for attempt in range(2):
        stats["calls"] += 1
        try:
            reply = backend(prompt, images)
        except Exception as exc:  # noqa: BLE001 - a VLM failure must never stop the pipeline
            log.warning("perceive: %s: backend %s raised %s: %s", what, getattr(backend, "name", "?"),
                        type(exc).__name__, str(exc)[:200])
            reply = None
        if isinstance(reply, str):
            return reply
        if attempt == 0:
            stats["retries"] += 1
    stats["failures"] += 1
    return None


def perceive(frames, question: str, backend, *, cache: PerceptionCache | None = None, video_id=None, spec=None,
             indices=None, stats: dict | None = None) -> str:
    """Eq. 1 over a clip's key frames: the rendered text (:func:`render`) of one description of frame 0
    and one :func:`parse_pair` of each consecutive pair (previous, current), T backend calls for T frames.

    frames: uint8 [T, H, W, 3], already the key frames (``keyframes.keyframe_sampler``).
    A backend call that returns None or raises is retried once; if it fails again its fields become ""
    (``stats["failures"]`` counts them and a warning is logged); it never raises. The text is then not
    cached, so a rerun asks again. With ``cache``, the key is (video_id, question, spec, backend.name,
    indices, PROMPT_VERSION) and a hit makes no backend call; ``video_id=None`` uses the sha256 of the
    frames instead. ``spec``: the perturbation spec (dict or PerturbSpec) the frames were made with, None
    for the clean video. ``stats`` (optional dict) is updated with calls, retries, failures, cache_hits.
    """
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be a non-empty uint8 [T, H, W, 3] array, got {frames.dtype} {frames.shape}")
    st = {"calls": 0, "retries": 0, "failures": 0, "cache_hits": 0}
    key = None
    if cache is not None:
        vid = video_id if video_id is not None else "sha256:" + hashlib.sha256(np.ascontiguousarray(frames)).hexdigest()
        key = cache.key(vid, question, spec, getattr(backend, "name", type(backend).__name__), indices)
        hit = cache.get(key)
        if hit is not None:
            st["cache_hits"] += 1
            _merge(stats, st)
            return hit
    reply = _ask(backend, FIRST_FRAME_PROMPT.format(question=question), [frames[0]], st, "frame 0")
    description = parse_description(reply) if reply is not None else ""
    pairs = []
    for j in range(1, len(frames)):
        reply = _ask(backend, PAIR_PROMPT.format(question=question), [frames[j - 1], frames[j]], st, f"pair {j}")
        pairs.append(parse_pair(reply) if reply is not None else dict.fromkeys(_FIELD_NAMES, ""))
    text = render(description, pairs)
    if st["failures"]:
        log.warning("perceive: %d of %d backend calls failed twice; their fields are empty (not cached)",
                    st["failures"], len(frames))
    elif key is not None:
        cache.put(key, text, getattr(backend, "name", ""))
    _merge(stats, st)
    return text


def _merge(stats, st):
    if stats is not None:
        for k, v in st.items():
            stats[k] = stats.get(k, 0) + v


# --------------------------------------------------------------------------- CLI
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Embodied-R perception (Sec. 2.2): key frames -> text via a frozen VLM.")
    ap.add_argument("video", help="a video file")
    ap.add_argument("--question", required=True, help="the question the perception is conditioned on")
    ap.add_argument("--backend", required=True, help=f"the VLM: {' or '.join(PERCEIVER_SPECS)}")
    ap.add_argument("--frames", type=int, default=8, help="at most this many key frames (at least min(4, frames))")
    ap.add_argument("--eps", type=float, default=0.5, help="key-frame overlap threshold (Sec. 2.1)")
    ap.add_argument("--max-pixels", type=int, default=448 * 448, help="resize frames to at most this many pixels")
    ap.add_argument("--cache", default=None, help="a SQLite file to cache the text in")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from machinery import video
    from extensions.embodied_r.keyframes import keyframe_sampler

    try:
        backend = make_perceiver(args.backend)  # a bad spec fails before any decoding
        frames, indices, _ = video.read_frames(args.video, num_frames=args.frames, max_pixels=args.max_pixels,
                                               sampler=keyframe_sampler(args.eps))
    except ValueError as exc:  # includes video.VideoError
        ap.error(str(exc))
    cache = PerceptionCache(args.cache) if args.cache else None
    stats = {}
    text = perceive(frames, args.question, backend, cache=cache, video_id=os.path.abspath(args.video),
                    indices=indices, stats=stats)
    log.info("key frames %s; %s", indices.tolist(), stats)
    print(text)
    return 0


if __name__ == "__main__":
    from machinery import runtime
    runtime.run(main)
