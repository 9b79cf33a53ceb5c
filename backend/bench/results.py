"""Bench results: one measured concurrency level, whoever measured it, in one shape.

Two producers, the same figures with the same definitions: `vllm bench serve`'s saved result JSON
(`parse_vllm_bench_result`; keys as vllm/benchmarks/serve.py writes them: `output_throughput`,
`request_throughput`, `mean|median|std|pNN_{ttft,tpot,itl,e2el}_ms`, and from 0.15.1 `spec_decode_*`,
its acceptance rate in percent), and our own streaming client's per-request measurements (`figures`,
which computes them as vLLM does: TTFT to the first chunk that carries a choice, ITL between such
chunks, latency to the last one, TPOT = (latency - TTFT) / (output tokens - 1) for requests with more
than one token, throughputs over the level's wall time, percentiles by linear interpolation, standard
deviation over the population).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from backend.bench.scrape import Acceptance

METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 99)
VLLM_BENCH = "vllm bench serve"
OUR_CLIENT = "eagle3-console client"


class BenchResultError(ValueError):
    """A result that cannot be read; the message names the key and what was expected."""


@dataclass(frozen=True)
class LevelResult:
    concurrency: int
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float  # completed requests / s
    output_throughput: float  # output tokens / s
    total_token_throughput: float
    latency_ms: dict[str, dict[str, float]]  # ttft|tpot|itl|e2el -> mean, median, std, p50, p90, p99
    acceptance: Acceptance | None = None
    source: str = OUR_CLIENT

    def stat(self, metric: str, which: str) -> float | None:
        return self.latency_ms.get(metric, {}).get(which)

    def to_dict(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "completed": self.completed, "failed": self.failed,
                "duration_s": self.duration_s, "total_input_tokens": self.total_input_tokens,
                "total_output_tokens": self.total_output_tokens, "request_throughput": self.request_throughput,
                "output_throughput": self.output_throughput, "total_token_throughput": self.total_token_throughput,
                "latency_ms": self.latency_ms, "source": self.source,
                "acceptance": self.acceptance.to_dict() if self.acceptance else None}

    @classmethod
    def from_dict(cls, data: Any) -> "LevelResult":
        if not isinstance(data, dict):
            raise BenchResultError(f"a level result must be an object, got {type(data).__name__}")
        latency = data.get("latency_ms")
        if not isinstance(latency, dict):
            raise BenchResultError("latency_ms: expected an object of metric -> statistics")
        stats = {str(m): {str(k): _num(v, f"latency_ms.{m}.{k}") for k, v in s.items()}
                 for m, s in latency.items() if isinstance(s, dict)}
        acc = data.get("acceptance")
        return cls(concurrency=_int(data, "concurrency", minimum=1), completed=_int(data, "completed"),
                   failed=_int(data, "failed"), duration_s=_num(data.get("duration_s"), "duration_s"),
                   total_input_tokens=_int(data, "total_input_tokens"),
                   total_output_tokens=_int(data, "total_output_tokens"),
                   request_throughput=_num(data.get("request_throughput"), "request_throughput"),
                   output_throughput=_num(data.get("output_throughput"), "output_throughput"),
                   total_token_throughput=_num(data.get("total_token_throughput"), "total_token_throughput"),
                   latency_ms=stats, acceptance=_acceptance(acc) if acc is not None else None,
                   source=str(data.get("source") or OUR_CLIENT))


@dataclass(frozen=True)
class BenchResult:
    """One bench run: a label (baseline, drafter, ...) and its levels, in concurrency order."""
    label: str
    model: str
    endpoint: str
    client: str
    workload: dict[str, Any]
    levels: tuple[LevelResult, ...] = ()
    server: dict[str, Any] = field(default_factory=dict)  # what the server said it was (/version, drafter)

    def level(self, concurrency: int) -> LevelResult | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "model": self.model, "endpoint": self.endpoint, "client": self.client,
                "workload": self.workload, "server": self.server, "levels": [lv.to_dict() for lv in self.levels]}

    @classmethod
    def from_dict(cls, data: Any) -> "BenchResult":
        if not isinstance(data, dict):
            raise BenchResultError("a bench result must be a JSON object")
        levels = data.get("levels")
        if not isinstance(levels, list):
            raise BenchResultError("levels: expected a list")
        for key in ("label", "model", "endpoint", "client"):
            if not isinstance(data.get(key), str):
                raise BenchResultError(f"{key}: expected a string, got {data.get(key)!r}")
        return cls(label=data["label"], model=data["model"], endpoint=data["endpoint"], client=data["client"],
                   workload=dict(data.get("workload") or {}), server=dict(data.get("server") or {}),
                   levels=tuple(sorted((LevelResult.from_dict(lv) for lv in levels), key=lambda lv: lv.concurrency)))


def _num(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BenchResultError(f"{key}: expected a finite number, got {value!r}")
    return float(value)


def _int(data: dict[str, Any], key: str, minimum: int = 0) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BenchResultError(f"{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _acceptance(data: Any) -> Acceptance:
    if not isinstance(data, dict):
        raise BenchResultError("acceptance: expected an object")
    rate = data.get("rate")
    per_pos = data.get("per_position") or []
    if not isinstance(per_pos, list):
        raise BenchResultError("acceptance.per_position: expected a list")
    return Acceptance(drafts=_num(data.get("drafts"), "acceptance.drafts"),
                      draft_tokens=_num(data.get("draft_tokens"), "acceptance.draft_tokens"),
                      accepted=_num(data.get("accepted"), "acceptance.accepted"),
                      rate=None if rate is None else _num(rate, "acceptance.rate"),
                      length=_num(data.get("length"), "acceptance.length"),
                      per_position=tuple(_num(p, "acceptance.per_position") for p in per_pos))


# ---- vllm bench serve's result JSON -------------------------------------------------------------------
def parse_vllm_bench_result(data: Any, concurrency: int | None = None) -> LevelResult:
    """One `vllm bench serve --save-result` JSON as a level. Versions before 0.15.1 have no spec_decode_*
    keys (the acceptance then comes from our own scrapes, see runner); a percentile that was not asked
    for is simply absent."""
    if not isinstance(data, dict):
        raise BenchResultError("vllm bench serve result: expected a JSON object")
    level = concurrency if concurrency is not None else data.get("max_concurrency")
    if isinstance(level, bool) or not isinstance(level, int) or level < 1:
        raise BenchResultError(f"max_concurrency: expected an integer >= 1 (run with --max-concurrency), "
                               f"got {level!r}")
    latency: dict[str, dict[str, float]] = {}
    for metric in METRICS:
        stats = {}
        for key, value in data.items():
            if key.endswith(f"_{metric}_ms") and isinstance(value, (int, float)) and not isinstance(value, bool):
                which = key[: -len(f"_{metric}_ms")]
                percentile_key = which.startswith("p") and which[1:].replace(".", "").isdigit()
                if which in ("mean", "median", "std") or percentile_key:
                    stats[which] = float(value)
        if stats:
            latency[metric] = stats
    completed = _int(data, "completed")
    failed = data.get("failed")
    if failed is None:  # before the key existed: the prompts that did not complete
        num_prompts = data.get("num_prompts")
        failed = max(0, num_prompts - completed) if isinstance(num_prompts, int) else 0
    duration = _num(data.get("duration"), "duration")
    total_out = _int(data, "total_output_tokens")
    total_in = _int(data, "total_input_tokens")
    return LevelResult(
        concurrency=level, completed=completed, failed=int(failed), duration_s=duration,
        total_input_tokens=total_in, total_output_tokens=total_out,
        request_throughput=_num(data.get("request_throughput"), "request_throughput"),
        output_throughput=_num(data.get("output_throughput"), "output_throughput"),
        total_token_throughput=_num(data.get("total_token_throughput", (total_in + total_out) / duration
                                             if duration > 0 else 0.0), "total_token_throughput"),
        latency_ms=latency, acceptance=_vllm_acceptance(data), source=VLLM_BENCH)


def _vllm_acceptance(data: dict[str, Any]) -> Acceptance | None:
    if "spec_decode_acceptance_length" not in data:
        return None
    drafts = _num(data.get("spec_decode_num_drafts"), "spec_decode_num_drafts")
    draft_tokens = _num(data.get("spec_decode_draft_tokens"), "spec_decode_draft_tokens")
    accepted = _num(data.get("spec_decode_accepted_tokens"), "spec_decode_accepted_tokens")
    rate_pct = data.get("spec_decode_acceptance_rate")
    per_pos = data.get("spec_decode_per_position_acceptance_rates") or []
    if not isinstance(per_pos, list):
        raise BenchResultError("spec_decode_per_position_acceptance_rates: expected a list")
    return Acceptance(drafts=drafts, draft_tokens=draft_tokens, accepted=accepted,
                      rate=None if rate_pct is None else _num(rate_pct, "spec_decode_acceptance_rate") / 100.0,
                      length=_num(data["spec_decode_acceptance_length"], "spec_decode_acceptance_length"),
                      per_position=tuple(_num(p, "spec_decode_per_position_acceptance_rates") for p in per_pos))


# ---- our client's figures ----------------------------------------------------------------------------
@dataclass
class RequestOutcome:
    """One request as our client saw it (seconds; vLLM's RequestFuncOutput fields)."""
    success: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    error: str = ""


def percentile(values: Sequence[float], q: float) -> float:
    """numpy's default (linear interpolation between closest ranks); 0 for no values, as vLLM reports."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _stats(values: Sequence[float]) -> dict[str, float]:
    n = len(values)
    mean = sum(values) / n if n else 0.0
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / n) if n else 0.0
    out = {"mean": mean * 1000, "median": percentile(values, 50) * 1000, "std": std * 1000}
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(values, p) * 1000
    return out


def figures(outcomes: Sequence[RequestOutcome], duration_s: float, concurrency: int,
            acceptance: Acceptance | None) -> LevelResult:
    ok = [o for o in outcomes if o.success]
    ttfts = [o.ttft for o in ok]
    tpots = [(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok if o.output_tokens > 1]
    itls = [gap for o in ok for gap in o.itl]
    e2els = [o.latency for o in ok]
    total_in = sum(o.prompt_tokens for o in ok)
    total_out = sum(o.output_tokens for o in ok)
    wall = duration_s if duration_s > 0 else float("inf")
    return LevelResult(
        concurrency=concurrency, completed=len(ok), failed=len(outcomes) - len(ok), duration_s=duration_s,
        total_input_tokens=total_in, total_output_tokens=total_out, request_throughput=len(ok) / wall,
        output_throughput=total_out / wall, total_token_throughput=(total_in + total_out) / wall,
        latency_ms={"ttft": _stats(ttfts), "tpot": _stats(tpots), "itl": _stats(itls), "e2el": _stats(e2els)},
        acceptance=acceptance, source=OUR_CLIENT)
