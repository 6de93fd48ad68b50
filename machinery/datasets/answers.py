"""Reading and scoring a model's answer: the answer in an output (the project's reasoning style, or exactly what
each benchmark's official scorer reads), number words, and the metrics (exact match, mean relative accuracy,
Video-R1's relative-error, WER and ROUGE rewards). grpo.py's accuracy reward (Eq. 10) and eval_pvrbench.py's
scores both read answers here; the departures from the official scorers are listed in EXTENSIONS.
"""
from __future__ import annotations

import functools
import logging
import math
import re
import unicodedata
from collections import defaultdict

import numpy as np

from machinery.datasets import data

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- answer extraction
# Two ways of reading an output (data.STYLES; eval_pvrbench.py --style also picks the prompt). "official": exactly as
# the source's official scorer (OFFICIAL_SCORERS), checked output for output against their code on the adversarial
# outputs of tests/data/official_scores/. "reason": Video-R1's think/answer outputs, with the project's
# extensions (EXTENSIONS), which the training rewards share.
OFFICIAL_SCORERS = {
    "vsibench": "lmms-eval <= 0.7.2 and thinking-in-space, tasks/vsibench/utils.py: fuzzy_matching (the first "
                "space-separated token of the output, which their pipeline strips first: api/task.py's "
                "ConfigurableTask.process_results), exact_match, mean_relative_accuracy; lmms-eval 0.7.3's "
                "extract_number with --scoring lmms-eval-0.7.3",
    "urbanvideo": "UrbanVideo-Bench eval.py: extract_option_letter on the raw output as run.py's CSV gives it back "
                  "(pandas: an empty or missing-value output, e.g. 'None', 'N/A', 'nan', is dropped)",
    "video-r1": "Video-R1 src/eval_bench.py reward_fn (also the synthetic set and a sample without a source)",
}
# VSI-Bench's numeric answers: lmms-eval <= 0.7.2's first token (thinking-in-space's, the default) or 0.7.3's
# extract_number (the first number or number-word phrase anywhere)
SCORINGS = ("lmms-eval-0.7.2", "lmms-eval-0.7.3")
# Where the project departs from the official scorers, and in which styles: "reason" (evaluation), "official"
# (evaluation) and "training" (grpo.py's rewards). results.json's `scoring` block lists those of its style.
EXTENSIONS = {
    "answer_tag": (("reason", "training"), "the content of the first complete <answer>...</answer> is scored for "
                   "every source (the official VSI-Bench and UrbanVideo scorers read the raw output: a tagged answer "
                   "scores 0 there)"),
    "unclosed_tag": (("reason",), "an unclosed or cut-off <answer> ('<answer>A', '<answer>A</answ') gives the text "
                     "after it (every official scorer: 0)"),
    "whitespace": (("reason",), "the output is stripped before UrbanVideo's first-character rule: ' A', '\\nA' "
                   "score 1 (eval.py reads the whitespace character; lmms-eval strips every output before VSI-Bench's "
                   "rules, so both styles do)"),
    "number_words": (("reason", "training"), "English number words and phrases count as numbers ('Seven', 'twenty "
                     "one', 'one hundred and five'); no official scorer reads them (lmms-eval 0.7.3's "
                     "extract_number does, with --scoring lmms-eval-0.7.3)"),
    "urbanvideo_dropped": (("reason",), "an UrbanVideo output eval.py drops (empty, or a missing-value string such "
                           "as 'None', 'N/A', 'nan') scores 0 in overall/tasks; overall_official_rule and "
                           "tasks_official_rule drop it as eval.py does"),
    "text_types": (("reason", "training"), "OCR / free-form answers: Video-R1 grpo.py's 1 - WER and mean ROUGE-1/2/L "
                   "F (eval_bench.py has no rule for them and scores 0)"),
    "ground_truth_zero": (("reason", "official", "training"), "a ground truth of 0 scores 1 for a prediction of 0, "
                          "else 0 (lmms-eval's MRA raises ZeroDivisionError; grpo.py's reward gives 0 even for 0; "
                          "eval_bench.py's float32 formula is followed in the official style)"),
    "non_finite": (("training",), "a non-finite regression prediction scores 0 (grpo.py's reward gives 'nan' 1.0)"),
    "format_whitespace": (("training",), "the format reward strips surrounding whitespace first: "
                          "'<think>..</think><answer>..</answer>\\n' gets 1 (Video-R1's fullmatch: 0)"),
}

