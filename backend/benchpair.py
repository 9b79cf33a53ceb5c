"""The bench, baseline against drafter, as one detached program that survives the console closing.

`python -m backend.benchpair --work-dir W --run-id R --plan PLAN.json`; the plan (written by the console,
console/control/bench_pair.py) holds the two bench command lines (`python -m backend.bench`, run ids
`R-baseline` and `R-drafter`, the second with `--baseline-run R-baseline`) and the one server switch's
plan (backend/switch.py: the baseline home, the drafter server away), which runs every change of server
and holds the host's server lock for the whole pair. Steps:

    1. the baseline serves: the drafter server stopped (seen down) if it runs, the baseline started if it
       does not, and answering
    2. bench the baseline
    3. switch: stop the baseline (seen down), start the drafter server, wait until it answers
    4. bench the drafter server (compared with step 2)
    5. always, also after a failure or SIGTERM: stop the drafter server, start the baseline again

With a third contender in the plan (`third`: a published drafter's bench, and a `third` server in the
switch: the drafter server's unit loading that checkpoint), it is benched between 2 and 3, and
the drafter's bench compares with both (`--third-run`): one table of the three.

The run directory R holds its events (progress per step) and a summary with the drafter bench's
comparison, so the console shows it as a bench run. Exit codes (backend/exitcodes.py): 0 done, 3 done
and the drafter is slower, 1 failed, 2 bad plan or run directory; a stop (SIGTERM) ends as stopped, exit 0,
after step 5.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from backend.bench import PAIR_STAGE, STAGE as BENCH_STAGE
from backend.lifecycle import StageFailed, StageRun, refuse
from backend.lookup import InputError, completed_run, last_finish
from backend.plans import PlanError, argv_list, read_plan
from backend.runs import Manifest, run_path, write_json_atomic
from backend.switch import Switch, SwitchFailed, SwitchPlan, SwitchPlanError, SwitchStopped, switch_from_dict

STAGE = PAIR_STAGE  # the console's bench row shows these runs; its benches are "bench" runs
PLAN_FILE = "benchpair-plan.json"
STEPS = ("baseline serving", "bench baseline", "swap to the drafter", "bench drafter", "back to the baseline")
THIRD_STEPS = ("baseline serving", "bench baseline", "swap to the published drafter", "bench published drafter",
               "swap to the drafter", "bench drafter", "back to the baseline")


@dataclass(frozen=True)
class Bench:
    run_id: str
    argv: list[str]


@dataclass(frozen=True)
class PairPlan:
    """The benches (baseline, drafter, and an optional third: a published drafter) and the one server
    switch that puts each server on the GPUs (backend/switch.py; the third runs in the drafter's unit)."""
    switch: SwitchPlan
    benches: dict[str, Bench]
    checkpoint: str | None = None
    third_checkpoint: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)  # as written, kept in the run dir

    @property
    def has_third(self) -> bool:
        return "third" in self.benches


def load_plan(path: str) -> PairPlan:
    data = read_plan(path)
    try:
        switch = switch_from_dict(data.get("switch"), path)
    except SwitchPlanError as exc:
        raise PlanError(str(exc)) from None
    benches: dict[str, Bench] = {}
    for key in ("baseline", "drafter", *(("third",) if "third" in data else ())):
        b = data.get(key)
        if not (isinstance(b, dict) and isinstance(b.get("run_id"), str)):
            raise PlanError(f"{path}: {key!r} must be {{\"run_id\": str, \"argv\": [str, ...]}}")
        benches[key] = Bench(b["run_id"], argv_list(b.get("argv"), f"{path}: {key}.argv"))
        try:
            switch.server(key)
        except KeyError:
            raise PlanError(f"{path}: the switch has no {key!r} server to bench") from None
    return PairPlan(switch=switch, benches=benches, checkpoint=data.get("checkpoint"),
                    third_checkpoint=data.get("third_checkpoint"), raw=data)


