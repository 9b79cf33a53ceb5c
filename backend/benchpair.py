"""The bench, baseline against drafter, as one detached program that survives the console closing.

`python -m backend.benchpair --work-dir W --run-id R --plan PLAN.json [--secret-file F]`; the plan (written by the console,
console/control/bench_pair.py) holds the baseline's bench command line (`python -m backend.bench`, run id
`R-baseline`), its contenders in the order they are benched (each a server of the switch, a bench command
line compared with the baseline's, a title for its steps), and the one server switch's plan
(backend/kit/switch.py: the baseline home, the contenders' servers away), which runs every change of server
and holds the host's server lock for the whole pair. The contenders: our drafter (`R-drafter`), or the
same drafter at several K (`R-k2`, `R-k3`: one drafter server start each, `num_speculative_tokens` = K),
and a published drafter (`R-third`, in the drafter server's unit) when the profile names one. Steps:

    1. the baseline serves: the drafter server stopped (seen down) if it runs, the baseline started if it
       does not, and answering
    2. bench the baseline
    3. for each contender: switch (stop the server running, seen down; start the contender's, wait until
       it answers), then bench it (compared with step 2)
    4. always, also after a failure or SIGTERM: stop the drafter server, start the baseline again
    5. always: remove the --secret-file copies (the API key every bench read), also after a refusal

The run directory R holds its events (progress per step) and a summary with one comparison of every
contender benched against the baseline, and with several K the best of them (`best_k`: the highest mean
speed-up over the concurrency levels), so the console shows it as a bench run. Exit codes
(backend/contract/exitcodes.py): 0 done, 3 done and our drafter (at its best K) is slower at some level, 1 failed,
2 bad plan or run directory; a stop (SIGTERM) ends as stopped, exit 0, after step 4.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from backend.bench import PAIR_STAGE, STAGE as BENCH_STAGE
from backend.bench.compare import MAX_RESULTS, CompareError, best, compare, load_run_result
from backend.contract.lookup import InputError, completed_run, last_finish
from backend.contract.plans import PlanError, argv_list, read_plan
from backend.contract.runs import Manifest, run_path, write_json_atomic
from backend.kit.child import Child
from backend.kit.lifecycle import StageFailed, StageRun, refuse
from backend.kit.secret_files import check_secret_file, remove_secret_file
from backend.kit.switch import Switch, SwitchFailed, SwitchPlan, SwitchPlanError, SwitchStopped, switch_from_dict

STAGE = PAIR_STAGE  # the console's bench row shows these runs; its benches are "bench" runs
PLAN_FILE = "benchpair-plan.json"
MAX_CONTENDERS = MAX_RESULTS - 1  # one comparison holds them all, beside the baseline


@dataclass(frozen=True)
class Bench:
    """One bench of the pair: the switch's server it measures, its command line, and (a contender) the
    title its steps carry, its K, and whether it is ours (a K of our drafter) or a published drafter."""
    server: str
    run_id: str
    argv: list[str]
    title: str = "baseline"
    k: int | None = None
    ours: bool = False


@dataclass(frozen=True)
class PairPlan:
    """The baseline's bench, the contenders' in order, and the one server switch that puts each server on
    the GPUs (backend/kit/switch.py; every contender runs in the drafter server's unit)."""
    switch: SwitchPlan
    baseline: Bench
    contenders: tuple[Bench, ...]
    checkpoint: str | None = None
    third_checkpoint: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)  # as written, kept in the run dir

    @property
    def steps(self) -> tuple[str, ...]:
        return ("baseline serving", "bench baseline",
                *(step for c in self.contenders for step in (f"swap to the {c.title}", f"bench {c.title}")),
                "back to the baseline")

    @property
    def ours(self) -> tuple[Bench, ...]:
        return tuple(c for c in self.contenders if c.ours)


def _bench(where: str, data: Any, switch: SwitchPlan, *, contender: bool) -> Bench:
    if not (isinstance(data, dict) and isinstance(data.get("run_id"), str) and isinstance(data.get("server"), str)):
        raise PlanError(f"{where} must be {{\"server\": str, \"run_id\": str, \"argv\": [str, ...]"
                        + (', "title": str, "k": int or null, "ours": bool' if contender else "") + "}")
    try:
        switch.server(data["server"])
    except KeyError:
        raise PlanError(f"{where}: the switch has no {data['server']!r} server to bench") from None
    argv = argv_list(data.get("argv"), f"{where}.argv")
    if not contender:
        return Bench(data["server"], data["run_id"], argv)
    title, k, ours = data.get("title"), data.get("k"), data.get("ours")
    if not isinstance(title, str) or not title or len(title) > 60:
        raise PlanError(f"{where}.title must be a short text (the steps' names), got {title!r}")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise PlanError(f"{where}.k must be a positive integer or null, got {k!r}")
    if not isinstance(ours, bool):
        raise PlanError(f"{where}.ours must be true or false, got {ours!r}")
    return Bench(data["server"], data["run_id"], argv, title, k, ours)


