"""Our own streaming client, for hosts without `vllm bench serve`: the same requests and the same timing
rules as its openai-chat backend (vllm/benchmarks/lib/endpoint_request_func.py).

Each request is a streamed chat completion with `max_completion_tokens`, `stream_options.include_usage`
and the fixed sampling settings. Time to first token is taken at the first event that carries a choice,
each later such event adds an inter-token latency (an event may carry several tokens: with a drafter it
carries 1 + accepted), the request's latency ends at the last one, and the token counts come from the
usage event. Everything read from the server is bounded: a line over MAX_LINE ends the request as failed.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

import aiohttp

from backend.bench.results import RequestOutcome
from backend.bench.scrape import SpecCounters, parse_spec_counters
from backend.bench.workload import Prompt

MAX_LINE = 1 * 2**20
MAX_METRICS = 16 * 2**20


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float
    top_p: float | None
    seed: int
    ignore_eos: bool = False


def request_body(model: str, prompt: Prompt, sampling: Sampling, index: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": list(prompt.messages),
                            "max_completion_tokens": sampling.max_tokens, "temperature": sampling.temperature,
                            "seed": sampling.seed + index, "stream": True, "stream_options": {"include_usage": True}}
    if sampling.top_p is not None:
        body["top_p"] = sampling.top_p
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    return body


async def send(session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str],
               timeout_s: float) -> RequestOutcome:
    out = RequestOutcome(success=False)
    start = time.perf_counter()
    last = start
    first = False
    try:
        async with session.post(url, json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                text = (await resp.content.read(2000)).decode("utf-8", "replace")
                out.error = f"HTTP {resp.status}: {text}"
                return out
            while True:
                line = await resp.content.readline()
                if not line:
                    break
                if len(line) > MAX_LINE:
                    out.error = f"a stream line over {MAX_LINE} bytes"
                    return out
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue  # blank separators and ": ping" comments
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                now = time.perf_counter()
                data = json.loads(payload)
                if not isinstance(data, dict):
                    continue
                if data.get("choices"):
                    if not first:
                        first = True
                        out.ttft = now - start
                    else:
                        out.itl.append(now - last)
                    last = now
                elif isinstance(data.get("usage"), dict):
                    usage = data["usage"]
                    out.output_tokens = int(usage.get("completion_tokens") or 0)
                    out.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                if isinstance(data.get("error"), dict):
                    out.error = str(data["error"].get("message", "error event"))[:2000]
                    return out
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:2000]
        return out
    if not first:
        out.error = "the stream ended before any token"
        return out
    out.success = True
    out.latency = last - start
    return out


async def scrape(session: aiohttp.ClientSession, endpoint: str, model: str | None) -> SpecCounters | None:
    """The spec-decode counters now (None: no drafter, or /metrics did not answer)."""
    try:
        async with session.get(f"{endpoint}/metrics", timeout=aiohttp.ClientTimeout(total=30)) as resp:
            if resp.status != 200:
                return None
            text = (await resp.content.read(MAX_METRICS)).decode("utf-8", "replace")
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None
    return parse_spec_counters(text, model)


async def run_prompts(session: aiohttp.ClientSession, url: str, model: str, prompts: tuple[Prompt, ...],
                      sampling: Sampling, concurrency: int, headers: dict[str, str], timeout_s: float,
                      on_done: Callable[[RequestOutcome], None]) -> tuple[list[RequestOutcome], float]:
    """All prompts, at most `concurrency` in flight; (outcomes in prompt order, wall seconds)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, prompt: Prompt) -> RequestOutcome:
        async with gate:
            outcome = await send(session, url, request_body(model, prompt, sampling, i), headers, timeout_s)
        on_done(outcome)
        return outcome

    began = time.perf_counter()
    outcomes = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return list(outcomes), time.perf_counter() - began
