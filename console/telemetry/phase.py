"""The server's phase, decided from everything the console can see of it (pure: no I/O, no clock).

Four witnesses, trusted in this order: the service manager (a unit that is not running cannot be
loading, whatever its log said last), HTTP (a server answering /health is up, and must serve the
profile's model to count as ready), the log (vLLM's own lines say which load step it is in), and
nothing at all ("unknown", while the host cannot be asked).
"""
from __future__ import annotations

from dataclasses import dataclass

ACTIVE_STATES = ("active", "activating", "reloading")


@dataclass(frozen=True)
class PhaseInputs:
    log_phase: str  # the load tracker's phase for the unit's current invocation
    log_error: str | None
    unit_state: str  # the service manager's ActiveState (tmux: mapped to the same words)
    unit_result: str | None
    host_reachable: bool
    http_listening: bool = False
    http_health: int | None = None
    http_error: str | None = None
    model_mismatch: str | None = None  # why the served model is not the profile's, when it is not


@dataclass(frozen=True)
class PhaseDecision:
    phase: str
    error: str | None = None
    estimate_load: bool = False  # worth estimating load progress and ETA
    serving: bool = False  # answering: metrics and the served model's facts apply


def decide(i: PhaseInputs) -> PhaseDecision:
    if i.unit_state not in ACTIVE_STATES:
        if i.unit_state == "unknown" and not i.host_reachable:
            return PhaseDecision("unknown")
        if i.log_phase == "failed" or i.unit_state == "failed":
            return PhaseDecision("failed", i.log_error or f"service {i.unit_state} ({i.unit_result or 'no result'})")
        return PhaseDecision("stopped")
    if i.http_listening and i.http_health == 200:
        if i.model_mismatch:
            return PhaseDecision("failed", i.model_mismatch, serving=True)
        return PhaseDecision("ready", i.http_error, serving=True)
    if i.http_listening and i.http_health is not None:
        # answering, but not healthy: a dead engine behind a live API server, or a load step's API
        phase = "failed" if i.log_phase in ("ready", "unknown") else i.log_phase
        return PhaseDecision(phase, i.http_error)
    decision = _from_log(i.log_phase, i.log_error)
    if i.http_listening and i.http_error and decision.error is None:
        # connected, but no answer in time: not ready, and not failed either (wait-ready keeps waiting)
        return PhaseDecision(decision.phase, i.http_error, decision.estimate_load)
    return decision


def _from_log(log_phase: str, log_error: str | None) -> PhaseDecision:
    """An active unit that does not answer HTTP: where its log says the load is."""
    if log_phase == "failed":
        return PhaseDecision("failed", log_error)
    if log_phase == "ready":
        # the log says up but nothing answers yet: the socket opens a few ms after that line
        return PhaseDecision("starting_api")
    if log_phase == "stopped":
        return PhaseDecision("stopped")  # it said goodbye and the manager has not seen it exit yet
    phase = "starting" if log_phase == "unknown" else log_phase
    return PhaseDecision(phase, estimate_load=phase in ("starting", "loading_weights"))
