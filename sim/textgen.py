"""Canned, deterministic model output and a toy tokenizer that counts it consistently.

The tokenizer splits text into pieces that each carry their leading whitespace, so concatenating the
pieces gives the text back: a streamed delta is exactly one or more pieces, and `len(token_ids)` always
equals the token count reported in `usage`. Ids are a stable hash of the piece into a small vocabulary;
special tokens (chat markers, `<think>`, `</think>`) have fixed low ids.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

VOCAB_SIZE = 32768
SPECIAL_TOKENS: dict[str, int] = {
    "<|im_end|>": 1, "<think>": 2, "</think>": 3, "<|im_user|>": 4, "<|im_assistant|>": 5,
    "<|im_system|>": 6, "<|im_middle|>": 7, "[BOS]": 8,
}
EOS_ID = SPECIAL_TOKENS["<|im_end|>"]
THINK_ID = SPECIAL_TOKENS["<think>"]
END_THINK_ID = SPECIAL_TOKENS["</think>"]
_FIRST_NORMAL_ID = 16
_PIECE_RE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+$")
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")


@lru_cache(maxsize=65536)
def _piece_id(piece: str) -> int:
    return _FIRST_NORMAL_ID + zlib.crc32(piece.encode()) % (VOCAB_SIZE - _FIRST_NORMAL_ID)


def split_pieces(text: str) -> list[str]:
    return _PIECE_RE.findall(text)


def encode(text: str, *, special: bool = True) -> list[int]:
    """Token ids of `text`; with `special`, chat markers in the text map to their special ids."""
    ids: list[int] = []
    parts = _SPECIAL_RE.split(text) if special else [text]
    for part in parts:
        if special and part in SPECIAL_TOKENS:
            ids.append(SPECIAL_TOKENS[part])
        elif part:
            ids.extend(_piece_id(p) for p in split_pieces(part))
    return ids


def message_text(content: Any) -> str:
    """Text of an OpenAI message `content`: a string, or a list of parts of which we keep the text ones."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise ValueError(f"message content must be a string or a list of parts, not {type(content).__name__}")


def render_chat(messages: list[dict[str, Any]], *, thinking: bool = True, add_generation_prompt: bool = True) -> str:
    """A Kimi-style chat template: role markers, then the generation prompt (thinking on or off)."""
    out = []
    for msg in messages:
        role = msg.get("role")
        marker = {"system": "<|im_system|>", "user": "<|im_user|>", "assistant": "<|im_assistant|>"}.get(
            role, "<|im_user|>")
        out.append(f"{marker}{role}<|im_middle|>{message_text(msg.get('content'))}<|im_end|>")
    if add_generation_prompt:
        out.append("<|im_assistant|>assistant<|im_middle|>")
        if not thinking:
            out.append("<think></think>")
    return "".join(out)


def seed_of(payload: Any) -> int:
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "big")


_THINKING = (
    "Let me break the question into the parts that actually matter.",
    "First I should pin down what is being asked before reaching for an answer.",
    "There is an obvious approach, but it is worth checking whether it holds for the edge cases.",
    "If the input is empty, the naive version would fail, so that case needs its own handling.",
    "I recall that the standard treatment starts from the definitions, so let me restate them.",
    "Hmm, wait: the second condition changes things, because it rules out the simplest option.",
    "A quick sanity check with small numbers: two and three give five, which matches the pattern.",
    "The cost here is dominated by the inner loop, so that is where the effort should go.",
    "Actually, the user probably wants a practical answer rather than a proof.",
    "Let me consider the alternative interpretation too, just in case the wording is ambiguous.",
    "So the plan is: explain the idea briefly, give an example, and mention the main pitfall.",
    "One more thing to verify is that the units are consistent throughout.",
    "That seems right; I will also note the assumption I am making about the input size.",
    "Comparing both options, the second one is simpler and just as correct.",
)
_ANSWER = (
    "The short answer is that it depends on the constraints, but the common case is straightforward.",
    "Start by stating the goal clearly, then work through the steps one at a time.",
    "For example, with an input of ten items the procedure finishes in a handful of steps.",
    "The main pitfall is forgetting the empty case, which should return early.",
    "In practice, measure before optimising: the bottleneck is rarely where you expect it.",
    "If you need more detail, the same reasoning extends naturally to larger inputs.",
    "Here is a compact way to think about it: keep the state small and update it incrementally.",
    "This approach is simple, easy to test, and fast enough for most workloads.",
    "To summarise, check the assumptions, handle the edge cases, and keep the solution readable.",
    "Each step can be verified independently, which makes mistakes easy to spot.",
    "A useful rule of thumb is to prefer the clearer option unless profiling says otherwise.",
    "Finally, remember to document why the choice was made, not just what it does.",
)


@lru_cache(maxsize=None)
def _sentence_tokens(sentence: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    pieces = tuple(split_pieces(" " + sentence))
    return pieces, tuple(_piece_id(p) for p in pieces)


@dataclass
class Segment:
    """A run of generated text as pieces with ids (pieces concatenate to the text)."""
    pieces: list[str]
    ids: list[int]

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def _fill(rng: random.Random, pool: tuple[str, ...], target: int, lead: str | None = None) -> Segment:
    seg = Segment([], [])
    if lead:
        pieces = split_pieces(lead)
        seg.pieces.extend(pieces)
        seg.ids.extend(_piece_id(p) for p in pieces)
    previous = None
    while len(seg.ids) < target:
        # never the same sentence twice in a row: reads less like a stuck sampler
        sentence = rng.choice([s for s in pool if s != previous])
        previous = sentence
        pieces, ids = _sentence_tokens(sentence)
        seg.pieces.extend(pieces)
        seg.ids.extend(ids)
    if seg.pieces:
        seg.pieces[0] = seg.pieces[0].lstrip()
        seg.ids[0] = _piece_id(seg.pieces[0])
    return seg


def generate(seed: int, topic: str, *, thinking: bool, response_tokens: int | None = None,
             quote_topic: bool = True) -> tuple[Segment, Segment]:
    """(reasoning, answer) for one request. Without `response_tokens`, a few sentences of each;
    with it, the two together come to about that many tokens (reasoning about 40 %). The reasoning
    opens by quoting the question unless `quote_topic` is off (the tiny model cannot learn to copy)."""
    rng = random.Random(seed)
    words = topic.split()[:8]
    lead = f"The user asks: \"{' '.join(words)}\"." if words else "The user sent an empty message."
    lead = lead if quote_topic else None
    if response_tokens is not None:
        total = max(4, response_tokens)
        think_target = total * 2 // 5 if thinking else 0
        answer_target = total - think_target
    else:
        think_target = rng.randint(40, 110) if thinking else 0
        answer_target = rng.randint(30, 90)
    reasoning = _fill(rng, _THINKING, think_target, lead) if thinking else Segment([], [])
    answer = _fill(rng, _ANSWER, answer_target)
    return reasoning, answer


def last_user_text(messages: list[dict[str, Any]]) -> str:
    for msg in reversed(messages):
        if msg.get("role") == "user":
            return message_text(msg.get("content"))
    return ""
