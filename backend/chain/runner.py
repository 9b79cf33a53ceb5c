"""Runs a plan's stage programs in order (see backend/chain/__init__.py)."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import time
from typing import Any

from backend.chain.plan import PLAN_FILE, ChainPlan, Hold, PlanError, PlannedStage, dumps_plan, load_chain
from backend.chain.requirements import check_plan
from backend.contract.lookup import InputError, completed_run, last_finish
from backend.contract.runs import Manifest, run_path
from backend.kit.child import Child
from backend.kit.lifecycle import StageFailed, StageRun, refuse
from backend.kit.secret_files import check_secret_file, remove_secret_file
from backend.kit.serverlock import LockHeld, ServerLock
from backend.kit.switch import BASELINE_HELD_ENV, Switch, SwitchFailed

STAGE = "pipeline"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m backend.chain", description=__doc__)
    p.add_argument("--work-dir", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--plan", required=True, help="the plan JSON (backend/chain/plan.py)")
    p.add_argument("--fresh", action="store_true", help="archive an existing chain run directory and start over")
    p.add_argument("--secret-file", action="append", default=[], metavar="PATH",
                   help="a secret a stage reads (the console's copy of the API key in the work dir's secrets/): "
                        "removed when the chain ends, whatever the outcome, also when that stage never ran")
    return p.parse_args(argv)


class Chain:
    def __init__(self, work_dir: str, run_id: str, stages: list[PlannedStage], *, lock_path: str = "",
                 hold: Hold | None = None):
        self.work_dir = work_dir
        self.run_id = run_id
        self.stages = stages
        self.child = Child()  # the running stage: it stops cleanly and leaves itself resumable
        self.ctx: StageRun | None = None
        self.results: list[dict[str, Any]] = []
        self.started = time.monotonic()
        self.lock = ServerLock(lock_path, f"pipeline run {run_id}") if lock_path or hold else None
        self.hold = hold
        # the chain holds the lock itself: its switch takes none of its own
        self.switch = Switch(dataclasses.replace(hold.switch, lock_path=""), holder=f"pipeline run {run_id}",
                             progress=self._switch_progress, emit=self._switch_emit) if hold else None
        self.index = 0
        self.held = False  # the chain stopped the baseline and has not started it again

    @property
    def stopping(self) -> bool:
        return bool(self.ctx and self.ctx.stopping)

    def _switch_progress(self, phase: str, force: bool = False, **extra: Any) -> None:
        if self.ctx is not None and (force or "baseline" in extra):
            self.ctx.emit("progress", done=self.index, total=len(self.stages),
                          current=self.stages[min(self.index, len(self.stages) - 1)].stage, phase=phase, **extra)

    def _switch_emit(self, kind: str, **data: Any) -> None:
        if self.ctx is not None:
            self.ctx.emit(kind, **data)

    def _hold_baseline(self) -> str | None:
        """Before the hold's first stage: stop the baseline (seen down); an error when it will not stop."""
        assert self.switch is not None
        home = self.switch.plan.home

        async def stop() -> None:
            if await self.switch.alive(home) is not False:
                await self.switch.stop_server(home)
        try:
            asyncio.run(stop())
        except SwitchFailed as exc:
            return str(exc)
        self.held = True
        return None

    def _release_baseline(self) -> str | None:
        """After the hold's last stage, or as soon as the chain ends early: the baseline starts again."""
        if not self.held or self.switch is None:
            return None
        self.held = False
        self.switch.record.baseline_stopped = True  # stopped by this chain (or found down): started here
        asyncio.run(self.switch.back())
        return None if self.switch.record.baseline_restarted else \
            "the baseline server could not be started again: start it by hand"

    def run(self, fresh: bool = False) -> int:
        identity = {"stages": [[s.stage, s.run_id] for s in self.stages]}
        ctx = self.ctx = StageRun(STAGE, self.run_id, work_dir=self.work_dir, fresh=fresh, mode="flag",
                                  manifest=Manifest(stage=STAGE, run_id=self.run_id, identity=identity))
        ctx.on_stop(self.child.forward)
        ctx.summarize = self._summarize
        ctx.stop_note = "the running stage is stopped; it resumes when the pipeline is started again"
        return ctx.run(self._body)

    def _body(self, ctx: StageRun) -> None:
        with open(ctx.file(PLAN_FILE), "w", encoding="utf-8") as f:  # what this run was asked to do, for whoever looks later
            f.write(dumps_plan(ChainPlan(self.stages, self.lock.path if self.lock else "", self.hold)))
        ctx.start(total=len(self.stages), stages=[s.stage for s in self.stages],
                  hold=[self.hold.first, self.hold.last] if self.hold else None)
        self.started = time.monotonic()
        problems = check_plan(self.work_dir, self._not_completed())
        if problems:  # before the first stage: a missing piece costs seconds, not a generation run
            error = "host requirements: " + "; ".join(p.line() for p in problems)
            self.results.append({"stage": problems[0].stage, "run_id": next(
                s.run_id for s in self.stages if s.stage == problems[0].stage), "status": "failed",
                "error": error, "requirements": [p.__dict__ for p in problems]})
            raise StageFailed(error)
        error: str | None = None
        try:
            if self.lock is not None:
                self.lock.acquire()
            for i, planned in enumerate(self.stages):
                self.index = i
                if self.stopping:
                    return
                if self.hold is not None and planned.stage == self.hold.first and not self.held:
                    if (why := self._hold_baseline()) is not None:
                        error = f"{planned.stage} not started: {why}"
                        break
                outcome = self._run_stage(planned, i)
                self.results.append(outcome)
                if outcome["status"] != "completed":
                    if self.stopping:
                        return
                    error = outcome.get("error") or f"{planned.stage} did not complete"
                    break
                if self.hold is not None and planned.stage == self.hold.last:
                    if (error := self._release_baseline()) is not None:
                        break
        except LockHeld as exc:
            error = f"refused: {exc}"
        finally:
            back = self._release_baseline()  # a chain that ended early: one start, here
            error = error or back
            if self.lock is not None:
                self.lock.release()
        if error:
            raise StageFailed(error)

    def _summarize(self, status: str, error: str | None) -> dict[str, Any]:
        results = self.results
        done = sum(1 for r in results if r["status"] == "completed")
        summary: dict[str, Any] = {"stage": STAGE, "run_id": self.run_id, "status": status, "done": done,
                                   "total": len(self.stages), "stages": results,
                                   "runs": {s.stage: s.run_id for s in self.stages},
                                   "elapsed_s": round(time.monotonic() - self.started, 1)}
        if self.switch is not None:
            summary["baseline"] = {"held": [self.hold.first, self.hold.last] if self.hold else None,
                                   **self.switch.record.to_dict()}
        if error:
            summary["error"] = error
            summary["failed_stage"] = results[-1]["stage"] if results and results[-1]["status"] != "completed" \
                else self.stages[min(self.index, len(self.stages) - 1)].stage
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
        env = {**os.environ, **planned.env}
        if self.lock is not None and self.lock.held:
            env.update(self.lock.child_env())  # the stage's own switch runs under the chain's lock
        if self.held:
            env[BASELINE_HELD_ENV] = "1"  # the chain starts the baseline after the hold's last stage
        try:
            code = self.child.run(list(planned.argv), env=env,
                                  pass_fds=self.lock.pass_fds() if self.lock is not None else ())
        except OSError as exc:
            return {**result, "status": "failed", "error": f"{planned.stage} could not start: {exc.strerror}"}
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
        copies = [check_secret_file(args.work_dir, path) for path in args.secret_file]
    except ValueError as exc:
        return refuse("pipeline", exc)
    try:
        try:
            plan = load_chain(args.plan)
        except PlanError as exc:
            return refuse("pipeline", exc)
        return Chain(args.work_dir, args.run_id, plan.stages, lock_path=plan.lock_path,
                     hold=plan.hold).run(fresh=args.fresh)
    finally:  # a stage that read it removed it already; one never started (skipped, stopped before) did not
        for path in copies:
            remove_secret_file(path)
