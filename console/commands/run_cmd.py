"""`eagle3-console run STAGE`: start a stage on the host, detached; `--wait` follows it to the end.

It starts the stage through the same Session action as the app's `s` key, so it refuses exactly what
the app refuses (a second run of a stage that is already running).
"""
from __future__ import annotations

import argparse
import asyncio
import sys

from console.commands.server_cmd import load_or_exit
from backend.events import EVENTS_FILE
from console.control.launch import run_dir_path, stage_ended
from console.control.units import stage_unit_name
from backend.lookup import STAGES as PIPELINE_STAGES
from console.control.launch import StageRequest, stops_baseline
from console.control.stages import FETCH_DRAFTER, host_stage
from backend.verify.report import table
from backend.bench.compare import CompareError, comparison_from_dict, format_table
from console.parsers.text import clean, clean_block
from console.session import Session
from console.telemetry.snapshot import RunInfo

FETCH_DRAFTER_CLI = "fetch-drafter"
NO_EVENTS_S = 120.0  # a started run silent this long gets a note (it is followed while its unit runs)
SERVE = ("serve-drafter", "serve-baseline")  # switch the server: not a run, an action on the host


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="start a pipeline stage on the host (detached: it survives the console)")
    p.add_argument("stage", choices=(*PIPELINE_STAGES, "pipeline", *SERVE, "bench", FETCH_DRAFTER_CLI),
                   help="a stage, a pipeline run, or a server switch: serve-drafter stops the baseline and serves "
                        "the verified drafter (--input: a verify run, or a train run a verify run verified; default "
                        "the latest completed verify run); serve-baseline stops the drafter server and starts the "
                        "baseline again; bench benches the baseline, swaps to the drafter server, benches it, "
                        "compares (exit 3 with --wait when the drafter is slower) and swaps back, as one detached "
                        f"program on the host (--input: the verify run whose drafter to bench); {FETCH_DRAFTER_CLI}: "
                        "[bench].third_drafter downloaded on the host, converted when needed")
    p.add_argument("--profile", required=True)
    p.add_argument("--input", dest="input_run", metavar="RUN",
                   help="the run whose output the stage consumes (default: the latest completed run of the "
                        "stage before it; pipeline: of the stage before --from)")
    p.add_argument("--from", dest="from_stage", choices=PIPELINE_STAGES, help="pipeline: the first stage")
    p.add_argument("--to", dest="to_stage", choices=PIPELINE_STAGES, help="pipeline: the last stage")
    p.add_argument("--dataset", help="override [generate].dataset: a path on the host; a relative one is taken from "
                                     "this directory on a local host, from [paths].data_dir on an SSH host")
    p.add_argument("--limit", type=int, help="override [generate].samples")
    p.add_argument("--checkpoint", metavar="PATH",
                   help="verify: this drafter checkpoint on the host instead of the train run's (e.g. the one "
                        "fetch-drafter printed), measured on the train run's held-out rows")
    p.add_argument("--run-id", help="default: STAGE-YYYYmmdd-HHMMSS; reuse one to resume it")
    p.add_argument("--fresh", action="store_true", help="archive an existing run dir of that id and start over")
    p.add_argument("--online", action=argparse.BooleanOptionalAction, default=None,
                   help="train (and pipeline, verify): train online on the prepare run, the extraction server "
                        "answering for each batch's hidden states in the baseline's place (no extract stage); "
                        "default: the profile's [extract] online")
    p.add_argument("--yes", action="store_true",
                   help="do not ask before a stage or switch that stops a server (extract, online training, "
                        "bench, serve-drafter, serve-baseline)")
    p.add_argument("--wait", action="store_true", help="follow the run; exit 0 only when it completed (serve-*: "
                                                       "wait until the server answers, at most "
                                                       "[server].load_timeout_s)")
    p.add_argument("--interval", type=float, default=2.0)
    p.set_defaults(func=cmd_run)


def confirmed(a: argparse.Namespace, req: StageRequest, profile) -> bool:
    """Extraction and online training stop the baseline server: say so, and go on only when the operator
    agrees."""
    if not stops_baseline(req, profile) or a.yes:
        return True
    why = {"bench": "the drafter server is benched",
           "extract": "the hidden states are extracted"}.get(req.stage, "the extraction server is needed")
    return ask(f"{req.stage} stops {profile.server.unit} on {profile.host.name} while {why}, and starts it "
               f"again afterwards. Go on? [y/N] ", f"{req.stage} stops the baseline server")


