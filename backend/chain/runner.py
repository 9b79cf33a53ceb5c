"""Runs a plan's stage programs in order (see backend/chain/__init__.py)."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Any

from backend.chain.requirements import check_plan
from backend.chain.plan import PLAN_FILE, PlanError, PlannedStage, dumps_plan, load_plan
from backend.events import EventLog
from backend.pipeline import InputError, completed_run, last_finish
from backend.runs import Manifest, RunDirError, open_run_dir, run_path, write_json_atomic

STAGE = "pipeline"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m backend.chain", description=__doc__)
    p.add_argument("--work-dir", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--plan", required=True, help="the plan JSON (backend/chain/plan.py)")
    p.add_argument("--fresh", action="store_true", help="archive an existing chain run directory and start over")
    return p.parse_args(argv)


class Chain:
    def __init__(self, work_dir: str, run_id: str, stages: list[PlannedStage]):
        self.work_dir = work_dir
        self.run_id = run_id
        self.stages = stages
        self.child: subprocess.Popen | None = None
        self.stopping = False
        self.log: EventLog | None = None

    def _on_signal(self, sig: int, _frame) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(sig)  # the stage stops cleanly and leaves itself resumable

    def run(self, fresh: bool = False) -> int:
        identity = {"stages": [[s.stage, s.run_id] for s in self.stages]}
        try:
            rd = open_run_dir(self.work_dir, self.run_id, Manifest(stage=STAGE, run_id=self.run_id, identity=identity),
                              fresh=fresh)
        except RunDirError as exc:
            print(f"pipeline: {exc}", file=sys.stderr)
            return 2
        with open(rd.file(PLAN_FILE), "w", encoding="utf-8") as f:
            f.write(dumps_plan(self.stages))  # what this run was asked to do, for whoever looks later
        self.log = EventLog(rd.events_path, STAGE, self.run_id)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        names = [s.stage for s in self.stages]
        self.log.emit("start", total=len(self.stages), stages=names, resumed=rd.resumed)
        results: list[dict[str, Any]] = []
        status, error = "completed", None
        started = time.monotonic()
        problems = check_plan(self.work_dir, self._not_completed())
        if problems:  # before the first stage: a missing piece costs seconds, not a generation run
            status = "failed"
            error = "host requirements: " + "; ".join(p.line() for p in problems)
            results.append({"stage": problems[0].stage, "run_id": next(
                s.run_id for s in self.stages if s.stage == problems[0].stage), "status": "failed",
                "error": error, "requirements": [p.__dict__ for p in problems]})
        for i, planned in enumerate(self.stages if not problems else []):
            if self.stopping:
                status = "stopped"
                break
            outcome = self._run_stage(planned, i)
            results.append(outcome)
            if outcome["status"] != "completed":
                status = "stopped" if self.stopping else "failed"
                error = outcome.get("error")
                break
        done = sum(1 for r in results if r["status"] == "completed")
        summary: dict[str, Any] = {"stage": STAGE, "run_id": self.run_id, "status": status, "done": done,
                                   "total": len(self.stages), "stages": results,
                                   "runs": {s.stage: s.run_id for s in self.stages},
                                   "elapsed_s": round(time.monotonic() - started, 1)}
        if error:
            summary["error"] = error
            summary["failed_stage"] = results[-1]["stage"]
        if status == "completed":
            last = completed_run(self.work_dir, self.stages[-1].run_id, self.stages[-1].stage)
            summary["outputs"] = last.outputs
        write_json_atomic(rd.summary_path, summary)
        self.log.emit("finish", status=status, summary=summary)
        print(f"pipeline: {status}: {done}/{len(self.stages)} stages" + (f" ({error})" if error else ""),
              file=sys.stderr)
        return 0 if status in ("completed", "stopped") else 1

    def _not_completed(self) -> list[PlannedStage]:
        out = []
        for planned in self.stages:
            try:
                completed_run(self.work_dir, planned.run_id, planned.stage)
            except InputError:
                out.append(planned)
        return out

    def _run_stage(self, planned: PlannedStage, index: int) -> dict[str, Any]:
        assert self.log is not None
        result = {"stage": planned.stage, "run_id": planned.run_id}
        try:
            completed_run(self.work_dir, planned.run_id, planned.stage)
            self.log.emit("progress", done=index + 1, total=len(self.stages), current=planned.stage,
                          current_run=planned.run_id, note="completed before: not run again")
            return {**result, "status": "completed", "skipped": True}
        except InputError:
            pass  # not run yet, or stopped or failed before: run it (a stage resumes itself)
        self.log.emit("progress", done=index, total=len(self.stages), current=planned.stage,
                      current_run=planned.run_id)
        print(f"pipeline: {planned.stage} ({planned.run_id}): {' '.join(planned.argv)}", file=sys.stderr, flush=True)
        try:
            self.child = subprocess.Popen(list(planned.argv), env={**os.environ, **planned.env})
        except OSError as exc:
            return {**result, "status": "failed", "error": f"{planned.stage} could not start: {exc.strerror}"}
        code = self.child.wait()
        self.child = None
        try:
            completed_run(self.work_dir, planned.run_id, planned.stage)
            self.log.emit("progress", done=index + 1, total=len(self.stages), current=planned.stage,
                          current_run=planned.run_id)
            return {**result, "status": "completed", "exit": code}
        except InputError as exc:
            finish = last_finish(run_path(self.work_dir, planned.run_id)) or {}
            summary = finish.get("summary") if isinstance(finish.get("summary"), dict) else {}
            why = summary.get("error") or f"exit {code}" + ("" if finish else f"; {exc}")
            state = finish.get("status") or "failed"
            return {**result, "status": state if state in ("stopped", "failed") else "failed", "exit": code,
                    "error": f"{planned.stage} run {planned.run_id} {state}: {why}"}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        stages = load_plan(args.plan)
    except PlanError as exc:
        print(f"pipeline: {exc}", file=sys.stderr)
        return 2
    return Chain(args.work_dir, args.run_id, stages).run(fresh=args.fresh)
