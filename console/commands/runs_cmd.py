"""`eagle3-console runs disk|prune --profile P ...`: the host's disk, and old runs removed with care."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict

from backend.bench import PAIR_STAGE
from backend.contract import stages as host_stages
from backend.contract.runs import RUN_ID_PATTERN
from backend.kit.preflight import human_bytes
from console import exitcodes
from console.commands.server_cmd import load_or_exit
from console.control.disk import DiskError, PrunePlan, RunSpace, parse_duration, prune, selection_args, survey
from console.host.base import HostError
from console.session import Session


def add_parser(sub: argparse._SubParsersAction) -> None:
    runs = sub.add_parser("runs", help="the host's disk: run sizes, and pruning old runs")
    rsub = runs.add_subparsers(dest="runs_command", required=True)
    d = rsub.add_parser("disk", help="free space of the volumes and each run's size, stage, state and age")
    d.add_argument("--profile", required=True)
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_disk)
    p = rsub.add_parser("prune", help="delete old runs (never a running or resumable run, the newest completed "
                                      "run of a stage, the drafter being served, nor any run those need); "
                                      "lists them and asks first")
    p.add_argument("--profile", required=True)
    p.add_argument("--older-than", help="only runs untouched for this long: 90s, 30m, 12h, 7d, 2w")
    p.add_argument("--stage", choices=host_stages.names() + ("pipeline", PAIR_STAGE))
    p.add_argument("--archived", action="store_true", help="only the runs --fresh moved aside")
    p.add_argument("--resumable", action="store_true",
                   help="failed, stopped and unfinished runs may go too (kept otherwise: they can be resumed)")
    p.add_argument("--yes", action="store_true", help="do not ask (scripts)")
    p.set_defaults(func=cmd_prune)


def age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{max(0.0, seconds):.0f}s"


def run_line(r: RunSpace, now: float) -> str:
    name = r.name + (" (archived)" if r.archived else "")
    return f"  {name:<44} {r.stage or '?':<10} {r.state:<10} {age(now - r.mtime):>5} {human_bytes(r.size):>10}"


def plan_text(plan: PrunePlan, now: float) -> str:
    lines = []
    if plan.delete:
        lines.append(f"would delete {len(plan.delete)} run(s), {human_bytes(plan.total_bytes)} in all:")
        lines += [f"{run_line(r, now)}  ({r.breaks or 'breaks nothing'})" for r in plan.delete]
    else:
        lines.append("nothing to delete")
    if plan.keep:
        lines.append("kept:")
        lines += [f"{run_line(r, now)}  ({r.reason})" for r in plan.keep]
    lines += [f"left out: {s}" for s in plan.skipped]
    return "\n".join(lines)


def results_text(asked: list[str], done: PrunePlan) -> tuple[str, bool]:
    """Each asked run's result, and whether every one went."""
    by = {d.name: d for d in done.results}
    lines = [f"deleted {len(done.deleted)} of {len(asked)} run(s)"]
    for name in asked:
        d = by.get(name)
        lines.append(f"  {name}: " + ("deleted" if d and d.deleted else
                                      f"NOT deleted: {d.reason if d else 'no answer from the host'}"))
    return "\n".join(lines), len(done.deleted) == len(asked)


async def running_runs(session: Session) -> list[str]:
    snap = await session.settle()
    if not snap.host.reachable:
        raise HostError(snap.host.error or "host not reachable")
    return [r.run_id for r in snap.runs if r.state == "running" and RUN_ID_PATTERN.fullmatch(r.run_id)]


def cmd_disk(a: argparse.Namespace) -> int:
    profile = load_or_exit(a.profile)

    async def go():
        async with Session(profile) as session:
            await session.host.connect()
            return await survey(session.host, profile)
    try:
        report = asyncio.run(go())
    except (DiskError, HostError) as e:
        print(f"error: {e}", file=sys.stderr)
        return exitcodes.FAILED
    if a.json:
        print(json.dumps({"volumes": [asdict(v) for v in report.volumes], "runs": [asdict(r) for r in report.runs],
                          "skipped": list(report.skipped)}))
        return exitcodes.OK
    now = time.time()
    for v in report.volumes:
        print(f"volume {v.path}: {human_bytes(v.free)} free of {human_bytes(v.total)}")
    for r in sorted(report.runs, key=lambda r: -r.size):
        print(run_line(r, now))
    for s in report.skipped:
        print(f"left out: {s}", file=sys.stderr)
    return exitcodes.OK


def cmd_prune(a: argparse.Namespace) -> int:
    profile = load_or_exit(a.profile)
    try:
        older = parse_duration(a.older_than) if a.older_than else None
    except DiskError as e:
        print(f"error: {e}", file=sys.stderr)
        return exitcodes.USAGE

    async def go() -> int:
        async with Session(profile) as session:
            selection = selection_args(running=await running_runs(session), older_than_s=older, stage=a.stage,
                                       archived=a.archived, resumable=a.resumable)
            plan = await prune(session.host, profile, selection)
            now = time.time()
            print(plan_text(plan, now))
            if not plan.delete:
                return exitcodes.OK
            if not a.yes:
                if not sys.stdin.isatty():
                    print("not deleting: pass --yes to delete without a terminal to ask on", file=sys.stderr)
                    return exitcodes.USAGE
                answer = await asyncio.to_thread(
                    input, f"delete these {len(plan.delete)} run(s), {human_bytes(plan.total_bytes)}? [y/N] ")
                if answer.strip().lower() not in ("y", "yes"):
                    print("nothing deleted")
                    return exitcodes.FAILED
            asked = [r.name for r in plan.delete]
            done = await prune(session.host, profile, selection, only=asked)
            text, all_went = results_text(asked, done)
            print(text)
            for s in done.skipped:
                print(f"left out: {s}", file=sys.stderr)
            return exitcodes.OK if all_went else exitcodes.FAILED
    try:
        return asyncio.run(go())
    except (DiskError, HostError) as e:
        print(f"error: {e}", file=sys.stderr)
        return exitcodes.FAILED
