"""`eagle3-console run STAGE`: start a stage on the host, detached; `--wait` follows it to the end.
`eagle3-console run stop (STAGE | --run-id ID)`: stop one, as the app's `x` key does.

It starts and stops through the same Session actions as the app's `s` and `x` keys, so it refuses
exactly what the app refuses (a second run of a stage that is already running). The stages it knows, their
CLI names and how each reports progress come from the stage table (console/control/stages.py).
"""
from __future__ import annotations

import argparse
import asyncio
import sys

from console import exitcodes
from console.commands.server_cmd import load_or_exit
from console.control import stages
from console.control.launch import PREFLIGHT_WARNING, StageRequest, stage_ended, stops_baseline
from console.control.units import stage_unit_name
from console.parsers.text import clean_block
from console.profile import parse_k_values
from console.control.launch import StageError, request_gpu_plan
from console.session import Session
from console.telemetry.progress import StageProgress
from console.snapshot import RunInfo

NO_EVENTS_S = 120.0  # a started run silent this long gets a note (it is followed while its unit runs)
SERVE = ("serve-drafter", "serve-baseline")  # switch the server: not a run, an action on the host
STOP = "stop"  # `run stop STAGE` / `run stop --run-id ID`: what the `x` key does


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="start a pipeline stage on the host (detached: it survives the console), "
                                   "or stop one (run stop STAGE | run stop --run-id ID)")
    fetch = stages.get(stages.FETCH_DRAFTER).cli
    chain = stages.pipeline_stages()
    p.add_argument("stage", choices=(*stages.cli_names(), *SERVE, STOP),
                   help="a stage, a pipeline run, or a server switch: serve-drafter stops the baseline and serves "
                        "the verified drafter (--input: a verify run, or a train run a verify run verified; default "
                        "the latest completed verify run); serve-baseline stops the drafter server and starts the "
                        "baseline again; bench benches the baseline, swaps to the drafter server, benches it (at "
                        "each K of --k, a drafter server start each), compares (exit 3 with --wait when the "
                        "drafter, at its best K, is slower) and swaps back, as one detached program on the host "
                        f"(--input: the verify run whose drafter to bench); {fetch}: "
                        "[bench].third_drafter downloaded on the host, converted when needed; stop: stop the running "
                        "run of STAGE, or the run --run-id names (--wait: until it has stopped)")
    p.add_argument("target", nargs="?", metavar="STAGE", help="run stop: the stage whose running run to stop")
    p.add_argument("--profile", required=True)
    p.add_argument("--input", dest="input_run", metavar="RUN",
                   help="the run whose output the stage consumes (default: the latest completed run of the "
                        "stage before it; pipeline: of the stage before --from)")
    p.add_argument("--from", dest="from_stage", choices=chain, help="pipeline: the first stage")
    p.add_argument("--to", dest="to_stage", choices=chain, help="pipeline: the last stage")
    p.add_argument("--dataset", help="override [generate].dataset: a path on the host; a relative one is taken from "
                                     "this directory on a local host, from [paths].data_dir on an SSH host")
    p.add_argument("--limit", type=int, help="override [generate].samples")
    p.add_argument("--checkpoint", metavar="PATH",
                   help="verify: this drafter checkpoint on the host instead of the train run's (e.g. the one "
                        "fetch-drafter printed), measured on the train run's held-out rows")
    p.add_argument("--run-id", help="default: STAGE-YYYYmmdd-HHMMSS; reuse one to resume it (run stop: the run "
                                    "to stop)")
    p.add_argument("--fresh", action="store_true", help="archive an existing run dir of that id and start over")
    p.add_argument("--online", action=argparse.BooleanOptionalAction, default=None,
                   help="train (and pipeline, verify): train online on the prepare run, the extraction server "
                        "answering for each batch's hidden states in the baseline's place (no extract stage); "
                        "default: the profile's [extract] online")
    p.add_argument("--k", dest="k_values", type=k_values, metavar="K[,K...]",
                   help="bench: bench the drafter at each of these K (draft tokens per step) in one run, one drafter "
                        "server start per K, and name the best (default [bench].k_values, else [drafter]."
                        "num_speculative_tokens alone)")
    p.add_argument("--yes", action="store_true",
                   help="do not ask before a stage or switch that stops a server (extract, online training, "
                        "bench, serve-drafter, serve-baseline)")
    p.add_argument("--wait", action="store_true", help="follow the run; exit 0 only when it completed (serve-*: "
                                                       "wait until the server answers, at most "
                                                       "[server].load_timeout_s)")
    p.add_argument("--interval", type=float, default=2.0)
    p.set_defaults(func=cmd_run)


