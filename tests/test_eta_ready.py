"""ETA to ready (console/telemetry/eta_ready.py) on replayed loads of known step timings.

The loads are vLLM 0.33's own lines (tests/samples/vllm/v0_33_load.log, one line per step) fed to the
load tracker at chosen times, so every step's real duration, and so the real time left, is known.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from console.parsers.vllm_load import LoadTracker
from console.telemetry.eta import LoadRecord, estimate_load, parse_load_history
from console.telemetry.eta_ready import (comparable, estimate_ready, settings_key, step_durations,
                                         weights_elapsed)

SAMPLE = (Path(__file__).parent / "samples" / "vllm" / "v0_33_load.log").read_text().splitlines()


def line(needle: str) -> str:
    return next(l for l in SAMPLE if needle in l)


# one line of each step, in load order, as vLLM 0.33 prints them
STEP_LINES = [
    ("starting", line("non-default args")),
    ("loading_weights", line("Starting to load model")),
    ("compiling", line("Model loading took")),
    ("allocating_kv_cache", line("Available KV cache memory")),
    ("capturing_cuda_graphs", line("Graph capturing finished")),
    ("starting_api", line("Starting vLLM server on")),
    ("ready", line("Application startup complete")),
]


def timeline(steps: dict[str, float], t0: float = 1000.0) -> list[tuple[float, str]]:
    """Each step's line at the time its step begins; `steps` gives each step's duration."""
    out, t = [], t0
    for step, text in STEP_LINES:
        out.append((t, text))
        t += steps.get(step, 0.0)
    return out


def replay(lines: list[tuple[float, str]], until: float | None = None) -> LoadTracker:
    tracker = LoadTracker()
    for ts, text in lines:
        if until is None or ts <= until:
            tracker.feed(text, ts)
    return tracker


SEED = {"starting": 80, "loading_weights": 1200, "compiling": 150, "allocating_kv_cache": 20,
        "capturing_cuda_graphs": 30, "starting_api": 5}  # the seed's 22-minute load


def record_of(steps: dict[str, float]) -> LoadRecord:
    lines = timeline(steps)
    tracker = replay(lines)
    assert tracker.phase == "ready"
    return LoadRecord(model="m", started=lines[0][0], ready=lines[-1][0], weights_gib=70.0,
                      phases=step_durations(tracker.phase_started, lines[-1][0]), settings="s1")


def eta_at(lines, now, history, *, used_gib=None):
    tracker = replay(lines, now)
    elapsed = weights_elapsed(tracker.phase, tracker.phase_started, now, tracker.load_started_ts)
    gpus = []
    if used_gib is not None:
        from console.telemetry.snapshot import GpuInfo
        gpus = [GpuInfo(0, "H200", int(used_gib * 1024), 143771)]
    weights = estimate_load(elapsed_s=elapsed, shards=None, shard_eta_s=None, shards_live=False, gpus=gpus,
                            expected_weights_gib=None, baseline_mib=0.0, previous=history[0] if history else None)
    return estimate_ready(phase=tracker.phase, phase_started=tracker.phase_started, now=now,
                          weights_eta_s=weights.eta_s if tracker.phase == "loading_weights" else None,
                          history=history)


def test_a_replayed_load_remembers_each_steps_duration():
    rec = record_of(SEED)
    assert rec.phases == {k: float(v) for k, v in SEED.items()}
    back = parse_load_history(rec.to_line() + "\n")
    assert back == [rec]


def test_same_timings_give_the_exact_remaining_time_in_every_step():
    history = [record_of(SEED)]
    lines = timeline(SEED, t0=5000.0)
    end = lines[-1][0]
    for ts, _ in lines[:-1]:
        for into in (0.0, 1.0):
            now = ts + into
            est = eta_at(lines, now, history)
            assert est.confidence == "previous_loads" and est.basis == 1
            assert est.eta_s == pytest.approx(end - now, abs=0.2), now


@pytest.mark.parametrize("frac", [0.25, 0.5, 0.75])
def test_a_slower_load_with_the_memory_signal_is_within_ten_percent(frac):
    history = [record_of(SEED)]
    slower = {**SEED, "loading_weights": 1320, "compiling": 120, "capturing_cuda_graphs": 40}
    lines = timeline(slower, t0=5000.0)
    start, end = lines[0][0], lines[-1][0]
    now = start + frac * (end - start)
    began = start + slower["starting"]
    used = 70.0 * min(1.0, (now - began) / slower["loading_weights"])  # memory in step with the bytes read
    est = eta_at(lines, now, history, used_gib=used)
    assert abs(est.eta_s - (end - now)) <= 0.10 * (end - now)


def test_weights_elapsed_counts_from_the_weights_first_line_not_the_unit_start():
    # a linear 1200 s weights step after 300 s of start-up; at half the weights, 600 s are left of them
    steps = {**SEED, "starting": 300}
    history = [record_of(steps)]
    lines = timeline(steps, t0=0.0)
    tracker = replay(lines, 900.0)
    assert tracker.phase == "loading_weights"
    elapsed = weights_elapsed(tracker.phase, tracker.phase_started, 900.0, tracker.load_started_ts)
    assert elapsed == 600.0
    est = estimate_load(elapsed_s=elapsed, shards=None, shard_eta_s=None, shards_live=False, gpus=[],
                        expected_weights_gib=None, baseline_mib=None, previous=history[0])
    assert est.source == "previous_load" and est.eta_s == 600.0
    assert weights_elapsed("starting", {}, 50.0, 0.0) == 0.0  # no weights yet: none elapsed


def test_without_a_previous_load_the_confidence_is_low():
    lines = timeline(SEED)
    est = eta_at(lines, lines[1][0] + 10, [])
    assert est.confidence == "low" and est.basis == 0
    est = estimate_ready(phase="loading_weights", phase_started={}, now=0.0, weights_eta_s=500.0, history=[])
    assert (est.eta_s, est.confidence) == (500.0, "low")  # the weights only
    assert estimate_ready(phase="ready", phase_started={}, now=0.0, weights_eta_s=None, history=[]).confidence is None


def test_only_loads_of_the_same_model_and_settings_count_and_the_median_wins():
    fast, slow, odd = record_of(SEED), record_of({**SEED, "compiling": 170}), record_of({**SEED, "compiling": 900})
    other = LoadRecord(**{**fast.__dict__, "settings": "s2", "phases": {**fast.phases, "compiling": 5000.0}})
    older = LoadRecord(**{**fast.__dict__, "settings": None, "ready": fast.ready - 10_000})
    picked = comparable([fast, other, slow, odd, older], "m", "s1")
    assert other not in picked and len(picked) == 3
    est = estimate_ready(phase="compiling", phase_started={"compiling": 0.0}, now=0.0, weights_eta_s=None,
                         history=comparable([fast, slow, odd], "m", "s1"))
    assert est.eta_s == 170 + 20 + 30 + 5  # the median compile, then the rest


def test_settings_key_tells_servers_and_arguments_apart():
    base = settings_key("baseline", "/m", ["--tp", "8"], [])
    assert base == settings_key("baseline", "/m", ["--tp", "8"], [])
    assert base != settings_key("drafter", "/m", ["--tp", "8"], [])
    assert base != settings_key("baseline", "/m", ["--tp", "4"], [])
    # where it listens is not a setting of the load
    assert settings_key("baseline", "/m", ["--port", "8001", "--tp", "8", "--host=0.0.0.0"], []) == base


def test_weights_signal_at_zero_before_the_step_ends_uses_the_steps_history():
    history = [record_of(SEED)]
    est = estimate_ready(phase="loading_weights", phase_started={"loading_weights": 0.0}, now=1100.0,
                         weights_eta_s=0.0, history=history)
    assert est.eta_s == 100 + 150 + 20 + 30 + 5


def test_foreign_phase_values_are_dropped_from_history():
    text = json.dumps({"model": "m", "started": 0, "ready": 10, "phases": {"compiling": "x", "starting": -1,
                                                                          "loading_weights": 5}})
    assert parse_load_history(text)[0].phases == {"loading_weights": 5.0}
