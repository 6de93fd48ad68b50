"""Robust-TO's reliability-aware tool orchestration (seed 001, "Robust-TO"): decompose, route, gather
evidence with calibrated confidence, synthesise in three reliability tiers.

The paper prints its prompts only in fragments and no formulas; what is the paper's is marked
"Robust-TO", what is our reading "(ours)". One question goes through five stages:

1. **Frame selection** (reliability.py): the k frames with the best reliability-relevance score, and
   the disturbance profile of those frames (blur, brightness, occlusion).
2. **Decomposition**: the policy is asked (:data:`DECOMPOSE_PROMPT`, Robust-TO's fragments: one atomic
   sub-query per perceptual demand, typed as spatial / temporal / attribute / action / text, as few as
   possible, the disturbance profile shown) for a JSON list of sub-queries; :func:`parse_subqueries`
   reads it tolerantly. When nothing usable comes back, the question itself is the one sub-query (ours).
3. **Routing** (:func:`route`): each sub-query goes to a tool of the registry (:data:`TOOLS`,
   :func:`register_tool`) by its type and words.
4. **Tools** return one :class:`Evidence` record each, Robust-TO's unified interface: the tool, a
   prediction, the frames it rests on, a confidence in [0, 1], and (added here) the mean disturbance of
   those frames. Offline tools here: :func:`ego_motion_tool` (OpenCV optical flow, perceive_cv.ego_motion),
   :func:`counter_tool` (colour blobs, perceive_cv.colour_blobs) and the policy VLM itself answering a
   sub-query on the selected frames with its token probabilities as confidence (``vlm``, registered by
   :class:`Agent`). A user tool is one function ``fn(query, frames, frame_ids, ctx) -> Evidence | None``.
5. **Three-tier synthesis** (:func:`tier`, :data:`SYNTHESIS_PROMPT`, Robust-TO): HIGH = confidence >= 0.7
   and disturbance < 0.3, LOW = confidence < 0.3 or disturbance >= 0.7, MEDIUM otherwise; the answer is
   built from HIGH evidence, MEDIUM only when consistent with it, LOW only when nothing else exists and
   then flagged as uncertain; output in <think>/<answer> tags. :func:`tiered_answer` applies the same
   rules by code (``Agent(synthesis="rules")``, ours): the ablation that measures the tools and tiers
   without the policy's synthesiser.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

import numpy as np

SUBQUERY_TYPES = ("spatial", "temporal", "attribute", "action", "text")  # Robust-TO's five semantic types

# --------------------------------------------------------------------------- tiers (Robust-TO)
HIGH, MEDIUM, LOW = "HIGH", "MEDIUM", "LOW"
HIGH_CONFIDENCE = 0.7   # HIGH: confidence >= 0.7 and disturbance < 0.3
HIGH_DISTURBANCE = 0.3
LOW_CONFIDENCE = 0.3    # LOW: confidence < 0.3 or disturbance >= 0.7
LOW_DISTURBANCE = 0.7


def tier(confidence: float, disturbance: float) -> str:
    """Robust-TO's reliability tier of one piece of evidence: HIGH (confidence >= 0.7 and disturbance
    < 0.3), LOW (confidence < 0.3 or disturbance >= 0.7), MEDIUM for all other evidence. The two
    conditions cannot both hold, so the order of the tests does not matter."""
    if confidence >= HIGH_CONFIDENCE and disturbance < HIGH_DISTURBANCE:
        return HIGH
    if confidence < LOW_CONFIDENCE or disturbance >= LOW_DISTURBANCE:
        return LOW
    return MEDIUM


@dataclass
class Evidence:
    """Robust-TO's unified evidence record: what a tool found (``prediction``), on which frames
    (``frame_ids``: temporal grounding), how sure it is (``confidence`` in [0, 1]), and the mean
    disturbance of those frames (``disturbance`` in [0, 1], from reliability.py; ours: the paper shows
    "Disturbance: {d_scores}" per source frame in its synthesis prompt)."""
    tool: str
    query: str
    prediction: str
    frame_ids: list = field(default_factory=list)
    confidence: float = 0.0
    disturbance: float = 0.0

    def __post_init__(self):
        self.confidence = float(min(1.0, max(0.0, self.confidence)))
        self.disturbance = float(min(1.0, max(0.0, self.disturbance)))
        self.frame_ids = [int(i) for i in self.frame_ids]

    @property
    def tier(self) -> str:
        return tier(self.confidence, self.disturbance)

    def to_dict(self) -> dict:
        return asdict(self) | {"tier": self.tier}


@dataclass
class SubQuery:
    type: str
    query: str


# --------------------------------------------------------------------------- prompts (Robust-TO fragments)
DECOMPOSE_PROMPT = """You plan the perception steps for a question about a video.
1. Identify the distinct perceptual demands implied by the question (e.g., object localization, action \
recognition, attribute comparison, text reading).
2. For each demand, formulate exactly one atomic sub-query targeting a single visual primitive.
3. Assign a semantic type to each sub-query: one of [spatial, temporal, attribute, action, text].
4. Minimize the total number of sub-queries - each must be strictly necessary.

