"""Acceptance split between a reasoning model's thinking and its answer (NVIDIA Model Optimizer's
specdec_bench and InferenceX report them apart: thinking drafts differently from the answer).

vLLM counts acceptance per server, not per request or per token, so the split is measured, not inferred:
a pass after the levels sends N requests one at a time (concurrency 1, nothing else in flight) and reads
the spec-decode counters three times around each: before it, at the first answer token (the first stream
event whose `delta.content` is not empty after the reasoning, which vLLM sends in `delta.reasoning`, or
`reasoning_content` before 0.13, the same two fields backend/generate/records.py reads), and after its
last event. Reasoning = the counters' growth from the first read to the second, answer = from the second
to the third; each is pooled over the requests (1 + accepted / drafts, as vLLM defines the length).

Limits, stated in the output: the boundary read races the running request, so the steps the server runs
while /metrics answers land in the reasoning window; the pass counts the answer events that arrived
before that read returned (`spill`) and reports them, the bound on steps attributed to the wrong side.
The step that carries the first answer tokens counts as reasoning (vLLM counts a step before its
tokens go out), so a short thinking reads a little towards the answer's figure. A request
with no reasoning (thinking off, or no reasoning parser) is all answer. Only concurrency 1 can be split
this way: with several requests in flight their steps share the counters.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

import aiohttp

from backend.bench.scrape import Acceptance, SpecCounters, acceptance_between
from backend.contract.numbers import finite

REASONING_FIELDS = ("reasoning", "reasoning_content")
MAX_LINE = 1 * 2**20
METHOD = ("concurrency 1; vLLM's counters read before each request, at its first answer token and after it; "
          "steps that ran during the boundary read count as reasoning (spill)")


def event_phase(data: Any) -> str | None:
    """'reasoning' or 'answer' for a chat stream event that carries text of either kind, else None."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    delta = choices[0].get("delta")
    if not isinstance(delta, dict):
        return None
    if isinstance(delta.get("content"), str) and delta["content"]:
        return "answer"
    if any(isinstance(delta.get(k), str) and delta[k] for k in REASONING_FIELDS):
        return "reasoning"
    return None


def pool(windows: Sequence[Acceptance | None]) -> Acceptance | None:
    """Windows of the counters summed into one (per position weighted by each window's drafts)."""
    drafts = draft_tokens = accepted = 0.0
    per: list[float] = []
    for a in windows:
        if a is None or a.drafts <= 0:
            continue
        drafts += a.drafts
        draft_tokens += a.draft_tokens
        accepted += a.accepted
        per += [0.0] * max(0, len(a.per_position) - len(per))
        for i, p in enumerate(a.per_position):
            per[i] += p * a.drafts
    if drafts <= 0:
        return None
    return Acceptance(drafts=drafts, draft_tokens=draft_tokens, accepted=accepted,
                      rate=accepted / draft_tokens if draft_tokens > 0 else None, length=1.0 + accepted / drafts,
                      per_position=tuple(p / drafts for p in per))


@dataclass(frozen=True)
class PhaseSplit:
    reasoning: Acceptance | None
    answer: Acceptance | None
    requests: int  # requests that completed in the pass
    with_reasoning: int  # of them, those whose stream carried reasoning before the answer
    spill: int  # answer events that arrived before a boundary read returned: steps counted as reasoning

    def lines(self) -> list[str]:
        def one(name: str, a: Acceptance | None) -> str:
            if a is None:
                return f"  {name:<9} no drafts counted"
            rate = f", {a.rate:.0%} of draft tokens" if a.rate is not None else ""
            return f"  {name:<9} acceptance length {a.length:.2f} ({int(a.drafts)} drafts{rate})"
        return [f"acceptance by phase ({self.requests} requests one at a time, {self.with_reasoning} with reasoning; "
                f"{self.spill} answer steps may count as reasoning):",
                one("reasoning", self.reasoning), one("answer", self.answer)]

    def to_dict(self) -> dict[str, Any]:
        return {"method": METHOD, "requests": self.requests, "with_reasoning": self.with_reasoning,
                "spill": self.spill, "reasoning": self.reasoning.to_dict() if self.reasoning else None,
                "answer": self.answer.to_dict() if self.answer else None}


@dataclass
class _Windows:
    reasoning: Acceptance | None = None
    answer: Acceptance | None = None
    had_reasoning: bool = False
    spill: int = 0
    ok: bool = False


Scrape = Callable[[], Awaitable[SpecCounters | None]]


async def one_request(session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str],
                      timeout_s: float, scrape: Scrape) -> _Windows:
    """One streamed request with the three counter reads (see the module docstring)."""
    out = _Windows()
    before = await scrape()
    mid: SpecCounters | None = None
    boundary: asyncio.Task[SpecCounters | None] | None = None
    try:
        async with session.post(url, json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return out
            while True:
                line = await resp.content.readline()
                if not line or len(line) > MAX_LINE:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                phase = event_phase(json.loads(payload))
                if phase == "reasoning" and boundary is None:
                    out.had_reasoning = True
                elif phase == "answer":
                    if boundary is None:
                        # read concurrently: the stream goes on being drained while /metrics answers
                        boundary = asyncio.ensure_future(scrape())
                    elif not boundary.done():
                        out.spill += 1
            if boundary is not None:
                mid = await boundary
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):
        if boundary is not None:
            boundary.cancel()
        return out
    after = await scrape()
    if boundary is None:  # no answer at all: everything was reasoning (or nothing was said)
        mid = after
    out.reasoning = acceptance_between(before, mid) if out.had_reasoning else None
    out.answer = acceptance_between(mid, after)
    out.ok = True
    return out


async def split(session: aiohttp.ClientSession, url: str, bodies: Sequence[dict[str, Any]], headers: dict[str, str],
                timeout_s: float, scrape: Scrape) -> PhaseSplit:
    """The pass: each request alone, in order; pooled per phase."""
    done = [await one_request(session, url, b, headers, timeout_s, scrape) for b in bodies]
    ok = [w for w in done if w.ok]
    return PhaseSplit(reasoning=pool([w.reasoning for w in ok]), answer=pool([w.answer for w in ok]),
                      requests=len(ok), with_reasoning=sum(w.had_reasoning for w in ok),
                      spill=sum(w.spill for w in ok))


def split_from_dict(data: Any) -> dict[str, float | None] | None:
    """The two lengths from a summary's `phases` (host data): {'reasoning': L|None, 'answer': L|None}."""
    if not isinstance(data, dict):
        return None
    out: dict[str, float | None] = {}
    for name in ("reasoning", "answer"):
        side = data.get(name)
        length = finite(side.get("length")) if isinstance(side, dict) else None
        out[name] = length if length is not None and 1 <= length < 1e6 else None
    return out
