"""The bench pane on real bench results: the demo's trained tiny drafter against its baseline (SVG
snapshot), the untrained one flagged slower in red, a running bench, hostile labels shown literally, and
the pane hidden in the console until the host has a bench run."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from textual.app import App, ComposeResult

from backend.bench import PAIR_STAGE
from console.telemetry.bench_view import bench_view
from console.telemetry.sanitize import sanitized
from console.snapshot import RunInfo, Snapshot
from console.ui.app import ConsoleApp
from console.ui.panes.bench import BenchPane, bench_markup
from harness.fake_controller import FakeController, base_snapshot, generation_run, stage_unit
from harness.polling import until

pytestmark = pytest.mark.timeout(60)
SAMPLES = Path(__file__).parent / "samples" / "bench"
NOW = 1_700_000_030.0


def finished(sample: str, run_id: str) -> RunInfo:
    """A finished bench pair (backend/benchpair.py): its summary is its drafter bench's, compared."""
    summary = json.loads((SAMPLES / sample).read_text())
    event = {"ts": NOW - 5, "kind": "finish", "stage": PAIR_STAGE, "run_id": run_id, "status": "completed",
             "summary": summary}
    return RunInfo(PAIR_STAGE, run_id, "done", stage_unit("bench"), summary["done"], summary["total"], 0, None, None,
                   event)


def with_runs(*runs: RunInfo) -> Snapshot:
    # through the collector's boundary, as every snapshot the panes see
    return sanitized(dataclasses.replace(base_snapshot(taken_at=NOW), runs=runs))


def test_view_of_the_trained_drafter_against_its_baseline():
    view = bench_view(finished("demo_bench_summary.json", "bench-drafter"))
    assert (view.label, view.baseline, view.state, view.slower, view.error) == ("drafter", "baseline", "done",
                                                                               False, None)
    drafter = [r for r in view.rows if r.label == "drafter"]
    assert [r.concurrency for r in drafter] == [1, 2] and all(r.ratio > 1 for r in drafter)
    assert all(r.acceptance_length > 2.2 for r in drafter)
    text = bench_markup(view).plain
    assert "drafter against baseline" in text and "1.65x" in text and "SLOWER" not in text


def test_a_slower_drafter_is_red():
    view = bench_view(finished("demo_bench_untrained_summary.json", "bench-untrained"))
    assert view.slower
    content = bench_markup(view)
    row = next(line for line in content.markup.splitlines() if "0.33x" in line)
    assert row.startswith("[b red]") and "0.33x" in row and "SLOWER" in row and "1.02" in row
    assert "do not serve it" in content.plain
    assert "concurrency 2: not measured by untrained" in content.plain


def test_running_bench_and_baseline_only_run():
    event = {"ts": NOW, "kind": "progress", "stage": "bench", "run_id": "b", "done": 7, "total": 12, "level": 2}
    running = bench_view(RunInfo("bench", "b", "running", None, 7, 12, 0, 3.0, None, event))
    assert "measuring: concurrency 2, 7/12 requests" in bench_markup(running).plain
    summary = json.loads((SAMPLES / "demo_bench_summary.json").read_text())
    del summary["comparison"]
    own = bench_view(RunInfo("bench", "b", "done", None, 12, 12, 0, None, None,
                             {"kind": "finish", "summary": summary}))
    assert [r.label for r in own.rows] == ["drafter", "drafter"] and all(r.ratio is None for r in own.rows)


@pytest.mark.parametrize("label", ["[red]x[/]", "[@click=app.quit]q[/]", "$label", "a\\[b]"])
def test_hostile_labels_shown_literally_and_garbage_summaries_said(label):
    run = finished("demo_bench_untrained_summary.json", "r")
    summary = json.loads(json.dumps(run.last_event["summary"]))
    summary["label"] = label
    for row in summary["comparison"]["rows"]:
        if row["label"] != "baseline":
            row["label"] = label
    view = bench_view(dataclasses.replace(run, last_event={"kind": "finish", "summary": summary}))
    assert label in bench_markup(view).plain  # literally, never as markup
    broken = bench_view(dataclasses.replace(run, last_event={"kind": "finish", "summary": {"comparison": {"rows": 5}}}))
    assert broken.error and "unreadable bench summary" in broken.error and not broken.rows


def several_k(best: dict | None) -> RunInfo:
    """The demo drafter's bench as a run of two K: the drafter's rows as drafter-k2 (slower at level 2) and
    drafter-k3, the best named as backend/benchpair.py names it."""
    run = finished("demo_bench_summary.json", "ks")
    summary = json.loads(json.dumps(run.last_event["summary"]))
    rows = []
    for row in summary["comparison"]["rows"]:
        if row["label"] == "baseline":
            rows.append(row)
            continue
        slow = row["concurrency"] == 2
        rows += [{**row, "label": "drafter-k2", "ratio": 0.9 if slow else 1.2, "slower": slow},
                 {**row, "label": "drafter-k3"}]
    summary["comparison"].update(rows=rows, labels=["baseline", "drafter-k2", "drafter-k3"], slower=True)
    summary.update(pair=True, k_values=[2, 3], **({"best_k": best} if best is not None else {}))
    return dataclasses.replace(run, last_event={**run.last_event, "summary": summary})


