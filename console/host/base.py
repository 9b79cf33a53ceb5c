"""The one interface the console uses to talk to a GPU host, whatever the transport.

Implementations: `SshHost` (asyncssh, console/host/ssh.py) and `LocalHost` (the console runs on the
host itself, or the demo; console/host/local.py). Commands are always argument lists: an implementation
that needs a shell string builds it with shlex.join, never by concatenation.
"""
from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import AsyncIterator, Protocol, Sequence


class HostError(Exception):
    """Base of every host-layer failure; `str()` is a sentence an operator can act on."""


class HostUnreachable(HostError):
    """Could not connect (refused, timeout, DNS); retried with backoff."""


class HostDisconnected(HostError):
    """The connection dropped while a command or stream was running; the next call reconnects."""


class AuthenticationFailed(HostError):
    """The server refused our key: reported, never retried in a loop."""


class HostKeyError(HostError):
    """The server's host key is unknown or changed; carries the fingerprint to show the operator."""

    def __init__(self, message: str, *, host: str, fingerprint: str | None, changed: bool):
        super().__init__(message)
        self.host = host
        self.fingerprint = fingerprint
        self.changed = changed


class CommandTimeout(HostError):
    pass


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float | None = None  # the command's own time, from its channel open to its exit


    @property
    def ok(self) -> bool:
        return self.returncode == 0


@dataclass(frozen=True)
class ReadChunk:
    data: bytes
    offset: int  # where `data` starts
    next_offset: int  # pass this to the next read
    size: int  # file size when read (smaller than offset -> the file was truncated or replaced)


class Host(Protocol):
    name: str

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    async def run(self, argv: Sequence[str], *, timeout: float | None = 30.0,
                  input: str | None = None, check: bool = False, errors: str = "replace") -> CommandResult:
        """Run argv to completion within `timeout` seconds overall (connecting and opening the channel
        included). `errors="surrogateescape"` keeps undecodable bytes recoverable (`.encode("utf-8",
        "surrogateescape")`), for callers that count bytes."""
        ...

    def stream(self, argv: Sequence[str]) -> AsyncIterator[str]:
        """Yield stdout lines (without newline) of a long-running command; the remote side dies with
        the channel (PTY on SSH). Raises HostDisconnected if the connection drops."""
        ...

    async def read_from(self, path: str, offset: int = 0, max_bytes: int = 1 << 20) -> ReadChunk: ...

    async def upload(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        """Write atomically: a temp file in the same directory, then rename."""
        ...

    def forward_port(self, remote_port: int) -> AbstractAsyncContextManager[int]:
        """Forward a free local port to the host's 127.0.0.1:remote_port; yields the local port."""
        ...
