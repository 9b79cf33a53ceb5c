from __future__ import annotations

from pathlib import Path

import pytest

from console.parsers.journal import JournalEntry, journal_follow_argv, parse_journal_json
from console.parsers.vllm_log import parse_line

SAMPLES = Path(__file__).parent / "samples" / "journal"


def entries() -> list[JournalEntry | None]:
    return [parse_journal_json(line) for line in (SAMPLES / "vllm_follow.jsonl").read_text().splitlines()]


def test_string_message_and_fields():
    e = entries()[1]
    assert e.cursor.startswith("s=9b1f2c0e8c5d4f7e9c2b1a0f3e4d5c6b;i=102;")
    assert e.ts == pytest.approx(1717316402.123456)
    assert e.message.endswith("serving model m")
    assert (e.unit, e.pid, e.priority, e.from_manager) == ("vllm.service", 40211, 6, False)


def test_manager_lines_are_attributed_to_the_unit():
    first, last = entries()[0], entries()[-1]
    assert (first.unit, first.pid, first.from_manager) == ("vllm.service", 1, True)
    assert first.message == "Started vllm.service - vLLM server."
    assert (last.priority, last.from_manager) == (4, True)


def test_byte_array_message_with_cr_keeps_last_redraw():
    e = entries()[2]
    assert e.message == "Loading safetensors checkpoint shards: 100% Completed | 4/4 [00:11<00:00,  2.88s/it]"
    assert parse_line(e.message).done == 4


def test_invalid_utf8_is_replaced():
    assert entries()[3].message == "(Worker_TP0 pid=40401) bad utf8 \ufffd\ufffd here"


def test_null_message():
    assert entries()[4].message == ""


@pytest.mark.parametrize("line", [
    "-- No entries --", "", "   ", "[1, 2, 3]", '"just a string"', '{"MESSAGE": "trunc', None, 42, b"\xff\xfe",
    "-- Journal begins at Mon 2024-06-03 10:00:00 UTC. --",
])
def test_non_json_lines_are_none(line):
    assert parse_journal_json(line) is None


@pytest.mark.parametrize("record,expected", [
    ('{"MESSAGE": [104, 105]}', JournalEntry(cursor=None, ts=None, message="hi")),
    ('{"MESSAGE": [104, 300, -1, "x", true, 105]}', JournalEntry(cursor=None, ts=None, message="hi")),
    ('{"MESSAGE": 12, "__REALTIME_TIMESTAMP": "abc", "_PID": "x"}', JournalEntry(None, None, "12")),
    ('{"__REALTIME_TIMESTAMP": "-5", "__CURSOR": ""}', JournalEntry(None, None, "")),
    ('{"MESSAGE": {"nested": 1}}', JournalEntry(None, None, "{'nested': 1}")),
])
def test_odd_records(record, expected):
    assert parse_journal_json(record) == expected


def test_bytes_input_is_accepted():
    assert parse_journal_json(b'{"MESSAGE": "ok"}').message == "ok"


def test_follow_argv():
    assert journal_follow_argv("vllm.service") == [
        "journalctl", "-u", "vllm.service", "-a", "-o", "json", "-f", "--no-pager", "-n", "200"]
    assert journal_follow_argv("vllm.service", lines=50)[-1] == "50"
    cursor = "s=9b1f;i=102;b=5f1c;m=1a2b;t=6151;x=8c1e"
    argv = journal_follow_argv("vllm.service", cursor=cursor)
    assert argv[-1] == f"--after-cursor={cursor}" and "-n" not in argv