_URBAN_OPTION = re.compile(r"Option:\s*[\[\s]*(\w)")   # UrbanVideo-Bench eval.py
# pandas.read_csv's default missing-value strings (the same in pandas 2.x and 3.x): run.py writes the outputs to a
# CSV and eval.py reads it back, so an output equal to one of them is NaN there and eval.py drops it
CSV_MISSING = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                         "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})


def _check_rules(style: str, scoring: str = SCORINGS[0]) -> None:
    if style not in data.STYLES:
        raise ValueError(f"unknown scoring style {style!r} (expected one of {data.STYLES})")
    if scoring not in SCORINGS:
        raise ValueError(f"unknown scoring {scoring!r} (expected one of {SCORINGS})")


def urban_dropped(text) -> bool:
    """Whether UrbanVideo-Bench's eval.py drops this output from numerator and denominator: no output, or one that
    pandas reads back from run.py's CSV as missing (exactly "", "None", "N/A", "nan", "null", ... :
    CSV_MISSING). A whitespace-only output is kept (and scores 0). An output holding a carriage return without a
    line feed breaks run.py's CSV itself (pandas ends the row there); that is not emulated."""
    return text is None or (isinstance(text, str) and text in CSV_MISSING)


def _fuzzy_matching(pred: str) -> str:
    """lmms-eval vsibench: the first space-separated token, trailing '.' removed."""
    return pred.split(" ")[0].rstrip(".").strip()


def _urban_letter(text: str) -> str:
    """UrbanVideo-Bench eval.py extract_option_letter: the regex, else the first character."""
    m = _URBAN_OPTION.search(text)
    if m:
        return m.group(1)
    return text[0].upper() if text else ""


_DIGITS = re.compile(r"-?\d+(?:\.\d+)?")


def _number_word_value(word: str) -> int | None:
    if word in data.NUMBER_WORDS:
        return data.NUMBER_WORDS.index(word)
    if word in data.TENS_WORDS:
        return 20 + 10 * data.TENS_WORDS.index(word)
    return {"hundred": 100, "thousand": 1000}.get(word)


def _word_run(s: str) -> tuple[int | None, list[int]]:
    """Start and values of the first run of number words in lower-case `s` ("and" inside a run skipped)."""
    start, values = None, []
    for m in re.finditer(r"[a-z]+", s):
        v = _number_word_value(m.group())
        if m.group() == "and" or (start is None and v is None):
            continue
        if v is None:
            break
        start = m.start() if start is None else start
        values.append(v)
    return start, values


def _first_number(text: str) -> str:
    """lmms-eval 0.7.3's extract_number, as a string: the first number in the text, digits ("3", "-2.5", read as
    "3.0", "-2.5") or a run of number words ("three hundred and twenty-one" -> "321.0"), whichever starts first;
    "" when there is none."""
    s = str(text).strip().lower()
    digits = _DIGITS.search(s)
    start, values = _word_run(s)
    if digits is not None and (start is None or digits.start() < start):
        try:
            return repr(float(digits.group()))
        except ValueError:
            pass
    if start is None:
        return ""
    total = current = 0
    for v in values:
        if v == 100:
            current = max(current, 1) * 100
        elif v == 1000:
            total, current = total + max(current, 1) * 1000, 0
        else:
            current += v
    return repr(float(total + current))


def _leading_number_phrase(span: str) -> str:
    """The longest phrase of 2 to 6 number words that starts `span` ("twenty one meters" -> "twenty one"), else "".
    The reasoning style reads it whole where VSI-Bench's first-token rule would keep "twenty" (our addition)."""
    tokens = span.split()
    for k in range(min(len(tokens), 6), 1, -1):
        phrase = " ".join(tokens[:k]).rstrip(".,")
        if words_to_number(phrase) is not None:
            return phrase
    return ""


def _answer_span(text: str) -> tuple[str, bool]:
    """(answer text, whether a complete <answer>...</answer> pair was found).

    The first complete pair wins (Video-R1 uses re.search). Without one, an unclosed
    ``<answer>`` gives the text after the last opening tag (our addition); otherwise the whole text.
    """
    m = data.ANSWER_TAG.search(text)
    if m:
        return m.group(1).strip(), True
    k = text.rfind("<answer>")
    if k >= 0:   # "<answer> B" or "<answer> B </answ": up to any closing-tag start
        text = text[k + len("<answer>"):].split("</", 1)[0]
    return text.strip(), False


