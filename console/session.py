"""One session with a host: the connect/follow/refresh loop and the one set of actions on it.

The app, `status`, `status --watch`, `wait-ready` and `run STAGE [--wait]` all drive the collector
through a Session and nothing else does, so they always agree (the same refusals, the same snapshots).

The loop ticks on its interval whatever the host layer is doing: a refresh that has not answered within
its deadline yields a snapshot that says the host is not answering (and since when), with the last
known values, while that refresh goes on in the background. The server unit's journal is streamed once
and shared: it feeds the load tracker, the readiness watch
(telemetry/readiness_watch.py: the ready ask) and any view following the server's log.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shlex
import time
from dataclasses import dataclass
from typing import AsyncGenerator, AsyncIterator, Awaitable, Callable, Protocol

from backend.contract import stages as host_stages
from backend.kit.serverlock import describe_holder, lock_path
from console.control import disk, launch, stages
from console.control.bench_pair import drafter_loads, drafter_starts_text
from console.control.disk import DiskReport
from console.control import drafter_server as ds
from console.control import switch_plan as sp
from console.control.gpu_plan import gpu_plan
from console.control.launch import Launch, StageError, StageRequest
from console.control.operator_unit import OperatorUnitError, read_server_program
from console.control.permissions import check_permission
from console.control.units import (HostCommand, ServerProgram, live_stage_units_argv,
                                   parse_live_stage_units, server_restart_commands, server_start_command,
                                   server_stop_command, stage_log_path)
from console.host.base import AuthenticationFailed, HostError, HostKeyError
from console.host.factory import host_for_profile
from console.parsers.journal import journal_follow_argv, parse_journal_json
from console.parsers.text import clean, clean_block
from console.profile import Profile
from console.telemetry.collector import Collector, journal_tail_cursor
from console.telemetry.eta import downtime_text, span_text
from console.telemetry.history import History
from console.telemetry.readiness_watch import ReadinessWatch
from console.telemetry.server_log import LogFileCursor
from console.snapshot import RunInfo, Snapshot

LOG_POLL_S = 0.5
LOG_READ_MAX = 1 << 20
BACKLOG_LINES = 200  # what a view following a log sees of its past
SUBSCRIBER_QUEUE = 20000  # lines a slow view may fall behind before the oldest are dropped


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    message: str
    commands: tuple[str, ...] = ()  # what ran on the host, as the operator reads it


@dataclass(frozen=True)
class JournalLine:
    text: str
    unit: str
    ts: float | None = None


class Controller(Protocol):
    """What the Textual app needs (a Session; tests pass a fake with the same shape). mypy checks that
    both conform (`_conforms` here and in harness/fake_controller.py) and tests/test_controller_shape.py
    that their signatures match this one, so the app never reaches for a member only one of them has."""
    profile_name: str
    host_name: str
    simulated: bool
    readonly: bool
    history: History  # the panes' strips, fed by the controller with every snapshot it yields

    @property
    def final_error(self) -> str | None:
        """Set when connecting cannot succeed until the operator acts (a refused key or host key)."""
        ...

    def snapshots(self) -> AsyncIterator[Snapshot]: ...

    def journal(self, unit: str) -> AsyncIterator[JournalLine]: ...

    async def start_stage(self, stage: str) -> ActionResult: ...

    def stops_baseline(self, stage: str) -> bool: ...

    def downtime(self, stage: str) -> str: ...

    async def stop_stage(self, stage: str) -> ActionResult: ...

    async def restart_server(self) -> ActionResult: ...

    async def serve_drafter(self, input_run: str | None = None) -> ActionResult: ...

    async def serve_baseline(self) -> ActionResult: ...

    async def disk_report(self) -> DiskReport: ...

    async def prune_plan(self) -> disk.PrunePlan: ...

    async def prune_runs(self, names: list[str]) -> ActionResult: ...

    async def deep_check(self) -> ActionResult: ...

    async def close(self) -> None: ...


class Session:
    def __init__(self, profile: Profile, *, readonly: bool = False, interval: float = 1.0,
                 deadline: float | None = None, clock: Callable[[], float] = time.time):
        self.profile = profile
        self.profile_name = profile.name or "profile"
        self.host_name = profile.host.name
        self.simulated = profile.host.simulated
        self.readonly = readonly
        self.interval = interval
        # how long a refresh may take before the snapshot says "not answering"
        self.deadline = deadline if deadline is not None else max(5.0, 3 * interval)
        self.clock = clock
        self.host = host_for_profile(profile)
        self.collector = Collector(profile, self.host, readonly=readonly, clock=clock)
        self._connected = False
        self._server_stream: asyncio.Task | None = None
        self._stream_unit: str | None = None
        self._subscribers: set[asyncio.Queue] = set()
        self._refresh: asyncio.Task | None = None
        self._waiting_since: float | None = None
        self.history = History()  # the panes' strips: GPU memory and utilization, token rates
        # the ready ask, the port watch and the log's tail: one owner (telemetry/readiness_watch.py)
        self.readiness = ReadinessWatch(profile, self.host, self.collector)

    @property
    def final_error(self) -> str | None:
        """Set when connecting cannot succeed until the operator acts (a refused key or host key)."""
        return self.collector.final_error

    # -- the loop -----------------------------------------------------------------------------------

    async def snapshots(self, *, connecting: bool = True) -> AsyncGenerator[Snapshot, None]:
        """A snapshot about every `interval` seconds, for ever; after a final error, that one and stop.
        `connecting`: first a snapshot that says so (a view shows it at once; a script skips it)."""
        if connecting:
            yield self.collector.snapshot(error="connecting...")
        while True:
            started = time.monotonic()
            # a probe takes a round trip and the host's own time (100-500 ms over SSH): an answer to
            # the ready ask that comes meanwhile is shown at once, not after it
            tick = asyncio.ensure_future(self.tick())
            answered = False
            try:
                while await self._answered_before(tick):
                    answered = True
                    yield self._answered_snapshot()
            finally:
                if not tick.done():
                    tick.cancel()  # the refresh itself goes on (Session.tick keeps it for the next tick)
            snap = tick.result()
            if answered and snap.host.not_answering_since is None:
                snap = self.collector.snapshot()  # with the ask's answer: newer than the probe's
            if self._connected:
                self.readiness.ensure_log_tail()
            self.history.add(snap)
            yield snap
            if self.final_error:
                return
            pause = self.interval if snap.host.reachable else 2 * self.interval
            while await self._answered_before(started + pause):
                yield self._answered_snapshot()

    def _answered_snapshot(self) -> Snapshot:
        snap = self.collector.snapshot()  # the next tick records the load (a write on the host: not here)
        self.history.add(snap)
        return snap

    async def _answered_before(self, until: asyncio.Future | float) -> bool:
        """Wait for the tick (a future) or until a monotonic time; True, early, when a ready ask answered."""
        answered = self.readiness.answered
        if not answered.is_set():
            waiter = asyncio.ensure_future(answered.wait())
            try:
                if isinstance(until, asyncio.Future):
                    await asyncio.wait({until, waiter}, return_when=asyncio.FIRST_COMPLETED)
                else:
                    await asyncio.wait({waiter}, timeout=max(0.0, until - time.monotonic()))
            finally:
                waiter.cancel()
        if answered.is_set():
            answered.clear()
            return True
        return False

    async def tick(self) -> Snapshot:
        """One step: connect if needed, refresh within the deadline, or say the host is not answering."""
        if self._refresh is None:
            self._refresh = asyncio.create_task(self._step())
            self._refresh_started = self.clock()
        done, _ = await asyncio.wait({self._refresh}, timeout=self.deadline)
        if self._refresh in done:
            task, self._refresh = self._refresh, None
            snap = task.result()
            if self._waiting_since is not None:
                # that probe waited out the outage: its time says nothing of the link, a fresh one does
                self._waiting_since = None
                self.collector.rtt_ms = None
                snap = dataclasses.replace(snap, host=dataclasses.replace(snap.host, rtt_ms=None))
                if snap.host.reachable:
                    with contextlib.suppress(asyncio.TimeoutError):
                        snap = await asyncio.wait_for(self._step(), self.deadline)
            return snap
        if self._waiting_since is None:
            self._waiting_since = self._refresh_started
        waited = self.clock() - self._waiting_since
        return self.collector.snapshot(
            not_answering_since=self._waiting_since,
            error=f"{self.host_name} is not answering (nothing for {waited:.0f} s); showing the last known state")

    async def _step(self) -> Snapshot:
        if not self._connected and self.final_error is None:
            self._connected = await self.collector.try_connect()
        if self._connected and self.final_error is None:
            self._ensure_server_stream()
            snap = await self.collector.refresh()
            self._ensure_server_stream()  # the refresh may have switched servers: stream the one followed now
            return snap
        return self.collector.snapshot()

    async def settle(self, *, deep: bool = False, rounds: int = 4) -> Snapshot:
        """A one-shot snapshot: connect, then probe until every run's events and unit have been read
        (the first probe finds runs, the next reads their events, then their units)."""
        snap = await self.tick()
        for _ in range(rounds):
            if not snap.host.reachable or self.collector.settled():
                break
            snap = await self.tick()
        if deep and snap.server.phase == "ready":
            await self.deep_check()
            snap = self.collector.snapshot()
        return snap

    # -- logs ---------------------------------------------------------------------------------------

    def _ensure_server_stream(self) -> None:
        if self.profile.server.manager != "systemd":
            return
        if self._server_stream is not None and self._stream_unit != self.collector.server_unit:
            self._server_stream.cancel()  # the other server is followed now (its log was primed)
            self._server_stream = None
        if self._server_stream is None:
            self._stream_unit = self.collector.server_unit
            self._server_stream = asyncio.create_task(self._follow_server_unit(self._stream_unit))

    async def _follow_server_unit(self, unit: str) -> None:
        """The followed server unit's one journal stream: every entry goes to the load tracker and to
        each view following the server's log."""
        async for entry in self._follow_unit(unit, lambda: self.collector.log.cursor):
            run = self.collector.log.invocation
            fed = self.collector.log.feed_entry(entry)
            if fed:  # a line of the unit's current run (False: an earlier run's; None: a duplicate)
                if self.collector.log.invocation != run:  # the stream saw a restart before any probe did
                    self.collector.new_run(time.monotonic())
                    self.readiness.new_run()
                self.readiness.run_line(self.collector.log.invocation, entry.message)
            if fed is not None:
                line = JournalLine(clean(entry.message), unit, entry.ts)
                for q in self._subscribers:
                    if q.full():
                        q.get_nowait()  # the oldest goes: a stalled view must not grow memory
                    q.put_nowait(line)

    async def _follow_unit(self, unit: str, cursor_of: Callable[[], str | None]):
        """Follow a unit's journal for ever, resuming right after the last entry seen (no gaps, no
        duplicates, across reconnects). Never `-n` with a follow: started before the unit has entries,
        journalctl drops the unit's first burst, so the follow always starts after a cursor."""
        delay = 0.5
        cursor = cursor_of()
        while self.final_error is None:
            try:
                if cursor is None:
                    cursor = await journal_tail_cursor(self.host)
                async for raw in self.host.stream(journal_follow_argv(unit, cursor=cursor, lines=0)):
                    entry = parse_journal_json(raw)
                    if entry is None:
                        continue
                    cursor = entry.cursor or cursor
                    delay = 0.5
                    yield entry
            except (AuthenticationFailed, HostKeyError) as e:
                self.collector.final_error = str(e)
            except HostError:
                pass
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    def journal(self, unit: str) -> AsyncIterator[JournalLine]:
        """Follow a unit's log (the server's, or a stage run's) with its recent past first."""
        servers = {ds.server_unit(self.profile, w): w for w in ds.SERVERS}
        if self.profile.server.manager != "systemd":
            path = ds.server_log(self.profile, servers[unit]) if unit in servers \
                else stage_log_path(self.profile, unit)
            return self._journal_file(unit, path)
        if unit == self.collector.server_unit:
            return self._journal_shared()
        return self._journal_stage(unit)

    async def _journal_shared(self) -> AsyncIterator[JournalLine]:
        queue: asyncio.Queue = asyncio.Queue(maxsize=SUBSCRIBER_QUEUE)
        self._subscribers.add(queue)  # before the backlog is read: no line can fall between the two
        unit = self.collector.server_unit
        for entry in list(self.collector.log.recent):
            yield JournalLine(clean(entry.message), unit, entry.ts)
        try:
            while True:
                yield await queue.get()
        finally:
            self._subscribers.discard(queue)

    async def _journal_stage(self, unit: str) -> AsyncIterator[JournalLine]:
        cursor: str | None = None
        try:
            res = await self.host.run(["journalctl", "-u", unit, "-a", "-o", "json", "--no-pager",
                                       "-n", str(BACKLOG_LINES)], timeout=30)
            for raw in res.stdout.splitlines():
                entry = parse_journal_json(raw)
                if entry is not None:
                    cursor = entry.cursor or cursor
                    yield JournalLine(clean(entry.message), unit, entry.ts)
        except HostError:
            pass
        async for entry in self._follow_unit(unit, lambda: cursor):
            yield JournalLine(clean(entry.message), unit, entry.ts)

    async def _journal_file(self, unit: str, path: str) -> AsyncIterator[JournalLine]:
        """tmux manager: tail the program's log file by offset (about the last 200 lines first)."""
        tail: LogFileCursor | None = None
        while True:
            try:
                if tail is None:
                    head = await self.host.read_from(path, 0, 0)
                    start = max(0, head.size - 64 * 1024)
                    tail = LogFileCursor(inode=await self._inode(path), offset=start, skip_to_newline=start > 0)
                    first = True
                chunk = await self.host.read_from(path, tail.offset or 0, LOG_READ_MAX)
                lines, _ = tail.take(await self._inode(path), chunk.size, chunk.data, limit=LOG_READ_MAX)
                if tail.restarted:
                    yield JournalLine(f"[console] {path} was replaced or cut short: reading it from its start", unit)
                if first:
                    lines, first = lines[-BACKLOG_LINES:], False
                for line in lines:
                    yield JournalLine(clean(line), unit)
            except HostError:
                pass
            await asyncio.sleep(LOG_POLL_S)

    async def _inode(self, path: str) -> str:
        res = await self.host.run(["stat", "-L", "-c", "%i", path], timeout=30)
        return res.stdout.strip() if res.ok else "0"

    # -- actions ------------------------------------------------------------------------------------

    def _refused(self) -> ActionResult | None:
        return ActionResult(False, "read-only console: no action that changes the host") if self.readonly else None

    async def _permission_refused(self, what: str) -> ActionResult | None:
        """The SSH user may not start or stop systemd units (console/control/permissions.py): refused with
        the fix before anything is stopped. Asked once per session while the answer is yes."""
        if getattr(self, "_may_manage_units", False):
            return None
        try:
            verdict = await check_permission(self.host, self.profile)
        except HostError as e:
            return ActionResult(False, clean_block(f"{what} failed: {e}"))
        if verdict is not None and not verdict.ok:
            return ActionResult(False, clean_block(f"{what} refused: {verdict.message}"))
        self._may_manage_units = True
        return None

    async def _run_all(self, commands: list[HostCommand], what: str) -> ActionResult:
        shown: list[str] = []
        for cmd in commands:
            shown.append(cmd.shown)
            try:
                res = await self.host.run(cmd.argv, timeout=self.profile.server.stop_timeout_s + 60)
            except HostError as e:
                return ActionResult(False, clean_block(f"{what} failed: {e}"), tuple(shown))
            if not res.ok:
                err = (res.stderr or res.stdout).strip().splitlines()
                return ActionResult(False, clean(f"{what} failed (exit {res.returncode}): {err[-1] if err else ''}"),
                                    tuple(shown))
        return ActionResult(True, f"{what}: done", tuple(shown))

    def running(self, stage: str) -> list[RunInfo]:
        return [r for r in stages.runs_of(stage, self.collector.run_infos()) if r.state == "running"]

    def stops_baseline(self, stage: str) -> bool:
        """Starting `stage` stops the baseline server for a while (extract; train and verify when the
        profile trains online): the app asks first."""
        try:
            return launch.stops_baseline(StageRequest(stage), self.profile)
        except StageError:
            return False

    def downtime(self, stage: str, req: StageRequest | None = None) -> str:
        """What starting `stage` (a stage, pipeline, bench, serve-drafter or serve-baseline) costs the
        baseline, said before it is spent: how many server loads, how long each on this host
        (state/loads.jsonl, as the load ETA reads it)."""
        starts = span = ""
        if stage in ("serve-drafter", "serve-baseline", "serve_drafter", "serve_baseline"):
            loads = 1
        else:
            req = req or StageRequest(stage)
            try:
                plan = launch.request_gpu_plan(req, self.profile)
            except StageError as e:
                return clean(str(e))
            loads = plan.loads
            span = self._down_span(plan)
            if stages.starts_pair(stage):  # the GPU plan counts one drafter server start: one per K, and the published
                k_values = req.bench_k_values(self.profile)[0]
                loads += drafter_loads(self.profile, k_values) - 1
                starts = f"{drafter_starts_text(self.profile, k_values)} and the baseline's restart: "
        s = self.profile.server
        return span + starts + downtime_text(loads, self.collector.history, s.model_id, s.load_timeout_s)

    def _down_span(self, plan) -> str:
        """The whole time the baseline is down for a GPU plan's stages, from this host's runs (the
        question names it before the answer: a pipeline holds it down for hours, not for its loads)."""
        down = [step.stage for step in plan.steps if step.baseline_down]
        pipeline_gpu_stages = {r.name for r in host_stages.TABLE if r.in_pipeline and r.takes_gpus != "no"}
        if not down or not set(down) <= pipeline_gpu_stages:
            return ""  # a bench or a serve switch: its loads are the downtime (said after this)
        where = f"from {down[0]} through {down[-1]}" if len(down) > 1 else f"during {down[0]}"
        text = f"the baseline is down {where} for {span_text(down, self.collector.run_infos())}"
        if plan.hold:
            text += f", started again once after {plan.hold[1]}"
        cpu = [step.stage for step in plan.steps
               if (row := host_stages.find(step.stage)) is not None and row.cpu_offline and not step.baseline_down]
        if cpu and len(plan.steps) > 1:
            text += f"; {', '.join(cpu)} runs on the CPU with the baseline serving again"
        return text + "; "

    async def start_stage(self, stage: str, **options) -> ActionResult:
        result, _ = await self.launch_stage(StageRequest(stage, **options))
        return result

    async def launch_stage(self, req: StageRequest) -> tuple[ActionResult, Launch | None]:
        """Start a stage or a pipeline run; the Launch (run id, unit, run dir) comes back for headless
        callers. Refused while a run of that stage (or a pipeline) is going: two runs would fight over the
        same GPUs and files."""
        stage = req.stage
        if refused := self._refused():
            return refused, None
        if stage == "serve":
            if refused := await self._permission_refused("start server") or await self._lock_refused(
                    "start server") or await self._drafter_running():
                return refused, None
            return await self._run_all([server_start_command(self.profile)], "start server"), None
        try:
            busy = launch.busy_stages(req, self.profile)
        except StageError as e:
            return ActionResult(False, f"start {stage} failed: {e}"), None
        holder = next((r for r in self.collector.run_infos() if r.run_id == req.run_id and r.state == "running"),
                      None) if req.run_id else None
        if holder is not None:  # the host refuses it too (backend/kit/runlock.py); said here before any start
            return ActionResult(False, clean(f"run {holder.run_id} is in use by its {holder.stage} program (one "
                                             f"program at a time writes a run directory): stop it first, wait "
                                             f"for it, or choose another --run-id")), None
        for name in busy:
            if running := self.running(name):
                return ActionResult(False, clean(f"{name} run {running[0].run_id} is already running "
                                                 f"(stop it first, or wait for it)")), None
            try:
                live = await self._live_units(name)
            except HostError as e:
                return ActionResult(False, clean_block(f"start {stage} failed: {e}")), None
            if live:
                return ActionResult(False, clean(f"{name} is already running in {', '.join(live)} "
                                                 f"(stop it first, or wait for it)")), None
        try:
            started = await launch.launch_stage(self.host, self.profile, req)
        except (StageError, HostError) as e:
            return ActionResult(False, clean_block(f"start {stage} failed: {e}")), None
        return ActionResult(True, f"{stage} run {started.run_id} started in {started.unit}",
                            tuple(started.commands)), started

    async def _live_units(self, stage: str) -> list[str]:
        res = await self.host.run(live_stage_units_argv(self.profile, stage), timeout=30)
        return parse_live_stage_units(self.profile, stage, res.stdout)

    async def stop_stage(self, stage: str) -> ActionResult:
        if refused := self._refused():
            return refused
        if stage == "serve":
            if refused := await self._permission_refused("stop server") or await self._lock_refused("stop server"):
                return refused
            if self.collector.active == "drafter":  # the server followed is the one the operator sees
                return await self._run_all([ds.drafter_stop_command(self.profile)], "stop the drafter server")
            return await self._run_all([server_stop_command(self.profile)], "stop server")
        result, _ = await self.stop_run(stage=stage)
        return result

    async def stop_run(self, *, stage: str | None = None, run_id: str | None = None,
                       ) -> tuple[ActionResult, RunInfo | None]:
        """Stop the running run of `stage` (its newest), or the run `run_id`: its unit gets SIGTERM and
        the stage ends as its lifecycle says (a pipeline's stage run stops with its chain, whose unit it
        runs in). The run stopped comes back for headless callers."""
        if refused := self._refused():
            return refused, None
        runs = self.collector.run_infos()
        if run_id is not None:
            found = [r for r in runs if r.run_id == run_id]
            if not found:
                return ActionResult(False, f"no run {run_id} on {self.host_name}"), None
            if found[-1].state != "running":
                return ActionResult(False, f"{found[-1].stage} run {run_id} is not running ({found[-1].state})"), None
            running = found
        elif stage is not None:
            running = [r for r in stages.runs_of(stage, runs) if r.state == "running"]
            if not running:
                return ActionResult(False, f"no running {stage} run to stop"), None
        else:
            return ActionResult(False, "nothing to stop: name a stage or a run"), None
        run = running[-1]
        if refused := await self._permission_refused(f"stop {run.unit}"):
            return refused, None
        try:
            shown = await launch.stop_stage_unit(self.host, self.profile, run.unit or "")
        except (StageError, HostError) as e:
            return ActionResult(False, clean_block(str(e))), None
        return ActionResult(True, clean(f"stopped {run.unit}"), tuple(shown)), run

    # -- which server: the baseline or the drafter server (one at a time on the GPUs) ----------------

    async def live_servers(self) -> set[str]:
        """Which servers (drafter_server.SERVERS) the service manager says run now."""
        res = await self.host.run(ds.live_servers_argv(self.profile), timeout=30)
        return ds.parse_live_servers(self.profile, res.stdout)

    async def _swap_refused(self) -> ActionResult | None:
        """A server swap beside another swap or a training run would fight over the GPUs."""
        for name in launch.SWAP_EXCLUSIVE:
            live = [r.unit or r.run_id for r in self.running(name)] or await self._live_units(name)
            if live:
                return ActionResult(False, clean(f"{name} is running in {', '.join(live)} and needs the GPUs or "
                                                 f"swaps the servers itself: wait for it, or stop it first"))
        return None

    async def _switch(self, to: str, checkpoint: str | None, code_dir: str, shown: list[str],
                      program: ServerProgram | None = None) -> ActionResult:
        """Run the one server switch (backend/kit/switch.py) on the host, detached: it stops the other server and
        sees it down, starts `to`, and answers here once `to` started; waiting until it answers, and the
        baseline's return when the drafter server never does, go on there even if this link drops."""
        no_expand = self.profile.server.manager == "systemd" and await launch.systemd_run_expands(self.host)
        plan = sp.serve_plan(self.profile, checkpoint, no_expand_option=no_expand, program=program)
        plan_file = sp.serve_plan_path(self.profile, to)
        await self.host.run(["mkdir", "-p", plan_file.rsplit("/", 1)[0]], timeout=30, check=True)
        await self.host.upload(json.dumps(plan.to_dict(), indent=2).encode(), plan_file)
        if to == "drafter":
            shown.append(server_stop_command(self.profile).shown)
            start = ds.drafter_start_command(self.profile, checkpoint or "", no_expand_option=no_expand,
                                             program=program)
        else:
            shown.append(ds.drafter_stop_command(self.profile).shown)
            start = server_start_command(self.profile)
        shown.append(start.shown)
        gpus = gpu_plan(self.profile, [f"serve-{to}"], online=False, chain=False)
        shown.extend(f"(gpus) {line}" for line in gpus.describe())
        argv = ["env", f"PYTHONPATH={code_dir}", *sp.switch_argv(self.profile, plan_file, to)]
        shown.append(shlex.join(argv))
        budget = 2 * plan.command_timeout_s + 2 * plan.stop_check_s + 60
        res = await self.host.run(argv, timeout=budget)
        if not res.ok:
            err = [l for l in (res.stderr or res.stdout).strip().splitlines() if l.strip()]
            why = err[-1].removeprefix("switch: ") if err else f"exit {res.returncode}"
            return ActionResult(False, clean(f"serve the {to} failed: {why}"), tuple(shown))
        return ActionResult(True, "", tuple(shown))

    async def serve_drafter(self, input_run: str | None = None) -> ActionResult:
        """Stop the baseline and serve the verified drafter (`input_run`: a verify run, or a train run a
        verify run verified; default the latest completed verify run) as `<server unit>-drafter`."""
        if refused := self._refused():
            return refused
        shown: list[str] = []
        if refused := await self._permission_refused("serve the drafter"):
            return refused
        try:
            if refused := await self._swap_refused():
                return refused
            live = await self.live_servers()
            if "drafter" in live:
                return ActionResult(False, f"the drafter server is already running in "
                                           f"{ds.drafter_unit(self.profile)} (serve the baseline to stop it)")
            code_dir = await launch.ensure_backend(self.host, self.profile, shown)
            query = ["env", f"PYTHONPATH={code_dir}", *ds.servable_argv(self.profile, input_run)]
            res = await self.host.run(query, timeout=120)
            if not res.ok:
                why = clean_block((res.stderr or res.stdout).strip()) or f"exit {res.returncode}"
                return ActionResult(False, f"no drafter to serve: {why}", tuple(shown))
            found = json.loads(res.stdout.strip().splitlines()[-1])
            checkpoint, verify_run = str(found["checkpoint"]), str(found["run_id"])
            program = await read_server_program(self.host, self.profile)
            if program.note:
                shown.append(f"note: {program.note}")
            result = await self._switch("drafter", checkpoint, code_dir, shown, program)
        except (ds.DrafterServerError, OperatorUnitError) as e:
            return ActionResult(False, clean_block(f"serve the drafter failed: {e}"), tuple(shown))
        except (HostError, launch.StageError, ValueError, KeyError) as e:
            return ActionResult(False, clean_block(f"serve the drafter failed: {e}"), tuple(shown))
        if not result.ok:
            return result
        self.collector.follow_server("drafter")
        return ActionResult(True, clean(f"drafter server starting in {ds.drafter_unit(self.profile)} with "
                                        f"{checkpoint} (verified by {verify_run}); the baseline is started again "
                                        f"on the host if it does not come up"), result.commands)

    async def serve_baseline(self) -> ActionResult:
        """Stop the drafter server (when it runs) and start the baseline again."""
        if refused := self._refused():
            return refused
        shown: list[str] = []
        if refused := await self._permission_refused("serve the baseline"):
            return refused
        try:
            if refused := await self._swap_refused():
                return refused
            live = await self.live_servers()
            if "baseline" in live and "drafter" not in live:
                self.collector.follow_server("baseline")
                return ActionResult(True, f"the baseline server is already running in {self.profile.server.unit}",
                                    tuple(shown))
            code_dir = await launch.ensure_backend(self.host, self.profile, shown)
            result = await self._switch("baseline", None, code_dir, shown)
        except (HostError, launch.StageError, ValueError) as e:  # ValueError: a name the manager must not get
            return ActionResult(False, clean_block(f"serve the baseline failed: {e}"), tuple(shown))
        if not result.ok:
            return result
        self.collector.follow_server("baseline")
        return ActionResult(True, f"baseline server starting in {self.profile.server.unit}", result.commands)

    async def restart_server(self) -> ActionResult:
        if refused := self._refused():
            return refused
        if refused := await self._permission_refused("restart server") or await self._lock_refused(
                "restart server") or await self._drafter_running():
            return refused
        return await self._run_all(server_restart_commands(self.profile), "restart server")

    async def switch_finished(self) -> bool:
        """Whether no program holds the host's server lock (a detached switch ends a moment after the
        server it started answers: a step started before then would be refused)."""
        return await self._lock_refused("") is None

    async def _lock_refused(self, what: str) -> ActionResult | None:
        """A program on the host holds the server lock (backend/kit/serverlock.py: an extract, a bench, a
        switch, a pipeline): starting or stopping a server now would cut into its switch."""
        path = lock_path(self.profile.paths.work_dir)
        script = ('[ -e "$1" ] || exit 0; command -v flock >/dev/null 2>&1 || exit 0; '
                  'flock -n "$1" true && exit 0; head -c 4096 "$1"; exit 75')
        try:
            res = await self.host.run(["sh", "-c", script, "sh", path], timeout=30)
        except HostError:
            return None  # cannot tell: the action's own command answers
        if res.returncode != 75:
            return None
        try:
            holder = json.loads(res.stdout or "{}")
        except ValueError:
            holder = {}
        return ActionResult(False, clean(f"{what} refused: the servers are being switched by "
                                         f"{describe_holder(holder if isinstance(holder, dict) else {})}; wait "
                                         f"for it to finish, or stop it first"))

    async def _drafter_running(self) -> ActionResult | None:
        """One server at a time on the GPUs: the baseline never starts beside the drafter server."""
        try:
            live = await self.live_servers()
        except (HostError, ValueError) as e:
            return ActionResult(False, clean_block(f"cannot tell which server runs: {e}"))
        if "drafter" in live:
            return ActionResult(False, f"the drafter server runs in {ds.drafter_unit(self.profile)}: serve the "
                                       f"baseline (it stops the drafter server first)")
        return None

    async def disk_report(self) -> DiskReport:
        await self.host.connect()
        return await disk.survey(self.host, self.profile, readonly=self.readonly)

    def _prune_selection(self) -> list[str]:
        running = [r.run_id for r in self.collector.run_infos() if r.state == "running"]
        return disk.selection_args(running=running, older_than_s=None, stage=None, archived=False)

    async def prune_plan(self) -> disk.PrunePlan:
        return await disk.prune(self.host, self.profile, self._prune_selection())

    async def prune_runs(self, names: list[str]) -> ActionResult:
        """Delete the runs the operator agreed to; the host plans again first and keeps what is protected now."""
        if refused := self._refused():
            return refused
        try:
            done = await disk.prune(self.host, self.profile, self._prune_selection(), only=names)
        except (disk.DiskError, HostError) as e:
            return ActionResult(False, clean_block(str(e)))
        by = {d.name: d for d in done.results}
        lines = [f"deleted {len(done.deleted)} of {len(names)} run(s)"]
        lines += [f"{n}: " + ("deleted" if n in by and by[n].deleted else
                              f"NOT deleted: {by[n].reason if n in by else 'no answer from the host'}") for n in names]
        lines += [f"left out: {s}" for s in done.skipped]
        return ActionResult(len(done.deleted) == len(names), clean_block("\n".join(lines)),
                            (f"python -m backend.kit.disk prune --delete ({len(names)} run(s))",))

    async def deep_check(self) -> ActionResult:
        try:
            text = await self.collector.run_deep_check()
        except (HostError, OSError) as e:
            return ActionResult(False, clean_block(f"deep check failed: {e}"))
        return ActionResult(text.startswith("ok"), clean_block(text), ("POST /v1/chat/completions",))

    async def close(self) -> None:
        for task in (self._server_stream, self._refresh):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._server_stream = self._refresh = None
        await self.readiness.close()
        await self.collector.close()
        with contextlib.suppress(Exception):
            await self.host.close()

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()



def _conforms(session: Session) -> Controller:
    """mypy fails here when Session lacks a member of the Controller Protocol or has one of another type."""
    return session
