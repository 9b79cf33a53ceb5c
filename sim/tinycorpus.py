"""The text the tiny verifier learns from, and the demo's questions: chat turns whose answers are English
documentation prose, made here from what every Python install carries offline.

The prose is CPython's own reference documentation, shipped in the standard library as
`pydoc_data.topics` (what `help("assert")` prints): about 80 topics, ~450 KB of English. Each prose
paragraph is cut into short answers, and each answer becomes one conversation in the chat template's exact
token layout (`<think> reasoning </think> answer <|im_end|>`), asked as one of several questions about
the section it came from; a share of the turns keep the stand-in's canned sentences (textgen) for the
original demo questions. The reasoning names the section, then says one of a few fixed sentences: the
`<think>` block stays short and regular (a drafter learns it quickly, as it would a real model's habits)
and the answer carries the variety. Nothing is downloaded; the same interpreter gives the same corpus
(its digest is part of the model's cache key, so another Python's docs build another model).
"""
from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from functools import lru_cache

from sim import textgen

# the original demo questions: still asked (canned answers), and part of the demo dataset's pool
DEMO_TOPICS = ("binary search", "the CAP theorem", "photosynthesis", "TCP slow start", "Rust lifetimes",
               "speculative decoding", "the Fourier transform", "B-trees", "mixture-of-experts models",
               "Raft consensus", "garbage collection", "the birthday paradox")
DEMO_ASKS = ("Explain {t} to a new engineer.", "What are the trade-offs of {t}?",
             "Give a short example that shows {t}.", "What is a common mistake people make with {t}?")
_EXTRA_QUESTIONS = ("Why is the sky blue?", "How do I reverse a linked list?", "What is a hash map?",
                    "Summarise the plot of a heist movie.", "Write a haiku about autumn.", "hello")
# questions about a documentation section ({s} is its title or the object it documents)
DOC_ASKS = ("Explain {s} to a new engineer.", "What does the Python documentation say about {s}?",
            "How does {s} work in Python?", "Give me a short overview of {s}.",
            "What should I know about {s}?", "Summarise the rules for {s}.",
            "What is a common mistake people make with {s}?", "Describe {s} in a few sentences.")
_SYSTEM = "You are a helpful assistant."
# the reasoning before a documentation answer: the section's name, then one of a few fixed sentences,
# so the think block is regular (a drafter learns it quickly) and still differs between questions
_DOC_THINKING = (
    "Let me recall what the reference documentation says about this.",
    "The user wants the precise rule, so I should quote the documented behaviour.",
    "I should check which part of the language reference covers this.",
    "A short answer with the exact semantics will help more than a long one.",
    "First I will state the rule, then mention the edge case that matters.",
    "The documentation describes this in terms of objects and their methods.",
    "I remember the relevant section; let me summarise it carefully.",
    "It is worth being exact here, because the details are easy to get wrong.",
)

DOC_SOURCE = "pydoc_data.topics"
# an answer ends at the first sentence end past this many words (drawn per answer): short answers keep
# completions near the previous model's length, so the demo generates as fast as before
ANSWER_WORDS = (10, 30)
CANNED_TOKENS = (30, 70)  # length of a canned turn's reasoning and answer together (textgen's tokens)


class CorpusUnavailable(RuntimeError):
    """The interpreter ships no `pydoc_data.topics` (some minimal distributions strip it)."""


@dataclass(frozen=True)
class Section:
    """A titled run of documentation prose: a heading or a documented object, and its paragraphs."""
    subject: str
    paragraphs: tuple[str, ...]


_UNDERLINE = re.compile(r"([*=\-~^])\1{2,}")
_DEFINITION = re.compile(r"\s{0,3}([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)\(.*\)(?: -> .*)?")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"(])")
_NOT_PROSE = re.compile(r">>>|::=|\+--|\|  |^\s*[#$%]|\.\.\.$")


def _prose(block: list[str]) -> str | None:
    """The paragraph as one line if it reads as English prose (not code, grammar or a table)."""
    raw = "\n".join(block)
    if _NOT_PROSE.search(raw) or block[0].startswith("      "):  # deeper than a definition body: code
        return None
    text = " ".join(" ".join(block).split())
    words = text.split()
    letters = sum(c.isalpha() or c in " ,.;:'\"()-" for c in text)
    if len(words) < 8 or letters < 0.9 * len(text) or not text.endswith((".", ".)")):
        return None
    return text


def _title(line: str) -> str:
    """A heading as it reads inside a question: "Format String Syntax" -> "format string syntax"
    (acronyms such as "OR" and quoted names kept)."""
    return " ".join(w.lower() if w.isalpha() and w.istitle() else w for w in line.split())


