"""Pure renderers and state helpers behind the panes, on real-format samples."""
from __future__ import annotations

from dataclasses import replace

import pytest

from harness.fake_controller import base_snapshot, generation_run, training_run
from console.snapshot import GpuInfo, RunInfo
from console.ui.panes.gauges import bar, duration, human_bytes, level_colour, pct, sparkline
from console.telemetry.progress import generation_view
from console.control.stages import pick_run
from console.ui.panes.generation import TokenRate, generation_markup
from console.ui.panes.gpus import gpu_row
from console.ui.panes.notices import transitions
from console.ui.panes.readiness import readiness_markup
from console.ui.panes.stages import stage_rows
from console.telemetry.progress import TrainPoint, train_point
from console.ui.panes.training import TrainHistory


@pytest.mark.parametrize("frac, width, expected", [
    (0.0, 4, "    "), (1.0, 4, "████"), (0.5, 4, "██  "), (1 / 4, 2, "▌ "), (1 / 16, 2, "▏ "), (2.0, 3, "███"),
    (None, 3, "   "), (0.3, 0, ""),
])
def test_bar_eighths(frac, width, expected):
    assert bar(frac, width) == expected


def test_level_colour_thresholds():
    assert [level_colour(f) for f in (0.05, 0.5, 0.85, None)] == ["green", "yellow", "red", "dim"]


def test_sparkline_scales_and_pads():
    assert sparkline([0, 100, None, 50], 6) == "  ▁█ ▅"
    assert sparkline(range(100), 3) == "███"


def test_numbers():
    assert human_bytes(512 * 2**30) == "512.0 GiB" and human_bytes(None) == "N/A" and human_bytes(10) == "10 B"
    assert duration(3725) == "1h02m" and duration(65) == "1m05s" and duration(None) == "N/A"
    assert pct(1, 4) == "25.0%" and pct(1, 0) == "N/A"


@pytest.mark.parametrize("width", [30, 55, 80, 120])
def test_gpu_row_fits_width(width):
    gpu = GpuInfo(3, "NVIDIA H200", 70000, 143771, 87, 61, 420.0)
    row = gpu_row(gpu, [10, 50, 90], width).plain
    assert "68.4/140.4G" in row and "87%" in row


def test_gpu_row_says_na_plainly():
    row = gpu_row(GpuInfo(0, "GPU"), [], 80).plain
    assert "N/A" in row and "%" not in row.replace("N/A", "")


def test_stage_rows_from_snapshot():
    snap = replace(base_snapshot(), runs=(generation_run(), RunInfo("train", "t0", "done", "eagle3-train.service"),
                                          RunInfo("train", "t1", "failed", "eagle3-train.service")))
    rows = {r.stage: r for r in stage_rows(snap)}
    assert rows["serve"].state == "running" and rows["serve"].unit == "eagle3-vllm.service"
    assert rows["generate"].state == "running" and rows["generate"].detail == "24%"
    assert rows["train"].state == "failed"  # newest run
    assert rows["extract"].state == "idle" and rows["extract"].unit is None
    assert stage_rows(base_snapshot(phase="failed"))[0].state == "failed"


def test_pick_run_prefers_running():
    runs = [RunInfo("generate", "a", "running"), RunInfo("generate", "b", "done")]
    assert pick_run(runs, "generate").run_id == "a" and pick_run(runs, "train") is None


def test_the_bench_row_shows_the_pair_never_one_of_its_benches():
    # the pair's benches (stage "bench") run inside it and finish before it: the row is the pair's
    runs = [RunInfo("bench_pair", "m1", "running", unit="e3-bench-m1"),
            RunInfo("bench", "m1-baseline", "done", unit="e3-bench-m1"),
            RunInfo("bench", "m1-drafter", "running", unit="e3-bench-m1")]
    assert pick_run(runs, "bench").run_id == "m1"
    rows = {r.stage: r for r in stage_rows(replace(base_snapshot(), runs=tuple(runs)))}
    assert rows["bench"].state == "running" and rows["bench"].unit == "e3-bench-m1"


def test_generation_markup_and_token_rate():
    rate = TokenRate()
    first = generation_run(done=1000, ts=100.0)
    second = generation_run(done=1010, ts=102.0)
    assert rate.feed(generation_view(first)) is None
    assert rate.feed(generation_view(second)) == pytest.approx(4500.0)
    text = generation_markup(second, 4500.0).plain
    assert "1010/5000" in text and "free disk 512.0 GiB" in text and "truncated (length) 4.0%" in text


def test_train_point_formats():
    assert train_point({"kind": "start"}) is None
    p = train_point({"step": 5, "epoch": 1, "loss": 1.5, "acc_0": 0.7, "acc_1": 0.4, "lr": 1e-4})
    assert p.acc == (0.7, 0.4) and p.loss == 1.5
    # a value of the wrong type reads as not given: one odd event costs a figure, never the pane
    assert train_point({"step": 5, "loss": "high", "lr": float("nan")}) == TrainPoint(step=5)


