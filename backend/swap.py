"""The server swap, one definition for every stage that needs the extraction server on the baseline's GPUs.

Extract (hidden states to disk) and online training (hidden states fetched per batch) both run their work
against a vLLM server started with the `extract_hidden_states` speculative config. The swap plan
(backend/extract/plan.py, built by the console) says how to get one; this module runs it:

    swap in       stop the baseline, start the extraction server, wait until it answers /health and
                  /v1/models (a server that exits while loading is named with the end of its log)
    the body      the stage's own work; `ExtractionServer.lost()` tells it, between checks, that the
                  server died (its unit is gone, or it failed `dead_after` health checks in a row)
    swap back     ALWAYS, also after a failure or a stop signal: stop the extraction server, start the
                  baseline; a baseline that will not start again is a fatal error naming the command

`run_swapped` runs an async body under the swap; `run_swapped_blocking` runs a blocking one (training
in the main thread, where its signal handlers must live) with a watchdog thread that calls `on_lost`
with the reason when the extraction server dies. Every step, its command and outcome reach the stage's
events through the `progress` and `emit` callbacks, and `Swap` records them for the summary.
"""
from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TypeVar

from backend.extract.plan import SwapPlan

T = TypeVar("T")
LOG_CHECK_S = 30.0  # the alive and log-tail commands' own time limit


class SwapFailed(Exception):
    """The swap (or the server it brought up) failed; the message says why and what to do."""


class SwapStopped(Exception):
    """A stop was asked for while swapping in."""


