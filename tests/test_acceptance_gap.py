"""Offline against online acceptance (backend/bench/acceptance_gap.py) on real samples: the verify summary and
the drafter's bench.json of one pipeline run on vLLM's CPU build (tests/samples/vllm/cpu-pipeline: 64 rows,
4 held-out, K=3, the bench's own client at concurrency 1, 4, 16)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.bench.acceptance_gap import acceptance_gap, counted, predicted
from backend.bench.results import BenchResult, LevelResult
from console.snapshot import RunInfo
from console.telemetry.bench_view import gap_of

SAMPLES = Path(__file__).parent / "samples" / "vllm" / "cpu-pipeline"


def _verify() -> dict:
    return json.loads((SAMPLES / "verify-summary.json").read_text())


def _bench() -> dict:
    return json.loads((SAMPLES / "bench-drafter.json").read_text())


def test_predicted_and_counted_from_real_runs():
    levels = BenchResult.from_dict(_bench()).levels
    gap = acceptance_gap(_verify(), levels)
    assert gap is not None and gap.k == 3
    assert gap.offline.length == pytest.approx(1.6701) and gap.offline.per_position == (0.3507, 0.1944, 0.125)
    # pooled over the three levels: vLLM's own 1 + accepted / drafts
    drafts = sum(lv.acceptance.drafts for lv in levels)
    accepted = sum(lv.acceptance.accepted for lv in levels)
    assert gap.drafts == int(drafts) and gap.online.length == pytest.approx(1 + accepted / drafts)
    assert gap.online.per_position[0] >= gap.online.per_position[1] >= gap.online.per_position[2]
    lines = gap.lines("v1")
    assert "predicted length 1.67" in lines[1] and f"vLLM counted     {gap.online.length:.2f}" in lines[2]


def test_no_gap_without_both_sides_or_at_another_k():
    levels = BenchResult.from_dict(_bench()).levels
    assert acceptance_gap({}, levels) is None
    assert acceptance_gap(_verify(), []) is None
    no_drafter = [LevelResult.from_dict({**lv, "acceptance": None}) for lv in _bench()["levels"]]
    assert counted(no_drafter) is None
    other_k = {**_verify(), "k": 2}
    assert acceptance_gap(other_k, levels) is None
    bad = _verify()
    bad["acceptance"]["trained"]["per_position"] = ["x", 0.1, 0.1]
    assert predicted(bad) is None


def test_the_bench_table_finds_the_verify_run_of_the_benched_checkpoint():
    verify, bench = _verify(), _bench()
    ckpt = verify["checkpoint"]
    runs = (RunInfo(stage="verify", run_id="v-old", state="done", last_event={**verify, "checkpoint": "/other"}),
            RunInfo(stage="verify", run_id="v1", state="done", last_event={"kind": "finish", **verify}),
            RunInfo(stage="bench", run_id="b-drafter", state="done",
                    last_event={"kind": "finish", "result": bench}))
    summary = {"runs": {"baseline": "b-baseline", "drafter": "b-drafter"}, "checkpoint": ckpt}
    found = gap_of(summary, runs)
    assert found is not None and found[0] == "v1" and found[1].k == 3
    assert gap_of({**summary, "checkpoint": "/elsewhere"}, runs) is None
    assert gap_of({"runs": {"drafter": "missing"}, "checkpoint": ckpt}, runs) is None


def test_of_several_k_the_verify_runs_k_is_compared():
    verify, bench = _verify(), _bench()
    runs = (RunInfo(stage="verify", run_id="v1", state="done", last_event={"kind": "finish", **verify}),
            RunInfo(stage="bench", run_id="ks-k3", state="done", last_event={"kind": "finish", "result": bench}))
    summary = {"runs": {"baseline": "ks-baseline", "drafter_k2": "ks-k2", "drafter_k3": "ks-k3"},
               "checkpoint": verify["checkpoint"]}
    found = gap_of(summary, runs)
    assert found is not None and found[1].k == 3


def test_the_snapshot_keeps_a_bench_levels_per_position_acceptance():
    """The console reads the bench run through its sanitized snapshot, where the per-position figures sit
    nine levels down (a depth bound of 8 dropped them: the table had no gap to show)."""
    import dataclasses

    from console.telemetry.sanitize import sanitized
    from harness.fake_controller import base_snapshot

    verify, bench = _verify(), _bench()
    runs = (RunInfo(stage="verify", run_id="v1", state="done", last_event={"kind": "finish", **verify}),
            RunInfo(stage="bench", run_id="b-drafter", state="done", last_event={"kind": "finish", "result": bench}))
    snap = sanitized(dataclasses.replace(base_snapshot(), runs=runs))
    found = gap_of({"runs": {"drafter": "b-drafter"}, "checkpoint": verify["checkpoint"]}, snap.runs)
    assert found is not None and len(found[1].online.per_position) == 3