class BenchPair:
    def __init__(self, work_dir: str, run_id: str, plan: PairPlan):
        self.work_dir, self.run_id, self.plan = work_dir, run_id, plan
        self.child: subprocess.Popen | None = None
        self.ctx: StageRun | None = None
        self.steps: list[dict[str, Any]] = []
        self.step_names = THIRD_STEPS if plan.has_third else STEPS
        self.switch = Switch(plan.switch, holder=f"bench run {run_id}", progress=self._switch_progress,
                             emit=self._switch_emit, stopped=lambda: self.stopping)

    @property
    def stopping(self) -> bool:
        return bool(self.ctx and self.ctx.stopping)

    def _forward(self, name: str) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(getattr(signal, name))  # a bench stops cleanly, keeping the levels it measured

    def say(self, text: str) -> None:
        print(f"benchpair: {text}", file=sys.stderr, flush=True)

    def _switch_progress(self, phase: str, force: bool = False, **extra: Any) -> None:
        """The switch's steps in the run's events (a phase beside the bench steps' counters)."""
        if "command" in extra:
            self.say(f"{extra.get('step')}: {extra['command']}")
        if self.ctx is not None and (force or "baseline" in extra):
            at = min(len(self.steps), len(self.step_names) - 1)  # the step counters stay as they are
            self.ctx.emit("progress", done=len(self.steps), total=len(self.step_names), current=self.step_names[at],
                          phase=phase, **extra)

    def _switch_emit(self, kind: str, **data: Any) -> None:
        if self.ctx is not None:
            self.ctx.emit(kind, **data)

    def serve(self, which: str) -> str | None:
        """Put `which` on the GPUs (the one server switch: the other stopped and seen down first, then it
        starts and answers); an error when it does not."""
        try:
            asyncio.run(self.switch.go(which))
        except SwitchFailed as exc:
            return str(exc)
        except SwitchStopped:
            return f"stopped while the {which} server started"
        return None

    def serve_baseline_again(self) -> str | None:
        """Always at the end: the drafter server goes, the baseline comes back."""
        asyncio.run(self.switch.back())
        if self.switch.record.baseline_restarted is False:
            return "the baseline server could not be started again: start it by hand"
        return None

    def bench(self, which: str) -> tuple[str | None, dict[str, Any] | None, int]:
        spec = self.plan.benches[which]
        self.say(f"bench {which} ({spec.run_id}): {' '.join(spec.argv)}")
        try:
            self.child = subprocess.Popen(spec.argv)
        except OSError as exc:
            return f"bench {which} could not start: {exc.strerror}", None, 1
        code = self.child.wait()
        self.child = None
        finish = last_finish(run_path(self.work_dir, spec.run_id)) or {}
        summary = finish.get("summary") if isinstance(finish.get("summary"), dict) else None
        try:
            completed_run(self.work_dir, spec.run_id, BENCH_STAGE)
        except InputError as exc:
            why = (summary or {}).get("error") or f"exit {code}; {exc}"
            return f"bench {which} ({spec.run_id}) {finish.get('status') or 'failed'}: {why}", summary, code
        return None, summary, code

    def step(self, index: int, error: str | None = None, **extra: Any) -> None:
        assert self.ctx is not None
        names = self.step_names
        self.steps.append({"step": names[index], "ok": error is None, **({"error": error} if error else {}), **extra})
        self.ctx.emit("progress", done=index + 1 if error is None else index, total=len(names), current=names[index],
                      **({"error": error} if error else {}))

    def run(self, fresh: bool = False) -> int:
        self.contenders = ["third", "drafter"] if self.plan.has_third else ["drafter"]
        self.runs = {which: self.plan.benches[which].run_id for which in ("baseline", *self.contenders)}
        identity = {**self.runs, "checkpoint": self.plan.checkpoint}
        ctx = self.ctx = StageRun(STAGE, self.run_id, work_dir=self.work_dir, fresh=fresh, mode="flag", prog="benchpair",
                                  manifest=Manifest(stage=STAGE, run_id=self.run_id, identity=identity))
        ctx.on_stop(self._forward)
        ctx.summarize = self._summarize
        ctx.stop_note = "the running bench stops, then the baseline is served again"
        self.started = time.monotonic()
        self.error: str | None = None
        self.back: str | None = None
        self.drafted: dict[str, Any] | None = None
        self.slower = False
        return ctx.run(self._body)

    def _body(self, ctx: StageRun) -> None:
        write_json_atomic(ctx.file(PLAN_FILE), self.plan.raw)
        ctx.start(total=len(self.step_names), steps=list(self.step_names), pair=True)
        error = None
        try:
            error = self.serve("baseline")
            self.step(0, error)
            if error is None and not self.stopping:
                error, _, _ = self.bench("baseline")
                self.step(1, error)
            for i, which in enumerate(self.contenders):
                if error is not None or self.stopping:
                    break
                error = self.serve(which)
                self.step(2 + 2 * i, error)
                if error is None and not self.stopping:
                    error, result, code = self.bench(which)
                    if which == "drafter":
                        self.drafted, self.slower = result, code == 3 or bool((result or {}).get("slower"))
                        self.step(3 + 2 * i, error, slower=self.slower)
                    else:
                        self.step(3 + 2 * i, error)
        finally:
            self.error = error
            self.back = self.serve_baseline_again()  # always: also after a failure or a stop
            self.step(len(self.step_names) - 1, self.back)
        if not self.stopping and (error or self.back):
            raise StageFailed("; ".join(e for e in (error, self.back) if e))

    def _summarize(self, status: str, error: str | None) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "stage": STAGE, "run_id": self.run_id, "status": status, "pair": True, "label": "drafter",
            "runs": self.runs, "checkpoint": self.plan.checkpoint,
            "third_checkpoint": self.plan.third_checkpoint, "steps": self.steps,
            "slower": self.slower, "switch": self.switch.record.to_dict(),
            "elapsed_s": round(time.monotonic() - self.started, 1)}
        if self.drafted and isinstance(self.drafted.get("comparison"), dict):
            summary["comparison"] = self.drafted["comparison"]
        errors = "; ".join(e for e in (self.error, self.back) if e)
        if errors or error:
            summary["error"] = errors or error
        self.say(f"{status}" + (": the drafter is SLOWER than the baseline" if self.slower else "")
                 + (f" ({summary['error']})" if summary.get("error") else ""))
        return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m backend.benchpair", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--fresh", action="store_true")
    a = p.parse_args(argv)
    try:
        plan = load_plan(a.plan)
    except PlanError as exc:
        return refuse("benchpair", exc)
    os.makedirs(a.work_dir, exist_ok=True)
    return BenchPair(a.work_dir, a.run_id, plan).run(fresh=a.fresh)


if __name__ == "__main__":
    raise SystemExit(main())
