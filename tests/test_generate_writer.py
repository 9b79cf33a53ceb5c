"""Durable output: torn-tail detection, resume index, restore on write failure (no server)."""
from __future__ import annotations

import errno
import json
import os

import pytest

from backend.generate import writer as w
from backend.generate.records import dumps_line


def _rec(i, **kw):
    base = {"id": f"s{i}", "truncated": False, "reasoning_captured": True, "prompt_tokens": 10,
            "completion_tokens": 20}
    base.update(kw)
    return dumps_line(base)


def test_scan_counts_and_detects_torn_tail(tmp_path):
    path = tmp_path / "out.jsonl"
    good = _rec(1) + _rec(2, truncated=True) + b"\x00\x00garbage}\n" + _rec(1)
    path.write_bytes(good + b'{"id":"s3","trunc')
    index = w.scan_output(str(path))
    assert index.done_ids == {"s1", "s2"}
    assert (index.records, index.truncated, index.bad_lines, index.duplicates) == (2, 1, 1, 1)
    assert index.prompt_tokens == 20 and index.completion_tokens == 40
    assert index.valid_bytes == len(good) and index.torn_bytes == len(b'{"id":"s3","trunc')
    side = w.drop_torn_tail(str(path), index)
    assert path.read_bytes() == good
    assert open(side, "rb").read() == b'{"id":"s3","trunc'
    again = w.scan_output(str(path))
    assert again.torn_bytes == 0 and again.done_ids == {"s1", "s2"}
    assert w.drop_torn_tail(str(path), again) is None


def test_scan_missing_file(tmp_path):
    assert w.scan_output(str(tmp_path / "none.jsonl")).records == 0


async def test_writer_batches_and_returns_meta(tmp_path):
    path = tmp_path / "out.jsonl"
    writer = w.DurableWriter(str(path), flush_every=3)
    assert not writer.append(_rec(1), "a")
    assert not writer.append(_rec(2), "b")
    assert path.read_bytes() == b""  # nothing reaches the file before a flush
    assert writer.append(_rec(3), "c")
    assert await writer.flush() == ["a", "b", "c"]
    assert writer.durable_size == path.stat().st_size == writer.bytes_written
    assert await writer.flush() == []
    writer.append(_rec(4), "d")
    assert writer.flush_sync() == ["d"]
    writer.close()
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["s1", "s2", "s3", "s4"]


async def test_write_failure_restores_file(tmp_path, monkeypatch):
    path = tmp_path / "out.jsonl"
    writer = w.DurableWriter(str(path), flush_every=100)
    writer.append(_rec(1))
    await writer.flush()
    before = path.read_bytes()
    real_write = os.write

    def short_writev(fd, bufs):
        return real_write(fd, bytes(bufs[0][:7]))  # a partial write, as a filling disk does

    def enospc(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(w.os, "writev", short_writev)
    monkeypatch.setattr(w.os, "write", enospc)
    writer.append(_rec(2))
    writer.append(_rec(3))
    with pytest.raises(w.WriteFailed) as info:
        await writer.flush()
    monkeypatch.undo()
    assert info.value.disk_full and "full" in str(info.value)
    assert path.read_bytes() == before  # no torn line left behind
    assert writer.pending == 0
    writer.close()


async def test_batch_over_iov_max_and_fsync_failure(tmp_path, monkeypatch):
    path = tmp_path / "out.jsonl"
    writer = w.DurableWriter(str(path), flush_every=10_000)
    for i in range(w.IOV_MAX * 2 + 5):  # more lines than one writev takes
        writer.append(_rec(i), i)
    assert len(await writer.flush()) == w.IOV_MAX * 2 + 5
    assert w.scan_output(str(path)).records == w.IOV_MAX * 2 + 5
    before = path.read_bytes()

    def eio(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(w.os, "fsync", eio)
    writer.append(_rec(99_999))
    with pytest.raises(w.WriteFailed) as info:
        await writer.flush()
    monkeypatch.undo()
    assert not info.value.disk_full and "fsync failed" in str(info.value)
    assert path.read_bytes() == before and writer.durable_size == len(before)
    writer.close()


async def test_cancelled_flush_still_completes_its_batch(tmp_path):
    import asyncio

    path = tmp_path / "out.jsonl"
    writer = w.DurableWriter(str(path), flush_every=100)
    writer.append(_rec(1))
    task = asyncio.ensure_future(writer.flush())
    await asyncio.sleep(0)  # the batch is taken and handed to the thread
    task.cancel()
    writer.append(_rec(2))
    assert writer.flush_sync() is not None
    writer.close()  # waits for the cancelled flush's thread
    assert w.scan_output(str(path)).done_ids == {"s1", "s2"}
