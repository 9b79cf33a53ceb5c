"""Ready the moment it is ready: everything that makes the session ask /health and /v1/models between its
ticks, in one owner.

Three things say "ask now": a line of the server's current run that says its API is starting or ready
(the journal stream under systemd, a `tail -F` of the log under tmux), and under systemd the port watch on
the host (port_watch.py), one per run of the unit. An ask goes on every ASK_GAP_S until the port answers
or its window ends; the answer itself (HTTP state, the unit seen active) is the collector's
(Collector.ask_ready), and `answered` tells the session's loop to yield a snapshot at once.

The session's one journal stream stays the session's (it also feeds the views); it hands each line of the
unit's current run here (`run_line`).
"""
from __future__ import annotations

import asyncio
import contextlib
import time

from console import naming
from console.host.base import Host, HostError
from console.parsers.vllm_log import APP_STARTING, HTTP_START, ROUTES, STARTUP_COMPLETE, parse_line
from console.profile import Profile
from console.telemetry.collector import Collector
from console.telemetry.port_watch import parse_port_watch, port_watch_argv

# How long to keep asking /health and /v1/models after a server log line, and how often. From the API
# server's start (`Starting vLLM server on`, its routes, uvicorn's startup lines) the port listens within
# moments; after `Application startup complete.`, within milliseconds. Ask from the start: journald posts
# new entries to followers at most every 250 ms (journald-server.c, POST_CHANGE_TIMER_INTERVAL_USEC), so
# over the journal stream the ready line itself can come a quarter of a second after it was written
# (hence the port watch under systemd).
ASK_WINDOW_S = {HTTP_START: 3.0, ROUTES: 3.0, APP_STARTING: 3.0, STARTUP_COMPLETE: 1.0}
ASK_GAP_S = 0.02
ASK_ON_LISTEN_S = 3.0  # the port watch saw it listen: /health answers within moments


def ask_window(line: str) -> float | None:
    """Seconds to keep asking whether the server answers after this line of its log; None: no news."""
    event = parse_line(line)
    return ASK_WINDOW_S.get(event.kind) if event is not None else None


class ReadinessWatch:
    def __init__(self, profile: Profile, host: Host, collector: Collector):
        self.profile = profile
        self.host = host
        self.collector = collector
        self.answered = asyncio.Event()  # an ask found the port answering: the loop yields at once
        self._ask_until: float | None = None  # monotonic
        self._asker: asyncio.Task | None = None
        # tmux: a `tail -F` of the followed server's log
        self._log_tail: asyncio.Task | None = None
        self._log_tail_path: str | None = None
        # systemd: a watch of the port on the host for each run of the unit
        self._port_watch: asyncio.Task | None = None
        self._port_watch_run: str | None = None  # the unit's invocation it was started for
        # the run whose port an ask found answering: its later lines (journald brings uvicorn's startup
        # lines a batch after the routes) ask nothing more; the next run's ask and watch are its own
        self._answered_run: str | None = None

    # -- what says "ask now" -------------------------------------------------------------------------

    def run_line(self, run: str | None, line: str) -> None:
        """systemd: a journal line of the unit's current run `run` (its invocation id)."""
        self._ensure_port_watch(run)
        if run is None or run != self._answered_run:
            self.server_said(line)

    def new_run(self) -> None:
        """The unit restarted: an answer not yet shown was the earlier process's."""
        self.answered.clear()

    def server_said(self, line: str) -> None:
        """A line of the followed server's current run: if it says the API is starting or ready, ask."""
        window = ask_window(line)
        if window is not None:
            self.ask_for(window)

    def ask_for(self, window: float) -> None:
        """Ask whether the server answers now, and every ASK_GAP_S for `window` seconds until it does."""
        self._ask_until = max(self._ask_until or 0.0, time.monotonic() + window)
        if self._asker is None or self._asker.done():
            self._asker = asyncio.create_task(self._ask_until_answered())

    async def _ask_until_answered(self) -> None:
        while self._ask_until is not None and time.monotonic() < self._ask_until:
            if await self.collector.ask_ready():
                self._answered_run = self.collector.log.invocation
                self.answered.set()
                break
            await asyncio.sleep(ASK_GAP_S)
        self._ask_until = None

    # -- systemd: the port watch ---------------------------------------------------------------------

    def _ensure_port_watch(self, run: str | None) -> None:
        """A line of the unit's run `run`: watch its port on the host until it listens (once per run).
        A watch still waiting from an earlier run goes on: it fires when this run listens."""
        if run is None or run == self._port_watch_run:
            return
        self._port_watch_run = run
        if self._port_watch is None or self._port_watch.done():
            self._port_watch = asyncio.create_task(self._watch_port())

    async def _watch_port(self) -> None:
        argv = port_watch_argv(self.profile.paths.python, self.profile.server.port)
        try:
            async for line in self.host.stream(argv):
                said = parse_port_watch(line)
                if said and self._port_watch_run != self._answered_run:  # not once an ask found it
                    self.ask_for(ASK_ON_LISTEN_S)
                if said is not None:
                    return
        except HostError:
            self._port_watch_run = None  # the link dropped: the run's next line starts another

    # -- tmux: the log's tail ------------------------------------------------------------------------

    def ensure_log_tail(self) -> None:
        """tmux manager: the probe reads the server's log once a tick, so a `tail -F` of it (while the
        loop runs) brings the ready line as it is written. systemd: the journal stream does it."""
        if self.profile.server.manager == "systemd":
            return
        path = naming.server_log(self.profile, self.collector.active)
        if self._log_tail is not None and (self._log_tail_path != path or self._log_tail.done()):
            self._log_tail.cancel()
            self._log_tail = None
        if self._log_tail is None:
            self._log_tail_path = path
            self._log_tail = asyncio.create_task(self._tail_log(path))

    async def _tail_log(self, path: str) -> None:
        delay = 0.5
        while self.collector.final_error is None:
            with contextlib.suppress(HostError):
                # -s: GNU tail polls (once a second by default) instead of using inotify when the
                # file is missing as it starts, as the log is before the server's first start
                async for raw in self.host.stream(["tail", "-n", "0", "-F", "-s", "0.05", "--", path]):
                    delay = 0.5
                    for line in raw.split("\r"):
                        self.server_said(line)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    async def close(self) -> None:
        for task in (self._log_tail, self._asker, self._port_watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._log_tail = self._asker = self._port_watch = None
