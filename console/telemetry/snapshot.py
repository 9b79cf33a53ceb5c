"""Typed records the collectors produce and the panes and `status --json` consume.

One snapshot type, shared by the headless CLI and the Textual app, so both always show the same facts.
Field names follow the `status --json` contract exactly (see README, "status --json").
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Phase = Literal[
    "stopped", "starting", "loading_weights", "compiling", "allocating_kv_cache",
    "capturing_cuda_graphs", "starting_api", "ready", "failed", "unknown",
]
PHASES: tuple[str, ...] = (
    "stopped", "starting", "loading_weights", "compiling", "allocating_kv_cache",
    "capturing_cuda_graphs", "starting_api", "ready", "failed", "unknown",
)


@dataclass
class HostInfo:
    name: str
    reachable: bool = False
    error: str | None = None
    rtt_ms: float | None = None
    simulated: bool = False
    sim_text: str | None = None  # demo host only: which text backend the vLLM stand-in runs


@dataclass
class ServiceInfo:
    manager: Literal["systemd", "tmux"]
    unit: str
    active_state: str = "unknown"
    sub_state: str = "unknown"
    restarts: int | None = None
    since: str | None = None
    since_ts: float | None = None  # `since` as unix seconds, when it could be parsed
    main_pid: int | None = None
    memory_bytes: int | None = None
    result: str | None = None


@dataclass
class Progress:
    done: int
    total: int


@dataclass
class ServerMetrics:
    """From vLLM's /metrics (rates over the interval between two scrapes)."""
    requests_running: int | None = None
    requests_waiting: int | None = None
    kv_cache_usage_pct: float | None = None
    generation_tps: float | None = None
    prompt_tps: float | None = None
    spec_acceptance_rate: float | None = None  # accepted / drafted tokens, drafter only
    spec_mean_acceptance_length: float | None = None
    spec_per_position: list[float] | None = None


@dataclass
class ServerInfo:
    phase: Phase = "unknown"
    progress: Progress | None = None
    eta_s: float | None = None
    eta_source: str | None = None  # "shards", "gpu_memory", "previous_load"
    fraction: float | None = None  # 0..1 of the weight loading, from the best signal
    model_id: str | None = None
    max_model_len: int | None = None
    version: str | None = None
    error: str | None = None
    reasoning_field: str | None = None  # set by the deep check
    deep_check: str | None = None
    metrics: ServerMetrics | None = None


@dataclass
class GpuInfo:
    index: int
    name: str
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None


@dataclass
class RunInfo:
    """One stage run found on the host (from its events.jsonl)."""
    stage: str
    run_id: str
    state: str  # idle | running | done | failed | stale
    unit: str | None = None
    done: int = 0
    total: int = 0
    failed: int = 0
    rate: float | None = None
    eta_s: float | None = None
    last_event: dict[str, Any] | None = None
    series: dict[str, Any] | None = None  # train runs: curves and checkpoints (console/telemetry/train_view.py)


@dataclass
class Snapshot:
    host: HostInfo
    service: ServiceInfo
    server: ServerInfo = field(default_factory=ServerInfo)
    gpus: list[GpuInfo] = field(default_factory=list)
    gpu_error: str | None = None
    runs: list[RunInfo] = field(default_factory=list)
    free_bytes: int | None = None  # on the work dir's volume
    taken_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
