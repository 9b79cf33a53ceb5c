"""The bench, baseline against drafter, as one detached program that survives the console closing.

`python -m backend.benchpair --work-dir W --run-id R --plan PLAN.json`; the plan (written by the console,
console/control/bench_pair.py) holds the two bench command lines (`python -m backend.bench`, run ids
`R-baseline` and `R-drafter`, the second with `--baseline-run R-baseline`) and the service manager's
commands to start, stop and check each server. Steps:

    1. the baseline serves: the drafter server stopped if it runs, the baseline started if it does not
    2. bench the baseline
    3. swap: stop the baseline (checked down), start the drafter server
    4. bench the drafter server (its bench waits for it to answer, and compares with step 2)
    5. always, also after a failure or SIGTERM: stop the drafter server, start the baseline again

With a third contender in the plan (`third`: a published drafter's bench, `start_third`: the drafter
server's unit loading that checkpoint), it is benched between 2 and 3 in the drafter server's unit, and
the drafter's bench compares with both (`--third-run`): one table of the three.

The run directory R holds its events (progress per step) and a summary with the drafter bench's
comparison, so the console shows it as a bench run.
Exit codes (backend/exitcodes.py): 0 done, 3 done and the drafter is slower, 1 failed, 2 bad plan or run
directory; a stop (SIGTERM) ends as stopped, exit 0, after step 5.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Any

from backend.bench import STAGE as BENCH_STAGE
from backend.lifecycle import StageFailed, StageRun, refuse
from backend.lookup import InputError, completed_run, last_finish
from backend.plans import PlanError, argv_list, read_plan
from backend.runs import Manifest, run_path, write_json_atomic

STAGE = "bench"  # the console shows the pair as its bench run (its benches are "bench" runs too)
PLAN_FILE = "benchpair-plan.json"
STEPS = ("baseline serving", "bench baseline", "swap to the drafter", "bench drafter", "back to the baseline")
THIRD_STEPS = ("baseline serving", "bench baseline", "swap to the published drafter", "bench published drafter",
               "swap to the drafter", "bench drafter", "back to the baseline")
_COMMANDS = ("stop_baseline", "start_baseline", "baseline_alive", "stop_drafter", "start_drafter", "drafter_alive")
STOP_CHECK_S = 30.0  # after a stop command returned, how long the unit may take to be seen gone


def load_plan(path: str) -> dict[str, Any]:
    data = read_plan(path)
    for key in (*_COMMANDS, *(("start_third",) if "third" in data else ())):
        argv_list(data.get(key), f"{path}: {key!r}")
    for key in ("baseline", "drafter", *(("third",) if "third" in data else ())):
        b = data.get(key)
        if not (isinstance(b, dict) and isinstance(b.get("run_id"), str)):
            raise PlanError(f"{path}: {key!r} must be {{\"run_id\": str, \"argv\": [str, ...]}}")
        argv_list(b.get("argv"), f"{path}: {key}.argv")
    return data


class BenchPair:
    def __init__(self, work_dir: str, run_id: str, plan: dict[str, Any]):
        self.work_dir, self.run_id, self.plan = work_dir, run_id, plan
        self.child: subprocess.Popen | None = None
        self.ctx: StageRun | None = None
        self.steps: list[dict[str, Any]] = []
        self.step_names = THIRD_STEPS if "third" in plan else STEPS
        self.loaded: str | None = None  # which checkpoint the drafter server's unit was started with here

    @property
    def stopping(self) -> bool:
        return bool(self.ctx and self.ctx.stopping)

    def _forward(self, name: str) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(getattr(signal, name))  # a bench stops cleanly, keeping the levels it measured

    def say(self, text: str) -> None:
        print(f"benchpair: {text}", file=sys.stderr, flush=True)

    def command(self, key: str, timeout: float = 900.0) -> tuple[bool, str]:
        argv = self.plan[key]
        self.say(f"{key}: {' '.join(argv)}")
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, f"{key} failed: {exc}"
        out = (res.stderr or res.stdout).strip().splitlines()
        return res.returncode == 0, f"{key} exit {res.returncode}" + (f": {out[-1][:300]}" if out else "")

    def alive(self, which: str) -> bool:
        which = "drafter" if which == "third" else which  # the published drafter runs in the drafter's unit
        try:
            return subprocess.run(self.plan[f"{which}_alive"], capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return True  # cannot tell: never start the other server beside it

    def stop(self, which: str) -> str | None:
        """Stop `which` server; an error when it still runs afterwards."""
        if not self.alive(which):
            return None
        ok, text = self.command(f"stop_{which}")
        deadline = time.monotonic() + STOP_CHECK_S
        while self.alive(which):
            if time.monotonic() > deadline:
                return f"the {which} server still runs after its stop ({text})"
            time.sleep(0.5)
        return None if ok or not self.alive(which) else text

    def start(self, which: str) -> str | None:
        if self.alive(which):
            return None
        ok, text = self.command(f"start_{which}")
        if ok:
            self.loaded = which
        return None if ok else text

    def serve(self, which: str) -> str | None:
        """One server at a time: the other is stopped (and checked down) before `which` starts; the drafter
        server's unit is restarted when it holds the other drafter."""
        if which == "baseline":
            return self.stop("drafter") or self.start("baseline")
        if self.loaded not in (None, which) and (error := self.stop("drafter")):
            return error
        return self.stop("baseline") or self.start(which)

    def bench(self, which: str) -> tuple[str | None, dict[str, Any] | None, int]:
        spec = self.plan[which]
        self.say(f"bench {which} ({spec['run_id']}): {' '.join(spec['argv'])}")
        try:
            self.child = subprocess.Popen(spec["argv"])
        except OSError as exc:
            return f"bench {which} could not start: {exc.strerror}", None, 1
        code = self.child.wait()
        self.child = None
        finish = last_finish(run_path(self.work_dir, spec["run_id"])) or {}
        summary = finish.get("summary") if isinstance(finish.get("summary"), dict) else None
        try:
            completed_run(self.work_dir, spec["run_id"], BENCH_STAGE)
        except InputError as exc:
            why = (summary or {}).get("error") or f"exit {code}; {exc}"
            return f"bench {which} ({spec['run_id']}) {finish.get('status') or 'failed'}: {why}", summary, code
        return None, summary, code

    def step(self, index: int, error: str | None = None, **extra: Any) -> None:
        assert self.ctx is not None
        names = self.step_names
        self.steps.append({"step": names[index], "ok": error is None, **({"error": error} if error else {}), **extra})
        self.ctx.emit("progress", done=index + 1 if error is None else index, total=len(names), current=names[index],
                      **({"error": error} if error else {}))

    def run(self, fresh: bool = False) -> int:
        self.contenders = ["third", "drafter"] if "third" in self.plan else ["drafter"]
        self.runs = {which: self.plan[which]["run_id"] for which in ("baseline", *self.contenders)}
        identity = {**self.runs, "checkpoint": self.plan.get("checkpoint")}
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
        write_json_atomic(ctx.file(PLAN_FILE), self.plan)
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
            self.back = self.serve("baseline")  # always: also after a failure or a stop
            self.step(len(self.step_names) - 1, self.back)
        if not self.stopping and (error or self.back):
            raise StageFailed("; ".join(e for e in (error, self.back) if e))

    def _summarize(self, status: str, error: str | None) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "stage": STAGE, "run_id": self.run_id, "status": status, "pair": True, "label": "drafter",
            "runs": self.runs, "checkpoint": self.plan.get("checkpoint"),
            "third_checkpoint": self.plan.get("third_checkpoint"), "steps": self.steps,
            "slower": self.slower, "elapsed_s": round(time.monotonic() - self.started, 1)}
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