[Input]
- Video context: {video_description}
- Disturbance profile of selected frames: blur={avg_blur}, brightness={avg_bright}, occlusion={avg_occl}
- Question: {original_query}

[Output Format]
Output a JSON list of atomic sub-queries, e.g. [{{"type": "action", "sub_query": "..."}}]. Only output the \
JSON - no explanations, no justification."""

SYNTHESIS_PROMPT = """Answer the question from the evidence that perception tools collected from the video.
Group evidence into three reliability tiers:
- HIGH: confidence >= 0.7 and disturbance < 0.3
- MEDIUM: all other evidence
- LOW: confidence < 0.3 or disturbance >= 0.7
Rules:
1. Build your answer primarily from HIGH-tier evidence.
2. Use MEDIUM-tier evidence only if it is consistent with HIGH-tier conclusions; discard it if contradictory.
3. Use LOW-tier evidence only when no HIGH-tier evidence exists, and explicitly note the uncertainty.
4. If all evidence is LOW-tier, state that the answer is uncertain.

[Input]
- Question: {original_query}
- Sub-queries and collected evidence:
{evidence}

[Output Format]
Provide your step-by-step reasoning inside <think> </think> tags, then the final answer inside \
<answer> </answer> tags. {answer_instruction}"""

# The frozen estimator of how many sub-queries a question needs (Robust-TO's count prompt fragments);
# its number is the budget beyond which the confidence-cost reward charges each extra sub-query.
COUNT_PROMPT = """How many atomic perception sub-queries does this question need?
1. Count how many distinct objects, actions, or spatial relations the question asks about.
2. Determine whether temporal reasoning across multiple moments is needed (adds sub-queries).
3. Assess whether the question can be answered from a single frame or requires multi-frame evidence.

Question: {original_query}

Output only the number."""


def format_evidence(evidence) -> str:
    """The synthesis prompt's evidence block, Robust-TO's layout, with each record's tier."""
    if not evidence:
        return "(no evidence was collected)"
    lines = []
    for e in evidence:
        lines += [f"- Sub-query: {e.query}",
                  f"  Tool: {e.tool}, Result: {e.prediction}, Confidence: {e.confidence:.2f}",
                  f"  Source frames: {e.frame_ids}, Disturbance: {e.disturbance:.2f}, Tier: {e.tier}"]
    return "\n".join(lines)


# --------------------------------------------------------------------------- parsing
_TYPE_WORDS = (  # (type, keyword pattern): a sub-query's type when the model gave none (ours)
    ("action", r"\b(turn|move|moving|go|going|heading|direction|action|walk|fly|rotate|forward|backward)\w*"),
    ("temporal", r"\b(first|before|after|order|then|when|sequence|appear\w*|earlier|later)\b"),
    ("text", r"\b(read|text|sign|written|word|label|number on)\b"),
    ("spatial", r"\b(where|closest|nearest|farthest|distance|left|right|above|below|behind|front|between)\b"),
    ("attribute", r"\b(colou?r|how many|count|size|shape|what kind|which)\b"),
)


def guess_type(text: str) -> str:
    t = str(text or "").lower()
    for kind, pattern in _TYPE_WORDS:
        if re.search(pattern, t):
            return kind
    return "attribute"


def _normalize_type(value, query) -> str:
    v = str(value or "").strip().lower()
    return v if v in SUBQUERY_TYPES else guess_type(query)