def ask(question: str, refusal: str) -> bool:
    """Yes or no on the terminal, default No; without a terminal, No with `refusal` and the way out."""
    if not sys.stdin.isatty():
        print(f"error: {refusal}; pass --yes to confirm", file=sys.stderr)
        return False
    return input(question).strip().lower() in ("y", "yes")


def confirmed_switch(a: argparse.Namespace, profile) -> bool:
    """A server switch stops the running server: ask, default No."""
    if a.yes:
        return True
    if a.stage == "serve-drafter":
        question = (f"serve-drafter stops {profile.server.unit} (the baseline) on {profile.host.name} and serves the "
                    f"verified drafter in {profile.server.unit}-drafter. Go on? [y/N] ")
    else:
        question = (f"serve-baseline stops {profile.server.unit}-drafter (the drafter server) on {profile.host.name} "
                    f"and starts {profile.server.unit} again. Go on? [y/N] ")
    return ask(question, f"{a.stage} stops a running server")


async def switch_server(a: argparse.Namespace, profile) -> int:
    which = "drafter" if a.stage == "serve-drafter" else "baseline"
    async with Session(profile, interval=a.interval) as session:
        snap = await session.settle()
        if not snap.host.reachable:
            print(f"error: {snap.host.error}", file=sys.stderr)
            return 1
        result = await (session.serve_drafter(a.input_run) if which == "drafter" else session.serve_baseline())
        for cmd in result.commands:
            print(f"$ {cmd}", file=sys.stderr)
        if not result.ok:
            print(f"error: {result.message}", file=sys.stderr)
            return 1
        print(result.message)
        if not a.wait:
            return 0
        return await wait_server(session, which, profile.server.load_timeout_s)


async def wait_server(session: Session, which: str, timeout: float) -> int:
    """Until the server switched to answers (0), fails (1) or `timeout` passes (2); a line per phase."""
    loop = asyncio.get_running_loop()
    deadline, last = loop.time() + timeout, None
    async for snap in session.snapshots(connecting=False):
        srv = snap.server
        on_it = (srv.drafter is not None) == (which == "drafter")
        line = f"{which} server ({snap.service.unit}): {srv.phase if on_it else 'switching'}"
        if line != last:
            print(line, flush=True)
            last = line
        if on_it and srv.phase == "ready" and not srv.error:
            if srv.drafter is not None:
                d = srv.drafter
                aux = ", ".join(map(str, d.aux_layers)) if d.aux_layers else "not logged"
                print(f"ready with the drafter: {'drafter loaded' if d.loaded else 'drafter load not logged'}, "
                      f"auxiliary layers {aux}")
            else:
                print(f"ready: {srv.model_id}")
            return 0
        if on_it and srv.phase == "failed":
            print(f"error: the {which} server failed: {clean_block(srv.error or 'see its log')}", file=sys.stderr)
            return 1
        if loop.time() > deadline:
            print(f"error: the {which} server is not ready after {timeout:g} s (phase {srv.phase})", file=sys.stderr)
            return 2
    return 1


async def run_stage(a: argparse.Namespace) -> int:
    profile = load_or_exit(a.profile)
    if a.stage in SERVE:
        return await switch_server(a, profile) if confirmed_switch(a, profile) else 2
    stage = FETCH_DRAFTER if a.stage == FETCH_DRAFTER_CLI else a.stage
    req = StageRequest(stage, run_id=a.run_id, input_run=a.input_run, fresh=a.fresh, dataset=a.dataset,
                       limit=a.limit, from_stage=a.from_stage, to_stage=a.to_stage, online=a.online,
                       checkpoint=a.checkpoint)
    if a.checkpoint and stage != "verify":
        print(f"error: --checkpoint is for verify, not {a.stage}", file=sys.stderr)
        return 2
    if not confirmed(a, req, profile):
        return 2
    async with Session(profile, interval=a.interval) as session:
        snap = await session.settle()
        if not snap.host.reachable:
            print(f"error: {snap.host.error}", file=sys.stderr)
            return 1
        result, launch = await session.launch_stage(req)
        for cmd in result.commands:
            print(f"$ {cmd}", file=sys.stderr)
        if not result.ok or launch is None:
            print(f"error: {result.message}", file=sys.stderr)
            return 1
        print(f"started {launch.unit}: run {launch.run_id} in {launch.run_dir}")
        if not a.wait:
            return 0
        return await follow_run(session, stage, launch.run_id)


