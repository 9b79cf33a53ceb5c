"""Which state changes between two snapshots deserve a toast (pure, so it is tested without an app)."""
from __future__ import annotations

from dataclasses import dataclass

from console.snapshot import Snapshot


@dataclass(frozen=True)
class Notice:
    text: str
    severity: str = "information"  # Textual notify severities: information | warning | error
    event: str = ""  # load_ready | load_failed | stage_completed | stage_failed (console/ui/calls.py)
    stage: str | None = None
    run_id: str | None = None
    model: str | None = None
    error: str | None = None


def transitions(prev: Snapshot | None, new: Snapshot) -> list[Notice]:
    if prev is None or not new.host.reachable:
        return []
    notices = []
    before, after = prev.server.phase, new.server.phase
    if after != before:
        if after == "ready":
            notices.append(Notice(f"Server ready: {new.server.model_id or 'model'}", event="load_ready",
                                  model=new.server.model_id))
        elif after == "failed":
            notices.append(Notice(f"Server load failed: {new.server.error or 'see journal'}", "error",
                                  event="load_failed", error=new.server.error))
    old_states = {(r.stage, r.run_id): r.state for r in prev.runs}
    for run in new.runs:
        old = old_states.get((run.stage, run.run_id))
        if old is None or old == run.state:
            continue
        if run.state == "done":
            notices.append(Notice(f"Stage {run.stage} finished ({run.run_id})", event="stage_completed",
                                  stage=run.stage, run_id=run.run_id))
        elif run.state == "failed":
            error = (run.last_event or {}).get("error") if isinstance(run.last_event, dict) else None
            notices.append(Notice(f"Stage {run.stage} failed ({run.run_id})", "error", event="stage_failed",
                                  stage=run.stage, run_id=run.run_id, error=error if isinstance(error, str) else None))
    return notices