def parse_subqueries(text, max_subqueries: int = 4) -> list[SubQuery]:
    """Sub-queries from the decomposer's reply: the first JSON list in it (inside code fences or prose);
    items may be objects with "sub_query" / "query" / "subquery" / "text" and "type", or bare strings
    (typed by :func:`guess_type`); unknown types are guessed the same way; empty and duplicate
    queries are dropped; at most ``max_subqueries``. Nothing parseable -> []."""
    s = str(text or "")
    start = s.find("[")
    while start != -1:
        depth, end = 0, None
        for i in range(start, len(s)):
            depth += {"[": 1, "]": -1}.get(s[i], 0)
            if depth == 0:
                end = i
                break
        if end is None:  # never closed: maybe a complete list starts inside it
            start = s.find("[", start + 1)
            continue
        try:
            items = json.loads(s[start:end + 1])
        except ValueError:
            start = s.find("[", start + 1)
            continue
        out, seen = [], set()
        for item in items if isinstance(items, list) else []:
            if isinstance(item, str):
                query, kind = item, None
            elif isinstance(item, dict):
                query = next((item[k] for k in ("sub_query", "query", "subquery", "text", "question")
                              if isinstance(item.get(k), str)), "")
                kind = item.get("type")
            else:
                continue
            query = " ".join(query.split())
            if query and query.lower() not in seen:
                seen.add(query.lower())
                out.append(SubQuery(_normalize_type(kind, query), query))
        if out:
            return out[:max_subqueries]
        start = s.find("[", end + 1)
    return []


def parse_count(text) -> int | None:
    """The estimator's number of sub-queries (the first integer 1-20 in the reply, digits or a word)."""
    words = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
    for tok in re.findall(r"\d+|[a-z]+", str(text or "").lower()):
        n = int(tok) if tok.isdigit() else words.get(tok)
        if n is not None and 1 <= n <= 20:
            return n
    return None


# --------------------------------------------------------------------------- tools and routing
TOOLS: dict = {}   # name -> (function, types it serves)


def register_tool(name: str, types=SUBQUERY_TYPES):
    """Decorator: add ``fn(query, frames, frame_ids, ctx) -> Evidence | None`` to :data:`TOOLS` under
    ``name`` for sub-queries of ``types``. ``frames``: uint8 [k, H, W, 3], the selected frames;
    ``frame_ids``: their indices in the clip; ``ctx``: :class:`Context` (question, options, per-frame
    disturbance, the policy). Returning None means "nothing found" (no evidence)."""
    def wrap(fn):
        TOOLS[name] = (fn, tuple(types))
        return fn
    return wrap


@dataclass
class Context:
    """What a tool may know besides its sub-query and frames."""
    question: str = ""
    options: list = field(default_factory=list)
    disturbance: np.ndarray | None = None   # per frame of the clip, [T], reliability.py's combined score
    agent: object = None                     # the Agent (its policy, for the vlm tool)

    def frame_disturbance(self, frame_ids) -> float:
        if self.disturbance is None or not len(frame_ids):
            return 0.0
        return float(np.mean(np.asarray(self.disturbance)[list(frame_ids)]))


_MOTION_WORDS = (r"\b(turn|turning|move|moving|go|going|heading|direction|rotate|rotating|forward|ahead|left|right|"
                 r"action)\b")
_COUNT_WORDS = r"\b(how many|count|number of)\b"


def route(sub: SubQuery, available=None) -> str:
    """The tool for a sub-query (ours; Robust-TO routes by type to its specialist tools): camera-motion
    questions (action / temporal / spatial type with motion words) -> ego_motion; counting questions ->
    counter; everything else, and any tool that is not registered, -> vlm."""
    names = set(TOOLS) if available is None else set(available)
    q = sub.query.lower()
    if sub.type in ("action", "temporal", "spatial") and re.search(_MOTION_WORDS, q) and "ego_motion" in names \
            and not re.search(_COUNT_WORDS, q):
        return "ego_motion"
    if re.search(_COUNT_WORDS, q) and "counter" in names:
        return "counter"
    return "vlm"


# Ego-motion words -> the synthetic benchmark's / UrbanVideo's action phrases (the prediction stays the
# perceive.py action; this only says which option it supports).
_TURNS = {"rotate left": "turn left", "rotate right": "turn right", "move forward": "go ahead",
          "move left": "turn left", "move right": "turn right"}


