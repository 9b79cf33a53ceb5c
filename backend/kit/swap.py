"""The extraction server in the baseline's place, for every stage that needs it: the one server switch
(backend/kit/switch.py) run with the swap plan (backend/kit/swap_plan.py), plus watching the server while
the stage works.

    swap in       Switch.go("extractor"): stop the baseline (seen down), start the extraction server, wait
                  until it answers /health and /v1/models
    the body      the stage's own work; `ExtractionServer.lost()` tells it, between checks, that the
                  server died (its unit is gone, or it failed `dead_after` health checks in a row)
    swap back     Switch.back(), ALWAYS, also after a failure or a stop signal (or the SIGTERM the stage's
                  lifecycle turns into an exception: the finally clauses below run)

`run_swapped` runs an async body under the swap; `run_swapped_blocking` runs a blocking one (training
in the main thread, where its signal handlers must live) with a watchdog thread that calls `on_lost`
with the reason when the extraction server dies. Without a plan the server at `endpoint` is only
watched. A pipeline that holds the baseline down across its stages says so with E3_BASELINE_HELD=1:
the switch then leaves the baseline down at the end (the pipeline starts it).
"""
from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any, Awaitable, Callable, TypeVar

from backend.kit.swap_plan import EXTRACTOR, SwapPlan
from backend.kit.switch import (BASELINE_HELD_ENV, LOG_CHECK_S, ServerSpec, StepRecord, Switch, SwitchFailed, SwitchPlan, SwitchRecord,
                            SwitchStopped, describe, kill_group, tail)

T = TypeVar("T")
SwapFailed = SwitchFailed
SwapStopped = SwitchStopped
Swap = SwitchRecord
__all__ = ["ExtractionServer", "SwapFailed", "SwapStopped", "Swap", "StepRecord", "describe", "kill_group", "tail",
           "run_swapped", "run_swapped_blocking", "LOG_CHECK_S", "BASELINE_HELD_ENV"]


def _noop(*_args: Any, **_kw: Any) -> None:
    return None


def baseline_held() -> bool:
    return os.environ.get(BASELINE_HELD_ENV) == "1"


class ExtractionServer:
    """The extraction server a stage works against: swapped in by a plan, or (no plan) one already running
    at `endpoint`, which is then only watched."""

    def __init__(self, plan: SwapPlan | None, endpoint: str = "", *,
                 progress: Callable[..., None] = _noop, emit: Callable[..., None] = _noop,
                 stopped: Callable[[], bool] = lambda: False, health_interval: float = 1.0, dead_after: int = 3,
                 ready_phase: str = "ready", holder: str = ""):
        self.plan = plan
        self.endpoint = (plan.endpoint if plan else endpoint).rstrip("/")
        self.health_url = plan.health_url if plan else f"{self.endpoint}/health"
        self.models_url = plan.models_url if plan else f"{self.endpoint}/v1/models"
        self.health_interval, self.dead_after = health_interval, dead_after
        self.ready_phase = ready_phase  # the progress phase once the server answers (the stage's work)
        # without a plan: a switch that never runs, only its HTTP checks (one definition of "answers")
        switch_plan = plan.switch if plan else SwitchPlan(
            home=ServerSpec("baseline", "", ["true"], ["true"]), away=[ServerSpec(EXTRACTOR, "", ["true"], ["true"])],
            endpoint=self.endpoint, ready_timeout_s=1.0)
        self.switch = Switch(switch_plan, holder=holder, progress=progress, emit=emit, stopped=stopped,
                             health_interval=health_interval, keep_home_down=baseline_held())
        self.misses = 0
        self.lost_reason = ""  # set once the watchdog found it dead

    @property
    def record(self) -> SwitchRecord:
        return self.switch.record

    @property
    def max_model_len(self) -> int | None:
        return self.switch.max_model_len

    @property
    def model_id(self) -> str | None:
        return self.switch.model_id

    async def swap_in(self) -> None:
        assert self.plan is not None
        await self.switch.go(EXTRACTOR)
        self.switch.progress(self.ready_phase, force=True)

    async def swap_back(self) -> None:
        """Always: the extraction server goes, the baseline comes back. A stop signal now changes nothing."""
        if self.plan is not None:
            await self.switch.back()

    # -- watching --------------------------------------------------------------------------------------
    async def http_ok(self, url: str, *, want_models: bool = False) -> bool:
        return await self.switch.http_ok(url, want_models=want_models)

    async def answers(self) -> bool:
        """It answers /health and lists a model in /v1/models (recording its max_model_len)."""
        return await self.http_ok(self.health_url) and await self.http_ok(self.models_url, want_models=True)

    async def healthy(self) -> bool:
        return await self.http_ok(self.health_url)

    async def alive(self) -> bool:
        """The extraction server's unit or session still runs (no plan, or no way to tell: assume so)."""
        if not self.plan:
            return True
        return await self.switch.alive(self.plan.extractor) is not False

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
        if not self.plan:
            return f"{self.endpoint} stopped answering"
        return await self.switch.why_dead(self.plan.extractor)


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
