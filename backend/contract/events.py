"""The events.jsonl contract between stage programs (host side) and the console.

A stage appends one JSON object per line to `<run dir>/events.jsonl`; the console reads the file
incrementally by byte offset over SSH. Both sides import this module so the format is defined once.

Every event has: `ts` (unix seconds), `kind`, `stage`, `run_id`. Kinds and their extra keys:
- start:    total, manifest (dict), unit (the systemd unit or tmux session it runs in, from E3_UNIT);
            generation also the progress counters as found on disk
- progress: done, total, failed, skipped, truncated, reasoning_captured, prompt_tokens,
            completion_tokens, rate (samples/s), bytes_written (generation).
            Generation: `total` is the dataset rows in scope in every event; `skipped_by_reason` and
            `failed_by_reason` count the rows left out and the samples that failed, `failed_permanent`
            those a rerun cannot fix, `reduced` the records sent with a cut max_tokens. A progress event
            follows every durable batch, so the last one says what is on disk.
            Train (backend/train/metrics.py, backend/train/worker.py) adds `phase`:
              plan:       total (steps, re-estimated each epoch), steps_per_epoch, epochs
              train:      step (0-based), done, total, epoch, loss, loss_k, acc_k, cond_acc_k (lists by draft
                          position), lr (lr_groups with several optimizers), rate (steps/s), eta_s,
                          tokens_per_s, step_ms
              val:        step (the last step trained), done, total, epoch, val_loss, val_loss_k, val_acc_k,
                          val_cond_acc_k
              checkpoint: checkpoint (path), checkpoint_kind (epoch | mid_epoch | interrupt), epoch, step
              best:       best_checkpoint (path), best_val_loss, epoch
              acceptance: epoch, step, mean_acceptance_length, per_position, anchors, val_loss, chosen_epoch,
                          stale_epochs, patience, stop (held-out acceptance of the epoch's checkpoint:
                          backend/train/selection.py)
            Verify: done, total, phase.
- pause:    reason
- resume:   (generation: the server is back, waited_s)
            train: step, epoch, local_step, checkpoint: training restarts from a checkpoint at `step`. Every
            progress event with a `step` >= this step written BEFORE this event is superseded (after a
            kill -9 the steps since the last checkpoint are trained again): a reader drops them.
- error:    message, fatal (bool)
- finish:   status ("completed" | "stopped" | "failed"), summary (dict)
"""
from __future__ import annotations

import errno
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from backend.contract.numbers import finite

EVENTS_FILE = "events.jsonl"
# The systemd unit or tmux session the stage runs in, set by whoever started it (a pipeline's stages run
# inside the chain's unit); the start event carries it.
UNIT_ENV = "E3_UNIT"
KINDS = ("start", "progress", "pause", "resume", "error", "finish")


