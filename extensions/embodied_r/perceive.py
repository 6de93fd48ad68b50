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
description, with a fixed action vocabulary (:data:`ACTIONS`, backend.py) so that actions are comparable across
frames, videos and backends.

Backends are callables ``backend(prompt, images) -> str | None`` with a ``name`` (part of the cache
key): :class:`HFPerceiver` (a local transformers VLM), :class:`OpenAIPerceiver` (any OpenAI-compatible
server, through ``chat.ChatClient``), :class:`perceive_cv.CVPerceiver`, or any object of that shape (tests
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

import hashlib
import json
import logging
import os
import re

import numpy as np

from extensions.embodied_r.backend import ACTIONS, as_images
from extensions.embodied_r.perceive_cv import CVPerceiver, cv_corpus

log = logging.getLogger(__name__)

UNKNOWN_ACTION = "unknown"  # what parse_pair returns for an action it cannot map onto ACTIONS (backend.py)

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
    ("rotate left", (r"\b(?:turn(?:s|ed|ing)?|rotat\w*|pan(?:s|ned|ning)?|yaw\w*|spin\w*)\b.*"
                     r"\b(?:left|counter-?clockwise|anti-?clockwise)\b")),
    ("rotate right", r"\b(?:turn(?:s|ed|ing)?|rotat\w*|pan(?:s|ned|ning)?|yaw\w*|spin\w*)\b.*\b(?:right|clockwise)\b"),
    ("tilt up", r"\b(?:tilt\w*|pitch\w*|look(?:s|ed|ing)?)\b.*\bup(?:ward)?s?\b"),
    ("tilt down", r"\b(?:tilt\w*|pitch\w*|look(?:s|ed|ing)?)\b.*\bdown(?:ward)?s?\b"),
    ("stay", (r"\b(?:stay\w*|stop\w*|static|still|stationary|hover\w*|no (?:motion|movement|change)|none|idle|"
              r"pause\w*)\b")),
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
    return corpus + list(cv_corpus())


# --------------------------------------------------------------------------- backends
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

        frames = [Image.fromarray(self._resize(im)) for im in as_images(images)]
        messages = [{"role": "user",
                     "content": [{"type": "image"} for _ in frames] + [{"type": "text", "text": prompt}]}]
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
        from machinery.eval import chat

        self.max_tokens = int(max_tokens)
        self.client = chat.ChatClient(base_url=base_url, model=model, api_key_env=api_key_env, timeout=timeout,
                                      max_retries=max_retries, temperature=temperature)
        self.name = f"openai:{model}@{self.client.base_url}|max_tokens={self.max_tokens}"

    def __repr__(self):
        return f"OpenAIPerceiver({self.client!r})"

    def __call__(self, prompt: str, images) -> str | None:
        return self.client.complete(prompt, self.max_tokens, frames=as_images(images))


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
        from machinery.eval import chat

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
    from machinery import cli

    ap = cli.ArgumentParser(description="Embodied-R perception (Sec. 2.2): key frames -> text via a frozen VLM.")
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
    from machinery import cli
    cli.run(main)
