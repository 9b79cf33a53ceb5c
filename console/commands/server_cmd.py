"""Headless commands: status, wait-ready, start-server, stop-server, restart-server.

These are the contract scripts and tests rely on; the app shows the same Snapshot.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import sys
import time

from console.profile import Profile, ProfileError, load_profile
from console.telemetry.collector import Collector, server_log_path
from console.host.base import HostError
from console.host.factory import host_for_profile
from console.control.units import server_restart_argvs, server_start_argv, server_stop_argv
from console.telemetry.snapshot import Snapshot

VOLATILE = ("taken_at", "rtt_ms")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    st = sub.add_parser("status", help="what the host and its vLLM server are doing, once or as it changes")
    st.add_argument("--profile", required=True)
    st.add_argument("--json", action="store_true", help="one JSON object (the scripting contract)")
    st.add_argument("--watch", action="store_true", help="a JSON line per change, until interrupted")
    st.add_argument("--interval", type=float, default=0.5, help="seconds between probes with --watch")
    st.add_argument("--deep", action="store_true",
                    help="when ready, also send one tiny chat completion: did content and reasoning come back?")
    st.set_defaults(func=cmd_status)

    wr = sub.add_parser("wait-ready", help="exit 0 when the server is ready, 1 if its load failed, 2 on timeout")
    wr.add_argument("--profile", required=True)
    wr.add_argument("--timeout", type=float, default=3600.0)
    wr.add_argument("--interval", type=float, default=0.5)
    wr.set_defaults(func=cmd_wait_ready)

    for name, helptext in (("start-server", "start the profile's vLLM unit or tmux session"),
                           ("stop-server", "stop it (SIGTERM, then wait)"),
                           ("restart-server", "stop and start it again")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--profile", required=True)
        p.add_argument("--yes", action="store_true", help="do not ask before stopping a running server")
        p.set_defaults(func=cmd_server_action, action=name)


def load_or_exit(path: str) -> Profile:
    try:
        return load_profile(path)
    except ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def _stable(d: dict) -> dict:
    """The snapshot without what changes every tick, to decide whether anything changed."""
    d = json.loads(json.dumps(d))
    for key in VOLATILE:
        d.pop(key, None)
        d.get("host", {}).pop(key, None)
    return d


async def open_collector(profile: Profile, *, readonly: bool = False) -> Collector:
    collector = Collector(profile, host_for_profile(profile), readonly=readonly)
    await collector.try_connect()
    return collector


async def snapshot_once(profile: Profile, *, deep: bool = False) -> Snapshot:
    collector = await open_collector(profile)
    try:
        if not collector.host_info.reachable:
            return collector.snapshot()
        snap = await collector.refresh()
        for _ in range(3):  # the first probe finds runs, the next reads their events, then their units
            if collector.settled():
                break
            snap = await collector.refresh()
        if deep and snap.server.phase == "ready":
            await collector.run_deep_check()
            snap = collector.snapshot()
        return snap
    finally:
        await collector.close()
        with contextlib.suppress(Exception):
            await collector.host.close()


def human(snap: Snapshot) -> str:
    h, s, v = snap.host, snap.service, snap.server
    lines = []
    if h.simulated:
        text = f", serving {h.sim_text}" if h.sim_text else ""
        lines.append(f"*** SIMULATED demo host: no real GPU or vLLM{text} ***")
    lines.append(f"host     {h.name}: " + ("reachable" + (f" ({h.rtt_ms} ms)" if h.rtt_ms else "")
                                          if h.reachable else f"UNREACHABLE: {h.error}"))
    lines.append(f"service  {s.manager} {s.unit}: {s.active_state}/{s.sub_state}"
                 + (f" since {s.since}" if s.since else "") + (f", {s.restarts} restarts" if s.restarts else ""))
    extra = ""
    if v.progress:
        extra += f" {v.progress.done}/{v.progress.total} shards"
    if v.fraction is not None:
        extra += f" {v.fraction:.0%}"
    if v.eta_s is not None:
        extra += f" ETA {int(v.eta_s)} s ({v.eta_source})"
    lines.append(f"server   {v.phase}{extra}")
    if v.model_id:
        lines.append(f"         model {v.model_id}, max_model_len {v.max_model_len}, vLLM {v.version}")
    if v.deep_check:
        lines.append(f"         deep check {v.deep_check}")
    if v.error:
        lines.append(f"         ERROR: {v.error}")
    if snap.gpu_error:
        lines.append(f"gpus     {snap.gpu_error}")
    for g in snap.gpus:
        mem = (f"{g.memory_used_mib}/{g.memory_total_mib} MiB" if g.memory_used_mib is not None else "memory N/A")
        util = f"{g.utilization_pct}%" if g.utilization_pct is not None else "N/A"
        lines.append(f"gpu {g.index:<4} {g.name}: {mem}, util {util}")
    for r in snap.runs:
        lines.append(f"run      {r.stage} {r.run_id}: {r.state} {r.done}/{r.total}"
                     + (f", {r.failed} failed" if r.failed else ""))
    return "\n".join(lines)


def cmd_status(a: argparse.Namespace) -> int:
    profile = load_or_exit(a.profile)
    if a.watch:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(watch(profile, a.interval))
        return 0
    snap = asyncio.run(snapshot_once(profile, deep=a.deep))
    print(json.dumps(snap.to_json()) if a.json else human(snap))
    return 0 if snap.host.reachable else 3


async def _follow(collector: Collector) -> None:
    """Keep the load tracker fed from the journal between probes (systemd units)."""
    async for _ in collector.follow_journal():
        pass


async def live_snapshots(profile: Profile, interval: float):
    collector = await open_collector(profile)
    follower = None
    try:
        while True:
            if collector.host_info.reachable and follower is None and profile.server.manager == "systemd":
                follower = asyncio.create_task(_follow(collector))
            if collector.host_info.reachable and collector.final_error is None:
                snap = await collector.refresh()
            elif collector.final_error is None and await collector.try_connect():
                snap = await collector.refresh()
            else:
                snap = collector.snapshot()
            yield snap
            if collector.final_error:
                return  # a refused key will not fix itself: say so once and stop
            await asyncio.sleep(interval)
    finally:
        if follower:
            follower.cancel()
        await collector.close()


async def watch(profile: Profile, interval: float) -> None:
    last = None
    async for snap in live_snapshots(profile, interval):
        d = snap.to_json()
        stable = _stable(d)
        if stable != last:
            last = stable
            print(json.dumps(d), flush=True)


async def wait_ready(profile: Profile, timeout: float, interval: float) -> tuple[int, Snapshot | None]:
    deadline = time.monotonic() + timeout
    snap = None
    gen = live_snapshots(profile, interval)
    try:
        while time.monotonic() < deadline:
            try:
                snap = await asyncio.wait_for(gen.__anext__(), max(0.1, deadline - time.monotonic()))
            except (asyncio.TimeoutError, StopAsyncIteration):
                break
            if snap.server.phase == "ready" and not snap.server.error:
                return 0, snap
            if snap.server.phase == "failed":
                return 1, snap
        return 2, snap
    finally:
        await gen.aclose()


def cmd_wait_ready(a: argparse.Namespace) -> int:
    profile = load_or_exit(a.profile)
    rc, snap = asyncio.run(wait_ready(profile, a.timeout, a.interval))
    if rc == 0:
        print(f"ready: {snap.server.model_id} (vLLM {snap.server.version})")
    elif rc == 1:
        print(f"load failed: {snap.server.error or 'see the journal'}", file=sys.stderr)
    else:
        phase = snap.server.phase if snap else "unknown"
        err = f"; {snap.host.error}" if snap and snap.host.error else ""
        print(f"timed out after {a.timeout:g} s; server phase {phase}{err}", file=sys.stderr)
    return rc


async def server_action(profile: Profile, action: str) -> tuple[int, list[str], str]:
    host = host_for_profile(profile)
    await host.connect()
    log = server_log_path(profile)
    if action == "start-server":
        argvs = [server_start_argv(profile, log)]
    elif action == "stop-server":
        argvs = [server_stop_argv(profile)]
    else:
        argvs = server_restart_argvs(profile, log)
    shown, out = [], ""
    try:
        for argv in argvs:
            shown.append(shlex.join(argv))
            res = await host.run(argv, timeout=profile.server.stop_timeout_s + 60)
            out += res.stdout + res.stderr
            if not res.ok:
                return res.returncode, shown, out
        return 0, shown, out
    finally:
        await host.close()


def cmd_server_action(a: argparse.Namespace) -> int:
    profile = load_or_exit(a.profile)
    if a.action in ("stop-server", "restart-server") and not a.yes:
        if not sys.stdin.isatty():
            print(f"error: {a.action} stops a running server; pass --yes to confirm", file=sys.stderr)
            return 2
        answer = input(f"{a.action.replace('-server', '')} {profile.server.unit} on {profile.host.name}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing done")
            return 1
    try:
        rc, shown, out = asyncio.run(server_action(profile, a.action))
    except HostError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    for cmd in shown:
        print(f"$ {cmd}")
    if out.strip():
        print(out.strip(), file=sys.stderr if rc else sys.stdout)
    return rc
