"""vLLM's /metrics turned into what an operator reads: load now, throughput and acceptance over a window.

Counters only make sense as rates, so two scrapes are kept; a counter that went down means the server
restarted and that window is skipped.
"""
from __future__ import annotations

from backend.contract.numbers import finite, whole
from console.snapshot import ServerMetrics
from console.parsers.metrics import VllmMetrics, parse_vllm_metrics
from console.telemetry.spec_window import spec_decode_window

SCRAPE_EVERY_S = 5.0


def _rate(prev: float | None, cur: float | None, dt: float) -> float | None:
    prev, cur = finite(prev), finite(cur)
    if prev is None or cur is None or dt <= 0 or cur < prev:
        return None
    return finite(round((cur - prev) / dt, 1))


def _pct(fraction: float | None) -> float | None:
    value = finite(fraction)
    return None if value is None else finite(round(value * 100, 1))


class MetricsWindow:
    def __init__(self) -> None:
        self.prev: tuple[float, VllmMetrics] | None = None
        self.last_scrape = float("-inf")
        self.current: ServerMetrics | None = None

    def due(self, now: float) -> bool:
        return now - self.last_scrape >= SCRAPE_EVERY_S

    def feed(self, text: str, now: float, model_name: str | None) -> ServerMetrics:
        self.last_scrape = now
        cur = parse_vllm_metrics(text, model_name)
        rates: dict = {}
        if self.prev is not None:
            then, prev = self.prev
            dt = now - then
            rates.update(generation_tps=_rate(prev.generation_tokens_total, cur.generation_tokens_total, dt),
                         prompt_tps=_rate(prev.prompt_tokens_total, cur.prompt_tokens_total, dt))
            window = spec_decode_window(prev, cur)
            if window is not None:
                rates.update(spec_acceptance_rate=window.acceptance_rate,
                             spec_mean_acceptance_length=window.mean_acceptance_length,
                             spec_per_position=tuple(window.per_position), spec_window_s=round(dt, 1))
        out = ServerMetrics(
            requests_running=whole(cur.requests_running),
            requests_waiting=whole(cur.requests_waiting),
            kv_cache_usage_pct=_pct(cur.kv_cache_usage),
            **rates)
        self.prev = (now, cur)
        self.current = out
        return out
