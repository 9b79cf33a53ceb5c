"""Durable JSONL output: batched appends with fsync, torn-tail detection, and the resume index.

A batch goes out with O_APPEND writes and then fsync; a crash can only leave the LAST line
unterminated (torn). On restart `scan_output` finds it and `drop_torn_tail` cuts it off (keeping the
bytes in a side file for forensics) so it is never parsed as data nor glued to the next record.
On a write error (disk full) the file is truncated back to its last durable size: intact, no torn line.
"""
from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from backend.generate.records import loads


class WriteFailed(Exception):
    """A batch could not be written; the file was restored to its last durable size."""

    def __init__(self, message: str, *, disk_full: bool):
        super().__init__(message)
        self.disk_full = disk_full


@dataclass
class ResumeIndex:
    done_ids: set[str] = field(default_factory=set)
    records: int = 0
    truncated: int = 0
    reasoning_captured: int = 0
    reduced: int = 0  # records sent with a max_tokens cut to fit the context
    prompt_tokens: int = 0
    completion_tokens: int = 0
    valid_bytes: int = 0  # length of the prefix made of complete lines
    torn_bytes: int = 0  # unterminated tail after valid_bytes
    bad_lines: int = 0  # complete lines that are not records (skipped, never counted as done)
    duplicates: int = 0


def scan_output(path: str) -> ResumeIndex:
    """Index an output file: which sample ids are complete, and where a torn tail starts."""
    index = ResumeIndex()
    if not os.path.exists(path):
        return index
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                index.torn_bytes = len(line)
                break
            index.valid_bytes += len(line)
            if not line.strip():
                continue
            try:
                record = loads(line)
                sid = record["id"]
            except (ValueError, TypeError, KeyError):
                index.bad_lines += 1
                continue
            if not isinstance(sid, str):
                index.bad_lines += 1
                continue
            if sid in index.done_ids:
                index.duplicates += 1
                continue
            index.done_ids.add(sid)
            index.records += 1
            index.truncated += bool(record.get("truncated"))
            index.reasoning_captured += bool(record.get("reasoning_captured"))
            index.reduced += bool(record.get("max_tokens_reduced"))
            index.prompt_tokens += record.get("prompt_tokens") or 0
            index.completion_tokens += record.get("completion_tokens") or 0
    return index


def drop_torn_tail(path: str, index: ResumeIndex) -> str | None:
    """Cut the unterminated tail off `path`; return the side file that keeps its bytes, if any."""
    if not index.torn_bytes:
        return None
    side = f"{path}.torn-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    with open(path, "rb") as f:
        f.seek(index.valid_bytes)
        tail = f.read()
    with open(side, "wb") as f:
        f.write(tail)
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, index.valid_bytes)
        os.fsync(fd)
    finally:
        os.close(fd)
    return side


IOV_MAX = 1024  # Linux's limit on buffers per writev


def _retrieve(future: "asyncio.Future[None]") -> None:
    # a cancelled flush leaves nobody to await its batch: read its error so asyncio does not log it
    if not future.cancelled():
        future.exception()


class DurableWriter:
    """Append-only JSONL writer; each record is one pre-encoded line ending in b"\\n".

    A batch goes out as one writev of the buffered lines (no join: that would copy every ~80 KB line
    once more) followed by fsync, both in a worker thread so a disk under writeback pressure stalls
    neither the event loop nor the sockets. `_io` keeps batches from overlapping even when a flush was
    cancelled while its thread still runs, and guards `durable_size`, which a failed write restores;
    `close` waits for such a batch rather than close the file under it.
    """

    def __init__(self, path: str, *, flush_every: int = 64, flush_bytes: int = 4 << 20):
        self.path = path
        self.flush_every = flush_every
        self.flush_bytes = flush_bytes
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.durable_size = os.fstat(self._fd).st_size
        self.bytes_written = 0  # by this process, durable
        self._buf: list[bytes] = []
        self._meta: list[Any] = []  # caller's per-line bookkeeping, handed back once durable
        self._buf_bytes = 0
        self._lock = asyncio.Lock()
        self._io = threading.Lock()
        self._batches = threading.Condition()  # counts batches handed to a thread, not yet done
        self._in_thread = 0

    @property
    def pending(self) -> int:
        return len(self._buf)

    def append(self, line: bytes, meta: Any = None) -> bool:
        """Buffer one line; True when a flush is due."""
        self._buf.append(line)
        self._meta.append(meta)
        self._buf_bytes += len(line)
        return len(self._buf) >= self.flush_every or self._buf_bytes >= self.flush_bytes

    def _take(self) -> tuple[list[bytes], list[Any]]:
        bufs, meta = self._buf, self._meta
        self._buf = []
        self._meta = []
        self._buf_bytes = 0
        return bufs, meta

    def _fail(self, exc: OSError, what: str) -> WriteFailed:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        detail = "the output volume is full" if full else f"{what} failed: {exc.strerror}"
        return WriteFailed(f"{self.path}: {detail}; the file was kept intact at {self.durable_size} bytes",
                           disk_full=full)

    def _writev_all(self, bufs: list[bytes]) -> None:
        for start in range(0, len(bufs), IOV_MAX):
            chunk = bufs[start:start + IOV_MAX]
            n = os.writev(self._fd, chunk)
            total = sum(map(len, chunk))
            if n < total:  # short write (a filling disk): finish it, or fail (the caller restores)
                view = memoryview(b"".join(chunk))[n:]
                while view:
                    written = os.write(self._fd, view)
                    if written <= 0:  # no progress and no error: never loop on it
                        raise OSError(errno.ENOSPC, "No space left on device (short write)")
                    view = view[written:]

    def _restore(self) -> None:
        try:
            os.ftruncate(self._fd, self.durable_size)
        except OSError:
            pass

    def _threaded_batch(self, bufs: list[bytes]) -> None:
        try:
            self._write_and_sync(bufs)
        finally:
            with self._batches:
                self._in_thread -= 1
                self._batches.notify_all()

    def _write_and_sync(self, bufs: list[bytes]) -> None:
        size = sum(map(len, bufs))
        with self._io:
            before = self.durable_size
            try:
                self._writev_all(bufs)
            except OSError as exc:
                self._restore()
                raise self._fail(exc, "write") from exc
            try:
                os.fsync(self._fd)
            except OSError as exc:
                self._restore()
                raise self._fail(exc, "fsync") from exc
            self.durable_size = before + size
            self.bytes_written += size

    async def flush(self) -> list[Any]:
        """Write and fsync what is buffered, off the event loop; return the durable lines' meta."""
        async with self._lock:
            if not self._buf:
                return []
            bufs, meta = self._take()
            # Shielded: a cancelled flush must not cancel a batch already taken from the buffer
            # (those lines would be lost from this run); the thread finishes it either way.
            with self._batches:
                self._in_thread += 1
            done = asyncio.get_running_loop().run_in_executor(None, self._threaded_batch, bufs)
            done.add_done_callback(_retrieve)
            await asyncio.shield(done)
            return meta

    def flush_sync(self) -> list[Any]:
        if not self._buf:
            return []
        bufs, meta = self._take()
        self._write_and_sync(bufs)
        return meta

    def discard(self) -> int:
        """Drop buffered lines (after a failed write: they will be regenerated on resume)."""
        count = len(self._buf)
        self._take()
        return count

    def close(self, wait_s: float = 120.0) -> None:
        with self._batches:  # a cancelled flush's batch may not even have started in its thread
            self._batches.wait_for(lambda: self._in_thread == 0, timeout=wait_s)
        with self._io:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
