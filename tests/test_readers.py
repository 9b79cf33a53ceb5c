"""Readers of remote files never wedge, drift or grow without bound: events.jsonl runs, the server's log
(tmux), and the probe's byte budget."""
from __future__ import annotations

import asyncio
import json

from backend.contract.events import Event
from console.control.units import stage_unit_name
from console.host.local import LocalHost
from console.profile import profile_from_dict
from console.telemetry.collector import Collector
from console.telemetry.probe import RunFile
from console.telemetry.runs import PROBE_EVENTS_BUDGET, READ_LIMIT, TAIL_BYTES, RunBook
from console.telemetry.server_log import LogFileCursor, ServerLog


def event_line(kind: str, **data) -> bytes:
    return Event(kind=kind, stage="generate", run_id="r", ts=1.0, data=data).to_line()


# -- events.jsonl ------------------------------------------------------------------------------------

def test_an_event_longer_than_one_read_is_read_whole_later():
    """A start event carrying a 4,800-file manifest is longer than one read: the reader asks for more
    next time instead of stopping that run for good."""
    book = RunBook("tmux")
    big = event_line("start", total=4800, manifest={"files": ["f" * 200] * 4800})
    assert len(big) > READ_LIMIT
    data = big + event_line("progress", done=7, total=4800)
    book.apply_listing([RunFile("/w/runs/r", "r", len(data), 1.0)])
    for _ in range(4):
        reads = book.reads_wanted()
        if not reads:
            break
        read = reads[0]
        book.apply_events(read.run_dir, data[read.offset:read.offset + read.limit], read.limit)
    track = book.tracks["/w/runs/r"]
    assert track.offset == len(data) and track.total == 4800 and track.progress["done"] == 7


def test_probe_budget_and_old_runs_read_from_their_tail():
    """100 finished runs found at start-up: one probe asks for a bounded number of bytes, and an old
    run is read from its tail (its last events say how it ended), not from its start."""
    book = RunBook("tmux")
    size = 512 * 1024
    book.apply_listing([RunFile(f"/w/runs/r{i}", f"r{i}", size, float(i)) for i in range(100)])
    reads = book.reads_wanted()
    assert sum(r.limit for r in reads) <= PROBE_EVENTS_BUDGET
    old = book.tracks["/w/runs/r0"]
    assert old.offset == size - TAIL_BYTES and old.skip_partial
    newest = book.tracks["/w/runs/r99"]
    assert newest.offset == 0  # the newest runs are read whole: their curves are drawn
    tail = b'"cut line"}\n' + event_line("progress", done=3, total=9) + event_line(
        "finish", status="completed", summary={"done": 9, "total": 9})
    book.apply_events(old.run_dir, tail, TAIL_BYTES)
    info = next(i for i in book.infos() if i.run_id == "r0")
    assert info.state == "done" and info.done == 9


def test_many_old_runs_make_small_probes_end_to_end(tmp_path):
    runs = tmp_path / "runs"
    for i in range(60):
        run = runs / f"r{i:03d}"
        run.mkdir(parents=True)
        lines = [event_line("start", total=1000)] + [event_line("progress", done=d, total=1000) for d in range(2000)]
        lines.append(event_line("finish", status="completed", summary={"done": 1000, "total": 1000}))
        (run / "events.jsonl").write_bytes(b"".join(lines))
    profile = profile_from_dict({"host": {"name": "localhost", "transport": "local"},
                                 "server": {"model_path": "/m", "manager": "tmux", "unit": "e3t-none"},
                                 "paths": {"work_dir": str(tmp_path)},
                                 "gpus": {"command": ["true"]}})
    host = Recording()
    collector = Collector(profile, host)

    async def go():
        await collector.connect()
        for _ in range(12):
            await collector.refresh()
        return collector.run_infos()

    infos = asyncio.run(go())
    assert len(infos) == 60 and all(i.state == "done" for i in infos)
    assert max(host.sizes) <= PROBE_EVENTS_BUDGET + 64 * 1024, max(host.sizes)


class Recording(LocalHost):
    """A LocalHost that remembers how many bytes each probe brought back."""

    def __init__(self):
        super().__init__()
        self.sizes: list[int] = []

    async def run(self, argv, **kw):
        res = await super().run(argv, **kw)
        if argv[:2] == ["sh", "-c"] and "@@E3PROBE" in argv[2]:
            self.sizes.append(len(res.stdout.encode("utf-8", "surrogateescape")))
        return res


# -- the server's log (tmux) --------------------------------------------------------------------------

