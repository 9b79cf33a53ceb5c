"""A hostile or broken server cannot hold the console: every HTTP check has an overall deadline and every
body a size cap (a real asyncio HTTP server on loopback plays the server)."""
from __future__ import annotations

import asyncio
import time
import tracemalloc

import httpx
import pytest

from console.profile import profile_from_dict
from console.telemetry import http_checks
from console.telemetry.http_checks import check_http, deep_check, fetch_metrics

pytestmark = pytest.mark.timeout(60)
PROFILE = profile_from_dict({"host": {"name": "gpu-host.example"}, "server": {"model_path": "/m", "unit": "v"},
                             "paths": {"work_dir": "/w"}})


async def serve(routes):
    """A tiny HTTP/1.1 server: `routes[path](writer)` writes the whole answer."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                length = next((int(l.split(b":")[1]) for l in head.split(b"\r\n")
                               if l.lower().startswith(b"content-length:")), 0)
                if length:
                    await reader.readexactly(length)
                await routes.get(path, not_found)(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def answer(body: bytes, status: str = "200 OK"):
    async def write(writer):
        writer.write(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
    return write


not_found = answer(b"{}", "404 Not Found")


async def drip(writer):
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
    for _ in range(100):
        writer.write(b" ")
        await writer.drain()
        await asyncio.sleep(2)  # httpx's read timeout restarts at every byte


def huge(size: int, line: bytes = b"x" * 1023 + b"\n"):
    async def write(writer):
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
        sent = 0
        while sent < size:
            chunk = line * 64
            writer.write(chunk)
            sent += len(chunk)
            await writer.drain()
    return write


async def test_a_dripping_health_answer_is_bounded(monkeypatch):
    monkeypatch.setattr(http_checks, "CHECK_DEADLINE_S", 1.5)
    server, url = await serve({"/health": drip})
    async with server, httpx.AsyncClient(base_url=url, timeout=3.0) as client:
        t0 = time.monotonic()
        state = await check_http(client, PROFILE)
        assert time.monotonic() - t0 < 4
        assert state.error and "did not answer" in state.error and state.health is None


async def test_a_huge_models_list_is_refused_not_buffered():
    models = huge(100 << 20, b'{"id": "' + b"m" * 1000 + b'"},\n')
    server, url = await serve({"/health": answer(b""), "/version": answer(b'{"version": "0.33.0"}'),
                               "/v1/models": models})
    async with server, httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        tracemalloc.start()
        state = await check_http(client, PROFILE)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert state.model_id is None and "body over" in state.error
        assert peak < 32 << 20  # 100 MB offered; a little over the 1 MiB cap was held


async def test_a_million_line_metrics_page_is_dropped():
    server, url = await serve({"/metrics": huge(40 << 20, b'vllm:num_requests_running{model_name="m"} 1\n')})
    async with server, httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        assert await fetch_metrics(client) is None


async def test_a_deep_check_that_never_ends_is_bounded():
    server, url = await serve({"/v1/chat/completions": drip})
    async with server, httpx.AsyncClient(base_url=url, timeout=3.0) as client:
        t0 = time.monotonic()
        result = await deep_check(client, PROFILE, timeout=1.5)
        assert time.monotonic() - t0 < 4 and not result.ok and "did not finish within" in result.message