@register_tool("ego_motion", types=("action", "temporal", "spatial"))
def ego_motion_tool(query, frames, frame_ids, ctx):
    """The camera's motion over the selected frames (perceive_cv.ego_motion on each consecutive pair):
    the action with the largest summed confidence; confidence = its share of the summed confidence x
    the mean confidence of the pairs that voted for it (a clip whose pairs disagree, or whose flow is
    weak, is not trusted). Fewer than two frames -> None."""
    from extensions.embodied_r import perceive_cv

    if len(frames) < 2:
        return None
    votes, confs = {}, {}
    for a, b in zip(frames[:-1], frames[1:]):
        action, c = perceive_cv.ego_motion(a, b)
        votes[action] = votes.get(action, 0.0) + c
        confs.setdefault(action, []).append(c)
    total = sum(votes.values())
    best = max(votes, key=votes.get)
    share = votes[best] / total if total > 0 else 0.0
    confidence = share * float(np.mean(confs[best]))
    prediction = best + (f" ({_TURNS[best]})" if best in _TURNS else "")
    return Evidence("ego_motion", query, prediction, frame_ids, confidence, ctx.frame_disturbance(frame_ids))


@register_tool("counter", types=("attribute", "spatial"))
def counter_tool(query, frames, frame_ids, ctx):
    """Objects of the colour the sub-query (else the question) names, from perceive_cv.colour_blobs: the
    count is the largest number seen in one selected frame (objects met one after another are
    undercounted: documented); confidence = the share of frames that see that many, halved when no
    colour is named (then every saturated blob counts). No frames -> None."""
    from extensions.embodied_r import perceive_cv

    if len(frames) == 0:
        return None
    text = f"{query} {ctx.question}".lower()
    colour = next((c for c in perceive_cv.CV_COLOURS if re.search(rf"\b{c}\b", query.lower())), None) \
        or next((c for c in perceive_cv.CV_COLOURS if re.search(rf"\b{c}\b", text)), None)
    counts = [sum(1 for b in perceive_cv.colour_blobs(f) if colour is None or b["colour"] == colour) for f in frames]
    n = max(counts)
    confidence = sum(c == n for c in counts) / len(counts) * (1.0 if colour else 0.5)
    what = f"{colour} objects" if colour else "coloured objects"
    return Evidence("counter", query, f"{n} {what}", frame_ids, confidence, ctx.frame_disturbance(frame_ids))


def stated_answers(e: Evidence, sample) -> list[str]:
    """The answers of ``sample`` a piece of evidence states (ours): for multiple choice the option letters
    whose text its prediction contains (rewards.supports), for numerical / regression questions the first
    number in it, otherwise the prediction itself."""
    from machinery.datasets import data
    from extensions.robust_to.rewards import supports

    if sample.problem_type == "multiple choice":
        letters = [L for L, _ in map(data.split_option, sample.options or []) if L]
        return [L for L in letters if supports(e.prediction, L, sample.problem_type, sample.options)]
    if sample.problem_type in ("numerical", "regression"):
        m = re.search(r"-?\d+(?:\.\d+)?", str(e.prediction))
        return [m.group(0)] if m else []
    return [str(e.prediction).strip()] if str(e.prediction).strip() else []


@dataclass
class TieredAnswer:
    """What Robust-TO's three tier rules make of one question's evidence (:func:`tiered_answer`)."""
    answer: str | None   # None: no evidence states an answer
    used: list           # the evidence the answer rests on
    tier: str | None     # the tier it came from
    uncertain: bool      # rule 4: all of it LOW tier


def tiered_answer(sample, evidence) -> TieredAnswer:
    """Robust-TO's synthesis rules applied literally, by code (ours: the paper has the policy apply them;
    this is the ablation that measures what the tools and the tiers give without the synthesiser, and
    the reasoning the agent's warm-up teaches). The tiers are tried in the order HIGH, MEDIUM, LOW
    (rules 1-3: MEDIUM only where no HIGH evidence states an answer, LOW only where nothing else does);
    within the first tier whose evidence states an answer (:func:`stated_answers`), each record votes for
    what it states with weight confidence x (1 - disturbance), split over what it states, and the
    heaviest answer wins (ties: the first stated). MEDIUM evidence that states the HIGH winner is kept
    as support (rule 2: consistent MEDIUM evidence is used; contradicting MEDIUM evidence is dropped).
    ``uncertain`` when the answer rests on LOW evidence only (rule 4)."""
    stated = [(e, stated_answers(e, sample)) for e in evidence]
    for level in (HIGH, MEDIUM, LOW):
        votes, backers = {}, {}
        for e, answers in stated:
            for a in answers if e.tier == level else []:
                votes[a] = votes.get(a, 0.0) + e.confidence * (1.0 - e.disturbance) / len(answers)
                backers.setdefault(a, []).append(e)
        if votes:
            best = max(votes, key=votes.get)  # dicts keep insertion order: ties go to the first stated
            used = list(backers[best])
            if level == HIGH:
                used += [e for e, answers in stated if e.tier == MEDIUM and best in answers]
            return TieredAnswer(best, used, level, level == LOW)
    return TieredAnswer(None, [], None, False)


