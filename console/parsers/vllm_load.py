"""Fold vLLM log events into the server's load phase (pure: no clock, no I/O; time comes with each line).

Phases only move forward within one load, because the engine core, workers and API server interleave
their lines and a late line of an earlier step must not move the display back. A new server start after
ready/failed/stopped begins a fresh load; failure and shutdown end one.
"""
from __future__ import annotations

import re

from console.snapshot import LOAD_ORDER, Progress
from console.parsers import vllm_log as v
from console.parsers.vllm_log import LogEvent, parse_line

# what the log alone can say: the load steps and their outcomes (never "unknown" once a line spoke)
LOAD_PHASES: tuple[str, ...] = ("stopped", *LOAD_ORDER, "failed")
_ORDER = {name: i for i, name in enumerate(LOAD_ORDER)}
_TERMINAL = ("ready", "failed", "stopped")
# pydantic's ValidationError puts the field and the reason on the lines after its header ("1 validation
# error for SpeculativeConfig" / "bogus_key" / "  Unexpected keyword argument [type=...]"): the header
# alone does not say what to fix
_VALIDATION_HEADER = re.compile(r"ValidationError: \d+ validation errors? for \w+$")
_VALIDATION_DETAIL_LINES = 2

# Which phase each event kind moves the load to (forward only).
_PHASE_OF: dict[str, str] = {
    v.START: "starting", v.ARGS: "starting", v.ENGINE_INIT: "starting", v.RUNNER: "starting",
    v.WEIGHTS_START: "loading_weights", v.SHARD_PROGRESS: "loading_weights", v.WEIGHTS_READ: "loading_weights",
    # vLLM's next step after the weights is the profile run, which is where torch.compile happens
    v.WEIGHTS_DONE: "compiling", v.COMPILE: "compiling",
    v.KV_CACHE: "allocating_kv_cache",
    v.GRAPH_PROGRESS: "capturing_cuda_graphs", v.GRAPH_DONE: "capturing_cuda_graphs",
    v.ENGINE_READY: "starting_api", v.HTTP_START: "starting_api", v.ROUTES: "starting_api",
    v.APP_STARTING: "starting_api",
    v.STARTUP_COMPLETE: "ready",
}


