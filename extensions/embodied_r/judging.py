"""Embodied-R's answer from reasoning (its Sec. 2.3): a'_i, the answer a reference model reads off a
rollout's reasoning p_i and the question q alone, without the video; the logical-consistency reward
(rewards.consistency_reward) scores a rollout 1 iff a'_i = a_i = g.

Any core judge answers it: a language-model judge (judge.OpenAIJudge, judge.HFJudge) is asked
ANSWER_FROM_REASONING_PROMPT through its ``ask`` hook (the judge's reply cache and stats) and the reply
is read by :func:`parse_reasoned_answer`; a judge without a language model (judge.LocalJudge) gets the
heuristic :func:`last_stated_answer`. Either way an answer that cannot be had is None, counted in the
judge's ``stats["missing"]``."""
from __future__ import annotations

import re
import unicodedata

from machinery.datasets import answers, data
import judge as judges

# The reference model sees the question q and the rollout's reasoning p_i only (no video) and gives
# its own answer a'_i. The paper does not print its prompt; this one is ours.
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


def _reasoning_item(item):
    """(question, reasoning, options) from a 2- or 3-tuple (options None when absent)."""
    q, r, *rest = item
    if len(rest) > 1:
        raise ValueError(f"an answer_from_reasoning item is (question, reasoning[, options]), got {len(item)} parts")
    return q, r, (rest[0] if rest else None)


def _option_texts(options) -> dict:
    """{"a": "sofa", ...}: the normalised text of each labelled option ("A. sofa")."""
    return {k.lower(): answers.norm_text(v) for k, v in map(data.split_option, options or []) if k}


_ANSWER_SAID = re.compile(r"\b(?:final\s+)?answer\s*(?:is|:)\s*(.+)", re.IGNORECASE)


def parse_reasoned_answer(text, options=None) -> str | None:
    """The reference model's answer (ANSWER_FROM_REASONING_PROMPT) from its reply: the content of
    <answer></answer> (answers.extract_answer), else what follows "answer is"/"answer:", else a reply of
    at most 3 words as a whole. With `options` ("A. sofa", ...) an option ("b", "(B)", "B. sofa") or an
    option's text ("sofa") becomes its upper-case letter. Trailing punctuation is dropped; None when
    nothing is left."""
    text = judges.clean_reply(text)
    if not text:
        return None
    if re.search(r"<answer>", text, re.IGNORECASE):
        span = answers.extract_answer(re.sub(r"(?i)</?answer>", lambda m: m.group(0).lower(), text))
    else:
        m = _ANSWER_SAID.search(text)
        span = m.group(1).split("\n")[0] if m else (text if len(text.split()) <= 3 else "")
    span = span.strip().rstrip(".!;,").strip()
    if not span:
        return None
    if options:
        letters = _option_texts(options)
        opt = answers.answer_option(span)
        if opt and (not letters or opt[0] in letters):
            return opt[0].upper()
        hit = [k for k, v in letters.items() if v and v == answers.norm_text(span)]
        if len(hit) == 1:
            return hit[0].upper()
    return span


# The offline reading (LocalJudge: a'_i without a language model). A letter counts as stated when it
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
    """One lower-case word stemmed as the judges stem it (number words as digits), plus a few irregular
    verbs."""
    n = answers.words_to_number(t)
    return str(n) if n is not None else _IRREGULAR.get(t) or answers.STEM_SUFFIX.sub("", t)


def _stemmed_tokens(text: str):
    """[(stemmed token, end offset)] of lower-cased `text`, articles dropped (as the judges drop them)."""
    return [(_stem_token(m.group()), m.end()) for m in re.finditer(r"[^\W_]+", text)
            if m.group() not in answers.ARTICLES]


def _last_number(text: str) -> str | None:
    """The last number stated in `text` ("1,000" -> "1000", "three" -> "3"), or None."""
    found = [(m.end(), m.group().replace(",", "").lstrip("+")) for m in _NUMBER_SAID.finditer(text)]
    low = text.lower()
    for m in _NUMBER_WORD.finditer(low):
        n = answers.words_to_number(m.group())
        before = low[:m.start()].split()
        if n is not None and not (n == 1 and before and before[-1].strip(",;:") in _NOT_A_COUNT):
            found.append((m.end(), str(n)))
    return max(found)[1] if found else None


def _stated_options(question, options) -> dict:
    """{"a": normalised text}: ``options`` ("A. sofa"), else the question's labelled lines, else its
    inline options as UrbanVideo writes them; {} for an open question."""
    opts = _option_texts(options) if options else {}
    if not opts:
        opts = {k.lower(): answers.norm_text(v) for k, v in answers.option_lines(question)}
    return opts or _option_texts(data.parse_inline_options(str(question or ""))[1])


def _last_option_stated(text: str, opts: dict) -> str | None:
    """The lower-case letter of the option of `opts` stated last in `text`, by letter or by text."""
    said = []                                               # (end offset, span length, letter)
    for m in _LETTER_SAID.finditer(text):
        letter = next(g for g in m.groups() if g).lower()
        if letter in opts:
            said.append((m.end(), 1, letter))
    toks = _stemmed_tokens(text.lower())
    words = [t for t, _ in toks]
    for letter, body in opts.items():
        pat = [_stem_token(t) for t in body.split()]
        last = next((i for i in range(len(words) - len(pat), -1, -1) if words[i:i + len(pat)] == pat), None)
        if pat and last is not None:
            said.append((toks[last + len(pat) - 1][1], len(body), letter))
    return max(said)[2] if said else None


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
    opts = _stated_options(question, options)
    if not opts:
        return _last_number(text)
    letter = _last_option_stated(text, opts)
    return letter.upper() if letter else None


def answer_from_reasoning_batch(judge, items) -> list:
    """a'_i for each (question, reasoning[, options]) item from a core judge, in input order (None =
    unparsable, failed or nothing stated; counted in ``judge.stats["missing"]``). A language-model
    judge replies in at most max(max_tokens, 32) tokens; LocalJudge counts one call per item."""
    items = [_reasoning_item(it) for it in items]
    if hasattr(judge, "ask"):
        prompts = [ANSWER_FROM_REASONING_PROMPT.format(question=question_with_options(q, o), reasoning=r)
                   for q, r, o in items]
        replies = judge.ask(prompts, max(judge.max_tokens, 32))
        out = [parse_reasoned_answer(t, o) for t, (_, _, o) in zip(replies, items)]
    else:
        judge.count("calls", len(items))
        out = [last_stated_answer(q, r, o) for q, r, o in items]
    judge.count("missing", sum(v is None for v in out))
    return out


def answer_from_reasoning(judge, question, reasoning, options=None):
    """a'_i for one rollout (see answer_from_reasoning_batch); None = no answer."""
    return answer_from_reasoning_batch(judge, [(question, reasoning, options)])[0]
