"""/metrics as the readiness pane shows it: load now, rates and drafter acceptance over a window."""
from __future__ import annotations

from pathlib import Path

from console.ui.panes.readiness import readiness_markup
from console.snapshot import ServerInfo
from console.telemetry.metrics_window import MetricsWindow

SAMPLES = Path(__file__).parent / "samples" / "metrics"


def test_two_scrapes_give_rates_and_acceptance():
    w = MetricsWindow()
    first = w.feed((SAMPLES / "v0_33_dp2_spec_a.prom").read_text(), 100.0, None)
    assert first.generation_tps is None  # one scrape: no rate yet
    assert first.requests_running is not None and first.kv_cache_usage_pct is not None
    second = w.feed((SAMPLES / "v0_33_dp2_spec_b.prom").read_text(), 110.0, None)
    assert second.generation_tps is not None and second.generation_tps > 0
    assert second.spec_mean_acceptance_length is not None and second.spec_mean_acceptance_length > 1
    assert 0 < second.spec_acceptance_rate <= 1 and second.spec_per_position
    text = readiness_markup(ServerInfo(phase="ready", model_id="m", metrics=second)).plain
    assert "tok/s" in text and "acceptance length" in text


def test_counter_reset_is_not_a_negative_rate():
    w = MetricsWindow()
    w.feed((SAMPLES / "v0_33_dp2_spec_b.prom").read_text(), 100.0, None)
    after_restart = w.feed((SAMPLES / "v0_33_dp2_spec_a.prom").read_text(), 110.0, None)
    assert after_restart.generation_tps is None


def test_scrape_cadence():
    w = MetricsWindow()
    assert w.due(0.0)
    w.feed("", 10.0, None)
    assert not w.due(12.0) and w.due(15.0)