@lru_cache(maxsize=1)
def doc_sections() -> tuple[Section, ...]:
    """The documentation's prose sections, in the order the topics list them. Raises CorpusUnavailable."""
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:
        raise CorpusUnavailable(f"the standard library's {DOC_SOURCE} cannot be imported: {exc}") from None
    sections: list[Section] = []
    for key in sorted(topics):
        lines = topics[key].split("\n")
        subject = key
        paragraphs: list[str] = []
        block: list[str] = []

        def flush_block() -> None:
            if block:
                text = _prose(block)
                if text:
                    paragraphs.append(text)
                block.clear()

        def flush_section(new_subject: str) -> None:
            nonlocal subject
            flush_block()
            if paragraphs:
                sections.append(Section(subject, tuple(paragraphs)))
                paragraphs.clear()
            subject = new_subject

        for i, line in enumerate(lines):
            following = lines[i + 1] if i + 1 < len(lines) else ""
            if _UNDERLINE.fullmatch(line):
                continue
            if line.strip() and _UNDERLINE.fullmatch(following) and len(following) == len(line.rstrip()):
                flush_section(_title(line))
            elif (m := _DEFINITION.fullmatch(line)) and not following.strip():
                flush_section(m.group(1) + "()")
            elif not line.strip():
                flush_block()
            else:
                block.append(line)
        flush_section(subject)
    return tuple(sections)


def _answers(paragraph: str, rng: random.Random) -> list[str]:
    """A paragraph cut at sentence ends into answers of about ANSWER_WORDS words."""
    out: list[str] = []
    current: list[str] = []
    target = rng.randint(ANSWER_WORDS[0], ANSWER_WORDS[1])
    for sentence in _SENTENCE_END.split(paragraph):
        current.append(sentence)
        if sum(len(s.split()) for s in current) >= target:
            out.append(" ".join(current))
            current, target = [], rng.randint(ANSWER_WORDS[0], ANSWER_WORDS[1])
    if current:
        if out and sum(len(s.split()) for s in current) < 12:  # too short to stand alone
            out[-1] += " " + " ".join(current)
        else:
            out.append(" ".join(current))
    return out


def doc_questions() -> list[str]:
    """Every distinct question about a documentation section."""
    seen: dict[str, None] = {}
    for section in doc_sections():
        for ask in DOC_ASKS:
            seen.setdefault(ask.format(s=section.subject), None)
    return list(seen)


def canned_questions() -> list[str]:
    return [a.format(t=t) for t in DEMO_TOPICS for a in DEMO_ASKS] + list(_EXTRA_QUESTIONS)


def demo_questions(count: int, seed: int = 13) -> list[str]:
    """`count` distinct questions for the demo dataset (repeating only past the pool's size, ~2,000):
    mostly about documentation sections, with the original demo questions mixed in."""
    rng = random.Random(seed)
    pool = doc_questions() + [a.format(t=t) for t in DEMO_TOPICS for a in DEMO_ASKS]
    rng.shuffle(pool)
    return [pool[i % len(pool)] for i in range(count)]


@dataclass(frozen=True)
class Turn:
    """One conversation as the template renders it: the prompt (up to and including the generation
    prompt) and the completion the model must learn to produce after it."""
    prompt: str
    completion: str

    @property
    def text(self) -> str:
        return self.prompt + self.completion


def render_turn(question: str, reasoning: str, answer: str, *, system: bool, thinking: bool) -> Turn:
    """One finished conversation as the chat template renders it (see tinylm.CHAT_TEMPLATE)."""
    head = f"<|im_system|>system<|im_middle|>{_SYSTEM}<|im_end|>" if system else ""
    prompt = f"{head}<|im_user|>user<|im_middle|>{question}<|im_end|><|im_assistant|>assistant<|im_middle|>"
    if thinking:
        return Turn(prompt, f"<think>{reasoning}</think>{answer}<|im_end|>")
    return Turn(prompt + "<think></think>", f"{answer}<|im_end|>")  # the template adds it when thinking is off


def _reasoning(rng: random.Random, subject: str) -> str:
    return f"The user asks about {subject}. {rng.choice(_DOC_THINKING)}"


def samples(count: int, seed: int) -> list[Turn]:
    """`count` conversations like the ones the verifier learned (documentation answers and a share of
    canned turns, drawn with `seed`): rows for tests and benchmarks that train drafters on its text."""
    return training_turns(max(1, count // 8), seed)[:count]


def training_turns(canned: int, seed: int) -> list[Turn]:
    """Every documentation answer once, asked with a random question about its section, plus `canned`
    turns of the stand-in's canned text for the original demo questions; shuffled. About one turn in
    eight has thinking off (`<think></think>` in the prompt, the answer alone after it)."""
    rng = random.Random(seed)
    out: list[Turn] = []
    for section in doc_sections():
        for paragraph in section.paragraphs:
            for answer in _answers(paragraph, rng):
                q = rng.choice(DOC_ASKS).format(s=section.subject)
                thinking = rng.random() >= 0.125
                reasoning = _reasoning(rng, section.subject) if thinking else ""
                out.append(render_turn(q, reasoning, answer, system=rng.random() < 0.25, thinking=thinking))
    qs = canned_questions()
    for i in range(canned):
        q = qs[i % len(qs)]
        thinking = rng.random() >= 0.125
        # about as long as a documentation turn: long canned turns teach the model to ramble
        reasoning, answer = textgen.generate(rng.getrandbits(64), q, thinking=thinking, quote_topic=False,
                                             response_tokens=rng.randint(*CANNED_TOKENS))
        out.append(render_turn(q, reasoning.text, answer.text, system=rng.random() < 0.25, thinking=thinking))
    rng.shuffle(out)
    return out


def digest(turns: list[Turn]) -> str:
    h = hashlib.sha256()
    for t in turns:
        h.update(t.prompt.encode())
        h.update(b"\0")
        h.update(t.completion.encode())
        h.update(b"\0")
    return h.hexdigest()
