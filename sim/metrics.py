"""The stand-in's /metrics: vLLM's Prometheus families, moved by the requests it really serves.

Each server gets its own registry (tests run several in one process). Children are bound to their
labels once, because `.labels()` on every request would cost more than the request itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sim.specdec import SpecCounts

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
FINISHED_REASONS = ("stop", "length", "abort", "error")


@dataclass
class SpecWindow:
    """Spec-decode totals since the last steady-state log line."""
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = field(default_factory=list)


class ServerMetrics:
    def __init__(self, model_name: str, *, num_spec_tokens: int = 0, old_cache_gauge: bool = False):
        self.registry = CollectorRegistry(auto_describe=False)
        labels = ("model_name", "engine")
        values = (model_name, "0")
        reg = self.registry
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                             labels, registry=reg).labels(*values)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                             labels, registry=reg).labels(*values)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                              labels, registry=reg).labels(*values)
        self.old_kv_usage = (Gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.",
                                   labels, registry=reg).labels(*values) if old_cache_gauge else None)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                     labels, registry=reg).labels(*values)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.",
                                         labels, registry=reg).labels(*values)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                                   labels, registry=reg).labels(*values)
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          labels + ("finished_reason",), registry=reg)
        self.success = {r: success.labels(*values, r) for r in FINISHED_REASONS}
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              labels, buckets=TTFT_BUCKETS, registry=reg).labels(*values)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             labels, buckets=ITL_BUCKETS, registry=reg).labels(*values)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             labels, buckets=E2E_BUCKETS, registry=reg).labels(*values)
        self.num_spec_tokens = num_spec_tokens
        self.spec = None
        if num_spec_tokens:
            self.spec = {
                "drafts": Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.",
                                  labels, registry=reg).labels(*values),
                "draft_tokens": Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.",
                                        labels, registry=reg).labels(*values),
                "accepted": Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                                    labels, registry=reg).labels(*values),
            }
            per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                              "Accepted tokens per draft position.", labels + ("position",), registry=reg)
            self.spec_per_pos = [per_pos.labels(*values, str(i)) for i in range(num_spec_tokens)]
        # plain totals for the steady-state log line (cheaper than reading the collectors back)
        self.window_prompt = 0
        self.window_generation = 0
        self.window_spec = SpecWindow(per_pos=[0] * num_spec_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def set_kv_usage(self, fraction: float) -> None:
        self.kv_usage.set(fraction)
        if self.old_kv_usage is not None:
            self.old_kv_usage.set(fraction)

    def finished(self, *, reason: str, prompt_tokens: int, completion_tokens: int, ttft: float, e2e: float,
                 acceptance: tuple[float, ...] = (), spec: SpecCounts | None = None,
                 itl: list[float] | None = None) -> None:
        """Account one finished request. `spec`: the request's real spec-decode counters (a real drafter);
        `acceptance`: made-up per-position rates (the SIMULATED drafter, no checkpoint); `itl`: the
        measured gaps between its steps (else the mean gap is observed once)."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)
        self.window_prompt += prompt_tokens
        self.window_generation += completion_tokens
        self.success.get(reason, self.success["error"]).inc()
        self.ttft.observe(ttft)
        self.e2e.observe(e2e)
        if itl is not None:
            for gap in itl:
                self.itl.observe(gap)
        elif completion_tokens > 1:
            self.itl.observe(max(0.0, e2e - ttft) / (completion_tokens - 1))
        if self.spec is None:
            return
        if spec is not None:
            self._record(spec.drafts, spec.draft_tokens, spec.accepted, spec.per_pos)
        elif completion_tokens > 0 and acceptance:
            self._spec(completion_tokens, acceptance)

    def _spec(self, tokens: int, acceptance: tuple[float, ...]) -> None:
        self._record(*self.made_up(tokens, acceptance))

    def made_up(self, tokens: int, acceptance: tuple[float, ...]) -> tuple[int, int, int, list[int]]:
        """SIMULATED drafter only: (drafts, draft tokens, accepted, per position) for `tokens` output tokens
        at per-position rates p_i (each step emits 1 + sum(p_i) tokens on average)."""
        rates = [acceptance[i] if i < len(acceptance) else 0.0 for i in range(self.num_spec_tokens)]
        drafts = max(1, math.ceil(tokens / (1 + sum(rates))))
        accepted_pos = [round(drafts * p) for p in rates]
        return drafts, drafts * self.num_spec_tokens, sum(accepted_pos), accepted_pos

    def _record(self, drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]) -> None:
        self.spec["drafts"].inc(drafts)
        self.spec["draft_tokens"].inc(draft_tokens)
        self.spec["accepted"].inc(accepted)
        for counter, n in zip(self.spec_per_pos, per_pos):
            counter.inc(n)
        w = self.window_spec
        w.drafts += drafts
        w.draft_tokens += draft_tokens
        w.accepted += accepted
        w.per_pos = [a + b for a, b in zip(w.per_pos, per_pos)]

    def take_window(self) -> tuple[int, int, SpecWindow]:
        out = (self.window_prompt, self.window_generation, self.window_spec)
        self.window_prompt = self.window_generation = 0
        self.window_spec = SpecWindow(per_pos=[0] * self.num_spec_tokens)
        return out


class RequestSpec:
    """One streamed request's spec-decode counters, put into /metrics step by step as vLLM does (its
    counters grow each engine step, so a read in the middle of a request sees the steps so far: the
    bench's reasoning/answer split reads them at the first answer token): the real drafter's counts, or
    the made-up rates' share of the tokens so far (the SIMULATED drafter)."""

    def __init__(self, metrics: ServerMetrics, acceptance: tuple[float, ...],
                 answer_acceptance: tuple[float, ...] | None = None):
        self.metrics = metrics
        self.acceptance = acceptance
        self.answer_acceptance = answer_acceptance  # made-up rates of the answer's tokens, when they differ
        self.done: tuple[int, int, int, list[int]] = (0, 0, 0, [0] * metrics.num_spec_tokens)

    def step(self, tokens: int, counts: SpecCounts | None, reasoning: int | None = None) -> None:
        """`tokens` output so far, `reasoning` of them in the thinking (None: not told)."""
        m = self.metrics
        if m.spec is None:
            return
        if counts is not None:
            now = (counts.drafts, counts.draft_tokens, counts.accepted, list(counts.per_pos))
        elif self.acceptance and tokens > 0:
            if self.answer_acceptance is not None and reasoning is not None:
                parts = [m.made_up(n, rates) for n, rates in ((reasoning, self.acceptance),
                                                             (tokens - reasoning, self.answer_acceptance)) if n > 0]
                now = (sum(x[0] for x in parts), sum(x[1] for x in parts), sum(x[2] for x in parts),
                       [sum(col) for col in zip(*(x[3] for x in parts))])
            else:
                now = m.made_up(tokens, self.acceptance)
        else:
            return
        d, dt, a, pp = self.done
        per_pos = [max(0, x - y) for x, y in zip(now[3], pp + [0] * (len(now[3]) - len(pp)))]
        if now[0] - d > 0 or now[2] - a > 0:
            m._record(now[0] - d, now[1] - dt, now[2] - a, per_pos)  # noqa: SLF001 - its own counters
        self.done = now