def _official_answer(text: str, source, problem_type, scoring: str) -> str:
    """What the source's official scorer reads in a raw output (OFFICIAL_SCORERS). VSI-Bench: the first
    space-separated token (or 0.7.3's first number) of the output stripped, as lmms-eval's pipeline gives it to the
    task (also what the task eval_pvrbench.py --export-lmms-eval writes sees); UrbanVideo: the Option: regex, else the
    first character ("" for an output eval.py drops, see urban_dropped); Video-R1's eval_bench (every other
    source): the first <answer>...</answer>'s content, the whole output when that is empty or absent."""
    if source == "vsibench":
        text = text.strip()
        if problem_type in ("numerical", "regression") and scoring == "lmms-eval-0.7.3":
            return _first_number(text)
        return _fuzzy_matching(text)
    if source == "urbanvideo":
        return "" if urban_dropped(text) else _urban_letter(text)
    m = data.ANSWER_TAG.search(text)
    return (m.group(1).strip() if m else "") or text


def extract_answer(text, source: str | None = None, *, problem_type: str | None = None,
                   strict: bool = False, style: str = "reason", scoring: str = SCORINGS[0]) -> str:
    """The answer in a model output; never raises on an output (None/empty -> "").

    ``style="official"``: what the source's official scorer reads (:func:`_official_answer`), whitespace,
    tags and all. ``style="reason"`` (the default):

    1. The content of the first complete ``<answer>...</answer>`` (Video-R1's regex); else the text
       after an unclosed ``<answer>``; else the whole output, stripped.
       ``strict=True`` is Video-R1's training reward: "" unless a complete tag pair exists.
    2. The source's official post-processing of that text:
       ``"vsibench"``: lmms-eval ``fuzzy_matching`` (first space-separated token, trailing '.'
       stripped), a leading number-word phrase read whole ("twenty one"), or with
       ``scoring="lmms-eval-0.7.3"`` its extract_number for numeric answers; ``"urbanvideo"``:
       ``Option:\\s*[\\[\\s]*(\\w)`` else the first character upper-cased; ``"video-r1"``/``"synthetic"``: the
       text itself (Video-R1's eval_bench falls back to the whole output); ``None``: the tag content as is, a
       bare output through the "Option:" regex and then the VSI first-token rule.
    For OCR/free-form ``problem_type`` step 2 is skipped (the text is the answer). The departures from the
    official scorers are listed in EXTENSIONS.
    """
    _check_rules(style, scoring)
    if style == "official" and strict:
        raise ValueError("strict=True is Video-R1's training reward, a reasoning-style rule; not with "
                         "style='official'")
    if text is None:
        return ""
    text = text if isinstance(text, str) else str(text)
    if style == "official":
        return _official_answer(text, source, problem_type, scoring)
    span, tagged = _answer_span(text)
    if strict and not tagged:
        return ""
    if problem_type in data.TEXT_TYPES or not span:
        return span
    if source == "vsibench":
        if problem_type in ("numerical", "regression"):
            if scoring == "lmms-eval-0.7.3":
                return _first_number(span)
            return _leading_number_phrase(span) or _fuzzy_matching(span)
        return _fuzzy_matching(span)
    if source == "urbanvideo":
        return _urban_letter(span)
    if source in ("video-r1", "synthetic") or tagged:
        return span
    m = _URBAN_OPTION.search(span)
    return m.group(1) if m else _fuzzy_matching(span)


def each(texts, sample) -> list[str]:
    """The answer in each of a sample's outputs (extract_answer by its source and problem type)."""
    return [extract_answer(t, sample.source, problem_type=sample.problem_type) for t in texts]


_THINK_TAG = re.compile(r"<think>\s*(.*?)\s*(</think>|$)", re.DOTALL)