def test_a_bench_of_several_k_names_the_best():
    from backend.benchpair import STAGE as PAIR_STAGE
    from console.control import stages

    best = {"k": 3, "label": "drafter-k3", "run_id": "ks-k3", "speedup": 1.386, "acceptance_length": 3.867,
            "slower": False}
    run = several_k(best)
    view = bench_view(run)
    assert [r.label for r in view.rows] == ["baseline", "drafter-k2", "drafter-k3"] * 2
    assert (view.best.k, view.best.label, view.best.slower) == (3, "drafter-k3", False)
    content = bench_markup(view)
    said = "best K: 3 (drafter-k3, 1.39x mean speed-up over the levels, acceptance length 3.87)"
    assert said in content.plain and "do not serve it" not in content.plain  # K=2's slower row is only marked
    assert next(line for line in content.markup.splitlines() if said in line).startswith("[b green]")
    # `run bench --wait` prints the table and the best K under it
    run = dataclasses.replace(run, stage=PAIR_STAGE)
    printed = stages.of_run(PAIR_STAGE).results(stages.view_of(run, [run]), [run])
    assert "drafter-k2" in printed[0] and "0.90x SLOWER" in printed[0] and printed[1] == said
    lost = bench_markup(bench_view(several_k({**best, "slower": True}))).markup
    assert "[b red]best K: 3" in lost and "SLOWER than the baseline at some level, do not serve it" in lost


@pytest.mark.parametrize("best", [{"k": 99, "label": "x", "speedup": 1.0}, {"k": 2, "label": "x", "speedup": "1"},
                                  {"k": True, "label": "x", "speedup": 1.0}, {"k": 2, "label": 5, "speedup": 1.0},
                                  "drafter-k2"])
def test_an_odd_best_k_is_not_shown(best):
    view = bench_view(several_k(best))
    assert view.best is None and view.error is None and len(view.rows) == 6
    assert "best K" not in bench_markup(view).plain


def test_a_hostile_best_k_label_is_shown_literally():
    label = "[@click=app.quit]q[/]"
    view = bench_view(several_k({"k": 2, "label": label, "speedup": 1.2}))
    assert f"best K: 2 ({label}, 1.20x" in bench_markup(view).plain


class PaneApp(App[None]):
    """The bench pane alone, bound like the console binds it."""

    def __init__(self, snapshot: Snapshot):
        super().__init__()
        self.snapshot = snapshot

    def compose(self) -> ComposeResult:
        yield BenchPane(id="bench")

    def on_mount(self) -> None:
        self.query_one(BenchPane).snapshot = self.snapshot


def test_bench_pane_snapshot(snap_compare):
    snap = with_runs(finished("demo_bench_summary.json", "bench-drafter"))
    assert snap_compare(PaneApp(snap), terminal_size=(100, 12))


def test_bench_pane_slower_snapshot(snap_compare):
    snap = with_runs(finished("demo_bench_untrained_summary.json", "bench-untrained"))
    assert snap_compare(PaneApp(snap), terminal_size=(100, 10))


async def test_console_shows_the_pane_only_with_a_bench_run():
    plain = with_runs(generation_run())
    benched = with_runs(generation_run(), finished("demo_bench_summary.json", "bench-drafter"))
    fake = FakeController([plain, benched], journal={}, simulated=True)
    app = ConsoleApp(fake, clock=lambda: NOW)
    async with app.run_test(size=(150, 60)) as pilot:
        await until(lambda: app.last_snapshot is not None, "a snapshot", timeout=10, pause=pilot.pause)
        pane = app.query_one("#bench", BenchPane)
        if app.last_snapshot is plain:
            assert not pane.has_class("-shown") and pane.display is False
        await until(lambda: app.last_snapshot is benched, "the bench snapshot", timeout=10, pause=pilot.pause)
        await pilot.pause(0.2)
        assert pane.has_class("-shown") and pane.error is None
        assert "1.65x" in pane.query_one("#bench-body").plain


async def test_a_bench_that_starts_while_watched_scrolls_into_view():
    """Below the training pane the bench is off screen on a short terminal: a new one comes into view."""
    from textual.containers import ScrollableContainer

    from harness.fake_controller import training_run

    plain = with_runs(generation_run(), training_run())
    benched = with_runs(generation_run(), training_run(), finished("demo_bench_summary.json", "bench-drafter"))
    fake = FakeController([plain, plain, benched], journal={}, simulated=True)
    app = ConsoleApp(fake, clock=lambda: NOW)
    async with app.run_test(size=(150, 45)) as pilot:
        await until(lambda: app.last_snapshot is benched, "the bench snapshot", timeout=10, pause=pilot.pause)
        main = app.query_one("#main", ScrollableContainer)
        pane = app.query_one("#bench", BenchPane)
        # the scroll is animated: on a loaded machine it takes more than a frame or two to arrive
        await until(lambda: main.scroll_y > 0 and pane.region.bottom <= main.region.bottom,
                    "the bench pane scrolled into view", timeout=10, pause=pilot.pause)
