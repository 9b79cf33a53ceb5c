"""The training pane on the events a real run wrote (tests/samples/train/: a 4-epoch CPU run of the tiny
verifier with mid-epoch checkpoints, and the verify run on it; paths rewritten to /data/eagle3), read
through the console's own run reader. SVG snapshot; regenerate with `--snapshot-update`."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from console.telemetry.probe import RunFile
from console.telemetry.progress import train_view
from console.telemetry.runs import RunBook
from console.ui.app import ConsoleApp
from console.ui.panes.training import TrainHistory, training_markup, verify_markup
from harness.app_snapshots import settle
from harness.fake_controller import SERVER_UNIT, FakeController, base_snapshot

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("utc")]  # times shown in UTC
SAMPLES = Path(__file__).parent / "samples" / "train"
NOW = 1_796_070_400.0
SIZE = (150, 48)


def real_runs():
    book = RunBook("systemd")
    for run_id, name in (("train-1", "train_events.jsonl"), ("verify-1", "verify_events.jsonl")):
        raw = (SAMPLES / name).read_bytes()
        book.apply_listing([RunFile(f"/data/eagle3/runs/{run_id}", run_id, len(raw), 0.0)])
        book.apply_events(f"/data/eagle3/runs/{run_id}", raw)
    return book.infos()


def test_the_real_run_reads_into_a_full_view():
    train, verify = real_runs()
    assert train.state == "done" and verify.state == "done"
    s = train.series
    assert len(s["val"]) == 4 and s["best"]["path"].startswith("/data/eagle3/runs/train-1/checkpoints/")
    assert s["loss"][0][1] > s["loss"][-1][1] and s["last_checkpoint"]["kind"] in ("epoch", "mid_epoch")
    h = TrainHistory()
    h.load_series(train.run_id, train_view(train))
    text = training_markup(train.run_id, train.state, train.eta_s, h, train.rate).plain
    assert "epoch 4/4" in text and f"step {s['step'] + 1}/{s['total']}" in text and "best /data/eagle3" in text
    table = verify_markup(verify).plain
    assert "checks 5 ok" in table and "trained" in table and "untrained" in table


def test_training_pane_on_a_real_run(snap_compare):
    snap = replace(base_snapshot(taken_at=NOW), runs=tuple(real_runs()))
    fake = FakeController([snap], {SERVER_UNIT: ["INFO 11-30 20:00:00 [api_server.py:1] ready"]}, simulated=True,
                          host_name="gpu-host")
    assert snap_compare(ConsoleApp(fake, clock=lambda: NOW), terminal_size=SIZE, run_before=settle)