def tail(text: str | bytes, lines: int = 3, width: int = 400) -> str:
    """The last few non-empty lines of a command's output, on one line, bounded."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-width:]


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class StepRecord:
    step: str
    command: str
    rc: int | None
    ok: bool
    seconds: float
    output: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Swap:
    """What the swap did, for the summary and the console: which steps ran and how they ended."""
    steps: list[StepRecord] = field(default_factory=list)
    baseline_stopped: bool = False
    baseline_restarted: bool | None = None  # None: never stopped, nothing to bring back

    def to_dict(self) -> dict[str, Any]:
        return {"steps": [s.to_dict() for s in self.steps], "baseline_stopped": self.baseline_stopped,
                "baseline_restarted": self.baseline_restarted}


def describe(swap: dict[str, Any]) -> str:
    """The swap of a summary on one line, as the stages print it."""
    steps = ", ".join(f"{s['step']} {'ok' if s['ok'] else 'FAILED'}" for s in swap["steps"])
    state = {True: "started again", False: "NOT started again", None: "untouched"}[swap["baseline_restarted"]]
    return f"swap: {steps or 'nothing run'}; baseline {state}"


def _noop(*_args: Any, **_kw: Any) -> None:
    return None


class ExtractionServer:
    """The extraction server a stage works against: swapped in by a plan, or (no plan) one already running
    at `endpoint`, which is then only watched."""

    def __init__(self, plan: SwapPlan | None, endpoint: str = "", *,
                 progress: Callable[..., None] = _noop, emit: Callable[..., None] = _noop,
                 stopped: Callable[[], bool] = lambda: False, health_interval: float = 1.0, dead_after: int = 3,
                 ready_phase: str = "ready"):
        self.plan = plan
        self.endpoint = (plan.endpoint if plan else endpoint).rstrip("/")
        self.health_url = plan.health_url if plan else f"{self.endpoint}/health"
        self.models_url = plan.models_url if plan else f"{self.endpoint}/v1/models"
        self.progress, self.emit, self.stopped = progress, emit, stopped
        self.health_interval, self.dead_after = health_interval, dead_after
        self.ready_phase = ready_phase  # the progress phase once the server answers (the stage's work)
        self.record = Swap()
        self.max_model_len: int | None = None  # what the server reports in /v1/models
        self.model_id: str | None = None
        self.misses = 0
        self.lost_reason = ""  # set once the watchdog found it dead

    # -- the plan's commands ---------------------------------------------------------------------------
    async def step(self, name: str, argv: list[str], phase: str) -> bool:
        assert self.plan is not None
        self.progress(phase, force=True, step=name, command=shlex.join(argv))
        t0 = time.monotonic()
        rc: int | None = None
        output = ""
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE, start_new_session=True)
            try:
                out, err = await asyncio.wait_for(proc.communicate(), self.plan.command_timeout_s)
                rc, output = proc.returncode, tail(err or out)
            except asyncio.TimeoutError:
                kill_group(proc.pid)
                await proc.wait()
                output = f"timed out after {self.plan.command_timeout_s:g} s"
        except OSError as exc:  # the command itself is missing
            output = f"{type(exc).__name__}: {exc}"
        record = StepRecord(step=name, command=shlex.join(argv), rc=rc, ok=rc == 0,
                            seconds=round(time.monotonic() - t0, 2), output=output)
        self.record.steps.append(record)
        self.progress(phase, force=True, swap=record.to_dict())
        if not record.ok:
            self.emit("error", fatal=False, message=f"{name} failed (exit {rc}): {output or 'no output'}; "
                      f"command: {record.command}")
        return record.ok

    async def swap_in(self) -> None:
        plan = self.plan
        assert plan is not None
        if self.stopped():
            raise SwapStopped()
        self.record.baseline_restarted = False  # from here on the baseline must be brought back
        if not await self.step("stop_baseline", plan.stop_baseline, "stopping_baseline"):
            raise SwapFailed(f"could not stop the baseline server ({self.record.steps[-1].output}); the GPUs were "
                             f"not handed to the extraction server")
        self.record.baseline_stopped = True
        if self.stopped():
            raise SwapStopped()
        if not await self.step("start_extractor", plan.start_extractor, "starting_extractor"):
            raise SwapFailed(f"could not start the extraction server: {self.record.steps[-1].output}")
        await self.wait_ready()

    async def swap_back(self) -> None:
        """Always: the extraction server goes, the baseline comes back. A stop signal now changes nothing."""
        plan = self.plan
        if plan is None:
            return
        started = {s.step for s in self.record.steps}
        if "start_extractor" in started:
            await self.step("stop_extractor", plan.stop_extractor, "stopping_extractor")
        if "stop_baseline" in started:
            self.record.baseline_restarted = await self.step("start_baseline", plan.start_baseline,
                                                             "starting_baseline")
            if not self.record.baseline_restarted:
                self.emit("error", fatal=True, message=f"the baseline server could not be started again: "
                          f"{self.record.steps[-1].output}; start it by hand: {self.record.steps[-1].command}")

    # -- watching --------------------------------------------------------------------------------------
    async def http_ok(self, url: str, *, want_models: bool = False) -> bool:
        import aiohttp

        try:
            timeout = aiohttp.ClientTimeout(total=5)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.get(url) as resp:
                    if resp.status != 200:
                        return False
                    if not want_models:
                        return True
                    body = json.loads((await resp.content.read(1 << 20)).decode() or "null")
                    if not (isinstance(body, dict) and isinstance(body.get("data"), list) and body["data"]):
                        return False
                    card = body["data"][0] if isinstance(body["data"][0], dict) else {}
                    limit = card.get("max_model_len")
                    self.max_model_len = limit if isinstance(limit, int) and not isinstance(limit, bool) else None
                    self.model_id = card.get("id") if isinstance(card.get("id"), str) else None
                    return True
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            return False

    async def answers(self) -> bool:
        """It answers /health and lists a model in /v1/models (recording its max_model_len)."""
        return await self.http_ok(self.health_url) and await self.http_ok(self.models_url, want_models=True)

    async def healthy(self) -> bool:
        return await self.http_ok(self.health_url)

    async def alive(self) -> bool:
        """The extraction server's unit or session still runs (no plan check: assume so)."""
        if not self.plan or not self.plan.extractor_alive:
            return True
        try:
            proc = await asyncio.create_subprocess_exec(*self.plan.extractor_alive, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.DEVNULL,
                                                        stderr=asyncio.subprocess.DEVNULL)
            return await asyncio.wait_for(proc.wait(), LOG_CHECK_S) == 0
        except (OSError, asyncio.TimeoutError):
            return True  # cannot tell: the health check decides

    async def lost(self) -> bool:
        """One check: True once the server is gone (unit ended, or `dead_after` failed health checks in a
        row); a single slow answer is not a death."""
        healthy, alive = await self.healthy(), await self.alive()
        self.misses = 0 if healthy and alive else self.misses + 1
        return not alive or self.misses >= self.dead_after

    async def still_up(self) -> bool:
        return await self.healthy() and await self.alive()

    async def why_dead(self) -> str:
        """The end of the extraction server's log, when the plan says how to read it."""
        if not self.plan or not self.plan.extractor_log_tail:
            return "its unit or session is gone" if self.plan else f"{self.endpoint} stopped answering"
        try:
            proc = await asyncio.create_subprocess_exec(*self.plan.extractor_log_tail, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT)
            out, _ = await asyncio.wait_for(proc.communicate(), LOG_CHECK_S)
        except (OSError, asyncio.TimeoutError):
            return "its log could not be read"
        lines = [l for l in out.decode(errors="replace").splitlines() if l.strip()]
        errors = [l for l in lines if " ERROR " in l or "Error" in l or "error" in l]
        return "last log lines: " + tail("\n".join(errors or lines), 2, 300)

    async def wait_ready(self) -> None:
        plan = self.plan
        assert plan is not None
        t0 = time.monotonic()
        while True:
            if self.stopped():
                raise SwapStopped()
            if await self.answers():
                self.progress(self.ready_phase, force=True, ready_after_s=round(time.monotonic() - t0, 1))
                return
            if not await self.alive():
                raise SwapFailed(f"the extraction server exited while starting ({await self.why_dead()})")
            waited = time.monotonic() - t0
            if waited > plan.ready_timeout_s:
                raise SwapFailed(f"the extraction server did not answer {plan.health_url} and {plan.models_url} "
                                 f"within {plan.ready_timeout_s:g} s ({await self.why_dead()})")
            self.progress("waiting_for_extractor", waited_s=round(waited, 1))
            deadline = time.monotonic() + min(1.0, self.health_interval)
            while time.monotonic() < deadline and not self.stopped():
                await asyncio.sleep(0.1)


