"""Run directories as a host program leaves them (manifest, start and finish events, a payload), aged
on demand: what the prune and the runs views are tested on."""
from __future__ import annotations

import os
import time
from pathlib import Path

from backend.contract.events import EventLog
from backend.contract.runs import Manifest, open_run_dir

DAY = 86400.0


def make_run(work: Path, run_id: str, stage: str, *, status: str | None = "completed", input_run: str | None = None,
             age_s: float = 0.0, payload: int = 4096, stages: list | None = None) -> Path:
    identity = {"input_run": input_run} if input_run else {}
    if stages:
        identity = {"stages": stages}
    rd = open_run_dir(str(work), run_id, Manifest(stage=stage, run_id=run_id, identity=identity))
    log = EventLog(rd.events_path, stage, run_id)
    log.emit("start", total=1)
    if status:
        log.emit("finish", status=status, summary={"status": status})
    Path(rd.path, "data.bin").write_bytes(b"x" * payload)
    when = time.time() - age_s
    for p in (Path(rd.path, "events.jsonl"), Path(rd.path)):
        os.utime(p, (when, when))
    return Path(rd.path)