def extract_reasoning(text, *, lenient: bool = False) -> str:
    """The reasoning in a model output, stripped; never raises (not a string -> "").

    The content of the first ``<think>...</think>`` block: Alg. 1 Step 2's p_j, "" without a closed
    block (a rollout that breaks the format has no reasoning to align). ``lenient=True`` also reads
    outputs that break the format (PVRBench's local quality judge rates any response): an unclosed
    ``<think>`` gives everything after it, an output without one its text outside the ``<answer>`` block.
    """
    if not isinstance(text, str):
        return ""
    m = _THINK_TAG.search(text)
    if m and (m.group(2) or lenient):
        return m.group(1).strip()
    return data.ANSWER_TAG.sub(" ", text).strip() if lenient and not m else ""


# --------------------------------------------------------------------------- numbers
def words_to_number(text: str) -> int | None:
    """English number words 0..999 -> int ("three", "twenty-one", "one hundred and five");
    None if the whole text is not a number phrase. Our addition: no official scorer does this."""
    if not isinstance(text, str):
        return None
    toks = text.strip().lower().rstrip(".").replace("-", " ").split()
    small = {w: i for i, w in enumerate(data.NUMBER_WORDS)}
    tens = {w: 20 + 10 * i for i, w in enumerate(data.TENS_WORDS)}
    if toks == ["zero"]:
        return 0
    n, i = 0, 0
    if len(toks) >= 2 and toks[1] == "hundred" and 1 <= small.get(toks[0], 0) <= 9:
        n, i = 100 * small[toks[0]], 2
        if i < len(toks) and toks[i] == "and":
            i += 1
    rest = toks[i:]
    if not rest:
        return n if i and toks[-1] != "and" else None
    if len(rest) == 1 and 1 <= small.get(rest[0], 0) <= 19:
        return n + small[rest[0]]
    if rest[0] in tens:
        if len(rest) == 1:
            return n + tens[rest[0]]
        if len(rest) == 2 and 1 <= small.get(rest[1], 0) <= 9:
            return n + tens[rest[0]] + small[rest[1]]
    return None


def _numberize(s: str) -> str:
    v = words_to_number(s)
    return str(v) if v is not None else s.strip()




def _normalize_number(s: str) -> float | None:
    """Video-R1 normalize_number: commas removed, then float()."""
    try:
        return float(s.replace(",", ""))
    except (AttributeError, TypeError, ValueError):
        return None


# --------------------------------------------------------------------------- metrics
_MRA_START, _MRA_END, _MRA_INTERVAL = 0.5, 0.95, 0.05


def _relative_metric(metric):
    """The shared edge cases of the relative metrics: non-finite or non-numeric inputs score 0.0, and
    gt == 0 (undefined: lmms-eval raises ZeroDivisionError) scores our limit, 1.0 if pred == 0 else 0.0."""
    @functools.wraps(metric)
    def wrapper(pred, gt, *args, **kwargs) -> float:
        try:
            pred, gt = float(pred), float(gt)
        except (TypeError, ValueError):
            return 0.0
        if not (math.isfinite(pred) and math.isfinite(gt)):
            return 0.0
        if gt == 0:
            return 1.0 if pred == 0 else 0.0
        return metric(pred, gt, *args, **kwargs)
    return wrapper


@_relative_metric
def mean_relative_accuracy(pred: float, gt: float, strict: bool = False) -> float:
    """Mean relative accuracy over confidence thresholds theta in {0.50, 0.55, ..., 0.95}.

    ``strict=False``: lmms-eval VSI-Bench, float64,
    ``linspace(.5, .95, int((.95 - .5) / .05 + 2))`` (10 points; the int() of 10.999... is 10) and
    ``|pred - gt| / gt <= 1 - theta``.
    ``strict=True``: Video-R1 eval_bench, torch float32: thresholds
    ``arange(.5, .95 + .025, .05)``, ``|pred - gt| / (|gt| + 1e-8) < 1 - theta``, float32 mean;
    emulated with numpy float32 (tests check it against torch).
    A negative gt uses |gt| (never happens in VSI-Bench); gt == 0 and non-finite inputs: see
    :func:`_relative_metric`.
    """
    if strict:
        return _mra_float32(pred, gt)
    conf = np.linspace(_MRA_START, _MRA_END, int((_MRA_END - _MRA_START) / _MRA_INTERVAL + 2))
    return float((abs(pred - gt) / abs(gt) <= 1 - conf).mean())


