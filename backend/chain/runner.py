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
from backend.lifecycle import StageFailed, StageRun, refuse
from backend.lookup import InputError, completed_run, last_finish
from backend.runs import Manifest, run_path

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
        self.ctx: StageRun | None = None
        self.results: list[dict[str, Any]] = []
        self.started = time.monotonic()

    @property
    def stopping(self) -> bool:
        return bool(self.ctx and self.ctx.stopping)

    def _forward(self, name: str) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(getattr(signal, name))  # the stage stops cleanly and leaves itself resumable

    def run(self, fresh: bool = False) -> int:
        identity = {"stages": [[s.stage, s.run_id] for s in self.stages]}
        ctx = self.ctx = StageRun(STAGE, self.run_id, work_dir=self.work_dir, fresh=fresh, mode="flag",
                                  manifest=Manifest(stage=STAGE, run_id=self.run_id, identity=identity))
        ctx.on_stop(self._forward)
        ctx.summarize = self._summarize
        ctx.stop_note = "the running stage is stopped; it resumes when the pipeline is started again"
        return ctx.run(self._body)

    def _body(self, ctx: StageRun) -> None:
        with open(ctx.file(PLAN_FILE), "w", encoding="utf-8") as f:
            f.write(dumps_plan(self.stages))  # what this run was asked to do, for whoever looks later
        ctx.start(total=len(self.stages), stages=[s.stage for s in self.stages])
        self.started = time.monotonic()
        problems = check_plan(self.work_dir, self._not_completed())
        if problems:  # before the first stage: a missing piece costs seconds, not a generation run
            error = "host requirements: " + "; ".join(p.line() for p in problems)
            self.results.append({"stage": problems[0].stage, "run_id": next(
                s.run_id for s in self.stages if s.stage == problems[0].stage), "status": "failed",
                "error": error, "requirements": [p.__dict__ for p in problems]})
            raise StageFailed(error)
        for i, planned in enumerate(self.stages):
            if self.stopping:
                return
            outcome = self._run_stage(planned, i)
            self.results.append(outcome)
            if outcome["status"] != "completed":
                if self.stopping:
                    return
                raise StageFailed(outcome.get("error") or f"{planned.stage} did not complete")

    def _summarize(self, status: str, error: str | None) -> dict[str, Any]:
        results = self.results
        done = sum(1 for r in results if r["status"] == "completed")
        summary: dict[str, Any] = {"stage": STAGE, "run_id": self.run_id, "status": status, "done": done,
                                   "total": len(self.stages), "stages": results,
                                   "runs": {s.stage: s.run_id for s in self.stages},
                                   "elapsed_s": round(time.monotonic() - self.started, 1)}
        if error:
            summary["error"] = error
            if results and results[-1]["status"] != "completed":
                summary["failed_stage"] = results[-1]["stage"]
        if status == "completed":
            last = completed_run(self.work_dir, self.stages[-1].run_id, self.stages[-1].stage)
            summary["outputs"] = last.outputs
        print(f"pipeline: {status}: {done}/{len(self.stages)} stages" + (f" ({error})" if error else ""),
              file=sys.stderr)
        return summary

    def _not_completed(self) -> list[PlannedStage]:
        out = []
        for planned in self.stages:
            try:
                completed_run(self.work_dir, planned.run_id, planned.stage)
            except InputError:
                out.append(planned)
        return out

    def _run_stage(self, planned: PlannedStage, index: int) -> dict[str, Any]:
        assert self.ctx is not None
        emit = self.ctx.emit
        result = {"stage": planned.stage, "run_id": planned.run_id}
        try:
            completed_run(self.work_dir, planned.run_id, planned.stage)
            emit("progress", done=index + 1, total=len(self.stages), current=planned.stage,
                          current_run=planned.run_id, note="completed before: not run again")
            return {**result, "status": "completed", "skipped": True}
        except InputError:
            pass  # not run yet, or stopped or failed before: run it (a stage resumes itself)
        emit("progress", done=index, total=len(self.stages), current=planned.stage,
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
            emit("progress", done=index + 1, total=len(self.stages), current=planned.stage,
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
        return refuse("pipeline", exc)
    return Chain(args.work_dir, args.run_id, stages).run(fresh=args.fresh)
