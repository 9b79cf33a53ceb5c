"""Headless commands: status, wait-ready, start-server, stop-server, restart-server.

These are the contract scripts and tests rely on; they drive the same Session as the app and print the
same Snapshot, whose text is already cleaned of anything that could drive a terminal.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from typing import Any

from console import exitcodes
from console.profile import Profile, ProfileError, load_profile
from console.parsers.text import clean_block
from console.session import Session
from console.snapshot import Snapshot


def add_parsers(sub: argparse._SubParsersAction) -> None:
    st = sub.add_parser("status", help="what the host and its vLLM server are doing, once or as it changes")
    st.add_argument("--profile", required=True)
    st.add_argument("--json", action="store_true", help="one JSON object (the scripting contract)")
    st.add_argument("--watch", action="store_true", help="a JSON line per change, until interrupted")
    st.add_argument("--interval", type=float, default=0.5, help="seconds between probes with --watch")
    st.add_argument("--deep", action="store_true",
                    help="when ready, also send one tiny chat completion: did content and reasoning come back?")
    st.add_argument("--timeout", type=float, default=120.0,
                    help="give up after this many seconds (a one-shot status; default 120)")
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
        raise SystemExit(exitcodes.USAGE) from None


def watch_key(doc: dict[str, Any]) -> dict[str, Any]:
    """What `status --watch` compares in a snapshot's JSON: state, not noise (round trips, power,
    temperature, utilization, free disk, token rates and ETAs move every poll; a line per poll would
    bury the changes)."""
    d = json.loads(json.dumps(doc))
    d.pop("taken_at", None)
    d.pop("free_bytes", None)
    d["host"].pop("rtt_ms", None)
    server = d["server"]
    server.pop("eta_s", None)
    server.pop("eta_ready_s", None)
    server.pop("metrics", None)
    if server.get("fraction") is not None:
        server["fraction"] = round(server["fraction"], 2)
    for g in d["gpus"]:
        for noisy in ("power_w", "utilization_pct", "temperature_c"):
            g.pop(noisy, None)
        if g.get("memory_used_mib") is not None:
            g["memory_used_mib"] = round(g["memory_used_mib"] / 1024)  # GiB steps
    for r in d["runs"]:
        for noisy in ("rate", "eta_s", "last_event"):
            r.pop(noisy, None)
    return d


async def snapshot_once(profile: Profile, *, deep: bool = False, timeout: float = 120.0) -> Snapshot:
    async with Session(profile, interval=0.5) as session:
        try:
            return await asyncio.wait_for(session.settle(deep=deep), timeout)
        except asyncio.TimeoutError:
            return session.collector.snapshot(not_answering_since=time.time() - timeout,
                                              error=f"no complete answer within {timeout:g} s")


def human(snap: Snapshot) -> str:
    h, s, v = snap.host, snap.service, snap.server
    lines = []
    if h.simulated and h.sim_engine:
        lines.append(f"*** demo host: {h.sim_text} ***")
    elif h.simulated:
        text = f", serving {h.sim_text}" if h.sim_text else ""
        lines.append(f"*** SIMULATED demo host: no real GPU or vLLM{text} ***")
    if h.reachable:
        state = "reachable" + (f" ({h.rtt_ms} ms)" if h.rtt_ms else "")
    elif h.not_answering_since is not None:
        state = f"NOT ANSWERING: {h.error}"
    else:
        state = f"UNREACHABLE: {h.error}"
    lines.append(f"host     {h.name}: {state}")
    lines.append(f"service  {s.manager} {s.unit}: {s.active_state}/{s.sub_state}"
                 + (f" since {s.since}" if s.since else "") + (f", {s.restarts} restarts" if s.restarts else ""))
    extra = ""
    if v.progress:
        extra += f" {v.progress.done}/{v.progress.total} shards"
    if v.fraction is not None:
        extra += f" {v.fraction:.0%}"
    if v.eta_s is not None:
        extra += f" ETA {int(v.eta_s)} s ({v.eta_source})"
    if v.eta_ready_s is not None:
        extra += f", ready in {int(v.eta_ready_s)} s ({v.eta_ready_confidence})"
    lines.append(f"server   {v.phase}{extra}" + (" (with drafter)" if v.drafter is not None else ""))
    if v.drafter is not None:
        d = v.drafter
        aux = ", ".join(map(str, d.aux_layers)) if d.aux_layers else "not logged"
        lines.append(f"         drafter {'loaded' if d.loaded else 'load not logged yet'}, auxiliary layers {aux}")
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
        return exitcodes.OK
    snap = asyncio.run(snapshot_once(profile, deep=a.deep, timeout=a.timeout))
    print(json.dumps(snap.to_json(), allow_nan=False) if a.json else human(snap))
    return exitcodes.OK if snap.host.reachable else exitcodes.UNREACHABLE


async def watch(profile: Profile, interval: float) -> None:
    last = None
    async with Session(profile, interval=interval) as session:
        async for snap in session.snapshots(connecting=False):
            doc = snap.to_json()
            key = watch_key(doc)
            if key != last:
                last = key
                print(json.dumps(doc, allow_nan=False), flush=True)


async def wait_ready(profile: Profile, timeout: float, interval: float) -> tuple[int, Snapshot | None]:
    rc, snap, _ = await wait_ready_why(profile, timeout, interval)
    return rc, snap


async def wait_ready_why(profile: Profile, timeout: float, interval: float,
                         ) -> tuple[int, Snapshot | None, str | None]:
    """(0 ready, 1 load failed, 2 not ready in time or never reachable; the last snapshot; the reason the
    host refused us for good, when it did: a refused client key or an unknown host key)."""
    deadline = time.monotonic() + timeout
    snap = None
    async with Session(profile, interval=interval) as session:
        gen = session.snapshots(connecting=False)
        try:
            while time.monotonic() < deadline:
                try:
                    snap = await asyncio.wait_for(gen.__anext__(), max(0.1, deadline - time.monotonic()))
                except (asyncio.TimeoutError, StopAsyncIteration):
                    break
                if snap.server.phase == "ready" and not snap.server.error:
                    return exitcodes.OK, snap, None
                if snap.server.phase == "failed":
                    return exitcodes.FAILED, snap, None
                if session.final_error:
                    return exitcodes.NOT_READY, snap, session.final_error
            return exitcodes.NOT_READY, snap, session.final_error
        finally:
            await gen.aclose()


def cmd_wait_ready(a: argparse.Namespace) -> int:
    profile = load_or_exit(a.profile)
    rc, snap, refused = asyncio.run(wait_ready_why(profile, a.timeout, a.interval))
    if rc == exitcodes.OK and snap is not None:  # OK and FAILED come with the snapshot that said so
        print(f"ready: {snap.server.model_id} (vLLM {snap.server.version})")
    elif rc == exitcodes.FAILED and snap is not None:
        print(f"load failed: {snap.server.error or 'see the journal'}", file=sys.stderr)
    elif refused:
        print(f"error: {profile.host.name} refused the connection for good: {clean_block(refused)}",
              file=sys.stderr)
    else:
        phase = snap.server.phase if snap else "unknown"
        err = f"; {snap.host.error}" if snap and snap.host.error else ""
        print(f"timed out after {a.timeout:g} s; server phase {phase}{err}", file=sys.stderr)
    return rc


async def server_action(profile: Profile, action: str) -> tuple[int, list[str], str]:
    """start-server / stop-server / restart-server: the keys' own session actions, with their refusals
    (the baseline never starts beside the drafter server; a stop stops the server the console follows).
    (exit code, the commands run, what to tell the operator): 0 done, 1 refused or failed, 3 unreachable."""
    async with Session(profile) as session:
        if not await session.collector.try_connect():
            return exitcodes.UNREACHABLE, [], f"{profile.host.name}: {session.final_error or session.collector.error or 'unreachable'}"
        await session.tick()  # which server runs now (the one a stop stops)
        act = {"start-server": lambda: session.start_stage("serve"),
               "stop-server": lambda: session.stop_stage("serve"),
               "restart-server": session.restart_server}[action]
        result = await act()
        return (exitcodes.OK if result.ok else exitcodes.FAILED), list(result.commands), result.message


def cmd_server_action(a: argparse.Namespace) -> int:
    profile = load_or_exit(a.profile)
    if a.action in ("stop-server", "restart-server") and not a.yes:
        if not sys.stdin.isatty():
            print(f"error: {a.action} stops a running server; pass --yes to confirm", file=sys.stderr)
            return exitcodes.USAGE
        answer = input(f"{a.action.replace('-server', '')} {profile.server.unit} on {profile.host.name}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing done")
            return exitcodes.FAILED
    rc, shown, message = asyncio.run(server_action(profile, a.action))
    for cmd in shown:
        print(f"$ {clean_block(cmd)}")
    if rc:
        print(f"error: {clean_block(message)}", file=sys.stderr)
    else:
        print(clean_block(message))
    return rc
