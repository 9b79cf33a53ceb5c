"""The events.jsonl contract between stage programs (host side) and the console.

A stage appends one JSON object per line to `<run dir>/events.jsonl`; the console reads the file
incrementally by byte offset over SSH. Both sides import this module so the format is defined once.

Every event has: `ts` (unix seconds), `kind`, `stage`, `run_id`. Kinds and their extra keys:
- start:    total, manifest (dict)
- progress: done, total, failed, skipped, truncated, reasoning_captured, prompt_tokens,
            completion_tokens, rate (samples/s), bytes_written (generation).
            Train (backend/train/metrics.py, backend/train/worker.py) adds `phase`:
              plan:       total (steps, re-estimated each epoch), steps_per_epoch, epochs
              train:      step (0-based), done, total, epoch, loss, loss_k, acc_k, cond_acc_k (lists by draft
                          position), lr (lr_groups with several optimizers), rate (steps/s), eta_s,
                          tokens_per_s, step_ms
              val:        step (the last step trained), done, total, epoch, val_loss, val_loss_k, val_acc_k,
                          val_cond_acc_k
              checkpoint: checkpoint (path), checkpoint_kind (epoch | mid_epoch | interrupt), epoch, step
              best:       best_checkpoint (path), best_val_loss, epoch
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

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

EVENTS_FILE = "events.jsonl"
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
        data = {k: v for k, v in record.items() if k not in ("ts", "kind", "stage", "run_id")}
        return cls(kind=str(record.get("kind", "")), stage=str(record.get("stage", "")),
                   run_id=str(record.get("run_id", "")), ts=float(record.get("ts", 0.0)), data=data)


class EventLog:
    """Appends events; each line is written with one os.write so a crash leaves at most one torn line."""

    def __init__(self, path: str, stage: str, run_id: str):
        self.path = path
        self.stage = stage
        self.run_id = run_id
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(self, kind: str, *, fsync: bool = False, **data: Any) -> Event:
        event = Event(kind=kind, stage=self.stage, run_id=self.run_id, data=data)
        os.write(self._fd, event.to_line())
        if fsync or kind in ("start", "finish", "error"):
            os.fsync(self._fd)
        return event

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def parse_events(chunk: bytes) -> tuple[list[Event], int]:
    """Parse complete lines of `chunk`; return the events and how many bytes were consumed.

    An unterminated last line is left for the next read (it may still be being written); a line
    that is not valid JSON (torn by a crash, then followed by more writes) is skipped, never raised.
    """
    events: list[Event] = []
    end = chunk.rfind(b"\n")
    if end < 0:
        return events, 0
    for line in chunk[: end + 1].splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            events.append(Event.from_record(record))
    return events, end + 1
