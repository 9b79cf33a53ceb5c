"""vLLM's /metrics (Prometheus text) -> the few numbers the console shows, summed over engines.

Parsed with prometheus_client's own parser so the exposition format (escapes, _total/_created,
histograms) is handled by the reference implementation. Samples are matched by sample name, which is
stable across client versions that name counter families with or without `_total`.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"  # before 0.12
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
REQUEST_SUCCESS = "vllm:request_success_total"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"

_SUMMED = {RUNNING: "requests_running", WAITING: "requests_waiting",
           PROMPT_TOKENS: "prompt_tokens_total", GENERATION_TOKENS: "generation_tokens_total",
           SPEC_DRAFTS: "spec_drafts", SPEC_DRAFT_TOKENS: "spec_draft_tokens",
           SPEC_ACCEPTED: "spec_accepted_tokens"}


@dataclass
class VllmMetrics:
    model_name: str | None = None
    models: tuple[str, ...] = ()  # every model_name seen in the scrape
    engines: int = 0
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None  # 0..1, the mean over engines
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    request_success: dict[str, float] = field(default_factory=dict)  # by finished_reason
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    spec_accepted_per_pos: dict[int, float] = field(default_factory=dict)
    malformed_lines: int = 0

    @property
    def has_spec_decode(self) -> bool:
        return self.spec_drafts is not None


@dataclass(frozen=True)
class SpecWindow:
    """Speculative decoding over the interval between two scrapes."""
    drafts: float
    draft_tokens: float
    accepted_tokens: float
    acceptance_rate: float | None  # accepted / draft tokens
    mean_acceptance_length: float  # 1 + accepted / drafts (the verified token counts too)
    per_position: tuple[float, ...]  # accepted at position i / drafts


def _samples(text: str) -> tuple[list, int]:
    """All samples; if the text is malformed somewhere, parse line by line and count what is dropped."""
    try:
        return [s for fam in text_string_to_metric_families(text) for s in fam.samples], 0
    except Exception:  # the parser raises ValueError and friends on any bad line; stay total
        pass
    samples: list = []
    bad = 0
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            samples.extend(s for fam in text_string_to_metric_families(line + "\n") for s in fam.samples)
        except Exception:
            bad += 1
    return samples, bad


def parse_vllm_metrics(text: str, model_name: str | None = None) -> VllmMetrics:
    """Sum vLLM's series for one model (the given one, else the first seen) over all its engines."""
    if not isinstance(text, str):
        return VllmMetrics()
    samples, bad = _samples(text)
    models: list[str] = []
    for s in samples:
        name = s.labels.get("model_name")
        if s.name.startswith("vllm:") and name and name not in models:
            models.append(name)
    chosen = model_name if model_name is not None else (models[0] if models else None)
    out = VllmMetrics(model_name=chosen, models=tuple(models), malformed_lines=bad)
    engines: set[str] = set()
    kv_new: list[float] = []
    kv_old: list[float] = []
    for s in samples:
        if not s.name.startswith("vllm:"):
            continue
        if chosen is not None and s.labels.get("model_name", chosen) != chosen:
            continue
        value = float(s.value)
        if not math.isfinite(value):  # NaN, or +Inf from a broken exporter: no reading
            continue
        if "engine" in s.labels:
            engines.add(s.labels["engine"])
        attr = _SUMMED.get(s.name)
        if attr is not None:
            setattr(out, attr, (getattr(out, attr) or 0.0) + value)
        elif s.name == KV_USAGE:
            kv_new.append(value)
        elif s.name == KV_USAGE_OLD:
            kv_old.append(value)
        elif s.name == REQUEST_SUCCESS:
            reason = s.labels.get("finished_reason", "unknown")
            out.request_success[reason] = out.request_success.get(reason, 0.0) + value
        elif s.name == SPEC_ACCEPTED_PER_POS:
            try:
                pos = int(s.labels.get("position", ""))
            except ValueError:
                continue
            out.spec_accepted_per_pos[pos] = out.spec_accepted_per_pos.get(pos, 0.0) + value
    kv = kv_new or kv_old
    out.kv_cache_usage = sum(kv) / len(kv) if kv else None
    out.engines = len(engines)
    return out
