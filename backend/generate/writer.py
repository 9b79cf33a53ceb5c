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


class DurableWriter:
    """Append-only JSONL writer; each record is one pre-encoded line ending in b"\\n"."""

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

    @property
    def pending(self) -> int:
        return len(self._buf)

    def append(self, line: bytes, meta: Any = None) -> bool:
        """Buffer one line; True when a flush is due."""
        self._buf.append(line)
        self._meta.append(meta)
        self._buf_bytes += len(line)
        return len(self._buf) >= self.flush_every or self._buf_bytes >= self.flush_bytes

    def _take(self) -> tuple[bytes, list[Any]]:
        data = b"".join(self._buf)
        meta = self._meta
        self._buf = []
        self._meta = []
        self._buf_bytes = 0
        return data, meta

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError as exc:
            self._restore()
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            what = "the output volume is full" if full else f"write failed: {exc.strerror}"
            raise WriteFailed(f"{self.path}: {what}; the file was kept intact at "
                              f"{self.durable_size} bytes", disk_full=full) from exc

    def _restore(self) -> None:
        try:
            os.ftruncate(self._fd, self.durable_size)
        except OSError:
            pass

    def _sync(self, restore_to: int) -> None:
        try:
            os.fsync(self._fd)
        except OSError as exc:
            self.durable_size = restore_to
            self._restore()
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            raise WriteFailed(f"{self.path}: fsync failed: {exc.strerror}", disk_full=full) from exc

    def _write_batch(self) -> tuple[list[Any], int]:
        data, meta = self._take()
        before = self.durable_size
        self._write_all(data)
        # Book the size now: a cancelled fsync below must not leave a stale size to truncate to.
        self.durable_size += len(data)
        self.bytes_written += len(data)
        return meta, before

    async def flush(self) -> list[Any]:
        """Write and fsync what is buffered (fsync off the event loop); return the durable lines' meta."""
        async with self._lock:
            if not self._buf:
                return []
            meta, before = self._write_batch()
            await asyncio.to_thread(self._sync, before)
            return meta

    def flush_sync(self) -> list[Any]:
        if not self._buf:
            return []
        meta, before = self._write_batch()
        self._sync(before)
        return meta

    def discard(self) -> int:
        """Drop buffered lines (after a failed write: they will be regenerated on resume)."""
        count = len(self._buf)
        self._take()
        return count

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