async def run_swapped(server: ExtractionServer, body: Callable[[], Awaitable[T]], *, swap: bool = True) -> T:
    """The body with the extraction server in the baseline's place (when `swap` and a plan), the baseline
    brought back whatever happens."""
    try:
        if swap and server.plan is not None:
            await server.swap_in()
        return await body()
    finally:
        await server.swap_back()


def run_swapped_blocking(server: ExtractionServer, body: Callable[[], T],
                         on_lost: Callable[[str], None]) -> T:
    """A blocking body (it keeps the main thread, and its signal handlers) under the swap. A watchdog
    thread checks the extraction server every `health_interval` and, when it dies, calls `on_lost` once
    with why; the body is expected to stop soon after (the caller's stop flag)."""
    loop = asyncio.new_event_loop()
    try:
        try:
            loop.run_until_complete(server.swap_in())
            done = threading.Event()

            def watch() -> None:
                async def check() -> str | None:
                    while not done.is_set():
                        if await server.lost():
                            return await server.why_dead()
                        await asyncio.sleep(server.health_interval)
                    return None

                reason = asyncio.run(check())
                if reason is not None and not done.is_set():
                    server.lost_reason = reason
                    on_lost(reason)

            watchdog = threading.Thread(target=watch, name="extraction-server-watchdog", daemon=True)
            watchdog.start()
            try:
                return body()
            except BaseException:
                # the body may fail on the dead server before the watchdog's checks add up: ask once more
                done.set()
                watchdog.join(timeout=2 * LOG_CHECK_S)
                if not server.lost_reason and not loop.run_until_complete(server.still_up()):
                    on_lost(loop.run_until_complete(server.why_dead()))
                raise
            finally:
                done.set()
                watchdog.join(timeout=2 * LOG_CHECK_S)
        finally:
            loop.run_until_complete(server.swap_back())
    finally:
        loop.close()
