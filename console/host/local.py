"""`LocalHost`: the Host interface on this machine (the console runs on the GPU host itself, or the demo)."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import time
from typing import AsyncIterator, Sequence

from .base import CommandResult, CommandTimeout, HostError, ReadChunk

MAX_LINE = 1 << 20  # stream() drops longer lines rather than buffer without bound


def _decode(data: bytes, errors: str = "replace") -> str:
    return data.decode("utf-8", errors=errors)


async def _kill(proc: asyncio.subprocess.Process) -> None:
    """Kill the child's whole process group (it was started in its own session) and reap it."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(proc.wait(), 5.0)


class LocalHost:
    """Runs commands as local subprocesses; no connection, so connect/close are no-ops."""

    def __init__(self, name: str = "localhost") -> None:
        self.name = name

    async def connect(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def run(self, argv: Sequence[str], *, timeout: float | None = 30.0,
                  input: str | None = None, check: bool = False, errors: str = "replace") -> CommandResult:
        argv_t = tuple(argv)
        if not argv_t:
            raise ValueError("run() needs a non-empty argv")
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv_t,
                stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True)  # own group, so a timeout kills grandchildren too
        except OSError as exc:
            # Same shape as a shell's "command not found" so callers see one failure mode on both hosts.
            return _checked(CommandResult(argv_t, 127, "", f"{argv_t[0]}: {exc.strerror}\n"), check)
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(input.encode() if input is not None else None), timeout)
        except asyncio.TimeoutError:
            await _kill(proc)
            raise CommandTimeout(f"{argv_t[0]} did not finish within {timeout} s") from None
        except asyncio.CancelledError:
            await _kill(proc)
            raise
        result = CommandResult(argv_t, proc.returncode if proc.returncode is not None else -1,
                               _decode(out, errors), _decode(err, errors), elapsed_s=time.monotonic() - started)
        return _checked(result, check)

    async def stream(self, argv: Sequence[str]) -> AsyncIterator[str]:
        argv_t = tuple(argv)
        if not argv_t:
            raise ValueError("stream() needs a non-empty argv")
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv_t, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise HostError(f"cannot start {argv_t[0]}: {exc.strerror}") from exc
        assert proc.stdout is not None
        try:
            # Our own splitting (not readline) so an overlong line is dropped whole, never yielded
            # as a fragment. stderr is merged in, as the PTY does on SshHost. Only '\n' splits: a '\r'
            # inside a line is a progress-bar redraw that callers split on.
            pending, dropping = b"", False
            while chunk := await proc.stdout.read(1 << 16):
                *complete, pending = (pending + chunk).split(b"\n")
                for line in complete:
                    if dropping:
                        dropping = False  # the tail of the dropped line
                        continue
                    yield _decode(line)
                if len(pending) > MAX_LINE:
                    pending, dropping = b"", True
            if pending and not dropping:
                yield _decode(pending)
        finally:
            # Consumer stopped early, was cancelled, or the command ended: never leave the child behind.
            await _kill(proc)

    async def read_from(self, path: str, offset: int = 0, max_bytes: int = 1 << 20) -> ReadChunk:
        if offset < 0 or max_bytes < 0:
            raise ValueError("offset and max_bytes must be >= 0")
        return await asyncio.to_thread(_read_chunk, path, offset, max_bytes)

    async def upload(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        await asyncio.to_thread(_atomic_write, data, remote_path, mode)

    @contextlib.asynccontextmanager
    async def forward_port(self, remote_port: int) -> AsyncIterator[int]:
        # The "remote" loopback is ours: the port is reachable as it is.
        yield remote_port


def _checked(result: CommandResult, check: bool) -> CommandResult:
    if check and not result.ok:
        detail = result.stderr.strip().splitlines()[-1:] or [""]
        raise HostError(f"{result.argv[0]} failed with exit {result.returncode}: {detail[0]}")
    return result


def _read_chunk(path: str, offset: int, max_bytes: int) -> ReadChunk:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if offset > size:
                # Truncated or replaced: report the size and read nothing; the caller restarts at 0.
                return ReadChunk(b"", offset, offset, size)
            f.seek(offset)
            data = f.read(max_bytes)
    except FileNotFoundError:
        return ReadChunk(b"", offset, offset, 0)
    return ReadChunk(data, offset, offset + len(data), size)


def _atomic_write(data: bytes, path: str, mode: int) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
