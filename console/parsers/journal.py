"""`journalctl -o json` lines -> JournalEntry, and the argv that follows a unit across reconnects.

journald stores a message containing '\\r' or invalid UTF-8 as binary: in JSON its MESSAGE is then a
list of byte values instead of a string (tqdm bars always hit this). MESSAGE may also be null.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from console.parsers.vllm_log import split_cr


@dataclass(frozen=True)
class JournalEntry:
    cursor: str | None
    ts: float | None  # unix seconds, from __REALTIME_TIMESTAMP (microseconds)
    message: str
    unit: str | None = None
    pid: int | None = None
    priority: int | None = None  # syslog level: 3 = err, 4 = warning, 6 = info
    from_manager: bool = False  # systemd's own line about the unit ("Started ...", "Main process exited")
    invocation: str | None = None  # which run of the unit wrote it (`_SYSTEMD_INVOCATION_ID`)


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        data = bytes(b for b in value if isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256)
        return data.decode("utf-8", errors="replace")
    return str(value)


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value) if isinstance(value, (int, str)) else None
    except ValueError:
        return None


def parse_journal_json(line: str | bytes) -> JournalEntry | None:
    """One `journalctl -o json` line -> JournalEntry; None for anything that is not a JSON object
    (e.g. `-- No entries --`, a truncated line after a dropped connection)."""
    if isinstance(line, (bytes, bytearray)):
        line = bytes(line).decode("utf-8", errors="replace")
    if not isinstance(line, str):
        return None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    usec = _int(record.get("__REALTIME_TIMESTAMP"))
    cursor = record.get("__CURSOR")
    system_unit = record.get("_SYSTEMD_UNIT")
    manager_unit = record.get("UNIT") or record.get("USER_UNIT")
    from_manager = bool(manager_unit) and (system_unit in (None, "init.scope") or _int(record.get("_PID")) == 1)
    unit = manager_unit if from_manager else (system_unit or manager_unit)
    # the program's own lines carry `_SYSTEMD_INVOCATION_ID`; systemd's lines about the unit `INVOCATION_ID`
    invocation = record.get("_SYSTEMD_INVOCATION_ID") or (record.get("INVOCATION_ID") if from_manager else None)
    return JournalEntry(
        cursor=cursor if isinstance(cursor, str) and cursor else None,
        ts=usec / 1_000_000 if usec is not None and usec >= 0 else None,
        message=split_cr(_text(record.get("MESSAGE"))),
        unit=unit if isinstance(unit, str) else None,
        pid=_int(record.get("_PID")),
        priority=_int(record.get("PRIORITY")),
        from_manager=from_manager,
        invocation=invocation if isinstance(invocation, str) and invocation else None,
    )


def journal_follow_argv(unit: str, cursor: str | None = None, lines: int = 200) -> list[str]:
    """Follow UNIT as JSON. With a cursor, resume right after it (no duplicate, no gap) instead of
    replaying the last `lines` entries."""
    argv = ["journalctl", "-u", unit, "-a", "-o", "json", "-f", "--no-pager"]
    if cursor:
        argv.append(f"--after-cursor={cursor}")
    else:
        argv += ["-n", str(max(0, int(lines)))]
    return argv
