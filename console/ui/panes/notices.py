"""Which state changes between two snapshots deserve a toast (pure, so it is tested without an app)."""
from __future__ import annotations

from dataclasses import dataclass

from console.snapshot import Snapshot


@dataclass(frozen=True)
class Notice:
    text: str
    severity: str = "information"  # Textual notify severities: information | warning | error


def transitions(prev: Snapshot | None, new: Snapshot) -> list[Notice]:
    if prev is None or not new.host.reachable:
        return []
    notices = []
    before, after = prev.server.phase, new.server.phase
    if after != before:
        if after == "ready":
            notices.append(Notice(f"Server ready: {new.server.model_id or 'model'}"))
        elif after == "failed":
            notices.append(Notice(f"Server load failed: {new.server.error or 'see journal'}", "error"))
    old_states = {(r.stage, r.run_id): r.state for r in prev.runs}
    for run in new.runs:
        old = old_states.get((run.stage, run.run_id))
        if old is None or old == run.state:
            continue
        if run.state == "done":
            notices.append(Notice(f"Stage {run.stage} finished ({run.run_id})"))
        elif run.state == "failed":
            notices.append(Notice(f"Stage {run.stage} failed ({run.run_id})", "error"))
    return notices
