"""LLM-as-judge for ROVA's alignment reward and PVRBench's reasoning-quality metrics (Sec. 3.3, App. C).

The paper asks GPT-4o (Alg. 1 l.8-10) for two verdicts on the j-th clean / j-th perturbed rollout pair:
Sim^a, a strict binary answer-consistency score (Fig. 8), and Sim^r, a three-tier reasoning-consistency
score (Fig. 9). Table 4 shows an open judge (Qwen3-13B) doing as well; App. H tries an embedding
(all-MiniLM-L6-v2) instead and finds it worse. PVRBench (Sec. 4, Table 2) scores reasoning traces on
five metrics with the same kind of judge. Three backends share one interface:

* :class:`OpenAIJudge`: any OpenAI-compatible chat-completions server (OpenAI, vLLM, SGLang), through
  :class:`chat.ChatClient` (retries, a thread pool, the key never printed, logged, cached or returned);
* :class:`HFJudge`: a local transformers chat model (e.g. Qwen3-13B, Table 4), greedy and batched;
* :class:`LocalJudge`: the offline default: rules for answers, MiniLM cosine tiers for reasoning.

Every backend has ``answer_consistency(ref, cand) -> 1 | 0 | None``, ``reasoning_consistency(ref,
cand) -> 1.0 | 0.5 | 0.0 | None`` and ``reasoning_quality(question, clean_trace, perturbed_trace) ->
{fragility, consistency, belief, recovery, attention}``, each with a ``*_batch`` form (results in input
order). A verdict that cannot be had (an unparsable reply, a failed request) is None and counted in
``stats["missing"]``, never an exception (grpo.py imputes it). The language-model backends keep every
reply in a :class:`chat.ReplyCache`.

Extensions that need a verdict of their own (e.g. an answer read from reasoning) ask a language-model
judge through :meth:`_PromptJudge.ask` (prompts in, cached and counted replies out) and record their
counts with :meth:`_Judge.count`; the answer normalisers (answers.py: :func:`norm_text`, :func:`answer_option`,
:func:`option_lines`; here :func:`clean_reply`) are public so that they read answers as the judges do.

The prompts of Figs. 8-9 are images in the paper; ours are written from their captions and App. C's
description of them.
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading

from machinery.datasets import answers, verdicts
from machinery.datasets.verdicts import clean_reply, parse_score  # noqa: F401 - public: replies read as the judges do
from machinery.eval import chat

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

# PVRBench's five metrics (Sec. 4, Table 2). The paper names them without defining them; the rubric
# is our reading (docs/DESIGN.md, "Readings of the paper"). Fragility is lower-is-better; Table 2's Avg. excludes it.
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

ANSWER_SCALE = (0, 1)
REASONING_SCALE = (0.0, 0.5, 1.0)

# ------------------------------------------------------------------- reading a reply (machinery/datasets/verdicts.py)
def parse_answer_score(text) -> int | None:
    """Fig. 8's verdict: 1, 0 or None."""
    v = parse_score(text, ANSWER_SCALE)
    return None if v is None else int(v)


def parse_reasoning_score(text) -> float | None:
    """Fig. 9's verdict: 1.0, 0.5, 0.0 or None."""
    v = parse_score(text, REASONING_SCALE)
    return None if v is None else float(v)


def parse_quality(text, keys=QUALITY_KEYS, lo: float = 0.0, hi: float = 5.0) -> dict:
    """The five 0-5 metrics of a reasoning-quality reply (verdicts.parse_metrics)."""
    return verdicts.parse_metrics(text, keys, lo, hi)


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

    def count(self, key: str, n: int = 1) -> None:
        """Add `n` to ``stats[key]`` (thread-safe; extensions count their own verdicts here too)."""
        with self._stats_lock:
            self.stats[key] = self.stats.get(key, 0) + n

    def _missing(self, values):
        self.count("missing", sum(v is None for v in values))
        return values

    def answer_consistency(self, reference, candidate):
        """Sim^a (Fig. 8): 1 if the answers match or are equivalent, else 0; None = no verdict."""
        return self.answer_consistency_batch([(reference, candidate)])[0]

    def reasoning_consistency(self, reference, candidate):
        """Sim^r (Fig. 9): 1.0 / 0.5 / 0.0; None = no verdict."""
        return self.reasoning_consistency_batch([(reference, candidate)])[0]

    def reasoning_quality(self, question, clean_trace, perturbed_trace, **kw) -> dict:
        """PVRBench's five 0-5 metrics of the perturbed trace against the clean one (None = not judged)."""
        return self.reasoning_quality_batch([(question, clean_trace, perturbed_trace)], **kw)[0]