async def follow_run(session: Session, stage: str, run_id: str) -> int:
    """Print a line per progress change until the run finishes (or turns out dead: exit 1)."""
    last = None
    noted = False
    quiet_since = asyncio.get_running_loop().time()
    async for snap in session.snapshots(connecting=False):
        run = next((r for r in snap.runs if r.run_id == run_id), None)
        if run is not None:
            quiet_since = asyncio.get_running_loop().time()
        elif snap.host.not_answering_since is not None:
            continue  # the host is slow to answer: its last facts say nothing of the run
        else:
            # a stage that dies before its first event (a missing module, a bad argument) leaves no run
            # to follow: ask its unit rather than wait out the silence
            ended = await stage_ended(session.host, session.profile, stage_unit_name(stage, run_id))
            if ended is not None and not await _has_events(session, run_id):
                print(f"error: the run wrote no events: {ended}", file=sys.stderr)
                return 1
            if ended is None and not noted and asyncio.get_running_loop().time() - quiet_since > NO_EVENTS_S:
                # alive but silent (slow imports on a busy host): say so once, and keep following it
                print(f"note: no events from run {run_id} for {NO_EVENTS_S:g} s; its unit "
                      f"{stage_unit_name(stage, run_id)} still runs: still waiting", file=sys.stderr)
                noted = True
            continue
        line = progress_line(run, snap.runs)
        if line != last:
            print(line, flush=True)
            last = line
        if run.state in ("done", "failed", "stopped", "stale"):
            ev = run.last_event or {}
            if run.state != "done" and ev.get("error"):
                print(f"error: {clean_block(ev['error'])}", file=sys.stderr)
            for text in results(run, snap.runs):
                print(text)
            if run.state == "done" and stage == "bench" and ev.get("slower"):
                print("the drafter is SLOWER than the baseline at some concurrency level: do not serve it",
                      file=sys.stderr)
                return 3
            return 0 if run.state == "done" else 1
    return 1  # the session ended: the host refused us (said in the last snapshot)


def progress_line(run: RunInfo, runs: tuple[RunInfo, ...]) -> str:
    ev = run.last_event or {}
    if run.stage == host_stage("bench") and isinstance(ev.get("current"), str):  # the pair: one line per step
        return f"{run.state}: {run.done}/{run.total} steps, {ev['current']}"
    if run.stage == FETCH_DRAFTER:  # counted in bytes
        line = f"{run.state}: {run.done / 2**20:.1f}/{run.total / 2**20:.1f} MiB"
        return line + (f", {run.rate / 2**20:.1f} MiB/s" if run.rate else "")
    if run.stage != "pipeline":
        line = f"{run.state}: {run.done}/{run.total} done, {run.failed} failed"
        return line + (f", {run.rate:.1f}/s" if run.rate else "")
    ev = run.last_event or {}
    line = f"{run.state}: {run.done}/{run.total} stages"
    current = next((r for r in runs if r.run_id == ev.get("current_run")), None)
    if run.state == "running" and current is not None:
        line += f", now {current.stage} {current.run_id}: {current.done}/{current.total}"
    return line


def results(run: RunInfo, runs: tuple[RunInfo, ...]) -> list[str]:
    """What a finished run has to say: verify's table (also at the end of a pipeline run that verified),
    else the outputs it leaves for the next stage."""
    verify = run if run.stage == "verify" else None
    if run.stage == "pipeline":
        chain_runs = ((run.last_event or {}).get("runs") or {})
        verify = next((r for r in runs if r.run_id == chain_runs.get("verify") and r.state == "done"), None)
    if verify is not None and isinstance(verify.last_event, dict) and verify.last_event.get("checks") is not None:
        try:
            return [clean_block(table(verify.last_event))]
        except (KeyError, TypeError, ValueError):
            pass  # an unexpected report: its outputs below are still worth printing
    summary = run.last_event or {}  # a finished run's summary, merged into its last event (telemetry/runs.py)
    if run.stage in ("bench", host_stage("bench")) and isinstance(summary.get("comparison"), dict):
        try:
            return [clean_block(format_table(comparison_from_dict(summary["comparison"])))]
        except (CompareError, TypeError, ValueError):
            pass
    outputs = (run.last_event or {}).get("outputs")
    return [clean(f"{name}: {path}") for name, path in outputs.items()] if isinstance(outputs, dict) else []


async def _has_events(session: Session, run_id: str) -> bool:
    """The run wrote its events (the probe just has not listed them yet)."""
    path = f"{run_dir_path(session.profile, run_id)}/{EVENTS_FILE}"
    return (await session.host.run(["test", "-s", path], timeout=30)).ok


def cmd_run(a: argparse.Namespace) -> int:
    return asyncio.run(run_stage(a))