def _cite(evidence) -> str:
    return "; ".join(f"the {e.tool} tool found {e.prediction} ({e.tier} tier, confidence {e.confidence:.2f})"
                     for e in evidence)


def rule_synthesis(sample, evidence) -> str:
    """The synthesis written by :func:`tiered_answer` instead of the policy (``Agent(synthesis="rules")``,
    ``python -m extensions.robust_to.eval --agent-synthesis rules``): the evidence it rests on, the answer it
    supports, the uncertainty flag of rule 4; an empty answer when no evidence states one."""
    t = tiered_answer(sample, evidence)
    if t.answer is None:
        return "<think>No evidence states an answer.</think>\n<answer></answer>"
    note = " All of it is LOW tier, so the answer is uncertain." if t.uncertain else ""
    return f"<think>Evidence: {_cite(t.used)}, which supports {t.answer}.{note}</think>\n<answer>{t.answer}</answer>"


def warmup_target(sample, evidence) -> str:
    """The synthesis target of the agent's warm-up (train.py:agent_sft_step here; ours), on clean videos. Where
    the three tier rules (:func:`tiered_answer`) reach the ground truth, the target is their reasoning:
    the evidence cited, "which supports" the answer, the answer. Elsewhere it cites the evidence the
    tiers would use (or says none was collected, or that it is all LOW tier) and then reasons as Video-R1's
    chain of thought does, ending in the ground truth. It teaches the policy to read the tool results,
    which Video-R1's chain of thought alone never mentions, and to name the option they support."""
    t = tiered_answer(sample, evidence)
    if t.answer is not None and str(t.answer).strip().lower() == str(sample.answer).strip().lower():
        return rule_synthesis(sample, evidence)
    used = [e for e in evidence if e.tier == HIGH] or [e for e in evidence if e.tier == MEDIUM] or list(evidence)
    cite = _cite(used) or "no evidence was collected"
    if used and all(e.tier == LOW for e in used):
        cite += ", all LOW tier, so the answer is uncertain"
    process = re.sub(r"</?think>", "", str(sample.process or "")).strip()
    return f"<think>Evidence: {cite}. {process}</think>\n<answer>{sample.answer}</answer>"


# --------------------------------------------------------------------------- the agent
VLM_TOOL_PROMPT = "Look at these frames and answer briefly, in a few words: {query}"


@dataclass
class Trace:
    """One question's pass through the agent: everything a reward, a log or an audit needs."""
    question: str
    frame_ids: list
    profile: dict
    decomposition: str
    subqueries: list
    evidence: list
    synthesis: str


