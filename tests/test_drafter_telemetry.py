"""Telemetry of the drafter server: that the drafter was loaded (its log lines, real vLLM format), live
acceptance over a window from two real-format /metrics scrapes and from the `SpecDecoding metrics:` log
line, in the snapshot (status --json) and in the readiness pane (text, and an SVG snapshot of the app)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from console.profile import profile_from_dict
from console.telemetry.collector import Collector
from console.snapshot import Snapshot
from console.ui.panes.readiness import readiness_markup

SAMPLES = Path(__file__).parent / "samples"
# vLLM's own lines (0.11+ format, worker/engine prefixes) of a load with an EAGLE-3 drafter
DRAFTER_LOAD = [
    "(APIServer pid=4012) INFO 11-30 21:04:10 [api_server.py:1885] vLLM API server version 0.11.0",
    "(EngineCore_DP0 pid=4210) INFO 11-30 21:04:31 [gpu_model_runner.py:2602] Starting to load model /shared/kimi...",
    "(Worker_TP0 pid=4300) INFO 11-30 21:09:02 [gpu_model_runner.py:2620] Loading drafter model...",
    "(Worker_TP0 pid=4300) INFO 11-30 21:09:03 [eagle.py:1092] Using auxiliary layers from speculative config: "
    "(2, 30, 58)",
    "(Worker_TP0 pid=4300) INFO 11-30 21:09:05 [gpu_model_runner.py:2653] Model loading took 71.2 GiB and "
    "295.1 seconds",
    "(APIServer pid=4012) INFO 11-30 21:11:40 [launcher.py:44] Application startup complete.",
    "(APIServer pid=4012) INFO 11-30 21:12:00 [metrics.py:96] SpecDecoding metrics: Mean acceptance length: 2.31, "
    "Accepted throughput: 1.23 tokens/s, Drafted throughput: 3.45 tokens/s, Accepted: 123 tokens, Drafted: 345 "
    "tokens, Per-position acceptance rate: 0.751, 0.567, 0.453, Avg Draft acceptance rate: 58.9%",
]


def collector() -> Collector:
    p = profile_from_dict({"host": {"name": "gpu-host.example"}, "server": {"model_path": "/shared/kimi",
                                                                           "unit": "vllm-kimi"},
                           "paths": {"work_dir": "/data/eagle3"}})
    return Collector(p, host=None)  # type: ignore[arg-type]  # nothing here reaches the host


def test_the_drafter_load_and_acceptance_in_the_snapshot():
    c = collector()
    for line in DRAFTER_LOAD:
        c.tracker.feed(line, 1.0)
    assert c.drafter_info() is None  # the baseline is followed: its log says nothing of a drafter
    c.follow_server("drafter")
    assert c.service.unit == "vllm-kimi-drafter" and c.server_unit == "vllm-kimi-drafter"
    assert c.drafter_info().loaded is False  # a fresh log: nothing of the new server's load yet
    for line in DRAFTER_LOAD:
        c.tracker.feed(line, 1.0)
    c.metrics.feed((SAMPLES / "metrics" / "v0_33_dp2_spec_a.prom").read_text(), 100.0, None)
    live = c.metrics.feed((SAMPLES / "metrics" / "v0_33_dp2_spec_b.prom").read_text(), 105.0, None)
    d = c.drafter_info()
    assert (d.unit, d.loaded, d.aux_layers) == ("vllm-kimi-drafter", True, (2, 30, 58))
    assert (d.log_stats.mean_acceptance_length, d.log_stats.acceptance_pct) == (2.31, 58.9)
    assert d.log_stats.per_position == (0.751, 0.567, 0.453)
    # the window between the two scrapes: the bench's own definitions (backend/bench/scrape.py)
    assert live.spec_acceptance_rate == pytest.approx(1890 / 3900)
    assert live.spec_mean_acceptance_length == pytest.approx(1 + 1890 / 1300)
    assert live.spec_per_position == pytest.approx((1000 / 1300, 550 / 1300, 340 / 1300))
    assert live.spec_window_s == 5.0
    # status --json: the same facts, typed
    doc = json.loads(json.dumps(Snapshot(host=c.host_info(), service=c.service,
                                         server=replace(c.server_info(), metrics=live)).to_json()))
    assert doc["server"]["drafter"] == {"unit": "vllm-kimi-drafter", "loaded": True, "aux_layers": [2, 30, 58],
                                        "log_stats": {"mean_acceptance_length": 2.31, "acceptance_pct": 58.9,
                                                      "per_position": [0.751, 0.567, 0.453],
                                                      "accepted_tokens": 123, "drafted_tokens": 345}}
    assert doc["server"]["metrics"]["spec_window_s"] == 5.0
    from console.commands.server_cmd import human
    text = human(Snapshot(host=c.host_info(), service=c.service, server=c.server_info()))
    assert "(with drafter)" in text and "drafter loaded, auxiliary layers 2, 30, 58" in text
    # and back to the baseline: nothing of the drafter remains
    c.follow_server("baseline")
    assert c.drafter_info() is None and c.metrics.current is None and c.service.unit == "vllm-kimi"


def test_readiness_says_with_drafter():
    c = collector()
    c.follow_server("drafter")
    for line in DRAFTER_LOAD:
        c.tracker.feed(line, 1.0)
    c.metrics.feed((SAMPLES / "metrics" / "v0_33_dp2_spec_a.prom").read_text(), 100.0, None)
    live = c.metrics.feed((SAMPLES / "metrics" / "v0_33_dp2_spec_b.prom").read_text(), 105.0, None)
    srv = replace(c.server_info(), phase="ready", model_id="kimi-k2.5", metrics=live)
    text = readiness_markup(srv).plain
    assert "with drafter (vllm-kimi-drafter): drafter loaded, auxiliary layers 2, 30, 58" in text
    assert "acceptance length 2.45, 48% (per position 0.77 0.42 0.26; /metrics, last 5 s)" in text
    assert "log      acceptance length 2.31, 58.9% (per position 0.75 0.57 0.45; SpecDecoding metrics line)" in text
    waiting = readiness_markup(replace(srv, drafter=replace(srv.drafter, loaded=False, aux_layers=None,
                                                            log_stats=None))).plain
    assert "drafter load not logged yet, auxiliary layers not logged" in waiting


NOW = 1_700_000_030.0


@pytest.mark.timeout(60)
def test_app_with_the_drafter_server(snap_compare, utc):
    from console.snapshot import DrafterInfo, ServerMetrics, SpecLogStats
    from console.ui.app import ConsoleApp
    from harness.fake_controller import FakeController, base_snapshot
    from harness.app_snapshots import SIZE, settle

    snap = base_snapshot()
    unit = "eagle3-vllm-drafter.service"
    drafter = DrafterInfo(unit="eagle3-vllm-drafter", loaded=True, aux_layers=(2, 18, 33),
                          log_stats=SpecLogStats(2.31, 58.9, (0.751, 0.567, 0.453), 123, 345))
    metrics = ServerMetrics(requests_running=3, requests_waiting=0, kv_cache_usage_pct=12.0, generation_tps=412.0,
                            spec_acceptance_rate=0.4846, spec_mean_acceptance_length=2.4538,
                            spec_per_position=(0.769, 0.423, 0.262), spec_window_s=5.0)
    snap = replace(snap, service=replace(snap.service, unit=unit),
                   server=replace(snap.server, drafter=drafter, metrics=metrics))
    fake = FakeController([snap], {unit: ["INFO 11-14 22:13:00 [gpu_model_runner.py:2620] Loading drafter model..."]},
                          simulated=True, host_name="gpu-host")
    assert snap_compare(ConsoleApp(fake, clock=lambda: NOW), terminal_size=SIZE, run_before=settle)
