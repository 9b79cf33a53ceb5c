"""Offline against online acceptance (backend/kit/acceptance_gap.py) on real samples: the verify summary and
the drafter's bench.json of one pipeline run on vLLM's CPU build (tests/samples/vllm/cpu-pipeline: 64 rows,
4 held-out, K=3, the bench's own client at concurrency 1, 4, 16)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from backend.kit.acceptance_gap import acceptance_gap, counted, predicted
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


# ---- where the count is shown: verify's report, its results, the Training pane ---------------------------
def _finished(work: Path, stage: str, run_id: str, summary: dict, mtime: float) -> None:
    """A run directory as a stage leaves it (manifest, start and finish events, summary), finished at `mtime`."""
    import os

    from backend.contract.events import EventLog
    from backend.contract.runs import Manifest, open_run_dir

    run = open_run_dir(str(work), run_id, Manifest(stage=stage, run_id=run_id, identity={"n": run_id}))
    events = EventLog(run.events_path, stage, run_id)
    events.emit("start", total=1, manifest=run.manifest.to_dict())
    summary = {"stage": stage, "run_id": run_id, "status": "completed", **summary}
    run.write_summary(summary)
    events.emit("finish", status="completed", summary=summary)
    events.close()
    os.utime(Path(run.path) / "summary.json", (mtime, mtime))


def _pair(work: Path, pair: str, checkpoint: str, levels: list, mtime: float, server: str = "drafter") -> None:
    _finished(work, "bench", f"{pair}-{server}", {"result": {**_bench(), "levels": levels}}, mtime)
    _finished(work, "bench_pair", pair, {"checkpoint": checkpoint, "pair": True,
                                         "runs": {"baseline": f"{pair}-baseline", server: f"{pair}-{server}"}}, mtime)


def test_the_verify_report_carries_vllms_count_from_the_newest_bench_of_its_checkpoint(tmp_path):
    """A checkpoint benched before it is verified (again): the report holds the newest bench's count of it
    at the verified K, and its table prints it beside the prediction with the gap and the tolerance."""
    from backend.verify.online import vllm_count
    from backend.verify.report import table

    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    levels = _bench()["levels"]
    _pair(tmp_path, "old", str(ckpt), levels[:1], 1000)
    _pair(tmp_path, "new", str(ckpt), levels, 2000)
    _pair(tmp_path, "elsewhere", str(tmp_path / "other"), levels, 3000)
    _pair(tmp_path, "at-k2", str(ckpt), [{**lv, "acceptance": {**lv["acceptance"], "per_position": [0.2, 0.1]}}
                                         for lv in levels], 4000, server="drafter_k2")
    found = vllm_count(str(tmp_path), str(ckpt), 3)
    on = counted(BenchResult.from_dict(_bench()).levels)
    assert found is not None and on is not None
    assert (found["bench_run"], found["drafter_run"], found["k"], found["drafts"]) == ("new", "new-drafter", 3, on[1])
    assert found["mean_acceptance_length"] == pytest.approx(on[0].length, abs=1e-4)
    assert vllm_count(str(tmp_path), str(ckpt), 2)["bench_run"] == "at-k2"
    assert vllm_count(str(tmp_path), str(tmp_path / "never-benched"), 3) is None
    text = table({**_verify(), "online": found})
    assert f"vLLM counted     {on[0].length:.2f}" in text and "predicted length 1.67" in text
    assert "bench new, " in text and "within the tolerance of ±0.60" in text
    assert "vLLM counted" not in table(_verify())  # no bench yet: nothing made up


def test_a_reported_count_and_a_bench_result_are_read_as_host_data():
    from backend.kit.acceptance_gap import levels_from_json, reported_count

    assert counted(levels_from_json(_bench()["levels"])) == counted(BenchResult.from_dict(_bench()).levels)
    assert levels_from_json("levels") == [] and counted(levels_from_json([{"acceptance": {"drafts": "NaN"}}])) is None
    odd = {"drafts": 9.0, "accepted": 3.0, "per_position": [0.2, "x", 0.1]}
    assert levels_from_json([{"acceptance": odd}])[0].acceptance is None

    good = {"bench_run": "b", "mean_acceptance_length": 1.3, "per_position": [0.2, 0.1, 0.0], "drafts": 10}
    assert reported_count({"online": good}) is not None
    for bad in ({**good, "drafts": 0}, {**good, "per_position": "x"}, {**good, "bench_run": 7},
                {**good, "mean_acceptance_length": float("nan")}, {**good, "per_position": [0.1, None, 0.0]}, []):
        assert reported_count({"online": bad}) is None, bad


def _runs_with_pair(verify: dict, levels: list) -> tuple[RunInfo, tuple[RunInfo, ...]]:
    v = RunInfo(stage="verify", run_id="v1", state="done", last_event={"kind": "finish", **verify}, started=10)
    pair = RunInfo(stage="bench_pair", run_id="b", state="done", started=20,
                   last_event={"kind": "finish", "summary": {"runs": {"baseline": "b-baseline", "drafter": "b-drafter"},
                                                             "checkpoint": verify["checkpoint"]}})
    drafter = RunInfo(stage="bench", run_id="b-drafter", state="done", started=21,
                      last_event={"kind": "finish", "result": {**_bench(), "levels": levels}})
    return v, (v, pair, drafter)


def test_the_training_pane_shows_vllms_count_beside_the_prediction():
    from console.ui.panes.training import verify_markup

    verify, levels = _verify(), _bench()["levels"]
    v, runs = _runs_with_pair(verify, levels)
    gap = acceptance_gap(verify, BenchResult.from_dict(_bench()).levels)
    text = verify_markup(v, runs).plain
    assert (f"vLLM     counted {gap.online.length:.2f} ({gap.drafts} drafts, bench b)   predicted 1.67   "
            f"gap {gap.gap:+.2f} within ±0.60") in text
    assert "vLLM" not in verify_markup(v).plain  # no bench of it: no line
    # a count the report carries (a bench before the verify) when the run book has none
    online = {"bench_run": "earlier", "mean_acceptance_length": 3.1, "per_position": [0.9, 0.7, 0.5], "drafts": 40}
    far = verify_markup(RunInfo(stage="verify", run_id="v2", state="done",
                                last_event={"kind": "finish", **verify, "online": online})).plain
    assert "counted 3.10 (40 drafts, bench earlier)   predicted 1.67   gap -1.43 OUTSIDE ±0.60" in far


def test_verifys_results_print_the_count_of_a_later_bench():
    """`run verify --wait` after a bench of the same checkpoint (the console's run book has it)."""
    from console.control.stages import get
    from console.telemetry.progress import verify_view

    v, runs = _runs_with_pair(_verify(), _bench()["levels"])
    text = "\n".join(get("verify").results(verify_view(v), runs))
    assert "predicted length 1.67" in text and "vLLM counted" in text and "bench b, " in text
