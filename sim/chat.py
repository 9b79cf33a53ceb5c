"""Pure builders for the stand-in's completion bodies: output tokens, truncation, usage, SSE chunks.

Output token order for a chat turn with thinking on: `<think>`, reasoning pieces, `</think>`, answer
pieces, then the end-of-turn token (`<|im_end|>`, counted in completion_tokens as vLLM counts EOS).
`max_tokens` cuts this sequence anywhere. `reasoning_tokens` counts the emitted tokens of the thinking
block, markers included, so completion_tokens == len(token_ids) always holds.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sim.textgen import END_THINK_ID, EOS_ID, THINK_ID, Segment

REASONING, CONTENT = "r", "c"


@dataclass
class Output:
    kinds: list[str]  # REASONING or CONTENT per token
    pieces: list[str]  # text per token ("" for markers and EOS)
    ids: list[int]
    finish_reason: str

    @property
    def reasoning_text(self) -> str | None:
        text = "".join(p for k, p in zip(self.kinds, self.pieces) if k == REASONING)
        return text or None

    @property
    def content_text(self) -> str | None:
        emitted = [p for k, p in zip(self.kinds, self.pieces) if k == CONTENT]
        return "".join(emitted) if any(emitted) else None

    @property
    def reasoning_tokens(self) -> int:
        return self.kinds.count(REASONING)


def build_output(reasoning: Segment, answer: Segment, *, thinking: bool, max_tokens: int,
                 eos: bool = True) -> Output:
    kinds: list[str] = []
    pieces: list[str] = []
    ids: list[int] = []
    if thinking:
        kinds += [REASONING] * (len(reasoning.ids) + 2)
        pieces += [""] + reasoning.pieces + [""]
        ids += [THINK_ID] + reasoning.ids + [END_THINK_ID]
    kinds += [CONTENT] * len(answer.ids)
    pieces += answer.pieces
    ids += answer.ids
    if eos:
        kinds.append(CONTENT)
        pieces.append("")
        ids.append(EOS_ID)
    finish = "stop"
    if max_tokens < len(ids):
        del kinds[max_tokens:], pieces[max_tokens:], ids[max_tokens:]
        finish = "length"
    return Output(kinds, pieces, ids, finish)


def usage(prompt_tokens: int, out: Output, *, reasoning_detail: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + len(out.ids),
                            "completion_tokens": len(out.ids), "prompt_tokens_details": None}
    if reasoning_detail:
        body["completion_tokens_details"] = {"reasoning_tokens": out.reasoning_tokens}
    return body


def message(out: Output, reasoning_keys: tuple[str, ...]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": out.content_text, "refusal": None,
                           "annotations": None, "audio": None, "function_call": None, "tool_calls": []}
    reasoning = out.reasoning_text
    for key in reasoning_keys:
        msg[key] = reasoning
    return msg


def chunk_spans(out: Output, per_chunk: int) -> list[tuple[int, int]]:
    """[start, end) token spans for streaming: at most `per_chunk` tokens, never across the
    reasoning/content boundary (a delta carries one or the other, as vLLM's reasoning parser does)."""
    return chunk_spans_between(out, 0, len(out.ids), per_chunk)


def chunk_spans_between(out: Output, start: int, n: int, per_chunk: int | None = None) -> list[tuple[int, int]]:
    """chunk_spans over out's tokens [start, n) (one live step's tokens: no size limit by default)."""
    per_chunk = per_chunk or max(1, n - start)
    spans = []
    while start < n:
        end = start + 1
        while end < n and end - start < per_chunk and out.kinds[end] == out.kinds[start]:
            end += 1
        spans.append((start, end))
        start = end
    return spans


_quote = json.JSONEncoder(ensure_ascii=False).encode
_TAIL_OPEN = ',"logprobs":null,"finish_reason":null,"stop_reason":null'


@lru_cache(maxsize=65536)
def _quoted(piece: str) -> str:
    return _quote(piece)


class ChunkEncoder:
    """Encodes `data: {...}` SSE events from a fixed prefix, so each chunk costs one small dumps."""

    def __init__(self, *, request_id: str, created: int, model: str, obj: str, reasoning_keys: tuple[str, ...],
                 token_ids: bool):
        self._base = json.dumps({"id": request_id, "object": obj, "created": created, "model": model},
                                separators=(",", ":"), ensure_ascii=False)[:-1]
        self._head = self._base + ',"choices":[{"index":0,'
        self.reasoning_keys = reasoning_keys
        self.token_ids = token_ids

    def first(self, prompt_ids: list[int] | None) -> bytes:
        extra = f',"prompt_token_ids":{json.dumps(prompt_ids)}' if prompt_ids is not None else ""
        return (f'data: {self._head}"delta":{{"role":"assistant","content":""}},"logprobs":null,'
                f'"finish_reason":null}}]{extra}}}\n\n').encode()

    def delta(self, out: Output, start: int, end: int, finish: str | None) -> bytes:
        # one token per chunk is the common case (no drafter): its escaped text is cached per piece,
        # which makes a long stream about twice as cheap to encode
        text = _quoted(out.pieces[start]) if end - start == 1 else _quote("".join(out.pieces[start:end]))
        if out.kinds[start] == REASONING:
            delta = "{" + ",".join(f'"{k}":{text}' for k in self.reasoning_keys) + "}"
        else:
            delta = '{"content":' + text + "}"
        ids = f',"token_ids":{json.dumps(out.ids[start:end])}' if self.token_ids else ""
        tail = _TAIL_OPEN if finish is None else f',"logprobs":null,"finish_reason":"{finish}","stop_reason":null'
        return f"data: {self._head}\"delta\":{delta}{tail}{ids}}}]}}\n\n".encode()

    def text_delta(self, out: Output, start: int, end: int, finish: str | None) -> bytes:
        """A /v1/completions stream chunk."""
        text = json.dumps("".join(out.pieces[start:end]), ensure_ascii=False)
        ids = f',"token_ids":{json.dumps(out.ids[start:end])}' if self.token_ids else ""
        reason = "null" if finish is None else f'"{finish}"'
        return (f'data: {self._head}"text":{text},"logprobs":null,"finish_reason":{reason},'
                f'"stop_reason":null{ids}}}]}}\n\n').encode()

    def usage(self, body: dict[str, Any]) -> bytes:
        return f'data: {self._base},"choices":[],"usage":{json.dumps(body)}}}\n\n'.encode()


DONE = b"data: [DONE]\n\n"


def error_body(message: str, err_type: str, code: int, *, nested: bool, param: str | None = None) -> dict[str, Any]:
    if nested:
        return {"error": {"message": message, "type": err_type, "param": param, "code": code}}
    return {"object": "error", "message": message, "type": err_type, "param": param, "code": code}
