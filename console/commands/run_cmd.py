"""`eagle3-console run STAGE`: start a stage on the host, detached; `--wait` follows it to the end."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys

from console.telemetry.collector import Collector
from console.commands.server_cmd import load_or_exit
from console.host.base import HostError
from console.host.factory import host_for_profile
from backend.events import EVENTS_FILE
from console.control.launch import StageError, launch_generate, run_dir_path, stage_ended
from console.telemetry.probe import stage_unit_name


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="start a pipeline stage on the host (detached: it survives the console)")
    p.add_argument("stage", choices=("generate",))
    p.add_argument("--profile", required=True)
    p.add_argument("--dataset", help="override [generate].dataset: a path on the host; a relative one is taken from "
                                     "this directory on a local host, from [paths].data_dir on an SSH host")
    p.add_argument("--limit", type=int, help="override [generate].samples")
    p.add_argument("--run-id", help="default: generate-YYYYmmdd-HHMMSS; reuse one to resume it")
    p.add_argument("--fresh", action="store_true", help="archive an existing run dir of that id and start over")
    p.add_argument("--wait", action="store_true", help="follow the run; exit 0 only when it completed")
    p.add_argument("--interval", type=float, default=2.0)
    p.set_defaults(func=cmd_run)


async def run_stage(a: argparse.Namespace) -> int:
    profile = load_or_exit(a.profile)
    host = host_for_profile(profile)
    try:
        await host.connect()
        launch = await launch_generate(host, profile, run_id=a.run_id, dataset=a.dataset, limit=a.limit,
                                       fresh=a.fresh)
        for cmd in launch.commands:
            print(f"$ {cmd}", file=sys.stderr)
        print(f"started {launch.unit}: run {launch.run_id} in {launch.run_dir}")
        if not a.wait:
            return 0
        return await follow_run(Collector(profile, host), launch.run_id, a.interval)
    except (StageError, HostError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        with contextlib.suppress(Exception):
            await host.close()


async def follow_run(collector: Collector, run_id: str, interval: float) -> int:
    """Print a line per progress change until the run finishes (or turns out dead: exit 1)."""
    await collector.connect()
    last = None
    seen = 0.0
    while True:
        snap = await collector.refresh()
        run = next((r for r in snap.runs if r.run_id == run_id), None)
        if run is not None:
            line = f"{run.state}: {run.done}/{run.total} done, {run.failed} failed"
            if run.rate:
                line += f", {run.rate:.1f}/s"
            if line != last:
                print(line, flush=True)
                last = line
            if run.state in ("done", "failed", "stopped", "stale"):
                ev = run.last_event or {}
                if run.state != "done" and ev.get("error"):
                    print(f"error: {ev['error']}", file=sys.stderr)
                return 0 if run.state == "done" else 1
        else:
            # a stage that dies before its first event (a missing module, a bad argument) leaves no run
            # to follow: ask its unit rather than wait out the silence
            ended = await stage_ended(collector.host, collector.profile, stage_unit_name("generate", run_id))
            if ended is not None and not await _has_events(collector, run_id):
                print(f"error: the run wrote no events: {ended}", file=sys.stderr)
                return 1
            seen += interval
            if seen > 120:
                print("error: the run wrote no events in 120 s: check its log", file=sys.stderr)
                return 1
        await asyncio.sleep(interval)


async def _has_events(collector: Collector, run_id: str) -> bool:
    """The run wrote its events (the collector just has not listed them yet)."""
    path = f"{run_dir_path(collector.profile, run_id)}/{EVENTS_FILE}"
    return (await collector.host.run(["test", "-s", path], timeout=30)).ok


def cmd_run(a: argparse.Namespace) -> int:
    return asyncio.run(run_stage(a))