def _mra_float32(pred: float, gt: float) -> float:
    """Video-R1 eval_bench's MRA as written, in float32 (see :func:`mean_relative_accuracy`): also at gt == 0,
    where |pred| / 1e-8 decides, and for non-finite inputs (0.0)."""
    with np.errstate(over="ignore", invalid="ignore"):
        p32, g32 = np.float32(pred), np.float32(gt)
        rel = np.abs(p32 - g32) / (np.abs(g32) + np.float32(1e-8))
        n = math.ceil((_MRA_END + _MRA_INTERVAL / 2 - _MRA_START) / _MRA_INTERVAL)
        thresholds = (_MRA_START + _MRA_INTERVAL * np.arange(n, dtype=np.float64)).astype(np.float32)
        hits = int(np.count_nonzero(rel < (np.float32(1) - thresholds)))
    return float(np.float32(hits) / np.float32(n))


@_relative_metric
def relative_error_reward(pred: float, gt: float) -> float:
    """Video-R1 grpo.py training reward for regression: 1 - clip((|p - g| + 1e-9) / (|g| + 1e-9), 0, 1).

    (The evaluation script uses MRA instead, see :func:`mean_relative_accuracy`.) gt == 0: our limit as
    for MRA (the literal formula gives 0.0 even for pred == 0).
    """
    rel = (abs(pred - gt) + 1e-9) / (abs(gt) + 1e-9)
    return 1.0 - min(1.0, max(0.0, rel))


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Video-R1's wer: word-level Levenshtein distance / max(1, number of reference words)."""
    ref, hyp = reference.split(), hypothesis.split()
    prev = list(range(len(hyp) + 1))
    for i in range(1, len(ref) + 1):
        cur = [i] + [0] * len(hyp)
        for j in range(1, len(hyp) + 1):
            cur[j] = prev[j - 1] if ref[i - 1] == hyp[j - 1] else 1 + min(prev[j], cur[j - 1], prev[j - 1])
        prev = cur
    return prev[len(hyp)] / max(1, len(ref))


@functools.cache
def _rouge():
    from rouge_score import rouge_scorer
    return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)


def rouge_score(reference: str, hypothesis: str) -> float:
    """Video-R1's compute_rouge_score: mean F of ROUGE-1/2/L with the Porter stemmer."""
    s = _rouge().score(reference, hypothesis)
    return (s["rouge1"].fmeasure + s["rouge2"].fmeasure + s["rougeL"].fmeasure) / 3


def _score_numerical(pred: str, gt: str, style: str) -> float:
    p, g = (_numberize(pred), _numberize(gt)) if style == "reason" else (pred, gt)
    if (("." in g) or ("," in g)) != (("." in p) or ("," in p)):
        return 0.0
    pn, gn = _normalize_number(p), _normalize_number(g)
    if pn is None or gn is None:
        return 0.0
    return 1.0 if round(gn, 2) == round(pn, 2) else 0.0


def _score_regression(pred: str, gt: str, source, train_reward: bool, style: str) -> float:
    parse = data.to_float if source == "vsibench" else _normalize_number
    if style == "reason":
        pred, gt = _numberize(pred), _numberize(gt)
    pn, gn = parse(pred), parse(gt)
    if pn is None or gn is None:
        return 0.0
    if source == "vsibench":
        return mean_relative_accuracy(pn, gn, strict=False)
    if train_reward:
        return relative_error_reward(pn, gn)
    if style == "official":
        return _mra_float32(pn, gn)
    return mean_relative_accuracy(pn, gn, strict=True)