@dataclass
class Event:
    kind: str
    stage: str
    run_id: str
    ts: float = field(default_factory=time.time)
    data: dict[str, Any] = field(default_factory=dict)

    def to_line(self) -> bytes:
        record = {"ts": round(self.ts, 3), "kind": self.kind, "stage": self.stage, "run_id": self.run_id}
        record.update(self.data)
        return (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode()

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> "Event":
        """Raises BadEvent when a key every event has is of the wrong type (a foreign or hostile writer:
        `"ts":"x"`, `"ts":null`, a list for a stage); readers skip that line and count it."""
        ts = finite(record.get("ts", 0.0))
        if ts is None:
            raise BadEvent(f"ts is not a finite number: {str(record.get('ts'))[:40]!r}")
        names = {}
        for key in ("kind", "stage", "run_id"):
            value = record.get(key, "")
            if not isinstance(value, str):
                raise BadEvent(f"{key} is not a string")
            names[key] = value
        data = {k: v for k, v in record.items() if k not in ("ts", "kind", "stage", "run_id")}
        return cls(ts=ts, data=data, **names)


class BadEvent(ValueError):
    """A JSON object that is not an event (a key every event has is missing its type)."""


class EventWriteFailed(OSError):
    """An event could not be written whole; the file was cut back to where it was (no torn line)."""


# The keys of a finish summary that say how the run ended; when the whole finish event no longer fits
# on a full disk, a finish with only these is tried, so the run still reads "failed: <why>", not stale.
FINISH_ESSENTIALS = ("status", "error", "done", "total", "failed", "skipped")
TAIL_SCAN = 1 << 16


class EventLog:
    """Appends events, each line whole or not at all.

    A line is written with os.write calls until complete; if that fails (a full disk writes part of it
    and then refuses the rest) the file is cut back to its size before the line, so a reader never sees
    half an event and the next line is never glued to one. Opening drops a torn last line left by a
    crash (its bytes are kept in a side file), for the same reason."""

    def __init__(self, path: str, stage: str, run_id: str):
        self.path = path
        self.stage = stage
        self.run_id = run_id
        self._fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self.dropped_tail = drop_torn_tail(self._fd, path)
        except BaseException:
            os.close(self._fd)
            raise

    def emit(self, kind: str, *, fsync: bool = False, **data: Any) -> Event:
        if kind == "start" and "unit" not in data and os.environ.get(UNIT_ENV):
            data["unit"] = os.environ[UNIT_ENV]  # where the console asks whether this run is alive
        event = Event(kind=kind, stage=self.stage, run_id=self.run_id, data=data)
        sync = fsync or kind in ("start", "finish", "error")
        try:
            self._append(event.to_line(), sync)
        except EventWriteFailed:
            compact = _compact_finish(event)
            if compact is None:
                raise
            self._append(compact.to_line(), True)
            return compact
        return event

    def _append(self, line: bytes, sync: bool) -> None:
        before = os.fstat(self._fd).st_size
        try:
            view = memoryview(line)
            while view:
                written = os.write(self._fd, view)
                if written <= 0:
                    raise OSError(errno.ENOSPC, "no progress writing (disk full?)")
                view = view[written:]
            if sync:
                os.fsync(self._fd)
        except OSError as exc:
            try:
                os.ftruncate(self._fd, before)
            except OSError:
                pass
            raise EventWriteFailed(exc.errno or errno.EIO,
                                   f"{self.path}: event not written ({exc.strerror or exc}); "
                                   f"the file was cut back to {before} bytes") from exc

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _compact_finish(event: Event) -> Event | None:
    if event.kind != "finish":
        return None
    summary = event.data.get("summary")
    small = {k: summary[k] for k in FINISH_ESSENTIALS if isinstance(summary, dict) and k in summary}
    data = {"status": event.data.get("status"), "summary": small, "compact": True}
    return Event(kind=event.kind, stage=event.stage, run_id=event.run_id, ts=event.ts, data=data)


def drop_torn_tail(fd: int, path: str) -> str | None:
    """Cut an unterminated last line (a crash mid-write) off the events file open at `fd`; return the
    side file keeping its bytes, or None when the file ends cleanly."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return None
    end = size
    keep = 0
    while end > 0:  # find the last newline, reading backwards in blocks
        start = max(0, end - TAIL_SCAN)
        block = os.pread(fd, end - start, start)
        at = block.rfind(b"\n")
        if at >= 0:
            keep = start + at + 1
            break
        end = start
    side = f"{path}.torn-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    with open(side, "wb") as f:
        f.write(os.pread(fd, size - keep, keep))
        f.flush()
        os.fsync(f.fileno())
    os.ftruncate(fd, keep)
    os.fsync(fd)
    return side


def _finite_or_none(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def load_json(line: bytes | str) -> Any:
    """One JSON value as a reader of another program's file takes it: `NaN`, `Infinity` and numbers that
    overflow a float (`1e999`) read as null, so no non-finite float gets past here; raises ValueError for
    anything that is not JSON, nested too deep (RecursionError) or with an integer too long to convert."""
    try:
        return json.loads(line, parse_float=_finite_or_none, parse_constant=lambda _name: None)
    except RecursionError as exc:
        raise ValueError("nested too deep") from exc


@dataclass
class ParsedEvents:
    events: list[Event]
    consumed: int  # bytes of the chunk that were whole lines
    skipped: int = 0  # whole lines that were not an event (not JSON, not an object, wrong types)


def read_events(chunk: bytes) -> ParsedEvents:
    """Parse the complete lines of `chunk`.

    An unterminated last line is left for the next read (it may still be being written); a line that is
    not an event (torn by a crash then followed by more writes, or written by a foreign or hostile
    program) is skipped and counted, never raised: its blast radius is that one line."""
    out = ParsedEvents([], 0)
    end = chunk.rfind(b"\n")
    if end < 0:
        return out
    out.consumed = end + 1
    for line in chunk[: end + 1].splitlines():
        if not line.strip():
            continue
        try:
            record = load_json(line)
            if not isinstance(record, dict):
                raise BadEvent("not a JSON object")
            out.events.append(Event.from_record(record))
        except ValueError:
            out.skipped += 1
    return out


def parse_events(chunk: bytes) -> tuple[list[Event], int]:
    """read_events without the count of skipped lines: (events, bytes consumed)."""
    parsed = read_events(chunk)
    return parsed.events, parsed.consumed