def test_train_history_keeps_points_once_and_best_checkpoint():
    h = TrainHistory()
    changed = [h.feed("r", train_point(training_run(step=s, epoch=s // 100).last_event))
               for s in (100, 100, 150, 200)]
    assert changed == [True, False, True, True]  # a repeated event (same snapshot twice) adds nothing
    assert [s for s, _ in h.steps] == [100, 150, 200]
    assert h.best is not None and h.best[1] == "checkpoints/epoch2" and set(h.val) == {1, 2}
    h.feed("other", train_point(training_run(step=1).last_event))
    assert [s for s, _ in h.steps] == [1] and h.best is None


def test_readiness_markup_loading_and_failed():
    text = readiness_markup(base_snapshot(phase="loading_weights").server).plain
    assert "loading_weights" in text and "from shard progress" in text
    assert "ready in 5m30s (each step from 2 previous loads)" in text
    assert "weights  1m35s" in text
    first = replace(base_snapshot(phase="loading_weights").server, eta_ready_s=95, eta_ready_confidence="low",
                    eta_ready_basis=0)
    assert "ready in >1m35s (low confidence: no previous load; weights only)" in readiness_markup(first).plain
    unknown = replace(first, phase="compiling", eta_ready_s=None)
    assert "ready in unknown (no previous load" in readiness_markup(unknown).plain
    failed = readiness_markup(base_snapshot(phase="failed").server)
    assert "✖ torch.OutOfMemoryError" in failed.plain and "[b red]✖ torch.OutOfMemoryError" in failed.markup


def test_transitions():
    loading, ready, failed = (base_snapshot(phase=p) for p in ("loading_weights", "ready", "failed"))
    assert transitions(None, ready) == []
    assert [n.text for n in transitions(loading, ready)] == ["Server ready: Qwen/Qwen3-8B"]
    assert transitions(loading, failed)[0].severity == "error"
    before = replace(base_snapshot(), runs=(RunInfo("generate", "g", "running"),))
    after = replace(base_snapshot(), runs=(RunInfo("generate", "g", "done"),))
    assert [n.text for n in transitions(before, after)] == ["Stage generate finished (g)"]


def test_clean_line_strips_terminal_control():
    from console.ui.panes.tail_view import clean_line
    assert clean_line("\x1b[31mERROR\x1b[0m\tboom\r\n") == "ERROR    boom"
    assert clean_line("title\x1b]0;pwned\x07 ok\x00\x9b") == "title ok"


async def test_line_batcher_delivers_first_at_once_then_batches():
    import asyncio

    from console.session import JournalLine
    from console.ui.panes.journal import LineBatcher
    got: list[list[str]] = []
    b = LineBatcher(lambda lines: got.append([l.text for l in lines]), 0.05)
    b.add(JournalLine("a", "u"))
    await asyncio.sleep(0.01)
    b.add(JournalLine("b", "u"))
    b.add(JournalLine("c", "u"))
    await asyncio.sleep(0.1)
    assert got == [["a"], ["b", "c"]]
    b.add(JournalLine("d", "u"))
    b.cancel()  # a unit no longer followed: its waiting lines are dropped
    await asyncio.sleep(0.1)
    assert got == [["a"], ["b", "c"]]


def test_help_lists_remapped_keys():
    from console.ui.keys import visible_keys
    from console.ui.screens.help import help_markup
    text = help_markup(visible_keys(False), {"stop_stage": "X"}, readonly=False).plain
    assert "X" in text and "stop_stage" in text and "?" in text and '[keys] stop_stage = "X"' in text


def test_gpu_row_with_memory_history_fits_width():
    gpu = GpuInfo(3, "NVIDIA H200", 70000, 143771, 87, 61, 420.0)
    row = gpu_row(gpu, [10, 50, 90], 120, [20.0, 40.0, 48.0]).plain
    assert len(row) <= 120 and row.endswith("▂▄▄          ▂▅▇")  # memory, then utilisation


def test_history_buckets_gpus_and_rates_over_minutes():
    from console.telemetry.history import BUCKET_S, POINTS, History
    from console.telemetry.snapshot import ServerMetrics
    h = History()
    base = base_snapshot(n_gpus=1)
    for i in range(POINTS + 5):
        gpu = replace(base.gpus[0], utilization_pct=i % 100, memory_used_mib=1000 * i, memory_total_mib=100_000)
        server = replace(base.server, metrics=ServerMetrics(generation_tps=10.0 * i))
        h.add(replace(base, gpus=(gpu,), server=server, taken_at=1_000_000.0 + i * BUCKET_S))
        h.add(replace(base, gpus=(gpu,), server=server, taken_at=1_000_000.0 + i * BUCKET_S + 1))  # same bucket
    assert len(h.gpu_util[0].values()) == POINTS and h.gpu_util[0].values()[-1] == POINTS + 4
    assert h.gpu_memory[0].values()[-1] == pytest.approx(POINTS + 4)
    assert h.generation_tps.values()[-1] == 10.0 * (POINTS + 4)
    # a gap in the samples is a gap in the strip, and a host that does not answer adds nothing
    h.add(replace(base, taken_at=1_000_000.0 + (POINTS + 8) * BUCKET_S))
    assert h.gpu_util[0].values()[-4:-1] == [None, None, None]
    h.add(replace(base, host=replace(base.host, reachable=False), taken_at=1_000_000.0 + (POINTS + 9) * BUCKET_S))
    assert h.gpu_util[0].values()[-1] is not None


def test_token_rate_strip_when_serving():
    from console.telemetry.snapshot import ServerMetrics
    srv = replace(base_snapshot().server, metrics=ServerMetrics(requests_running=4, generation_tps=800.0))
    text = readiness_markup(srv, [100.0, None, 400.0, 800.0]).plain
    assert "rate     " in text and "generated tok/s, last 5 min, peak 800" in text
    assert "rate" not in readiness_markup(srv, [800.0]).plain.split("load")[1]  # one sample: no strip yet