def score(pred, gt, problem_type: str, source: str | None = None, *, train_reward: bool = False,
          style: str = "reason") -> float:
    """Accuracy of an *extracted* answer (see :func:`extract_answer`, with the same `style`) in [0, 1]; never
    raises on a garbage prediction (0.0), raises ValueError on an unknown problem_type or style.

    multiple choice: exact match after strip (Video-R1; UrbanVideo eval.py compares with ``==``
      too); ``source="vsibench"``: case-insensitive (lmms-eval exact_match). A prediction such as
      "B. sofa" is not reduced to its letter here (no official scorer does); the VSI/UrbanVideo
      extraction rules do that before scoring.
    numerical: Video-R1: 0 unless both or neither contain '.' or ','; then float (commas removed)
      and equality after round(x, 2).
    regression: ``source="vsibench"``: lmms-eval MRA (``<=``, float64; unparsable -> 0.0);
      otherwise Video-R1's eval MRA (``<``, float32), or with ``train_reward=True`` Video-R1's
      grpo.py reward 1 - clipped relative error.
    OCR: 1 - WER clipped to [0, 1]; free-form: mean ROUGE-1/2/L F, clipped (Video-R1's grpo.py).
    Number words ("three", "twenty-one") count as numbers for numerical/regression (our addition).
    ``style="official"``: no number words; UrbanVideo's letters compared with ``==`` as they are; Video-R1's
    eval MRA also at gt == 0 (its float32 formula); OCR/free-form 0.0 (eval_bench.py has no rule for them).
    """
    if problem_type not in data.PROBLEM_TYPES:
        raise ValueError(f"unknown problem_type {problem_type!r} (expected one of {data.PROBLEM_TYPES})")
    _check_rules(style)
    try:
        pred = "" if pred is None else str(pred)
        gt = "" if gt is None else str(gt)
        if problem_type == "multiple choice":
            if style == "official" and source == "urbanvideo":
                return 1.0 if pred == gt else 0.0
            p, g = pred.strip(), gt.strip()
            if source == "vsibench":
                p, g = p.lower(), g.lower()
            return 1.0 if p == g else 0.0
        if problem_type == "numerical":
            return _score_numerical(pred, gt, style)
        if problem_type == "regression":
            return _score_regression(pred, gt, source, train_reward, style)
        if style == "official":
            return 0.0
        if problem_type == "OCR":
            return max(0.0, min(1.0, 1.0 - word_error_rate(gt, pred)))
        return max(0.0, min(1.0, rouge_score(gt, pred)))   # free-form
    except Exception:
        log.debug("score: unscorable prediction %r for %r", pred, gt, exc_info=True)
        return 0.0


def read_and_score(output, source, problem_type, answer, style="reason", scoring=SCORINGS[0]):
    """(the answer read from an output, its score) under `style` and `scoring`: eval_pvrbench.py's per-sample
    scoring, and that of the lmms-eval task it exports (machinery/eval/lmms_utils.py)."""
    pred = extract_answer(output, source, problem_type=problem_type, style=style, scoring=scoring)
    return pred, score(pred, answer, problem_type, source, style=style)


def score_sample(output, sample: data.Sample, *, strict: bool = False, train_reward: bool = False,
                 style: str = "reason", scoring: str = SCORINGS[0]) -> float:
    """Score a raw model output against a sample: extract with the sample's source, then score, both in `style`
    (and with `scoring`'s VSI-Bench numeric rule). An UrbanVideo output that eval.py drops scores 0 here
    (urban_dropped tells which; eval_pvrbench leaves them out of the official-rule figures)."""
    pred = extract_answer(output, sample.source, problem_type=sample.problem_type, strict=strict, style=style,
                          scoring=scoring)
    return score(pred, sample.answer, sample.problem_type, sample.source, train_reward=train_reward, style=style)


# --------------------------------------------------------------------------- answers as the offline judge compares them
ARTICLES = {"a", "an", "the"}
STEM_SUFFIX = re.compile(r"(?<=\w{3})(?:ing|ed|s)$")  # crude stemming: "turning" -> "turn", "objects" -> "object"
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


def norm_text(s: str) -> str:
    """Lower case, no punctuation or articles, number words as digits, single spaces."""
    s = unicodedata.normalize("NFKC", s).lower()
    s = re.sub(r"[^\w\s]", " ", s)
    toks = [t for t in s.split() if t not in ARTICLES]
    return " ".join(str(n) if (n := words_to_number(t)) is not None else t for t in toks)


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
            n = words_to_number(" ".join(toks[:k]))
            if n is not None:
                value, unit = float(n), " ".join(toks[k:])
                break
        else:
            return None
    if not unit:
        return value, None
    return (value, _UNITS[unit]) if unit in _UNITS else None


def answer_option(s: str):
    """An answer's option: "B" / "B." / "(B)" / "B) sofa" / "B. sofa" -> ("b", "sofa" normalised, or "");
    None otherwise. data.split_option's grammar, except that an answer's label may be lower-case too
    ("b) sofa"; in an option list or a question only an upper-case label counts)."""
    s = unicodedata.normalize("NFKC", s).strip()
    letter, body = data.split_option(s[:2].upper() + s[2:])      # the label: "b" or "(b" at the start
    return (letter.lower(), norm_text(body)) if letter else None


