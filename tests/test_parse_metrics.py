from __future__ import annotations

from pathlib import Path

import pytest

from console.parsers.metrics import VllmMetrics, parse_vllm_metrics
from console.telemetry.spec_window import spec_decode_window

SAMPLES = Path(__file__).parent / "samples" / "metrics"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text(encoding="utf-8")


def test_sums_over_engines():
    m = parse_vllm_metrics(sample("v0_33_dp2_spec_a.prom"))
    assert (m.model_name, m.models, m.engines) == ("kimi-k2.5", ("kimi-k2.5",), 2)
    assert (m.requests_running, m.requests_waiting) == (5.0, 1.0)
    assert m.kv_cache_usage == pytest.approx(0.1875)  # mean of the engines' fractions
    assert (m.prompt_tokens_total, m.generation_tokens_total) == (80000.0, 135000.0)
    assert m.request_success == {"abort": 0.0, "length": 3.0, "stop": 60.0, "error": 0.0}
    assert (m.spec_drafts, m.spec_draft_tokens, m.spec_accepted_tokens) == (1500.0, 4500.0, 2000.0)
    assert m.spec_accepted_per_pos == {0: 1000.0, 1: 600.0, 2: 400.0}
    assert m.has_spec_decode and m.malformed_lines == 0


def test_old_gpu_cache_usage_name_and_no_drafter():
    m = parse_vllm_metrics(sample("v0_11_old_kv.prom"))
    assert (m.model_name, m.kv_cache_usage, m.engines) == ("qwen3-8b", 0.004, 1)
    assert m.request_success == {"stop": 12.0, "length": 3.0}
    assert not m.has_spec_decode and m.spec_accepted_per_pos == {}
    assert spec_decode_window(None, m) is None


def test_other_model_is_filtered_out():
    text = sample("v0_11_old_kv.prom") + (
        '# TYPE vllm:num_requests_running gauge\n'
        'vllm:num_requests_running{engine="0",model_name="other"} 7.0\n')
    assert parse_vllm_metrics(text).requests_running == 1.0
    assert parse_vllm_metrics(text, model_name="other").requests_running == 7.0
    assert parse_vllm_metrics(text).models == ("qwen3-8b", "other")


def test_window_between_two_scrapes():
    a = parse_vllm_metrics(sample("v0_33_dp2_spec_a.prom"))
    b = parse_vllm_metrics(sample("v0_33_dp2_spec_b.prom"))
    w = spec_decode_window(a, b)
    assert (w.drafts, w.draft_tokens, w.accepted_tokens) == (1300.0, 3900.0, 1890.0)
    assert w.acceptance_rate == pytest.approx(1890 / 3900)
    assert w.mean_acceptance_length == pytest.approx(1 + 1890 / 1300)
    assert w.per_position == pytest.approx((1000 / 1300, 550 / 1300, 340 / 1300))


def test_window_since_start_and_after_restart():
    a = parse_vllm_metrics(sample("v0_33_dp2_spec_a.prom"))
    b = parse_vllm_metrics(sample("v0_33_dp2_spec_b.prom"))
    since_start = spec_decode_window(None, a)
    assert since_start.mean_acceptance_length == pytest.approx(1 + 2000 / 1500)
    # counters went down: the server restarted, the window is everything since then
    assert spec_decode_window(b, a) == since_start


def test_window_without_new_drafts_is_none():
    a = parse_vllm_metrics(sample("v0_33_dp2_spec_a.prom"))
    assert spec_decode_window(a, a) is None


def test_malformed_lines_are_counted_not_fatal():
    text = sample("v0_11_old_kv.prom") + "this is { not prometheus\nvllm:num_requests_waiting{ 3\n"
    m = parse_vllm_metrics(text)
    assert (m.requests_running, m.prompt_tokens_total, m.malformed_lines) == (1.0, 1234.0, 2)


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "<html>502 Bad Gateway</html>", None, "\x00\xff"])
def test_garbage_gives_empty_metrics(text):
    m = parse_vllm_metrics(text)
    assert isinstance(m, VllmMetrics)
    assert (m.requests_running, m.kv_cache_usage, m.spec_drafts) == (None, None, None)


def test_nan_gauge_is_no_reading():
    m = parse_vllm_metrics('vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN\n')
    assert m.kv_cache_usage is None
