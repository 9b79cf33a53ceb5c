"""The phase decision (console/telemetry/phase.py), table-driven over everything the collector can see:
every log phase x unit state x HTTP state x model check."""
from __future__ import annotations

import itertools

import pytest

from console.telemetry.phase import ACTIVE_STATES, PhaseDecision, PhaseInputs, decide
from console.snapshot import LOAD_ORDER, PHASES

LOG_PHASES = ("unknown", "stopped", *LOAD_ORDER, "failed")
UNIT_STATES = ("active", "activating", "reloading", "deactivating", "inactive", "failed", "unknown")
# (listening, /health status, error)
HTTP = {"silent": (False, None, None), "healthy": (True, 200, None), "sick": (True, 503, "GET /health returned 503"),
        "slow": (True, None, "the server did not answer its health checks within 5 s")}
MODEL = {"right": None, "wrong": "wrong model served: 'x', the profile expects 'y'"}


def inputs(log, unit, http, model, reachable=True) -> PhaseInputs:
    listening, health, error = HTTP[http]
    return PhaseInputs(log_phase=log, log_error="CUDA out of memory" if log == "failed" else None,
                       unit_state=unit, unit_result="exit-code" if unit == "failed" else None,
                       host_reachable=reachable, http_listening=listening, http_health=health, http_error=error,
                       model_mismatch=MODEL[model])


def expected(log, unit, http, model, reachable=True) -> PhaseDecision:
    """The rules, written out once more as a plain reading of the README's promises."""
    if unit not in ACTIVE_STATES:
        if unit == "unknown" and not reachable:
            return PhaseDecision("unknown")
        if log == "failed":
            return PhaseDecision("failed", "CUDA out of memory")
        if unit == "failed":
            return PhaseDecision("failed", "service failed (exit-code)")
        return PhaseDecision("stopped")
    if http == "healthy":
        if model == "wrong":
            return PhaseDecision("failed", MODEL["wrong"], serving=True)
        return PhaseDecision("ready", None, serving=True)
    if http == "sick":
        return PhaseDecision("failed" if log in ("ready", "unknown") else log, HTTP[http][2])
    if log == "failed":
        return PhaseDecision("failed", "CUDA out of memory")
    slow = HTTP[http][2]  # connected, no answer in time: said, but neither ready nor failed
    if log == "ready":
        return PhaseDecision("starting_api", slow)
    if log == "stopped":
        return PhaseDecision("stopped", slow)
    phase = "starting" if log == "unknown" else log
    return PhaseDecision(phase, slow, estimate_load=phase in ("starting", "loading_weights"))


@pytest.mark.parametrize("log, unit, http, model",
                         list(itertools.product(LOG_PHASES, UNIT_STATES, HTTP, MODEL)))
def test_every_combination(log, unit, http, model):
    got = decide(inputs(log, unit, http, model))
    assert got == expected(log, unit, http, model)
    assert got.phase in PHASES


@pytest.mark.parametrize("log", LOG_PHASES)
def test_unreachable_host_with_unknown_unit_is_unknown(log):
    got = decide(inputs(log, "unknown", "silent", "right", reachable=False))
    assert got.phase == "unknown" and got.error is None


# The cases operators hit, by name (the table above covers them; these say why they matter).
CASES = [
    ("a healthy server serving another model is never ready", ("ready", "active", "healthy", "wrong"), "failed"),
    ("a dead unit is not loading, whatever its log said last", ("loading_weights", "inactive", "silent", "right"),
     "stopped"),
    ("the log says up, the socket is not open yet", ("ready", "active", "silent", "right"), "starting_api"),
    ("a restarted unit whose new process has printed nothing yet", ("unknown", "activating", "silent", "right"),
     "starting"),
    ("a dead engine behind a live API server", ("ready", "active", "sick", "right"), "failed"),
    ("a server too slow to answer its checks is not ready, and not failed", ("ready", "active", "slow", "right"),
     "starting_api"),
    ("a unit that failed to start leaves its root cause", ("failed", "failed", "silent", "right"), "failed"),
]


@pytest.mark.parametrize("why, args, phase", CASES, ids=[c[0] for c in CASES])
def test_named_cases(why, args, phase):
    assert decide(inputs(*args)).phase == phase


def test_load_progress_is_estimated_only_while_weights_load():
    estimating = {log for log in LOG_PHASES if decide(inputs(log, "active", "silent", "right")).estimate_load}
    assert estimating == {"unknown", "starting", "loading_weights"}