def option_lines(question) -> list:
    """[(letter, text)] of the question's lines that are labelled options ("A. sofa", "(B) chair")."""
    return [(k, v) for k, v in map(data.split_option, str(question or "").split("\n")) if k and v]


def _same_quantity(qr, qc) -> bool:
    """Two (value, unit or None) quantities: equal values in a common unit (a bare number takes the other's)."""
    (vr, ur), (vc, uc) = qr, qc
    if ur and uc:
        if ur[0] != uc[0]:
            return False
        vr, vc = vr * ur[1], vc * uc[1]
    return math.isclose(vr, vc, rel_tol=1e-6, abs_tol=1e-9)


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
        return _same_quantity(qr, qc)
    orf, ocd = answer_option(ref), answer_option(cand)
    if orf and ocd:
        return orf[0] == ocd[0]
    if orf or ocd:
        letter_text = (orf or ocd)[1]
        return bool(letter_text) and letter_text == norm_text(cand if orf else ref)
    return norm_text(ref) == norm_text(cand)

# --------------------------------------------------------------------------- a condition's aggregate (App. B.1)
# eval_pvrbench.py's figures and the lmms-eval task it exports (machinery/eval/lmms_task.py) both aggregate here.
REL_DIRECTION = ("object_rel_direction_easy", "object_rel_direction_medium", "object_rel_direction_hard")


def mean(values):
    """The mean of the values that are not None (None when there are none)."""
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def condition_score(records, source, style="reason"):
    """Official aggregate of one condition's records ({"task", "score", "error", "response"}) of one source.
    vsibench/synthetic: lmms-eval's vsibench_aggregate_results (rel_direction levels merged, unweighted mean
    over tasks); urbanvideo: eval.py's accuracy per question_category and micro total. UrbanVideo's outputs that
    eval.py drops (urban_dropped) count as 0 in the reasoning style, with eval.py's figures beside
    (urban_official); in the official style `overall` and `tasks` are eval.py's."""
    if source == "urbanvideo":
        return urban_score(records, style)
    by_task = _by_task(records)
    per_type = {t: float(np.mean(v)) for t, v in sorted(by_task.items())}
    tasks = {t: m for t, m in per_type.items() if t not in REL_DIRECTION}
    levels = [per_type[t] for t in REL_DIRECTION if t in per_type]
    if levels:
        tasks["object_rel_direction"] = float(np.mean(levels))
    overall = mean(tasks.values())
    return {"overall": overall, "tasks": tasks, "question_types": per_type, "n": len(records),
            "n_errors": sum(r.get("error") is not None for r in records)}


def _by_task(records):
    by_task = defaultdict(list)
    for r in records:
        if r.get("error") is None:
            by_task[r["task"]].append(r["score"])
    return by_task


def urban_score(records, style="reason"):
    """UrbanVideo-Bench's figures: accuracy per question_category and the micro total, of every output
    (reasoning style: an output eval.py drops scores 0, the honest choice) or of the outputs eval.py keeps
    (official style), with eval.py's figures and the number of dropped outputs beside (urban_official)."""
    official = urban_official(records)
    kept = [r for r in records if style == "reason" or not urban_dropped(r.get("response"))]
    by_task = _by_task(kept)
    per_type = {t: float(np.mean(v)) for t, v in sorted(by_task.items())}
    return {"overall": mean([s for v in by_task.values() for s in v]), "tasks": dict(per_type),
            "question_types": per_type, "n": len(records),
            "n_errors": sum(r.get("error") is not None for r in records), **official}


def urban_official(records):
    """UrbanVideo's eval.py figures: it drops an output that pandas reads back from run.py's CSV as missing (empty,
    'None', 'N/A', 'nan', 'null', ...: urban_dropped) from numerator and denominator, and keeps a
    whitespace-only one (wrong). Its total, its accuracy per question_category and how many outputs it drops."""
    ok = [r for r in records if r.get("error") is None]
    kept = [r for r in ok if not urban_dropped(r.get("response"))]
    by_task = _by_task(kept)
    return {"n_dropped": len(ok) - len(kept), "overall_official_rule": mean([r["score"] for r in kept]),
            "tasks_official_rule": {t: float(np.mean(v)) for t, v in sorted(by_task.items())}}
