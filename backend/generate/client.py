"""The chat-completions client: one aiohttp session, retries with backoff, pause while the server is down.

Connection refused means the server is gone (crashed, restarting, still loading): every worker
waits on one `ServerGate` instead of burning its retries, one poller watches GET /health, and the
gate reopens by itself when it answers 200. 5xx, disconnects and timeouts are retried with
exponential backoff up to `max_retries`; 4xx other than 408/409/425/429 fail at once (a bad request
does not get better), except a 400 whose message speaks of the server's state (`fit.transient_400`).
A 200 whose body the caller's `parse` cannot read (not JSON, no `choices`) is retried the same way: a
server mid-restart or a proxy in front of it answers like that, and the next answer is usually good.
Every failure carries a reason (`REASONS`) so the run can count them and say whether a rerun can help.
"""
from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import aiohttp

from backend.generate.fit import error_message, transient_400
from backend.kit.secret_files import read_secret_file

RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})
# Why a request failed. `rejected` is permanent (the server refused this request: retrying cannot help);
# the others are transient (retries ran out: a rerun may succeed).
REJECTED = "rejected"
SERVER_ERROR = "server_error"
THROTTLED = "throttled"
TIMEOUT = "timeout"
CONNECTION_LOST = "connection_lost"
UNREACHABLE = "unreachable"
BAD_RESPONSE = "bad_response"  # HTTP 200 whose body is not a usable completion (transient)
REASONS = (REJECTED, SERVER_ERROR, THROTTLED, TIMEOUT, CONNECTION_LOST, UNREACHABLE, BAD_RESPONSE)
SHOWN_BODY = 300  # characters of an answer's body an error message quotes


def shown_body(data: bytes, limit: int = SHOWN_BODY) -> str:
    """A server's answer as an error may quote it: decoded, control characters as `?` (the text reaches logs
    and the console's screen), cut to `limit` characters with the full size said."""
    text = data[:limit * 4].decode(errors="replace")
    text = "".join(ch if ch.isprintable() else "?" for ch in text[:limit])
    return text if len(data) <= limit else f"{text}... ({len(data)} bytes)"


class RequestFailed(Exception):
    """A request that will not succeed by retrying now; recorded in the failures file."""

    def __init__(self, message: str, *, attempts: int, permanent: bool, reason: str = "",
                 status: int | None = None, server_message: str = ""):
        super().__init__(message)
        self.attempts = attempts
        self.permanent = permanent
        self.reason = reason or (REJECTED if permanent else SERVER_ERROR)
        self.status = status
        self.server_message = server_message  # the error body's message, for a 4xx


class ServerGone(Exception):
    """The server stayed down longer than max_pause_s: the run stops instead of waiting forever."""


@dataclass(frozen=True)
class ClientSettings:
    base_url: str  # http://host:port, without /v1
    concurrency: int = 200
    request_timeout: float = 1800.0
    connect_timeout: float = 10.0
    max_retries: int = 5
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    health_interval: float = 2.0
    max_pause_s: float = 0.0  # 0: wait for the server forever
    api_key: str | None = None


def read_api_key(env_name: str | None, file_name: str | None, *, remove: bool = False) -> str | None:
    """The API key from an environment variable's name or a file; never from argv (ps shows argv).
    `remove`: the file is the console's copy for this run; it is deleted once read, also when unusable."""
    if env_name:
        value = os.environ.get(env_name)
        if not value:
            raise ValueError(f"--api-key-env {env_name}: that environment variable is not set or empty")
        return value.strip()
    if file_name:
        return read_secret_file(file_name, "--api-key-file", remove=remove)
    return None


