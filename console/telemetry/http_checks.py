"""Readiness over HTTP through the forwarded port: /health, /version, /v1/models, deep check.

httpx is fine here: a handful of requests a second at most. A connection refused is the normal state
while vLLM loads (it binds only at the end), so it is reported as "not listening", never as an error.
The server is untrusted: every check has one overall deadline (httpx's timeouts are per read, so a
server dripping a byte a second would hold a plain request for ever) and every body a size cap.
"""
from __future__ import annotations

import asyncio
import re
import json
from dataclasses import dataclass
from pathlib import Path

import httpx

from console.profile import Profile, api_key

CHECK_DEADLINE_S = 5.0  # /health + /version + /v1/models together
METRICS_DEADLINE_S = 5.0
JSON_BODY_MAX = 1 << 20  # /version, /v1/models, /_sim/info
METRICS_BODY_MAX = 8 << 20  # a real exposition is tens of KB; a million lines is not a server we serve
DEEP_BODY_MAX = 4 << 20


class BodyTooLarge(Exception):
    pass


async def _get(client: httpx.AsyncClient, path: str, cap: int, **kw) -> tuple[int, bytes]:
    """GET with the body read up to `cap` bytes (more is an error, never buffered)."""
    async with client.stream("GET", path, **kw) as r:
        body = bytearray()
        async for chunk in r.aiter_bytes():
            body += chunk
            if len(body) > cap:
                raise BodyTooLarge(f"GET {path}: body over {cap // 1024} KiB")
        return r.status_code, bytes(body)


def _json(body: bytes):
    try:
        return json.loads(body)
    except ValueError:
        return None


@dataclass
class HttpState:
    listening: bool = False
    health: int | None = None  # status code of GET /health
    version: str | None = None
    model_id: str | None = None
    max_model_len: int | None = None
    error: str | None = None


@dataclass
class DeepCheck:
    ok: bool
    message: str
    reasoning_field: str | None = None  # "reasoning" | "reasoning_content" | None
    content: bool = False
    reasoning: bool = False
    finish_reason: str | None = None


def _headers(profile: Profile) -> dict[str, str]:
    key = api_key(profile)
    return {"Authorization": f"Bearer {key}"} if key else {}


async def check_http(client: httpx.AsyncClient, profile: Profile) -> HttpState:
    try:
        return await asyncio.wait_for(_check_http(client, profile), CHECK_DEADLINE_S)
    except asyncio.TimeoutError:
        return HttpState(listening=True, error=f"the server did not answer its health checks within "
                                               f"{CHECK_DEADLINE_S:g} s")


async def _check_http(client: httpx.AsyncClient, profile: Profile) -> HttpState:
    state = HttpState()
    try:
        r = await client.get("/health")
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError):
        return state  # not listening yet: vLLM binds only when loading is done
    except httpx.TimeoutException:
        state.error = "GET /health timed out"
        return state
    state.listening = True
    state.health = r.status_code
    if r.status_code != 200:
        state.error = f"GET /health returned {r.status_code}"
        return state
    try:
        # side by side: over SSH each request is a round trip, and the ready check waits on both
        (vcode, vbody), (code, body) = await asyncio.gather(
            _get(client, "/version", JSON_BODY_MAX),
            _get(client, "/v1/models", JSON_BODY_MAX, headers=_headers(profile)))
        version = _json(vbody) if vcode == 200 else None
        if isinstance(version, dict) and version.get("version") is not None:
            state.version = str(version["version"])
        if code == 200:
            models = _json(body)
            data = models.get("data") if isinstance(models, dict) else None
            if isinstance(data, list) and data and isinstance(data[0], dict):
                model_id = data[0].get("id")
                state.model_id = model_id if isinstance(model_id, str) else None
                mml = data[0].get("max_model_len")
                state.max_model_len = mml if isinstance(mml, int) and not isinstance(mml, bool) else None
            else:
                state.error = "GET /v1/models: no model in the answer"
        elif code == 401:
            state.error = "GET /v1/models: 401 unauthorized (set the profile's api_key_env or api_key_file)"
        else:
            state.error = f"GET /v1/models returned {code}"
    except (httpx.HTTPError, BodyTooLarge) as e:
        state.error = f"reading /version or /v1/models failed: {e}"
    return state