class Agent:
    """Robust-TO around a policy VLM (``policy.load_policy``'s model and processor): the same weights
    decompose, answer the ``vlm`` tool's sub-queries and synthesise; every stage is batched over the
    questions given. ``k``: frames selected per question (reliability.select_frames; ``scorer``,
    ``alpha`` go to it). ``tools``: names of :data:`TOOLS` to use (default all, plus ``vlm``).
    ``synthesis``: "policy" (Robust-TO: the policy reads :data:`SYNTHESIS_PROMPT`) or "rules" (the tier
    rules applied by code, :func:`rule_synthesis`: an ablation; greedy runs only)."""

    def __init__(self, model, processor, k: int = 8, max_subqueries: int = 4, decompose_tokens: int = 96,
                 tool_tokens: int = 16, synthesis_tokens: int = 128, tools=None, scorer=None, alpha=None,
                 synthesis: str = "policy"):
        if synthesis not in ("policy", "rules"):
            raise ValueError(f"synthesis must be 'policy' or 'rules', got {synthesis!r}")
        self.model, self.processor, self.synthesis = model, processor, synthesis
        self.k, self.max_subqueries = int(k), int(max_subqueries)
        self.decompose_tokens, self.tool_tokens, self.synthesis_tokens = decompose_tokens, tool_tokens, synthesis_tokens
        self.tools = set(tools) if tools is not None else set(TOOLS) | {"vlm"}
        self.scorer, self.alpha = scorer, alpha

    # ---- stage 1: frames
    def select(self, frames, question):
        """(selected frame ids, per-frame disturbance [T] = 1 - reliability, disturbance profile of the
        selection), from one pass of reliability.frame_scores."""
        from extensions.robust_to import reliability

        kw = {} if self.alpha is None else {"alpha": self.alpha}
        scores = reliability.frame_scores(frames, question, scorer=self.scorer, **kw)
        ids = np.asarray(reliability.select_frames(frames, question, self.k, scorer=self.scorer, scores=scores,
                                                   **kw)).tolist()
        return ids, 1.0 - np.asarray(scores["reliability"], np.float64), reliability.profile(frames, ids, scores=scores)

    # ---- the policy
    def _generate(self, texts, clips, max_new_tokens, do_sample=False, n=1, temperature=1.0):
        from machinery.model import policy

        prompts = [[{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": t}]}] for t in texts]
        inputs = policy.make_inputs(self.processor, prompts, clips)
        return policy.rollout(self.model, self.processor, inputs, n=n, max_new_tokens=max_new_tokens,
                              do_sample=do_sample, temperature=temperature)

    def ask(self, queries, clips):
        """The ``vlm`` tool for a batch: greedy short answers and their confidence, the geometric mean
        of the answer's token probabilities (exp of the mean log-probability; ours, the paper says the
        tools return calibrated scores without saying how the VLM's is made)."""
        from machinery.model import policy
        import torch

        if not queries:
            return []
        out = self._generate([VLM_TOOL_PROMPT.format(query=q) for q in queries], clips, self.tool_tokens)
        with torch.no_grad():
            logp = policy.token_logprobs(self.model, out.prompt_inputs, out.completion_ids, out.completion_mask)
        mask = out.completion_mask.to(logp.device).float()
        mean = (logp * mask).sum(1) / mask.sum(1).clamp(min=1)
        return [(" ".join(t.split()) or "(no answer)", float(torch.exp(m))) for t, m in zip(out.texts, mean)]

    # ---- stages 2-5
    @staticmethod
    def decompose_text(question, n_frames, profile) -> str:
        return DECOMPOSE_PROMPT.format(video_description=f"{n_frames} selected frames of the video (shown)",
                                       avg_blur=profile["avg_blur"], avg_bright=profile["avg_bright"],
                                       avg_occl=profile["avg_occl"], original_query=question)

    def decompose(self, questions, clips, profiles, do_sample=False, n=1, temperature=1.0):
        texts = [self.decompose_text(q, len(c), p) for q, c, p in zip(questions, clips, profiles)]
        return self._generate(texts, clips, self.decompose_tokens, do_sample, n, temperature)

    def plan(self, decomposition: str, question: str) -> list[SubQuery]:
        """The parsed sub-queries, or the question itself as one sub-query when none parse (ours)."""
        subs = parse_subqueries(decomposition, self.max_subqueries)
        return subs or [SubQuery(guess_type(question), question)]

    def gather(self, subqueries, clips, frame_ids, contexts):
        """Evidence for every sub-query: ``subqueries[i]`` are question i's; tools run per sub-query,
        the ``vlm`` tool batched over all questions."""
        evidence = [[None] * len(subs) for subs in subqueries]
        pending = []
        for i, subs in enumerate(subqueries):
            for j, sub in enumerate(subs):
                name = route(sub, self.tools)
                if name != "vlm" and name in TOOLS:
                    evidence[i][j] = TOOLS[name][0](sub.query, clips[i], frame_ids[i], contexts[i])
                else:
                    pending.append((i, j, sub))
        answers = self.ask([s.query for _, _, s in pending], [clips[i] for i, _, _ in pending])
        for (i, j, sub), (pred, conf) in zip(pending, answers):
            evidence[i][j] = Evidence("vlm", sub.query, pred, frame_ids[i], conf,
                                      contexts[i].frame_disturbance(frame_ids[i]))
        return [[e for e in ev if e is not None] for ev in evidence]

    def synthesis_text(self, sample, evidence) -> str:
        from machinery.datasets import data

        return SYNTHESIS_PROMPT.format(original_query=data.question_text(sample), evidence=format_evidence(evidence),
                                       answer_instruction=data.TYPE_TEMPLATE.get(sample.problem_type, "").strip())

    def synthesize(self, samples, evidence, clips, do_sample=False, n=1, temperature=1.0):
        return self._generate([self.synthesis_text(s, ev) for s, ev in zip(samples, evidence)], clips,
                              self.synthesis_tokens, do_sample, n, temperature)

    def prepare(self, samples, clips):
        """Stage 1 for a batch: (questions with options, per sample (frame ids, disturbance [T], profile),
        the selected frames)."""
        from machinery.datasets import data

        questions = [data.question_text(s) for s in samples]
        sel = [self.select(c, q) for c, q in zip(clips, questions)]
        return questions, sel, [np.asarray(c)[ids] for c, (ids, _, _) in zip(clips, sel)]

    def evidence(self, samples, questions, sel, chosen, rows, plans):
        """Stage 4: the evidence of each plan; ``rows[i]`` is the index of plan i's sample."""
        contexts = [Context(questions[b], list(samples[b].options or []), sel[b][1], self) for b in rows]
        return self.gather(plans, [chosen[b] for b in rows], [sel[b][0] for b in rows], contexts)

    def _pass(self, samples, clips, n, do_sample, temperature=1.0):
        """Every stage, ``n`` decompositions per sample, one synthesis per decomposition."""
        questions, sel, chosen = self.prepare(samples, clips)
        dec = self.decompose(questions, chosen, [p for _, _, p in sel], do_sample=do_sample, n=n,
                             temperature=temperature)
        rows = [b for b in range(len(samples)) for _ in range(n)]
        subs = [self.plan(t, questions[b]) for t, b in zip(dec.texts, rows)]
        evidence = self.evidence(samples, questions, sel, chosen, rows, subs)
        if self.synthesis == "rules":
            if do_sample:
                raise ValueError("Agent(synthesis='rules') has nothing to sample: GRPO needs the policy's synthesis")
            syn, texts = None, [rule_synthesis(samples[b], ev) for b, ev in zip(rows, evidence)]
        else:
            syn = self.synthesize([samples[b] for b in rows], evidence, [chosen[b] for b in rows],
                                  do_sample=do_sample, temperature=temperature)
            texts = syn.texts
        traces = [Trace(questions[b], sel[b][0], sel[b][2], d, [asdict(x) for x in sq], ev, t)
                  for b, d, sq, ev, t in zip(rows, dec.texts, subs, evidence, texts)]
        return traces, dec, syn

    def sample(self, samples, clips, group_size: int, temperature: float = 1.0):
        """GRPO's rollouts of the agent (train.py --agent robust-to): per sample, ``group_size``
        decompositions are sampled, each plan's tools run (the vlm tool greedy: a tool, not the policy
        being explored), and one synthesis is sampled per plan. Returns (traces, decompositions,
        syntheses): B x G traces, sample-major, and the two policy.Rollout batches (B x G rows each) whose
        completions the GRPO loss trains."""
        return self._pass(samples, clips, int(group_size), True, temperature)

    def expected_subqueries(self, samples, clips, model=None):
        """The frozen estimator's sub-query budget per sample (:data:`COUNT_PROMPT`, greedy): ``model``
        (the frozen reference) when given, else this agent's policy; None where the reply has no number."""
        from machinery.model import policy

        from machinery.datasets import data

        texts = [COUNT_PROMPT.format(original_query=data.question_text(s)) for s in samples]
        prompts = [[{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": t}]}] for t in texts]
        inputs = policy.make_inputs(self.processor, prompts, clips)
        out = policy.rollout(model if model is not None else self.model, self.processor, inputs, n=1,
                             max_new_tokens=8, do_sample=False)
        return [parse_count(t) for t in out.texts]

    def run(self, samples, clips):
        """Greedy pass of every stage for a batch of (sample, frames uint8 [T, H, W, 3]): one
        :class:`Trace` per sample; the final text is ``trace.synthesis``."""
        return self._pass(samples, clips, 1, False)[0]


@register_tool("vlm")
def vlm_tool(query, frames, frame_ids, ctx):
    """The policy VLM answering one sub-query on the selected frames (needs ``ctx.agent``)."""
    if ctx.agent is None:
        return None
    (pred, conf), = ctx.agent.ask([query], [frames])
    return Evidence("vlm", query, pred, frame_ids, conf, ctx.frame_disturbance(frame_ids))