def backoff_delay(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff with full jitter, so 200 workers do not retry in lockstep."""
    return random.uniform(0, min(cap, base * (2 ** (attempt - 1))))


class ServerGate:
    """Open while the server is believed up; closed (pausing all workers) while it is down."""

    def __init__(self, probe: Callable[[], Awaitable[int | None]], *, interval: float, max_pause_s: float,
                 on_pause: Callable[[str], None], on_resume: Callable[[float], None]):
        self._probe = probe
        self._interval = interval
        self._max_pause_s = max_pause_s
        self._on_pause = on_pause
        self._on_resume = on_resume
        self._open = asyncio.Event()
        self._open.set()
        self._poller: asyncio.Task[None] | None = None
        self._gone: str | None = None
        self.paused_since: float | None = None
        self.pauses = 0

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    async def wait_open(self) -> None:
        if self._gone:
            raise ServerGone(self._gone)
        await self._open.wait()
        if self._gone:
            raise ServerGone(self._gone)

    def report_down(self, reason: str) -> None:
        if not self._open.is_set() or self._gone:
            return
        self._open.clear()
        self.paused_since = time.monotonic()
        self.pauses += 1
        self._on_pause(reason)
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        assert self.paused_since is not None
        while True:
            await asyncio.sleep(self._interval)
            if await self._probe() == 200:
                break
            waited = time.monotonic() - self.paused_since
            if self._max_pause_s and waited > self._max_pause_s:
                self._gone = (f"the server has been down for {waited:.0f} s (over --max-pause-s "
                              f"{self._max_pause_s:.0f}); check its unit/log and restart the run")
                self._open.set()  # wake the waiters so they see ServerGone
                return
        waited = time.monotonic() - self.paused_since
        self.paused_since = None
        self._on_resume(waited)
        self._open.set()

    async def close(self) -> None:
        if self._poller is not None and not self._poller.done():
            self._poller.cancel()
            try:
                await self._poller
            except asyncio.CancelledError:
                pass


class ChatClient:
    """Use as `async with ChatClient(settings) as client:`; `gate` is set up by `attach_gate`."""

    def __init__(self, settings: ClientSettings):
        self.settings = settings
        self.session: aiohttp.ClientSession | None = None
        self.gate: ServerGate | None = None
        self._alive_probe: asyncio.Future[int | None] | None = None
        self.chat_url = settings.base_url.rstrip("/") + "/v1/chat/completions"
        self._chat_timeout = aiohttp.ClientTimeout(total=settings.request_timeout,
                                                   sock_connect=settings.connect_timeout)

    async def __aenter__(self) -> "ChatClient":
        headers = {"Content-Type": "application/json"}
        if self.settings.api_key:
            headers["Authorization"] = f"Bearer {self.settings.api_key}"
        connector = aiohttp.TCPConnector(limit=self.settings.concurrency, limit_per_host=0)
        self.session = aiohttp.ClientSession(
            connector=connector, headers=headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.settings.connect_timeout))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.gate is not None:
            await self.gate.close()
        if self.session is not None:
            await self.session.close()

    def attach_gate(self, *, on_pause: Callable[[str], None], on_resume: Callable[[float], None]) -> ServerGate:
        s = self.settings
        self.gate = ServerGate(self.health, interval=s.health_interval, max_pause_s=s.max_pause_s,
                               on_pause=on_pause, on_resume=on_resume)
        return self.gate

    async def health(self) -> int | None:
        """GET /health status, or None when nothing answers."""
        try:
            async with self._session().get(self.settings.base_url.rstrip("/") + "/health",
                                           timeout=aiohttp.ClientTimeout(total=5)) as resp:
                await resp.read()
                return resp.status
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return None

    async def get_json(self, path: str, timeout: float = 10.0) -> tuple[int, Any]:
        async with self._session().get(self.settings.base_url.rstrip("/") + path,
                                       timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            body = await resp.read()
            try:
                from backend.generate.records import loads

                return resp.status, loads(body) if body else None
            except ValueError:
                return resp.status, body.decode(errors="replace")

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None:
            raise RuntimeError("ChatClient used outside `async with`")
        return self.session

    async def post_once(self, body: bytes, timeout: float | None = None) -> tuple[int, bytes]:
        t = self._chat_timeout if timeout is None else aiohttp.ClientTimeout(
            total=timeout, sock_connect=self.settings.connect_timeout)
        async with self._session().post(self.chat_url, data=body, timeout=t) as resp:
            return resp.status, await resp.read()

    async def post_path(self, path: str, payload: Any, timeout: float = 30.0) -> tuple[int, bytes]:
        """POST a JSON payload to another endpoint of the server (/tokenize); one attempt."""
        from backend.generate.records import dumps_line

        async with self._session().post(self.settings.base_url.rstrip("/") + path, data=dumps_line(payload),
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            return resp.status, await resp.read()

    async def tokenize(self, payload: Any, timeout: float = 60.0) -> tuple[int, bytes] | None:
        """POST /tokenize, waiting like `chat` while the server is down; None when it gave no answer."""
        while True:
            if self.gate is not None:
                await self.gate.wait_open()
            try:
                return await self.post_path("/tokenize", payload, timeout)
            except aiohttp.ClientConnectorError as exc:
                if self.gate is None:
                    return None
                self.gate.report_down(f"cannot connect to {self.settings.base_url}: {exc.os_error or exc}")
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                return None

    async def chat(self, body: bytes, parse: Callable[[bytes], Any] | None = None) -> tuple[Any, int]:
        """POST one encoded chat request until it succeeds; return (response body, attempts), the body as
        `parse` reads it when given (a ValueError from it is a malformed answer, retried like a 5xx)."""
        s = self.settings
        attempts = 0
        while True:
            if self.gate is not None:
                await self.gate.wait_open()
            try:
                status, data = await self.post_once(body)
            except aiohttp.ClientConnectorError as exc:
                # Refused/unreachable: the server is down. Pause everyone; this is not a failed attempt.
                if self.gate is not None:
                    self.gate.report_down(f"cannot connect to {s.base_url}: {exc.os_error or exc}")
                    continue
                error, reason = f"cannot connect to {s.base_url}: {exc}", UNREACHABLE
            except asyncio.TimeoutError:
                error, reason = f"no complete answer within {s.request_timeout:g} s (request timeout)", TIMEOUT
            except (aiohttp.ClientError, OSError) as exc:
                error, reason = f"connection lost mid-request: {type(exc).__name__}: {exc}", CONNECTION_LOST
                await self._check_alive()
            else:
                if status == 200:
                    if parse is None:
                        return data, attempts + 1
                    try:
                        return parse(data), attempts + 1
                    except (ValueError, RecursionError) as exc:
                        why = shown_body(str(exc).encode())
                        error = f"HTTP 200 but not a chat completion ({why}): {shown_body(data)}"
                        reason = BAD_RESPONSE
                else:
                    text = shown_body(data)
                    if status < 500 and status not in RETRYABLE_STATUSES:
                        message = error_message(data[:4096])
                        if not (status == 400 and transient_400(message)):
                            raise RequestFailed(f"HTTP {status}: {text}", attempts=attempts + 1, permanent=True,
                                                reason=REJECTED, status=status, server_message=message)
                    error = f"HTTP {status}: {text}"
                    reason = SERVER_ERROR if status >= 500 or status == 400 else THROTTLED
                    if status >= 500:
                        await self._check_alive()
            attempts += 1
            if attempts > s.max_retries:
                raise RequestFailed(f"{error} (gave up after {attempts} attempts)", attempts=attempts,
                                    permanent=False, reason=reason)
            await asyncio.sleep(backoff_delay(attempts, s.backoff_base, s.backoff_max))

    async def _check_alive(self) -> None:
        # A 5xx or a dropped connection may mean the engine died (/health 503) or the process is gone.
        # One probe is shared by every worker that failed at the same moment (a 5xx burst hits 200).
        if self.gate is None or not self.gate.is_open:
            return
        if self._alive_probe is None or self._alive_probe.done():
            self._alive_probe = asyncio.ensure_future(self.health())
        if await asyncio.shield(self._alive_probe) != 200:
            self.gate.report_down("the server stopped answering /health after a failed request")