def test_a_log_line_longer_than_one_read_is_skipped_not_waited_for():
    cursor = LogFileCursor(inode="7", offset=0)
    limit = 1024
    huge = b"x" * 3000 + b"\n"
    data = huge + b"(APIServer pid=1) INFO 01-01 00:00:00 [launcher.py:44] Route: /health\n"
    for _ in range(10):
        lines, _ = cursor.take("7", len(data), data[cursor.offset:cursor.offset + limit], limit=limit)
        if lines:
            break
    assert lines == ["(APIServer pid=1) INFO 01-01 00:00:00 [launcher.py:44] Route: /health"]
    assert cursor.offset == len(data)


def test_undecodable_bytes_never_move_the_offset():
    cursor = LogFileCursor(inode="7", offset=0)
    data = b"bad \xff\xfe byte\nnext line\npartial"
    lines, partial = cursor.take("7", len(data), data, limit=1 << 20)
    assert lines == ["bad \ufffd\ufffd byte", "next line"] and partial == "partial"
    assert cursor.offset == data.index(b"partial")


def test_a_truncated_or_replaced_log_is_read_again_from_its_start():
    cursor = LogFileCursor(inode="7", offset=0)
    cursor.take("7", 100, b"a\n" * 50, limit=1 << 20)
    assert cursor.offset == 100
    cursor.take("7", 10, b"", limit=1 << 20)  # copytruncate: smaller than where we are
    assert cursor.offset == 0 and cursor.restarted
    cursor.take("7", 10, b"x\n" * 5, limit=1 << 20)
    cursor.take("8", 4, b"", limit=1 << 20)  # rotated: another file under the same name
    assert cursor.offset == 0 and cursor.restarted and cursor.inode == "8"


def test_a_new_log_file_is_a_new_load():
    log = ServerLog()
    fail = b"(EngineCore_DP0 pid=9) ERROR 06-02 10:30:01 [core.py:1] EngineCore failed to start.\n"
    log.prime_log("1", len(fail), fail, 0, 1.0)
    assert log.tracker.phase == "failed"
    log.feed_log("2", 10, b"", 2.0, limit=1 << 20)  # the restart moved the old log aside
    assert log.tracker.phase == "unknown" and log.tracker.error is None


def test_journal_lines_of_an_earlier_run_never_reach_the_tracker():
    from console.parsers.journal import parse_journal_json

    def entry(cursor, inv, msg):
        return parse_journal_json(json.dumps({"__CURSOR": cursor, "__REALTIME_TIMESTAMP": "1000000",
                                              "_SYSTEMD_INVOCATION_ID": inv, "MESSAGE": msg}))

    log = ServerLog()
    fail = "(EngineCore_DP0 pid=9) ERROR 06-02 10:30:01 [core.py:1] EngineCore failed to start."
    start = "(APIServer pid=5) INFO 06-02 10:31:00 [api_server.py:1] vLLM server version 0.33.0, serving model m"
    log.feed_backlog([entry("c1", "old", fail), entry("c2", "new", start)], "new")
    assert log.tracker.phase == "starting"
    assert log.feed_entry(entry("c3", "old", fail)) is False  # a late line of the failed run
    assert log.tracker.phase == "starting"
    assert log.feed_entry(entry("c2", "new", start)) is None  # seen before
    assert log.begin_invocation("newer") and log.tracker.phase == "unknown"  # the probe saw a restart


def test_a_probe_older_than_the_stream_never_brings_an_ended_run_back():
    """Restart under one name while a probe is under way: the probe read the unit's InvocationID before
    the stop and answers after the stream saw the new run's first lines. Taking its word would file the
    new run as an earlier one, and its ready lines would then start no ready ask."""
    from console.parsers.journal import parse_journal_json

    def entry(cursor, inv, msg):
        return parse_journal_json(json.dumps({"__CURSOR": cursor, "__REALTIME_TIMESTAMP": "1000000",
                                              "_SYSTEMD_INVOCATION_ID": inv, "MESSAGE": msg}))

    log = ServerLog()
    assert log.begin_invocation("first")
    start = "(APIServer pid=5) INFO 06-02 10:31:00 [api_server.py:1] vLLM server version 0.33.0, serving model m"
    assert log.feed_entry(entry("c1", "second", start)) is True  # the stream: the restart's first line
    assert not log.begin_invocation("first")  # the probe's older answer
    assert log.invocation == "second"
    ready = "(APIServer pid=5) INFO:     Application startup complete."
    assert log.feed_entry(entry("c2", "second", ready)) is True
    assert stage_unit_name("generate", "r") == "e3-generate-r"
