"""events.jsonl on a full disk (a real, tiny tmpfs): an event is written whole or not at all, a finish
that no longer fits is still said in short, a torn tail is dropped on reopen, and a failed atomic JSON
write leaves no temp file holding the space."""
from __future__ import annotations

import errno
import json
import os

import pytest

from backend.contract.events import EventLog, EventWriteFailed, parse_events
from backend.contract.runs import write_json_atomic
from console.telemetry.runs import RunBook
from console.telemetry.probe import RunFile
from harness.rig.tmpfs import small_tmpfs


@pytest.fixture
def small_disk(tmp_path):
    with small_tmpfs(tmp_path / "small", "64k") as mnt:
        yield mnt


def fill(directory) -> None:
    """Take every free block left, so the next allocation fails (ENOSPC)."""
    with open(os.path.join(directory, "filler"), "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        try:
            while True:
                f.write(b"\0")
        except OSError:
            pass


def lines_of(path) -> list[dict]:
    data = open(path, "rb").read()
    assert data == b"" or data.endswith(b"\n"), f"torn tail: {data[-80:]!r}"
    return [json.loads(line) for line in data.splitlines()]


def test_an_event_is_whole_or_absent_and_a_finish_still_says_why(small_disk):
    path = str(small_disk / "events.jsonl")
    log = EventLog(path, "generate", "r")
    log.emit("start", total=10, manifest={})
    fill(small_disk)
    before = open(path, "rb").read()
    # more than the room left in the file's last block: the disk takes part of it, then refuses
    with pytest.raises(EventWriteFailed) as info:
        log.emit("progress", done=1, total=10, note="x" * 9000)
    assert info.value.errno == errno.ENOSPC
    assert open(path, "rb").read() == before  # cut back: no half event for a reader to choke on
    error = "output.jsonl: the output volume is full; the file was kept intact"
    finish = log.emit("finish", status="failed",
                      summary={"status": "failed", "error": error, "done": 3, "total": 10, "failed": 0,
                               "skipped_by_reason": {f"reason-{i}": i for i in range(600)}})
    log.close()
    assert finish.data["compact"] is True
    events = lines_of(path)
    assert [e["kind"] for e in events] == ["start", "finish"]
    assert events[-1]["summary"] == {"status": "failed", "error": error, "done": 3, "total": 10, "failed": 0}

    # the console reads that as "failed: disk full", not stale
    book = RunBook("tmux")
    book.apply_listing([RunFile(run_dir=str(small_disk), run_id="r", size=os.path.getsize(path), mtime=0.0)])
    book.apply_events(str(small_disk), open(path, "rb").read())
    [info_] = book.infos()
    assert info_.state == "failed" and "full" in info_.last_event["error"] and info_.done == 3


def test_a_torn_tail_is_dropped_on_reopen(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path), "generate", "r")
    log.emit("start", total=10, manifest={})
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"ts":1.0,"kind":"finish","stage":"generate","run_id":"r","status":"fail')  # a crash here
    log = EventLog(str(path), "generate", "r")
    log.emit("start", total=10, manifest={}, resumed=True)
    log.close()
    events = lines_of(path)
    assert [e["kind"] for e in events] == ["start", "start"] and events[1]["resumed"] is True
    assert parse_events(path.read_bytes())[1] == path.stat().st_size
    [side] = [p for p in tmp_path.iterdir() if ".torn-" in p.name]
    assert side.read_bytes().endswith(b'"status":"fail') and log.dropped_tail == str(side)


def test_a_torn_tail_longer_than_the_scan_block(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"kind":"start"}\n' + b"y" * 200_000)
    EventLog(str(path), "generate", "r").close()
    assert path.read_bytes() == b'{"kind":"start"}\n'
    path.write_bytes(b"z" * 70_000)  # no complete line at all
    EventLog(str(path), "generate", "r").close()
    assert path.read_bytes() == b""


def test_a_failed_atomic_json_write_leaves_no_temp_file(small_disk):
    fill(small_disk)
    target = small_disk / "summary.json"
    with pytest.raises(OSError) as info:
        write_json_atomic(str(target), {"blob": "x" * 20_000})
    assert info.value.errno == errno.ENOSPC
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]  # no summary.json.tmp-PID