async def fetch_metrics(client: httpx.AsyncClient) -> str | None:
    """/metrics is open even with --api-key; None when it cannot be read (never an error to the caller)."""
    try:
        code, body = await asyncio.wait_for(_get(client, "/metrics", METRICS_BODY_MAX), METRICS_DEADLINE_S)
    except (httpx.HTTPError, BodyTooLarge, asyncio.TimeoutError):
        return None
    return body.decode("utf-8", errors="replace") if code == 200 else None


def demo_engine_text(version: str) -> str:
    """The demo host's header when its server is vLLM's own CPU build (console/demo.py, engine "vllm")."""
    m = re.match(r"(\d{1,4})\.(\d{1,4})", version)
    return f"vLLM {m[1]}.{m[2]} CPU build, simulated GPUs" if m else "vLLM CPU build, simulated GPUs"


async def sim_text_backend(client: httpx.AsyncClient, version: str | None = None) -> str | None:
    """Demo host only: which text the vLLM stand-in serves (`GET /_sim/info`, not a vLLM endpoint); when
    the server has no such path (404) and told its /version `version`, it is vLLM's own CPU build."""
    try:
        code, body = await asyncio.wait_for(_get(client, "/_sim/info", JSON_BODY_MAX), CHECK_DEADLINE_S)
    except (httpx.HTTPError, BodyTooLarge, asyncio.TimeoutError):
        return None
    if code == 404 and version is not None:
        return demo_engine_text(version)
    info = _json(body)
    if not isinstance(info, dict) or not info.get("text_backend"):
        return None
    backend = str(info["text_backend"])
    label = "tiny language model" if backend == "tinylm" else "canned text"
    return f"{label}" + (f" ({info['note']})" if info.get("note") else "")


def model_mismatch(profile: Profile, served: str | None) -> str | None:
    expected = profile.server.model_id
    if served is not None and served != expected:
        return f"wrong model served: {served!r}, the profile expects {expected!r}"
    return None


async def deep_check(client: httpx.AsyncClient, profile: Profile, *, timeout: float = 120.0) -> DeepCheck:
    """One tiny chat completion: does generation work, and where does the reasoning come back?"""
    body = {
        "model": profile.server.model_id,
        "messages": [{"role": "user", "content": "What is 2 + 3? Answer with one number."}],
        "max_tokens": 256,
        "temperature": 0,
    }
    if profile.generate.chat_template_kwargs:
        body["chat_template_kwargs"] = profile.generate.chat_template_kwargs

    async def post() -> tuple[int, bytes]:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=_headers(profile),
                                 timeout=timeout) as r:
            data = bytearray()
            async for chunk in r.aiter_bytes():
                data += chunk
                if len(data) > DEEP_BODY_MAX:
                    raise BodyTooLarge(f"answer over {DEEP_BODY_MAX >> 20} MiB")
            return r.status_code, bytes(data)

    try:
        status, raw = await asyncio.wait_for(post(), timeout)
    except asyncio.TimeoutError:
        return DeepCheck(False, f"chat completion did not finish within {timeout:g} s")
    except (httpx.HTTPError, BodyTooLarge) as e:
        return DeepCheck(False, f"chat completion failed: {type(e).__name__}: {e}")
    payload = _json(raw)
    if payload is None:
        return DeepCheck(False, f"chat completion returned {status} with a non-JSON body")
    if status != 200:
        err = payload.get("error") if isinstance(payload, dict) else None
        msg = err.get("message") if isinstance(err, dict) else (payload.get("message") if isinstance(payload, dict) else None)
        return DeepCheck(False, f"chat completion returned {status}: {msg or payload}")
    try:
        choice = payload["choices"][0]
        message = choice.get("message") or {}
        if not isinstance(message, dict):
            raise TypeError
    except (KeyError, IndexError, TypeError, AttributeError):
        return DeepCheck(False, "chat completion answer has no choices[0].message")
    field = None
    reasoning = None
    for name in ("reasoning", "reasoning_content"):  # >= 0.16 `reasoning`, <= 0.11.0 only the other
        if message.get(name):
            field, reasoning = name, message[name]
            break
    content = message.get("content")
    check = DeepCheck(ok=bool(content) or bool(reasoning), message="", reasoning_field=field,
                      content=bool(content), reasoning=bool(reasoning), finish_reason=choice.get("finish_reason"))
    parts = [f"content {'yes' if content else 'EMPTY'}",
             f"reasoning {'in ' + field if field else 'none'}", f"finish_reason {check.finish_reason}"]
    if profile.server.expect_reasoning and not reasoning:
        check.ok = False
        parts.append("the profile expects reasoning: check --reasoning-parser and chat_template_kwargs")
    check.message = ", ".join(parts)
    return check
