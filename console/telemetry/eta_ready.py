"""ETA to *ready*: the weights, then compile, KV cache, CUDA graphs and API start (pure: no I/O, no clock).

Each step comes from the host's previous loads of the same model and settings (`state/loads.jsonl`
remembers each load's step durations): the step in progress is measured from its own first line, the
steps after it take what they took before (the median of the last few loads, so one odd load does not
swing it). The weights step has a better signal of its own (shards, GPU memory: eta.py), used while it
runs. Without a previous load only the weights can be estimated: the estimate says so (confidence "low").
"""
from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

from console.telemetry.eta import LoadRecord
from console.telemetry.snapshot import LOAD_ORDER

# the load's steps before ready, in order (LOAD_ORDER without its last, "ready")
STEPS: tuple[str, ...] = tuple(p for p in LOAD_ORDER if p != "ready")
HISTORY_LOADS = 3  # how many previous loads the typical step durations are taken from


def settings_key(which: str, model_path: str, vllm_args: Sequence[str], command: Sequence[str]) -> str:
    """What makes two loads comparable: the server (baseline or drafter), the model and its arguments."""
    blob = json.dumps([which, model_path, _without_address(vllm_args), _without_address(command)],
                      separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


_ADDRESS_FLAGS = ("--port", "--host")  # where it listens does not change how long it loads


def _without_address(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _ADDRESS_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f + "=" for f in _ADDRESS_FLAGS)):
            out.append(arg)
    return out


def step_durations(phase_started: dict[str, float], ready_ts: float) -> dict[str, float]:
    """Seconds in each step of a finished load, from when each step began (a step the log skipped
    takes nothing: its time is in the step before)."""
    seen = [(p, phase_started[p]) for p in STEPS if p in phase_started]
    out: dict[str, float] = {}
    for i, (step, began) in enumerate(seen):
        end = seen[i + 1][1] if i + 1 < len(seen) else ready_ts
        out[step] = round(max(0.0, end - began), 2)
    return out


def weights_elapsed(phase: str, phase_started: dict[str, float], now: float,
                    fallback_start: float | None) -> float | None:
    """Seconds the weights have been loading. From the weights' own first line: counted from the
    unit's start, the imports and engine set-up before them (minutes on a large host) made a linear
    load look about 20 % slower than it is at half-load."""
    start = phase_started.get("loading_weights")
    if start is None and phase in ("unknown", "starting"):
        return 0.0  # not loading weights yet
    if start is None:
        start = fallback_start  # the log began after the weights' first line (a journal read mid-load)
    return None if start is None else max(0.0, now - start)


def comparable(records: Iterable[LoadRecord], model: str, settings: str | None) -> list[LoadRecord]:
    """The previous loads of this model and settings that recorded their steps, newest first. A record
    from before settings were remembered counts for its model."""
    same = [r for r in records if r.model == model and r.phases
            and (settings is None or r.settings in (None, settings))]
    return sorted(same, key=lambda r: r.ready, reverse=True)[:HISTORY_LOADS]


def typical_steps(records: Sequence[LoadRecord]) -> dict[str, float]:
    out: dict[str, float] = {}
    for step in STEPS:
        values = [r.phases[step] for r in records if r.phases and step in r.phases]
        if values:
            out[step] = statistics.median(values)
    return out


@dataclass(frozen=True)
class ReadyEstimate:
    eta_s: float | None
    confidence: str | None  # "previous_loads" (each step from them) or "low" (weights only: no history)
    basis: int = 0  # how many previous loads the steps come from


def estimate_ready(*, phase: str, phase_started: dict[str, float], now: float, weights_eta_s: float | None,
                   history: Sequence[LoadRecord]) -> ReadyEstimate:
    if phase not in STEPS:
        return ReadyEstimate(None, None)
    typical = typical_steps(history)
    if not typical:
        if phase == "loading_weights" and weights_eta_s is not None:
            return ReadyEstimate(round(weights_eta_s, 1), "low")  # the steps after it are not counted
        return ReadyEstimate(None, "low")
    index = STEPS.index(phase)
    if phase == "loading_weights" and weights_eta_s:
        current = weights_eta_s
    else:  # (the weights signal at 0 with the step not over yet: the step's tail, as long as it took before)
        began = phase_started.get(phase, now)
        # a step running longer than before has its end any moment now: never a negative remainder
        current = max(0.0, typical.get(phase, 0.0) - (now - began))
    later = sum(typical.get(step, 0.0) for step in STEPS[index + 1:])
    return ReadyEstimate(round(current + later, 1), "previous_loads", len(history))