def k_values(text: str) -> tuple[int, ...]:
    try:
        return tuple(parse_k_values(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--k ")) from None


def declined(a: argparse.Namespace, req: StageRequest, profile, downtime: str) -> int | None:
    """Extraction and online training stop the baseline server: say so, and what it costs (`downtime`:
    Session.downtime, from the host's measured loads), and go on (None) only when the operator agrees."""
    if not stops_baseline(req, profile) or a.yes:
        return None
    if stages.get(req.stage).kind == "chain":  # the whole span is in `downtime`: hours, not its loads
        return ask(f"{req.stage} stops {profile.server.unit} on {profile.host.name}: {downtime}. Go on? [y/N] ",
                   f"{req.stage} stops the baseline server: {downtime}")
    why = ("the drafter server is benched" if stages.starts_pair(req.stage) else
           {"extract": "the hidden states are extracted"}.get(req.stage, "the extraction server is needed"))
    return ask(f"{req.stage} stops {profile.server.unit} on {profile.host.name} while {why}, and starts it "
               f"again afterwards; it costs {downtime}. Go on? [y/N] ",
               f"{req.stage} stops the baseline server and costs {downtime}")


def ask(question: str, refusal: str) -> int | None:
    """Yes (None: go on) or no on the terminal, default No (FAILED: declined); without a terminal, USAGE
    with `refusal` and the way out (--yes)."""
    if not sys.stdin.isatty():
        print(f"error: {refusal}; pass --yes to confirm", file=sys.stderr)
        return exitcodes.USAGE
    if input(question).strip().lower() in ("y", "yes"):
        return None
    print("nothing done")
    return exitcodes.FAILED


def declined_switch(a: argparse.Namespace, profile, downtime: str) -> int | None:
    """A server switch stops the running server: ask, saying what it costs, default No."""
    if a.yes:
        return None
    if a.stage == "serve-drafter":
        question = (f"serve-drafter stops {profile.server.unit} (the baseline) on {profile.host.name} and serves the "
                    f"verified drafter in {profile.server.unit}-drafter; it costs {downtime}. Go on? [y/N] ")
    else:
        question = (f"serve-baseline stops {profile.server.unit}-drafter (the drafter server) on {profile.host.name} "
                    f"and starts {profile.server.unit} again; it costs {downtime}. Go on? [y/N] ")
    return ask(question, f"{a.stage} stops a running server and costs {downtime}")


async def switch_server(a: argparse.Namespace, profile) -> int:
    which = "drafter" if a.stage == "serve-drafter" else "baseline"
    async with Session(profile, interval=a.interval) as session:
        snap = await session.settle()
        if not snap.host.reachable:
            print(f"error: {snap.host.error}", file=sys.stderr)
            return exitcodes.FAILED
        if (code := declined_switch(a, profile, session.downtime(a.stage))) is not None:
            return code
        result = await (session.serve_drafter(a.input_run) if which == "drafter" else session.serve_baseline())
        for cmd in result.commands:  # the unit's command line and a checkpoint path: the host's text
            print(f"$ {clean_block(cmd)}", file=sys.stderr)
        if not result.ok:
            print(f"error: {clean_block(result.message)}", file=sys.stderr)
            return exitcodes.FAILED
        print(clean_block(result.message))
        if not a.wait:
            return exitcodes.OK
        return await wait_server(session, which, profile.server.load_timeout_s)


async def wait_server(session: Session, which: str, timeout: float) -> int:
    """Until the server switched to answers (0), fails (1) or `timeout` passes (2); a line per phase."""
    loop = asyncio.get_running_loop()
    deadline, last, settle = loop.time() + timeout, None, 0
    async for snap in session.snapshots(connecting=False):
        srv = snap.server
        on_it = (srv.drafter is not None) == (which == "drafter")
        line = f"{which} server ({snap.service.unit}): {srv.phase if on_it else 'switching'}"
        if line != last:
            print(line, flush=True)
            last = line
        if on_it and srv.phase == "ready" and not srv.error:
            if srv.drafter is not None and not (srv.drafter.loaded and srv.drafter.aux_layers) and settle < 2:
                # the ready line's immediate check answers before the tick that reads the log's drafter
                # lines: give the log a tick or two before saying they are missing
                settle += 1
                continue
            if srv.drafter is not None:
                d = srv.drafter
                aux = ", ".join(map(str, d.aux_layers)) if d.aux_layers else "not logged"
                print(f"ready with the drafter: {'drafter loaded' if d.loaded else 'drafter load not logged'}, "
                      f"auxiliary layers {aux}")
            else:
                print(f"ready: {srv.model_id}")
            # the switch (detached on the host) sees the server answer a moment after the console does and
            # only then lets go of the server lock: the next command (a bench, a stage) would be refused
            while not await session.switch_finished() and loop.time() < deadline:
                await asyncio.sleep(0.25)
            return exitcodes.OK
        if on_it and srv.phase == "failed":
            print(f"error: the {which} server failed: {clean_block(srv.error or 'see its log')}", file=sys.stderr)
            return exitcodes.FAILED
        if loop.time() > deadline:
            print(f"error: the {which} server is not ready after {timeout:g} s (phase {srv.phase})", file=sys.stderr)
            return exitcodes.NOT_READY
    return exitcodes.FAILED


async def run_stage(a: argparse.Namespace) -> int:
    profile = load_or_exit(a.profile)
    if a.stage == STOP:
        return await stop_run(a, profile)
    if a.target is not None:
        print(f"error: unexpected argument {a.target!r} (only run stop takes a STAGE)", file=sys.stderr)
        return exitcodes.USAGE
    if a.stage in SERVE:
        return await switch_server(a, profile)
    stage = stages.by_cli(a.stage).name
    req = StageRequest(stage, run_id=a.run_id, input_run=a.input_run, fresh=a.fresh, dataset=a.dataset,
                       limit=a.limit, from_stage=a.from_stage, to_stage=a.to_stage, online=a.online,
                       checkpoint=a.checkpoint, k_values=a.k_values, yes=a.yes)
    if a.checkpoint and stage != "verify":
        print(f"error: --checkpoint is for verify, not {a.stage}", file=sys.stderr)
        return exitcodes.USAGE
    if a.k_values is not None and not stages.starts_pair(stage):
        print(f"error: --k is for bench, not {a.stage}", file=sys.stderr)
        return exitcodes.USAGE
    async with Session(profile, interval=a.interval) as session:
        snap = await session.settle()
        if not snap.host.reachable:
            print(f"error: {snap.host.error}", file=sys.stderr)
            return exitcodes.FAILED
        try:  # GPUs that cannot be shared as asked are refused before any question
            request_gpu_plan(req, profile)
        except StageError as e:
            print(f"error: {e}", file=sys.stderr)
            return exitcodes.FAILED
        # asked once connected: the downtime comes from the host's measured loads
        if (code := declined(a, req, profile, session.downtime(stage, req))) is not None:
            return code
        # a run id given again resumes that run: --wait follows the new start, never the old outcome
        before = next((r for r in snap.runs if r.run_id == a.run_id), None) if a.run_id else None
        result, launch = await session.launch_stage(req)
        for cmd in result.commands:  # a preflight's warning (the host's integrity) is said as one, not as `$`
            warning = cmd.startswith(PREFLIGHT_WARNING)
            print(f"{'' if warning else '$ '}{clean_block(cmd)}", file=sys.stderr)
        if not result.ok or launch is None:
            print(f"error: {clean_block(result.message)}", file=sys.stderr)
            return exitcodes.FAILED
        print(f"started {launch.unit}: run {launch.run_id} in {clean_block(launch.run_dir)}")
        if not a.wait:
            return exitcodes.OK
        return await follow_run(session, stage, launch.run_id, before=before)


async def stop_run(a: argparse.Namespace, profile) -> int:
    """`run stop STAGE | --run-id ID [--wait]`: the `x` key, headless; 0 once stopped."""
    if (a.target is None) == (a.run_id is None):
        print("error: run stop takes a STAGE or --run-id ID (one of them)", file=sys.stderr)
        return exitcodes.USAGE
    if a.target is not None:
        try:
            spec = stages.by_cli(a.target) if a.target in stages.cli_names() else stages.get(a.target)
        except stages.UnknownStage:
            print(f"error: unknown stage {a.target!r}: expected one of {', '.join(stages.cli_names())}",
                  file=sys.stderr)
            return exitcodes.USAGE
        if spec.kind == "server":
            print(f"error: {spec.name} is a server, not a run: use stop-server or run serve-baseline",
                  file=sys.stderr)
            return exitcodes.USAGE
    async with Session(profile, interval=a.interval) as session:
        snap = await session.settle()
        if not snap.host.reachable:
            print(f"error: {snap.host.error}", file=sys.stderr)
            return exitcodes.FAILED
        result, run = await session.stop_run(stage=spec.name if a.target is not None else None, run_id=a.run_id)
        for cmd in result.commands:
            print(f"$ {clean_block(cmd)}", file=sys.stderr)
        if not result.ok or run is None:
            print(f"error: {clean_block(result.message)}", file=sys.stderr)
            return exitcodes.FAILED
        print(clean_block(result.message))
        if not a.wait:
            return exitcodes.OK
        return await wait_stopped(session, run)


async def wait_stopped(session: Session, run: RunInfo) -> int:
    """Until the run stopped was seen to end: 0 when it stopped (or completed first), 1 when it failed or
    died without a word."""
    async for snap in session.snapshots(connecting=False):
        now = next((r for r in snap.runs if r.run_id == run.run_id), None)
        if now is None or now.state == "running":
            continue
        view = stages.view_of(now, snap.runs)
        print(view.line(), flush=True)
        if view.error and now.state != "done":
            print(f"note: {view.error}", file=sys.stderr)
        return exitcodes.OK if now.state in ("stopped", "done") else exitcodes.FAILED
    return exitcodes.FAILED


async def follow_run(session: Session, stage: str, run_id: str, before: RunInfo | None = None) -> int:
    """Print a line per progress change until the run finishes (or turns out dead: exit 1). `before`: the
    run as it was before this start (a resume): its outcome is not this start's, so it is not followed."""

    def ours(runs: tuple[RunInfo, ...]) -> RunInfo | None:
        run = next((r for r in runs if r.run_id == run_id), None)
        if run is None or (before is not None and run.started == before.started):
            return None
        return run

    last = None
    noted = False
    quiet_since = asyncio.get_running_loop().time()
    async for snap in session.snapshots(connecting=False):
        run = ours(snap.runs)
        if run is not None:
            quiet_since = asyncio.get_running_loop().time()
        elif snap.host.not_answering_since is not None:
            continue  # the host is slow to answer: its last facts say nothing of the run
        else:
            # a stage that dies before its first event (a missing module, a bad argument) leaves no run
            # to follow: ask its unit rather than wait out the silence
            ended = await stage_ended(session.host, session.profile, stage_unit_name(stage, run_id))
            if ended is not None:
                snap = await session.settle()  # read what it wrote before it ended
                run = ours(snap.runs)
                if run is None:
                    print(f"error: the run wrote no events{' for this start' if before else ''}: {ended}",
                          file=sys.stderr)
                    return exitcodes.FAILED
            else:
                if not noted and asyncio.get_running_loop().time() - quiet_since > NO_EVENTS_S:
                    # alive but silent (slow imports on a busy host): say so once, and keep following it
                    print(f"note: no events from run {run_id} for {NO_EVENTS_S:g} s; its unit "
                          f"{stage_unit_name(stage, run_id)} still runs: still waiting", file=sys.stderr)
                    noted = True
                continue
        view = stages.view_of(run, snap.runs)
        line = view.line()
        if line != last:
            print(line, flush=True)
            last = line
        if view.finished:
            if run.state != "done" and view.error:
                print(f"error: {view.error}", file=sys.stderr)
            # the results read other runs too (the bench's: its drafter bench, the verify run it compares
            # with), whose last events this session may not have read yet: read every run to the end first
            settled = await session.settle()
            for text in results(view, settled.runs if settled.host.reachable else snap.runs):
                print(text)
            if run.state == "done" and view.slower:
                print("the drafter is SLOWER than the baseline at some concurrency level: do not serve it",
                      file=sys.stderr)
                return exitcodes.SLOWER
            return exitcodes.OK if run.state == "done" else exitcodes.FAILED
    return exitcodes.FAILED  # the session ended: the host refused us (said in the last snapshot)


def progress_line(run: RunInfo, runs: tuple[RunInfo, ...]) -> str:
    return stages.view_of(run, runs).line()


def results(view: StageProgress, runs: tuple[RunInfo, ...]) -> list[str]:
    """What a finished run has to say, by its stage's result reader (verify: its table; bench: the
    comparison; else the outputs it leaves for the next stage)."""
    try:
        reader = stages.of_run(view.stage).results  # by the stage its run carries (the pair: bench_pair)
    except stages.UnknownStage:
        reader = stages.outputs
    return [clean_block(text) for text in reader(view, runs)]


def cmd_run(a: argparse.Namespace) -> int:
    return asyncio.run(run_stage(a))
