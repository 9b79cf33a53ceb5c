"""Run lookup: the pipeline's host-side stages, in order, and how each finds the output of the one before it.

Each stage is `python -m backend.<stage>` writing its own run directory (backend/contract/runs.py). When it
completes, its summary.json names what it produced under `outputs` (absolute paths on the host), and
the stage that consumes it is given the producing run's id (`--input-run`), never a guessed path. A run
that is still going, failed or was stopped is refused as input with a message that says so.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from backend.contract import stages as host_stages
from backend.contract.events import EVENTS_FILE, parse_events
from backend.contract.runs import SUMMARY_FILE, RunDirError, read_manifest, run_path

# Host-side stages in pipeline order, and the stage whose output each consumes by default: the host's
# stage table (backend/contract/stages.py) as it stands at import; serving and benchmarking are driven by
# the console.
STAGES: tuple[str, ...] = host_stages.pipeline()
INPUT_STAGE: dict[str, str] = host_stages.input_stages()


class InputError(RunDirError):
    """The run named as a stage's input cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class CompletedRun:
    stage: str
    run_id: str
    path: str
    summary: dict[str, Any]
    outputs: dict[str, str] = field(default_factory=dict)

    def output(self, name: str) -> str:
        """An output's path, or an InputError naming the run and what it lacks."""
        path = self.outputs.get(name)
        if not path:
            raise InputError(f"{self.stage} run {self.run_id} has no output {name!r} "
                             f"(it has: {', '.join(sorted(self.outputs)) or 'none'})")
        return path


def _outputs(summary: dict[str, Any]) -> dict[str, str]:
    out = summary.get("outputs")
    outputs = {str(k): str(v) for k, v in out.items() if v} if isinstance(out, dict) else {}
    # the generation stage names its files at the top level of its summary
    if isinstance(summary.get("output"), str):
        outputs.setdefault("records", summary["output"])
    rows = summary.get("token_rows")
    if isinstance(rows, dict) and isinstance(rows.get("path"), str):
        outputs.setdefault("token_rows", rows["path"])
    return outputs


def last_finish(path: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(path, EVENTS_FILE), "rb") as f:
            events, _ = parse_events(f.read())
    except OSError:
        return None
    finishes = [e for e in events if e.kind in ("start", "finish")]
    if not finishes or finishes[-1].kind != "finish":
        return None
    return dict(finishes[-1].data)


def completed_run(work_dir: str, run_id: str, stage: str) -> CompletedRun:
    """The completed run `run_id` of `stage`, or an InputError saying why it cannot be used."""
    path = run_path(work_dir, run_id)
    if not os.path.isdir(path):
        raise InputError(f"no run {run_id!r} in {os.path.dirname(path)}")
    manifest = read_manifest(path)
    if manifest is None or manifest.stage != stage:
        found = manifest.stage if manifest else "no manifest"
        raise InputError(f"run {run_id!r} is not a {stage} run ({found})")
    finish = last_finish(path)
    if finish is None:
        raise InputError(f"{stage} run {run_id} has not finished (still running, or it died without a "
                         f"word): wait for it, or resume it by starting it again with --run-id {run_id}")
    status = finish.get("status")
    if status != "completed":
        why = (finish.get("summary") or {}).get("error") if isinstance(finish.get("summary"), dict) else None
        raise InputError(f"{stage} run {run_id} {status or 'did not complete'}"
                         + (f": {why}" if why else "") + f"; resume it with --run-id {run_id}")
    try:
        with open(os.path.join(path, SUMMARY_FILE), encoding="utf-8") as f:
            summary = json.load(f)
    except (OSError, ValueError) as exc:
        raise InputError(f"{stage} run {run_id}: cannot read its {SUMMARY_FILE}: {exc}") from exc
    if not isinstance(summary, dict):
        raise InputError(f"{stage} run {run_id}: {SUMMARY_FILE} is not a JSON object")
    return CompletedRun(stage=stage, run_id=run_id, path=path, summary=summary, outputs=_outputs(summary))


def latest_completed(work_dir: str, stage: str, where: Callable[[CompletedRun], bool] | None = None) -> CompletedRun:
    """The most recently finished completed run of `stage` (the default input of the next stage); `where`:
    only the runs it accepts."""
    runs_dir = os.path.join(os.path.abspath(work_dir), "runs")
    candidates: list[tuple[float, str]] = []
    for name in os.listdir(runs_dir) if os.path.isdir(runs_dir) else ():
        manifest = _quiet_manifest(os.path.join(runs_dir, name))
        if manifest is not None and manifest.stage == stage:
            summary = os.path.join(runs_dir, name, SUMMARY_FILE)
            if os.path.exists(summary):
                candidates.append((os.path.getmtime(summary), name))
    for _, run_id in sorted(candidates, reverse=True):
        try:
            run = completed_run(work_dir, run_id, stage)
        except InputError:
            continue
        if where is None or where(run):
            return run
    raise InputError(f"no completed {stage} run in {runs_dir}: run `{stage}` first, or name one with --input")


def _quiet_manifest(path: str):
    try:
        return read_manifest(path)
    except RunDirError:
        return None
