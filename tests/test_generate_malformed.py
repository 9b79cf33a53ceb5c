"""A 200 that is not a chat completion (JSON without `choices`, a body that is not JSON) is retried like a
5xx: bounded, and the final error quotes what came back, cut short and without control characters.

The server is a tiny aiohttp app on 127.0.0.1 written here: the stand-in (sim/) answers like vLLM and has no
way to send a broken 200, and a real vLLM only does so behind a misbehaving proxy or mid-restart."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

from aiohttp import web

from backend.generate.client import BAD_RESPONSE, ChatClient, ClientSettings, RequestFailed
from backend.generate.fit import ContextLimits
from backend.generate.request import Generated, PromptFitter
from backend.generate.runner import PERMANENT_FAILURES

GOOD = {"choices": [{"message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1}}


async def serve(answers: Iterator[bytes]) -> tuple[web.AppRunner, str, list[int]]:
    seen: list[int] = []

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        seen.append(1)
        return web.Response(status=200, body=next(answers), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}", seen


def fitter(client: ChatClient) -> PromptFitter:
    return PromptFitter(client, model="m", base={"model": "m", "max_tokens": 8}, max_tokens=8, policy="skip",
                        chat_template_kwargs={}, limits=ContextLimits())


def test_a_garbage_200_is_retried_and_the_next_good_answer_is_used():
    async def go() -> tuple[object, int]:
        answers = iter([b'{"object": "error", "message": "no choices here"}', b"<html>bad gateway</html>",
                        json.dumps(GOOD).encode()])
        runner, url, seen = await serve(answers)
        try:
            settings = ClientSettings(base_url=url, concurrency=1, max_retries=3, backoff_base=0.01)
            async with ChatClient(settings) as client:
                out = await fitter(client).generate([{"role": "user", "content": "hi"}])
        finally:
            await runner.cleanup()
        return out, len(seen)

    out, requests = asyncio.run(go())
    assert isinstance(out, Generated) and out.completion.content == "fine" and requests == 3


def test_garbage_every_time_gives_up_after_the_retries_saying_what_came_back():
    body = b"\x1b[31mnot json " + b"x" * 5000

    async def go() -> tuple[RequestFailed, int]:
        runner, url, seen = await serve(iter([body] * 10))
        try:
            settings = ClientSettings(base_url=url, concurrency=1, max_retries=2, backoff_base=0.01)
            async with ChatClient(settings) as client:
                try:
                    await fitter(client).generate([{"role": "user", "content": "hi"}])
                except RequestFailed as exc:
                    return exc, len(seen)
        finally:
            await runner.cleanup()
        raise AssertionError("a garbage answer was accepted")

    failed, requests = asyncio.run(go())
    assert requests == 3 and failed.attempts == 3 and not failed.permanent and failed.reason == BAD_RESPONSE
    assert BAD_RESPONSE not in PERMANENT_FAILURES  # a rerun retries the sample
    text = str(failed)
    assert text.startswith("HTTP 200 but not a chat completion (") and "?[31mnot json xxx" in text
    assert "\x1b" not in text and "(5014 bytes)" in text and "(gave up after 3 attempts)" in text
    assert len(text) < 600
