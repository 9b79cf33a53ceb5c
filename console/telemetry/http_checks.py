"""Readiness over HTTP through the forwarded port: /health, /version, /v1/models, deep check.

httpx is fine here: a handful of requests a second at most. A connection refused is the normal state
while vLLM loads (it binds only at the end), so it is reported as "not listening", never as an error.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import httpx

from console.profile import Profile


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


def api_key(profile: Profile) -> str | None:
    """From the environment variable or file the profile names; the key itself is never in a profile."""
    s = profile.server
    if s.api_key_env and os.environ.get(s.api_key_env):
        return os.environ[s.api_key_env]
    if s.api_key_file:
        try:
            return Path(s.api_key_file).expanduser().read_text().strip() or None
        except OSError:
            return None
    return None


def _headers(profile: Profile) -> dict[str, str]:
    key = api_key(profile)
    return {"Authorization": f"Bearer {key}"} if key else {}


async def check_http(client: httpx.AsyncClient, profile: Profile) -> HttpState:
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
        v = await client.get("/version")
        if v.status_code == 200:
            state.version = str(v.json().get("version")) if isinstance(v.json(), dict) else None
        m = await client.get("/v1/models", headers=_headers(profile))
        if m.status_code == 200:
            data = m.json().get("data") or []
            if data and isinstance(data[0], dict):
                state.model_id = data[0].get("id")
                mml = data[0].get("max_model_len")
                state.max_model_len = int(mml) if isinstance(mml, int) else None
        elif m.status_code == 401:
            state.error = "GET /v1/models: 401 unauthorized (set the profile's api_key_env or api_key_file)"
        else:
            state.error = f"GET /v1/models returned {m.status_code}"
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        state.error = f"reading /version or /v1/models failed: {e}"
    return state


async def fetch_metrics(client: httpx.AsyncClient) -> str | None:
    """/metrics is open even with --api-key; None when it cannot be read (never an error to the caller)."""
    try:
        r = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None


async def sim_text_backend(client: httpx.AsyncClient) -> str | None:
    """Demo host only: which text the vLLM stand-in serves (`GET /_sim/info`, not a vLLM endpoint)."""
    try:
        info = (await client.get("/_sim/info")).json()
    except (httpx.HTTPError, ValueError):
        return None
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
    try:
        r = await client.post("/v1/chat/completions", json=body, headers=_headers(profile), timeout=timeout)
    except httpx.HTTPError as e:
        return DeepCheck(False, f"chat completion failed: {type(e).__name__}: {e}")
    try:
        payload = r.json()
    except ValueError:
        return DeepCheck(False, f"chat completion returned {r.status_code} with a non-JSON body")
    if r.status_code != 200:
        err = payload.get("error") if isinstance(payload, dict) else None
        msg = err.get("message") if isinstance(err, dict) else (payload.get("message") if isinstance(payload, dict) else None)
        return DeepCheck(False, f"chat completion returned {r.status_code}: {msg or payload}")
    try:
        choice = payload["choices"][0]
        message = choice.get("message") or {}
    except (KeyError, IndexError, TypeError):
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
