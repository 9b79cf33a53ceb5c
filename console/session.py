"""The real Controller: collectors and the host layer behind the app (see console/controller.py)."""
from __future__ import annotations

import asyncio
import contextlib
import shlex
from typing import AsyncIterator

from console.profile import Profile
from console.telemetry.collector import Collector, server_log_path
from console.control.stages import ActionResult, JournalLine
from console.host.base import HostError
from console.host.factory import host_for_profile
from console.control.units import server_restart_argvs, server_start_argv, server_stop_argv
from console.telemetry.snapshot import Snapshot
from console.control.launch import StageError, launch_generate, stage_log_path, stop_stage_unit

LOG_POLL_S = 0.5


class LiveController:
    def __init__(self, profile: Profile, *, readonly: bool = False, interval: float = 1.0):
        self.profile = profile
        self.profile_name = profile.name or "profile"
        self.host_name = profile.host.name
        self.simulated = profile.host.simulated
        self.readonly = readonly
        self.interval = interval
        self.host = host_for_profile(profile)
        self.collector = Collector(profile, self.host, readonly=readonly)
        self._connected = False
        self._follower: asyncio.Task | None = None

    # -- data ---------------------------------------------------------------------------------------

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        self.collector.host_info.error = "connecting..."
        yield self.collector.snapshot()
        while True:
            if not self._connected and self.collector.final_error is None:
                self._connected = await self.collector.try_connect()
            if self._connected and self.collector.final_error is None:
                if self._follower is None and self.profile.server.manager == "systemd":
                    self._follower = asyncio.create_task(self._feed_tracker())
                snap = await self.collector.refresh()
            else:
                snap = self.collector.snapshot()
            yield snap
            await asyncio.sleep(self.interval if self.collector.host_info.reachable else 2 * self.interval)

    async def _feed_tracker(self) -> None:
        async for _ in self.collector.follow_journal():
            pass

    def journal(self, unit: str) -> AsyncIterator[JournalLine]:
        if self.profile.server.manager == "systemd":
            return self._journal_systemd(unit)
        return self._journal_file(unit, self._log_path(unit))

    async def _journal_systemd(self, unit: str) -> AsyncIterator[JournalLine]:
        async for text in self.collector.follow_journal(unit, feed_tracker=False):
            yield JournalLine(text=text, unit=unit)

    def _log_path(self, unit: str) -> str:
        if unit == self.profile.server.unit:
            return server_log_path(self.profile)
        return stage_log_path(self.profile, unit)

    async def _journal_file(self, unit: str, path: str) -> AsyncIterator[JournalLine]:
        """tmux manager: tail the program's log file by offset (about the last 200 lines first)."""
        from console.parsers.vllm_log import split_cr
        offset, first = None, True
        while True:
            try:
                if offset is None:
                    offset = max(0, (await self.host.read_from(path, 0, 0)).size - 64 * 1024)
                chunk = await self.host.read_from(path, offset, 1 << 20)
                if chunk.size < offset:
                    offset, first = 0, False  # truncated or replaced: start over
                    continue
                end = chunk.data.rfind(b"\n") + 1
                lines = chunk.data[:end].decode(errors="replace").split("\n")[:-1]
                if first:
                    lines = lines[1:][-200:] if offset > 0 else lines[-200:]  # a tail starts mid-line
                    first = False
                offset += end
                for line in lines:
                    yield JournalLine(text=split_cr(line), unit=unit)
            except HostError:
                pass
            await asyncio.sleep(LOG_POLL_S)

    # -- actions ------------------------------------------------------------------------------------

    def _refuse(self) -> ActionResult | None:
        return ActionResult(False, "read-only console: no action that changes the host") if self.readonly else None

    async def _run_all(self, argvs: list[list[str]], what: str) -> ActionResult:
        shown = []
        for argv in argvs:
            shown.append(shlex.join(argv))
            try:
                res = await self.host.run(argv, timeout=self.profile.server.stop_timeout_s + 60)
            except HostError as e:
                return ActionResult(False, f"{what} failed: {e}", tuple(shown))
            if not res.ok:
                err = (res.stderr or res.stdout).strip().splitlines()
                return ActionResult(False, f"{what} failed (exit {res.returncode}): {err[-1] if err else ''}",
                                    tuple(shown))
        return ActionResult(True, f"{what}: done", tuple(shown))

    async def start_stage(self, stage: str) -> ActionResult:
        if refused := self._refuse():
            return refused
        if stage == "serve":
            return await self._run_all([server_start_argv(self.profile, server_log_path(self.profile))],
                                       "start server")
        if stage == "generate":
            running = [r for r in self.collector.run_infos() if r.stage == "generate" and r.state == "running"]
            if running:
                return ActionResult(False, f"generate run {running[0].run_id} is already running")
            try:
                launch = await launch_generate(self.host, self.profile)
            except (StageError, HostError) as e:
                return ActionResult(False, f"start generate failed: {e}")
            return ActionResult(True, f"generate run {launch.run_id} started in {launch.unit}",
                                tuple(launch.commands))
        return ActionResult(False, f"stage {stage!r} cannot be started from this version of the console yet")

    async def stop_stage(self, stage: str) -> ActionResult:
        if refused := self._refuse():
            return refused
        if stage == "serve":
            return await self._run_all([server_stop_argv(self.profile)], "stop server")
        running = [r for r in self.collector.run_infos() if r.stage == stage and r.state == "running"]
        if not running:
            return ActionResult(False, f"no running {stage} run to stop")
        try:
            shown = await stop_stage_unit(self.host, self.profile, running[-1].unit or "")
        except (StageError, HostError) as e:
            return ActionResult(False, str(e))
        return ActionResult(True, f"stopped {running[-1].unit}", tuple(shown))

    async def restart_server(self) -> ActionResult:
        if refused := self._refuse():
            return refused
        return await self._run_all(server_restart_argvs(self.profile, server_log_path(self.profile)),
                                   "restart server")

    async def deep_check(self) -> ActionResult:
        try:
            text = await self.collector.run_deep_check()
        except (HostError, OSError) as e:
            return ActionResult(False, f"deep check failed: {e}")
        return ActionResult(text.startswith("ok"), text, ("POST /v1/chat/completions",))

    async def close(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(BaseException):
                await self._follower
        await self.collector.close()
        with contextlib.suppress(Exception):
            await self.host.close()
