"""SVG snapshots of fixed states (clock frozen, TZ=UTC). Regenerate with `--snapshot-update`."""
from __future__ import annotations

from dataclasses import replace


import pytest

from console.ui.app import ConsoleApp
from harness.app_snapshots import SIZE, settle
from harness.fake_controller import (SERVER_UNIT, FakeController, base_snapshot, generation_run, stage_unit,
                                     training_run)

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("utc")]  # times shown in UTC
NOW = 1_700_000_030.0


def app_for(*snapshots, journal=None, **kwargs) -> ConsoleApp:
    lines = journal or {SERVER_UNIT: [f"INFO 11-14 22:13:{i:02d} [loader.py:42] loading shard {i}"
                                      for i in range(8)]}
    fake = FakeController(list(snapshots), lines, simulated=True, host_name="gpu-host")
    return ConsoleApp(fake, clock=lambda: NOW, **kwargs)


def training_history(n: int = 41):  # 41: the last point falls on a plot redraw (every 5 s)
    """Successive training snapshots so the pane has a curve (it keeps history itself)."""
    snaps = []
    for i in range(1, n + 1):
        snap = base_snapshot(taken_at=NOW - n + i)
        snaps.append(replace(snap, runs=(replace(generation_run(done=5000, total=5000), state="done"),
                                         training_run(step=i * 5, epoch=1 + i * 5 // 100))))
    return snaps


def test_loading(snap_compare):
    assert snap_compare(app_for(base_snapshot(phase="loading_weights")), terminal_size=SIZE, run_before=settle)


def test_ready(snap_compare):
    assert snap_compare(app_for(base_snapshot()), terminal_size=SIZE, run_before=settle)


def test_failed(snap_compare):
    assert snap_compare(app_for(base_snapshot(phase="failed")), terminal_size=SIZE, run_before=settle)


def test_generation_mid_run(snap_compare):
    snap = replace(base_snapshot(n_gpus=8), runs=(generation_run(),))
    assert snap_compare(app_for(snap), terminal_size=SIZE, run_before=settle)


def test_training_mid_run(snap_compare):
    assert snap_compare(app_for(*training_history()), terminal_size=SIZE, run_before=settle)


def test_disconnected_narrow(snap_compare):
    down = base_snapshot(reachable=False, taken_at=NOW)
    assert snap_compare(app_for(base_snapshot(taken_at=NOW - 42), down), terminal_size=(90, 48),
                        run_before=settle)


def test_stop_confirmation(snap_compare):
    snap = replace(base_snapshot(), runs=(generation_run(),))

    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("j", "x")
        await pilot.pause(0.2)

    assert snap_compare(app_for(snap, journal={SERVER_UNIT: [], stage_unit("generate"): []}),
                        terminal_size=SIZE, run_before=run_before)


def history_snapshots(n: int = 31):
    """Five minutes of snapshots 10 s apart: memory filling as a load goes on, GPU 1 throttling in the
    middle, then the server generating at a rate that sags and recovers."""
    from console.telemetry.snapshot import ServerMetrics
    snaps = []
    for i in range(n):
        base = base_snapshot(taken_at=NOW - 10 * (n - 1 - i))
        gpus = tuple(replace(g, memory_used_mib=min(130_000, 4_000 + 6_000 * i),
                             utilization_pct=(30 if g.index == 1 and 10 <= i < 18 else 95) if i > 12 else 5)
                     for g in base.gpus)
        tps = None if i < 14 else 900.0 - 400.0 * (18 <= i < 22) + 10 * (i % 3)
        server = replace(base.server, metrics=ServerMetrics(requests_running=32, requests_waiting=0,
                                                            kv_cache_usage_pct=41.0, generation_tps=tps))
        snaps.append(replace(base, gpus=gpus, server=server))
    return snaps


def test_history_strips(snap_compare):
    """Per-GPU memory and utilisation strips and the token-rate strip, over the session's five minutes."""
    assert snap_compare(app_for(*history_snapshots()), terminal_size=(230, 48), run_before=settle)