class _PromptJudge(_Judge):
    """A judge that asks a language model: prompts in, reply texts out, through the cache.
    Subclasses implement ``_complete_many(prompts, max_tokens, images) -> [reply | None]``."""
    model = ""

    def __init__(self, cache=None, max_tokens: int = 16, quality_max_tokens: int = 256):
        super().__init__()
        self.cache = cache if isinstance(cache, chat.ReplyCache) else chat.ReplyCache(cache)
        self.max_tokens, self.quality_max_tokens = max_tokens, quality_max_tokens

    def _params(self, max_tokens) -> str:
        return f"max_tokens={max_tokens}"

    def ask(self, prompts, max_tokens, images=None) -> list:
        """The model's reply text to each prompt (None where it could not be asked), in input order: each
        distinct prompt asked once, replies cached under (backend, model, max_tokens and images, prompt).
        Counts stats["calls"] and ["cache_hits"]; parsing the replies, and counting the ones that give
        no verdict as missing, is the caller's."""
        extra = self._params(max_tokens) + "".join(f"|img:{hashlib.sha256(b).hexdigest()}" for b in images or [])
        keys = [self.cache.key(self.name, self.model, extra + "\n" + p) for p in prompts]
        replies, todo = [None] * len(prompts), {}
        for i, k in enumerate(keys):
            hit = self.cache.get(k)
            if hit is not None:
                replies[i] = hit
                self.count("cache_hits")
            elif k in todo:                     # the same prompt twice in one batch: asked once
                todo[k].append(i)
                self.count("cache_hits")
            else:
                todo[k] = [i]
        if todo:
            self.count("calls", len(todo))
            got = self._complete_many([prompts[idx[0]] for idx in todo.values()], max_tokens, images)
            for (k, idx), reply in zip(todo.items(), got):
                if reply is not None:
                    self.cache.put(k, reply, self.name, self.model)
                for i in idx:
                    replies[i] = reply
        return replies

    def answer_consistency_batch(self, pairs) -> list:
        prompts = [ANSWER_CONSISTENCY_PROMPT.format(reference=r, candidate=c) for r, c in pairs]
        return self._missing([parse_answer_score(t) for t in self.ask(prompts, self.max_tokens)])

    def reasoning_consistency_batch(self, pairs) -> list:
        prompts = [REASONING_CONSISTENCY_PROMPT.format(reference=r, candidate=c) for r, c in pairs]
        return self._missing([parse_reasoning_score(t) for t in self.ask(prompts, self.max_tokens)])

    def reasoning_quality_batch(self, items, images=None) -> list:
        """One dict per (question, clean_trace, perturbed_trace); `images` (frames shown to a vision
        judge) go with every item, so batch only items of one video. A reply with any metric missing
        counts one missing verdict."""
        prompts = [REASONING_QUALITY_PROMPT.format(question=q, clean=c, perturbed=p) for q, c, p in items]
        out = [parse_quality(t) for t in self.ask(prompts, self.quality_max_tokens, chat.jpegs(images))]
        self.count("missing", sum(any(v is None for v in d.values()) for d in out))
        return out

    def close(self) -> None:
        self.cache.close()