class LoadTracker:
    """Feed every server log line in order; read the phase and load facts at any time.

    `phase` is "unknown" until a line says something about the load (the journal may begin mid-load).
    """

    def __init__(self) -> None:
        self.phase: str = "unknown"
        self.version: str | None = None
        self.served_model: str | None = None
        self.aux_layers: tuple[int, ...] | None = None
        self.engine_stats: v.EngineStats | None = None
        self.spec_stats: v.SpecDecodeStats | None = None
        self._reset_load()

    def _reset_load(self) -> None:
        self.progress: Progress | None = None
        # this load serves a drafter: the V1 runner's "Loading drafter model", or the V2 runner's Eagle3 aux
        # layers line (it loads the drafter right after it, and logs nothing of its own)
        self.drafter_loaded = False
        self.runner: str | None = None  # "v2" once "Using V2 Model Runner" is seen (V1 never names itself)
        self.shard_eta_s: float | None = None
        self.graph_progress: Progress | None = None
        self.weights_gib: float | None = None
        self.weights_seconds: float | None = None
        self.kv_cache_gib: float | None = None
        self.kv_cache_tokens: int | None = None
        self.load_started_ts: float | None = None
        self.ready_ts: float | None = None
        self.stopped_ts: float | None = None
        # when each load step began (its first line): the ETA to ready measures the step in progress
        # from there, and a finished load's step durations are what the next load's ETA expects
        self.phase_started: dict[str, float] = {}
        self._cause: tuple[int, str] | None = None
        self._detail_wanted = 0  # lines of a ValidationError still to fold into the cause

    @property
    def error(self) -> str | None:
        """The most specific failure line of the current load, once it has failed."""
        if self.phase != "failed" or self._cause is None:
            return None
        return self._cause[1]

    @property
    def cause(self) -> str | None:
        """The most specific failure or exception line of the current load, failed or not: what a server
        that exits without a failure marker said last (vLLM refusing its configuration prints a Python
        traceback and exits 1, which only the service manager sees as a failure)."""
        return self._cause[1] if self._cause is not None else None

    def feed(self, line: str, ts: float | None = None) -> LogEvent | None:
        """Parse and apply one line; returns the event (or None) so callers can also use it."""
        event = parse_line(line)
        if event is not None:
            self._detail_wanted = 0
            self.apply(event, ts)
        elif self._detail_wanted and self._cause is not None:
            detail = v.message_text(line).strip()
            if detail:
                detail = re.sub(r"\s*\[type=[^\]]*\]\s*$", "", detail)
                self._cause = (self._cause[0], f"{self._cause[1]}: {detail}")
                self._detail_wanted -= 1
        return event

    def stop(self, ts: float | None = None) -> None:
        """The service manager says the unit stopped (a clean stop leaves no log marker)."""
        if self.phase != "failed":
            self.phase = "stopped"
            self.stopped_ts = ts

    def apply(self, event: LogEvent, ts: float | None = None) -> None:
        kind = event.kind
        if kind == v.START and self.phase not in ("unknown", "starting"):
            self._restart()  # a new API server process: whatever we knew belongs to the old one
        elif kind in (v.ARGS, v.ENGINE_INIT, v.RUNNER, v.WEIGHTS_START) and self.phase in _TERMINAL:
            self._restart()
        self._record(event)
        if kind in (v.FAILURE, v.EXCEPTION):
            self._note_failure(event, fatal=kind == v.FAILURE)
            return
        if kind == v.SHUTDOWN:
            self.stop(ts)
            return
        target = _PHASE_OF.get(kind)
        if target is None or self.phase in ("failed", "stopped"):
            return
        if self.phase == "unknown" or _ORDER[target] > _ORDER.get(self.phase, -1):
            self.phase = target
            if ts is not None:
                self.phase_started.setdefault(target, ts)
        if self.load_started_ts is None and target != "ready" and ts is not None:
            self.load_started_ts = ts
        if target == "ready" and self.ready_ts is None:
            self.ready_ts = ts

    def _restart(self) -> None:
        self.phase = "unknown"
        self.engine_stats = self.spec_stats = None
        self._reset_load()

    def _record(self, event: LogEvent) -> None:
        kind = event.kind
        if event.version:
            self.version = event.version
        if event.model and kind in (v.START, v.ARGS, v.ENGINE_INIT) and (
                kind != v.ENGINE_INIT or self.served_model is None):
            self.served_model = event.model
        if kind == v.SHARD_PROGRESS and event.total:
            self.progress = Progress(done=event.done or 0, total=event.total)
            self.shard_eta_s = event.remaining_s
            if self.shard_eta_s is None and event.seconds_per_item is not None:
                self.shard_eta_s = (event.total - (event.done or 0)) * event.seconds_per_item
        elif kind == v.WEIGHTS_START and event.message.startswith(v.DRAFTER_START):
            self.drafter_loaded = True
        elif kind == v.RUNNER:
            self.runner = event.text
        elif kind == v.GRAPH_PROGRESS and event.total:
            self.graph_progress = Progress(done=event.done or 0, total=event.total)
        elif kind == v.WEIGHTS_READ:
            # "Model loading took" (the whole load, drafter included) follows and replaces this
            if self.weights_seconds is None:
                self.weights_seconds = event.seconds
        elif kind == v.WEIGHTS_DONE:
            self.weights_gib = event.gib if event.gib is not None else self.weights_gib
            self.weights_seconds = event.seconds if event.seconds is not None else self.weights_seconds
            if self.progress is not None:
                self.progress = Progress(done=self.progress.total, total=self.progress.total)
            self.shard_eta_s = 0.0 if self.progress is not None else None
        elif kind == v.KV_CACHE:
            self.kv_cache_gib = event.gib if event.gib is not None else self.kv_cache_gib
            self.kv_cache_tokens = event.tokens if event.tokens is not None else self.kv_cache_tokens
        elif kind == v.AUX_LAYERS:
            self.aux_layers = event.aux_layers
            if event.message.startswith("Using Eagle3"):
                self.drafter_loaded = True
        elif kind == v.ENGINE_STATS:
            self.engine_stats = event.engine_stats
        elif kind == v.SPEC_STATS:
            self.spec_stats = event.spec_stats

    def _note_failure(self, event: LogEvent, *, fatal: bool) -> None:
        # A caught exception while serving is a request error, not a dead server: ignore it once up.
        # Teardown after a stop logs noise (cancelled tasks, dead engine): not a failure of the load.
        if self.phase == "stopped" or (not fatal and self.phase == "ready"):
            return
        rank = event.rank if event.rank is not None else v.RANK_EXCEPTION
        text = event.text or event.message
        if self._cause is None or rank > self._cause[0]:
            self._cause = (rank, text)
            if _VALIDATION_HEADER.search(text):
                self._detail_wanted = _VALIDATION_DETAIL_LINES
        if fatal:
            self.phase = "failed"