def load_plan(path: str) -> PairPlan:
    data = read_plan(path)
    try:
        switch = switch_from_dict(data.get("switch"), path)
    except SwitchPlanError as exc:
        raise PlanError(str(exc)) from None
    baseline = _bench(f"{path}: baseline", data.get("baseline"), switch, contender=False)
    raw = data.get("contenders")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_CONTENDERS:
        raise PlanError(f"{path}: contenders must be a list of 1 to {MAX_CONTENDERS} benches")
    contenders = tuple(_bench(f"{path}: contenders[{i}]", c, switch, contender=True) for i, c in enumerate(raw))
    for what, values in (("run_id", [baseline.run_id, *(c.run_id for c in contenders)]),
                         ("server", [c.server for c in contenders]), ("title", [c.title for c in contenders])):
        if len(set(values)) != len(values):
            raise PlanError(f"{path}: the benches' {what}s repeat ({', '.join(values)})")
    if not any(c.ours for c in contenders):
        raise PlanError(f"{path}: no contender is ours (\"ours\": true): nothing to compare the baseline with")
    return PairPlan(switch=switch, baseline=baseline, contenders=contenders, checkpoint=data.get("checkpoint"),
                    third_checkpoint=data.get("third_checkpoint"), raw=data)


class BenchPair:
    def __init__(self, work_dir: str, run_id: str, plan: PairPlan):
        self.work_dir, self.run_id, self.plan = work_dir, run_id, plan
        self.child = Child()  # the running bench: it stops cleanly, keeping the levels it measured
        self.ctx: StageRun | None = None
        self.steps: list[dict[str, Any]] = []
        self.step_names = plan.steps
        self.switch = Switch(plan.switch, holder=f"bench run {run_id}", progress=self._switch_progress,
                             emit=self._switch_emit, stopped=lambda: self.stopping)

    @property
    def stopping(self) -> bool:
        return bool(self.ctx and self.ctx.stopping)

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

    def bench(self, spec: Bench) -> str | None:
        which = spec.title
        argv = list(spec.argv)
        command = self.plan.switch.server(spec.server).command
        if command and "backend.bench" in argv:  # provenance: the server this leg benches, as the switch runs it
            argv += ["--server-command", json.dumps(command)]
        self.say(f"bench {which} ({spec.run_id}): {' '.join(spec.argv)}")
        try:
            code = self.child.run(argv)
        except OSError as exc:
            return f"bench {which} could not start: {exc.strerror}"
        finish = last_finish(run_path(self.work_dir, spec.run_id)) or {}
        summary = finish.get("summary") if isinstance(finish.get("summary"), dict) else None
        try:
            completed_run(self.work_dir, spec.run_id, BENCH_STAGE)
        except InputError as exc:
            why = (summary or {}).get("error") or f"exit {code}; {exc}"
            return f"bench {which} ({spec.run_id}) {finish.get('status') or 'failed'}: {why}"
        return None

    def step(self, index: int, error: str | None = None, **extra: Any) -> None:
        assert self.ctx is not None
        names = self.step_names
        self.steps.append({"step": names[index], "ok": error is None, **({"error": error} if error else {}), **extra})
        self.ctx.emit("progress", done=index + 1 if error is None else index, total=len(names), current=names[index],
                      **({"error": error} if error else {}))

    def run(self, fresh: bool = False) -> int:
        plan = self.plan
        self.runs = {b.server: b.run_id for b in (plan.baseline, *plan.contenders)}
        identity = {**self.runs, "checkpoint": plan.checkpoint,
                    **({"k_values": [c.k for c in plan.ours]} if len(plan.ours) > 1 else {})}
        ctx = self.ctx = StageRun(STAGE, self.run_id, work_dir=self.work_dir, fresh=fresh, mode="flag", prog="benchpair",
                                  manifest=Manifest(stage=STAGE, run_id=self.run_id, identity=identity))
        ctx.on_stop(self.child.forward)
        ctx.server_commands = {s.name: s.command for s in (plan.switch.home, *plan.switch.away) if s.command}
        ctx.summarize = self._summarize
        ctx.stop_note = "the running bench stops, then the baseline is served again"
        self.started = time.monotonic()
        self.error: str | None = None
        self.back: str | None = None
        self.benched: list[Bench] = []
        return ctx.run(self._body)

    def _body(self, ctx: StageRun) -> None:
        write_json_atomic(ctx.file(PLAN_FILE), self.plan.raw)
        ctx.start(total=len(self.step_names), steps=list(self.step_names), pair=True)
        error = None
        try:
            error = self.serve(self.plan.baseline.server)
            self.step(0, error)
            if error is None and not self.stopping:
                error = self.bench(self.plan.baseline)
                self.step(1, error)
            for i, contender in enumerate(self.plan.contenders):
                if error is not None or self.stopping:
                    break
                error = self.serve(contender.server)
                self.step(2 + 2 * i, error)
                if error is None and not self.stopping:
                    error = self.bench(contender)
                    self.step(3 + 2 * i, error)
                    if error is None:
                        self.benched.append(contender)
        finally:
            self.error = error
            self.back = self.serve_baseline_again()  # always: also after a failure or a stop
            self.step(len(self.step_names) - 1, self.back)
        if not self.stopping and (error or self.back):
            raise StageFailed("; ".join(e for e in (error, self.back) if e))

    def _comparison(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """One comparison of every contender benched (ours first, as each bench compares itself) against
        the baseline, and of ours the best by mean speed-up."""
        done = sorted(self.benched, key=lambda c: not c.ours)
        if not done:
            return {}, None
        try:
            results = {b.run_id: load_run_result(self.work_dir, b.run_id) for b in (self.plan.baseline, *done)}
            cmp = compare(list(results.values()), results[self.plan.baseline.run_id].label)
        except (InputError, CompareError) as exc:
            self.say(f"no comparison: {exc}")
            return {}, None
        ours = [c for c in done if c.ours]
        top = best(cmp, [results[c.run_id].label for c in ours])
        winner = next((c for c in ours if top is not None and results[c.run_id].label == top.label), None)
        found = None if top is None or winner is None else {
            "k": winner.k, "label": top.label, "run_id": winner.run_id, "speedup": round(top.speedup, 3),
            "acceptance_length": None if top.acceptance_length is None else round(top.acceptance_length, 3),
            "slower": top.slower}
        return cmp.to_dict(), found

    def _what_ours_said(self, top: dict[str, Any] | None) -> dict[str, Any]:
        """Our drafter's bench (the best K's, else the one benched) beyond the table: its reference line's
        figures, its reasoning/answer split and its self-test, as that bench's summary has them."""
        ours = [c for c in self.benched if c.ours]
        pick = next((c for c in ours if top is not None and c.run_id == top["run_id"]), ours[0] if ours else None)
        if pick is None:
            return {}
        try:
            said = completed_run(self.work_dir, pick.run_id, BENCH_STAGE).summary
        except InputError:
            return {}
        out: dict[str, Any] = {}
        for key in ("reference", "phases", "self_test"):
            if isinstance(said.get(key), dict):
                out[key] = {**said[key], "label": said.get("label")} if key == "phases" else said[key]
        return out

    def _summarize(self, status: str, error: str | None) -> dict[str, Any]:
        comparison, top = self._comparison()
        slower = bool(top and top["slower"])
        summary: dict[str, Any] = {
            "stage": STAGE, "run_id": self.run_id, "status": status, "pair": True, "label": "drafter",
            "runs": self.runs, "checkpoint": self.plan.checkpoint,
            "third_checkpoint": self.plan.third_checkpoint, "steps": self.steps,
            "slower": slower, "switch": self.switch.record.to_dict(),
            "elapsed_s": round(time.monotonic() - self.started, 1)}
        if comparison:
            summary["comparison"] = comparison
        summary.update(self._what_ours_said(top))
        if len(self.plan.ours) > 1:  # several K of our drafter: which paid best
            summary["k_values"] = [c.k for c in self.plan.ours]
            if top is not None:
                summary["best_k"] = top
        errors = "; ".join(e for e in (self.error, self.back) if e)
        if errors or error:
            summary["error"] = errors or error
        best_said = (f"; best K {top['k']}: {top['speedup']:.2f}x mean speed-up" if "best_k" in summary and top
                     else "")
        self.say(f"{status}" + (": the drafter is SLOWER than the baseline" if slower else "") + best_said
                 + (f" ({summary['error']})" if summary.get("error") else ""))
        return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m backend.benchpair", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--fresh", action="store_true")
    p.add_argument("--secret-file", action="append", default=[], metavar="PATH",
                   help="a secret the benches read (the console's copy of the API key in the work dir's secrets/, "
                        "their --api-key-file): removed when this program ends, whatever the outcome")
    a = p.parse_args(argv)
    try:
        copies = [check_secret_file(a.work_dir, path) for path in a.secret_file]
    except ValueError as exc:
        return refuse("benchpair", exc)
    try:
        try:
            plan = load_plan(a.plan)
        except PlanError as exc:
            return refuse("benchpair", exc)
        os.makedirs(a.work_dir, exist_ok=True)
        return BenchPair(a.work_dir, a.run_id, plan).run(fresh=a.fresh)
    finally:  # after the last bench, or a failure, a stop (SIGTERM: the lifecycle's), a refusal
        for path in copies:
            remove_secret_file(path)


if __name__ == "__main__":
    raise SystemExit(main())