# --------------------------------------------------------------------------- OpenAI-compatible HTTP
class OpenAIJudge(_PromptJudge):
    """GPT-4o (the paper's judge) or any OpenAI-compatible chat-completions server (vLLM, SGLang), asked
    through a :class:`chat.ChatClient` built from the same arguments (see there: the request, the key
    from ``$api_key_env``, retries, Retry-After, the thread pool). The client counts its retries and
    errors straight into this judge's ``stats`` (keys no other part of the judge writes)."""
    served = True   # (eval_pvrbench's Runner sends it every pair of a window at once, with frames)
    name = "openai"

    def __init__(self, base_url: str | None = None, model: str = "gpt-4o",
                 api_key_env: str = "OPENAI_API_KEY", timeout: float = 60, max_retries: int = 5,
                 concurrency: int = 8, cache=None, temperature: float = 0, max_tokens: int = 16,
                 quality_max_tokens: int = 256, backoff_base: float = 1.0, backoff_max: float = 60.0):
        super().__init__(cache, max_tokens, quality_max_tokens)
        self.client = chat.ChatClient(base_url, model, api_key_env, timeout, max_retries, concurrency, temperature,
                                      backoff_base, backoff_max)
        self.client.stats = self.stats
        self.model, self.base_url = model, self.client.base_url

    def __repr__(self):
        state = "set" if os.environ.get(self.client.api_key_env) else "unset"
        return (f"OpenAIJudge(model={self.model!r}, base_url={self.base_url!r}, "
                f"api_key_env={self.client.api_key_env!r} ({state}), stats={self.stats})")

    def _params(self, max_tokens) -> str:
        return f"temperature={self.client.temperature}|max_tokens={max_tokens}"

    def _complete_many(self, prompts, max_tokens, images=None) -> list:
        return self.client.complete_many(prompts, max_tokens, images)

    def close(self) -> None:
        self.client.close()
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
                self.count("errors")
                out += [None] * len(texts)
                continue
            out += tok.batch_decode(seq[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        return out


# --------------------------------------------------------------------------- offline default
# (its answer normalisation and text measures, public so that extensions read answers by the same rules:
# machinery/datasets/answers.py, machinery/datasets/verdicts.py)
# Measured by experiments/calibrate_judge.py on its 34 labelled reasoning pairs, MiniLM cosine similarity
# per tier: 1.0 (paraphrases) 0.71-0.94, mean 0.87; 0.5 (additions/omissions) 0.39-0.88, mean 0.72;
# 0.0 (contradictions) 0.66-0.99, mean 0.84: minimal-edit contradictions (left <-> right, first <->
# last) score 0.97-0.99, above most paraphrases: a sentence encoder does not see them; only
# different-scene hallucinations fall low (0.06-0.40). Accuracy is flat at 18/34 = 0.53 for hi in
# 0.79-0.85 and lo in 0.40-0.60 (always-0.0: 14/34 = 0.41; chance 0.33); we take that plateau's centre.
# The exact optimum (0.826, 0.516) gains one pair on a 0.002 gap: not worth the fragility.
# Leave-one-out, that optimum classifies only 7/34: the tiers overlap too much to separate.
DEFAULT_THRESHOLDS = (0.82, 0.50)
MINILM_PACKAGE = verdicts.MINILM_PACKAGE


class LocalJudge(_Judge):
    """The offline stand-in for GPT-4o (App. H's encoder, not the paper's judge).

    Sim^a: :func:`answers.answers_equivalent`. Sim^r: cosine similarity of all-MiniLM-L6-v2 embeddings of the
    two reasoning texts, sim >= hi -> 1.0, sim >= lo -> 0.5, else 0.0 (``thresholds=(hi, lo)``, default
    measured, see DEFAULT_THRESHOLDS). An empty side scores 0 (nothing to agree with). MiniLM reads
    at most 256 word pieces (~180 words) of each text. The encoder loads on first use.

    reasoning_quality, a documented heuristic: fragility = 5 (1 - max(sim, 0)) between the clean and
    perturbed reasoning (None if either is empty); consistency = 5 if the perturbed trace's own answer
    (or, for an option letter, the option's text from the question) is stated in its reasoning, 1 if
    only another option's text is, 2.5 if neither, 0 with no <answer>; belief, recovery and attention
    need the video or a capable judge: None."""
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
        emb = verdicts.encoder(self.model_path).encode(texts, batch_size=64, normalize_embeddings=True,
                                               convert_to_numpy=True, show_progress_bar=False)
        return [float(emb[2 * i] @ emb[2 * i + 1]) for i in range(len(pairs))]

    def answer_consistency_batch(self, pairs) -> list:
        self.count("calls", len(pairs))
        return [int(answers.answers_equivalent(r, c)) for r, c in pairs]

    def reasoning_consistency_batch(self, pairs) -> list:
        self.count("calls", len(pairs))
        hi, lo = self.thresholds
        ask = [i for i, (r, c) in enumerate(pairs) if str(r or "").strip() and str(c or "").strip()]
        out = [0.0] * len(pairs)
        for i, s in zip(ask, self.similarities([pairs[i] for i in ask])):
            out[i] = 1.0 if s >= hi else 0.5 if s >= lo else 0.0
        return out

    def reasoning_quality_batch(self, items, images=None) -> list:
        """See the class docstring; `images` are ignored (the heuristic reads text only)."""
        self.count("calls", len(items))
        split = [(q, verdicts.split_trace(c), verdicts.split_trace(p)) for q, c, p in items]
        ask = [i for i, (_, c, p) in enumerate(split) if c[0] and p[0]]
        sims = dict(zip(ask, self.similarities([(split[i][1][0], split[i][2][0]) for i in ask])))
        out = []
        for i, (question, _, (reasoning, answer)) in enumerate(split):
            frag = round(5.0 * (1.0 - min(max(sims[i], 0.0), 1.0)), 3) if i in sims else None
            out.append({"fragility": frag, "consistency": verdicts.self_consistency(question, reasoning, answer),
                        "belief": None, "recovery": None, "attention": None})
        return out


# --------------------------------------------------------------------------- asking for verdicts

def ask_pairs(judge, kind: str, pairs: list[tuple[str, str]]) -> list:
    """Ask the judge for `kind` ("answer" or "reasoning") consistency of (reference, candidate) pairs;
    batched when the judge offers it. Any failure becomes None (a missing verdict), never a crash."""
    if not pairs:
        return []
    batch = getattr(judge, f"{kind}_consistency_batch", None)
    try:
        if batch is not None:
            out = list(batch(pairs))
            if len(out) != len(pairs):
                raise ValueError(f"judge returned {len(out)} verdicts for {len(pairs)} pairs")
            return out
    except Exception as e:  # noqa: BLE001 - a judge outage must not stop training
        log.warning("judge %s_consistency_batch failed (%s); asking pair by pair", kind, e)
    single = getattr(judge, f"{kind}_consistency")
    out = []
    for ref, cand in pairs:
        try:
            out.append(single(ref, cand))
        except Exception as e:  # noqa: BLE001
            log.warning("judge %s_consistency failed on one pair (%s)", kind, e)
            out.append(None)
    return out


def on_scale(values, allowed):
    """Verdicts on the judge's scale as floats; anything else (None, garbage, off-scale) -> None."""
    out = []
    for v in values:
        try:
            f = float(v)
        except (TypeError, ValueError):
            f = None
        out.append(f if f in allowed else None)
    return out


# --------------------------------------------------------------------------- construction
JUDGE_SPECS = ("local", "local:MODEL_DIR", "openai:MODEL", "hf:PATH", "none")


STAND_IN_ABOVE = 100_000_000   # parameters: a real model, not a test's tiny one


def stand_in_note(spec, n_params=None):
    """One line when the default offline judge ("local") stands in for the paper's GPT-4o judge (App. C.1) on a real
    model (`n_params` >= STAND_IN_ABOVE, or None: a served one, its size unknown); None otherwise."""
    real = n_params is None or n_params >= STAND_IN_ABOVE
    if str(spec).strip().partition(":")[0].lower() == "local" and real:
        return ("note: --judge local is an offline stand-in (MiniLM embeddings) for the paper's GPT-4o judge "
                "(App. C.1); --judge openai:MODEL (OpenAI's API, or a served model at $OPENAI_BASE_URL) or hf:PATH "
                "asks a real one")
    return None


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
        return OpenAIJudge(base_url=base_url, model=arg, cache=cache, **kwargs)
    if kind == "hf" and arg:
        return HFJudge(arg, cache=cache, **kwargs)
    raise ValueError(f"unknown judge {spec!r}; valid forms: {', '.join(JUDGE_SPECS)}")
